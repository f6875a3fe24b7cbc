package doctest_test

// The reference pages are written by hand from the code; these tests fail when the code grows a
// field, an attribute or an exit code the pages do not name.

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/cli"
	"github.com/tfstackplan/tfstackplan/internal/job"
	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/runner"
)

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tagNames returns the names a struct's fields have under a tag (json, hcl), recursing into
// nested structs, slices and pointers of the listed types.
func tagNames(t reflect.Type, tag string, seen map[reflect.Type]bool) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || seen[t] {
		return nil
	}
	seen[t] = true
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get(tag), ",")
		if name == "" || name == "-" {
			continue
		}
		out = append(out, name)
		out = append(out, tagNames(f.Type, tag, seen)...)
	}
	return out
}

// TestResultDocumented: docs/result.md names every field of the result document.
func TestResultDocumented(t *testing.T) {
	doc := readDoc(t, "result.md")
	for _, name := range tagNames(reflect.TypeFor[job.Result](), "json", map[reflect.Type]bool{}) {
		if !strings.Contains(doc, "`"+name+"`") {
			t.Errorf("docs/result.md does not name the result field %q", name)
		}
	}
	for _, kind := range []string{job.KindUsage, job.KindConfig, job.KindTerramate, job.KindScript,
		job.KindClassify, job.KindGate, job.KindCancelled, job.KindInternal} {
		if !strings.Contains(doc, "`"+kind+"`") {
			t.Errorf("docs/result.md does not name the error kind %q", kind)
		}
	}
	for _, v := range []runner.VerdictKind{runner.VerdictSatisfied, runner.VerdictNotClassified, runner.VerdictNotSatisfied,
		runner.VerdictUnconfirmable, runner.VerdictUnreachable} {
		if !strings.Contains(doc, "`"+v.String()+"`") {
			t.Errorf("docs/result.md does not name the gate verdict %q", v)
		}
	}
}

// TestConfigDocumented: docs/configuration.md names every attribute of an environment block.
func TestConfigDocumented(t *testing.T) {
	doc := readDoc(t, "configuration.md")
	for _, name := range tagNames(reflect.TypeFor[runner.Environment](), "hcl", map[reflect.Type]bool{}) {
		if name == "name" { // the block's label
			continue
		}
		if !strings.Contains(doc, "| `"+name+"` |") {
			t.Errorf("docs/configuration.md has no row for the environment attribute %q", name)
		}
	}
}

// TestExitCodesDocumented: docs/exit-codes.md has a row for each exit code.
func TestExitCodesDocumented(t *testing.T) {
	doc := readDoc(t, "exit-codes.md")
	for _, code := range []int{cli.ExitOK, cli.ExitFailure, cli.ExitUsage, cli.ExitGateDenied, cli.ExitDrift, cli.ExitPolicy} {
		if !strings.Contains(doc, "\n| "+string(rune('0'+code))+" |") {
			t.Errorf("docs/exit-codes.md has no row for exit code %d", code)
		}
	}
}

// Policy and tokens files are shown in blocks no command reads (a policy with the gcp-iam
// granter needs Google credentials to serve): an hcl block with a requester is a policy, one
// with roles a tokens file, and each must be one the server accepts.
var (
	policyBlockRE = regexp.MustCompile(`(?m)^\s*requester\s*=`)
	tokensBlockRE = regexp.MustCompile(`(?m)^\s*roles\s*=`)
)

// TestHCLExamplesParse: every policy and tokens file the documents show is read by the server
// without error.
func TestHCLExamplesParse(t *testing.T) {
	for _, name := range documents(t) {
		for _, b := range parseDoc(t, name) {
			if b.Lang != "hcl" {
				continue
			}
			isPolicy, isTokens := policyBlockRE.MatchString(b.Body), tokensBlockRE.MatchString(b.Body)
			switch {
			case isPolicy && isTokens:
				t.Errorf("%s: one block shows a policy and a tokens file: show them apart", b.Where())
			case isPolicy:
				if _, err := service.ParsePolicy(b.Where(), []byte(b.Body)); err != nil {
					t.Errorf("%s: the policy is refused: %v", b.Where(), err)
				}
			case isTokens:
				if err := new(auth.Authenticator).ParseTokens(b.Where(), []byte(b.Body)); err != nil {
					t.Errorf("%s: the tokens file is refused: %v", b.Where(), err)
				}
			}
		}
	}
}
