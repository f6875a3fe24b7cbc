package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const renderTofuDir = "../../testdata/tofu"

func renderPlanPath(scenario string) string {
	return filepath.Join(renderTofuDir, scenario, "plan.json")
}

func TestRenderJSONCounts(t *testing.T) {
	code, out, errOut := runMain("render", "--plan", renderPlanPath("mixed"), "--stack", "stacks/app", "--format", "json")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Class  string `json:"class"`
		Stacks []struct {
			Stack    string         `json:"stack"`
			Class    string         `json:"class"`
			Counts   map[string]int `json:"counts"`
			PlanHash string         `json:"plan_hash"`
		} `json:"stacks"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if doc.Class != "destructive" || len(doc.Stacks) != 1 {
		t.Fatalf("class %q with %d stacks, want destructive with 1", doc.Class, len(doc.Stacks))
	}
	s := doc.Stacks[0]
	want := map[string]int{"create": 1, "update": 1, "replace": 1, "delete": 1, "forget": 0, "import": 0, "read": 0}
	if s.Stack != "stacks/app" || s.Class != "destructive" || len(s.Counts) != len(want) {
		t.Fatalf("stack %+v", s)
	}
	for k, v := range want {
		if n, ok := s.Counts[k]; !ok || n != v {
			t.Errorf("counts[%s] = %d (present %v), want %d", k, n, ok, v)
		}
	}
	if h, ok := strings.CutPrefix(s.PlanHash, "v1:"); !ok || len(h) != 64 {
		t.Errorf("plan hash %q is not a v1 content hash (v1: and 64 hex digits)", s.PlanHash)
	}
}

func TestRenderFormats(t *testing.T) {
	for _, tc := range []struct {
		format, want string
	}{
		{"text", "WARNING: 2 destructive changes"},
		{"markdown", "> [!CAUTION]"},
		{"comment", "[Execution details and logs](https://example.com/x/1)"},
	} {
		code, out, errOut := runMain("render", "--plan", renderPlanPath("mixed"), "--format", tc.format, "--execution-url", "https://example.com/x/1")
		if code != ExitOK || !strings.Contains(out, tc.want) {
			t.Errorf("--format %s: exit %d, stdout lacks %q:\n%s%s", tc.format, code, tc.want, out, errOut)
		}
	}
}

func TestRenderTextColourOnlyWhenAsked(t *testing.T) {
	var out bytes.Buffer
	opts := &RenderOptions{IO: &IO{Out: &out, ErrOut: &out}, Plan: renderPlanPath("mixed"), Format: "text"}
	if err := runRender(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "\x1b[") {
		t.Error("colour written to a non-terminal")
	}
	out.Reset()
	opts.Color = new(true)
	if err := runRender(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "\x1b[") {
		t.Error("--color=always wrote no colour")
	}
}

func TestRenderNeverPrintsSecrets(t *testing.T) {
	for _, format := range []string{"text", "markdown", "comment", "json"} {
		code, out, errOut := runMain("render", "--plan", renderPlanPath("sensitive"), "--format", format, "--color", "always")
		if code != ExitOK {
			t.Fatalf("--format %s: exit %d: %s", format, code, errOut)
		}
		if strings.Contains(out+errOut, "hunter2") {
			t.Errorf("--format %s leaks the secret:\n%s", format, out)
		}
	}
}

func TestRenderUsageAndBadPlans(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "plan.json")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		args   []string
		code   int
		stderr []string
	}{
		{"bad format", []string{"render", "--plan", renderPlanPath("mixed"), "--format", "html"}, ExitUsage, []string{"--format", "html"}},
		{"no plan", []string{"render"}, ExitUsage, []string{"--plan"}},
		{"bad color", []string{"render", "--plan", renderPlanPath("mixed"), "--color", "rainbow"}, ExitUsage, []string{"--color"}},
		{"positional", []string{"render", "plan.json"}, ExitUsage, []string{"plan.json"}},
		{"empty plan", []string{"render", "--plan", empty, "--stack", "stacks/db"}, ExitFailure, []string{"stacks/db", empty, "empty"}},
		{"human plan", []string{"render", "--plan", filepath.Join(renderTofuDir, "mixed", "plan.txt")}, ExitFailure, []string{"human-readable"}},
		{"directory", []string{"render", "--plan", renderTofuDir}, ExitFailure, []string{"directory"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runMain(tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			for _, want := range tc.stderr {
				if !strings.Contains(errOut, want) {
					t.Errorf("stderr %q lacks %q", errOut, want)
				}
			}
			if tc.code == ExitFailure && !strings.Contains(out, "unclassified") {
				t.Errorf("an unreadable plan must render as unclassified, got:\n%s", out)
			}
		})
	}
}
