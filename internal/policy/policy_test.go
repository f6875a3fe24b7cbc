package policy

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/tfstackplan/tfstackplan/internal/doctest"
)

// recordedPlan is a plan OpenTofu recorded for the project's tests.
func recordedPlan(name string) string {
	return filepath.Join("..", "..", "testdata", "tofu", name, "plan.json")
}

// writeFiles writes name → content under a new temporary directory and returns it.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func compile(t *testing.T, defs ...Definition) *Set {
	t.Helper()
	s, err := Compile(context.Background(), defs)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func evalFile(t *testing.T, s *Set, plan string) *Result {
	t.Helper()
	f, err := os.Open(plan)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	input, err := ReadInput(f)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Eval(context.Background(), input)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func messages(fs []Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Policy+"/"+f.Rule+": "+f.Message)
	}
	return out
}

func wantMessages(t *testing.T, what string, got []Finding, want ...string) {
	t.Helper()
	if g := messages(got); !reflect.DeepEqual(g, want) {
		t.Errorf("%s:\n got %q\nwant %q", what, g, want)
	}
}

// The conftest rules, as strings and as objects, in v1 syntax, on the recorded mixed plan
// (update a, replace b, delete c, create e).
func TestEvalRulesV1(t *testing.T) {
	dir := writeFiles(t, map[string]string{"p/rules.rego": `package main

deny contains sprintf("%s is deleted", [rc.address]) if {
	some rc in input.resource_changes
	rc.change.actions == ["delete"]
}

violation contains {"msg": "replaced", "address": rc.address, "actions": rc.change.actions} if {
	some rc in input.resource_changes
	count(rc.change.actions) == 2
}

deny_created contains {"msg": sprintf("%s is created", [rc.address])} if {
	some rc in input.resource_changes
	rc.change.actions == ["create"]
}

warn contains sprintf("%s is updated", [rc.address]) if {
	some rc in input.resource_changes
	rc.change.actions == ["update"]
}

warn_object contains {"msg": "format", "version": input.format_version} if true

helper := 1
`})
	s := compile(t, Definition{Name: "p", Files: []string{"p/*.rego"}, BaseDir: dir})
	if got, want := s.Rules()["p"], []string{"deny", "deny_created", "violation", "warn", "warn_object"}; !reflect.DeepEqual(got, want) {
		t.Errorf("rules %q, want %q", got, want)
	}
	r := evalFile(t, s, recordedPlan("mixed"))
	wantMessages(t, "failures", r.Failures,
		"p/deny: terraform_data.c is deleted",
		"p/deny_created: terraform_data.e is created",
		"p/violation: replaced")
	wantMessages(t, "warnings", r.Warnings,
		"p/warn: terraform_data.a is updated",
		"p/warn_object: format")
	if !r.Failed() {
		t.Error("Failed() is false with failures")
	}
	wantDetails := map[string]any{"address": "terraform_data.b", "actions": []any{"delete", "create"}}
	if got := r.Failures[2].Details; !reflect.DeepEqual(got, wantDetails) {
		t.Errorf("violation details %v, want %v", got, wantDetails)
	}
	if got := r.Warnings[1].Details; !reflect.DeepEqual(got, map[string]any{"version": "1.2"}) {
		t.Errorf("warn_object details %v", got)
	}
	if r.Failures[0].Details != nil {
		t.Errorf("a string finding has details %v", r.Failures[0].Details)
	}
}

// Policies written before OPA 1.0 evaluate with rego_version v0, and fail to compile as v1,
// naming the file and line.
func TestEvalRegoV0(t *testing.T) {
	dir := writeFiles(t, map[string]string{"old.rego": `package main

deny[msg] {
	rc := input.resource_changes[_]
	rc.change.actions[_] == "delete"
	msg := sprintf("%s: delete", [rc.address])
}

warn[{"msg": "old style"}] {
	true
}
`})
	def := Definition{Name: "old", Files: []string{"old.rego"}, BaseDir: dir, RegoVersion: RegoV0}
	r := evalFile(t, compile(t, def), recordedPlan("mixed"))
	wantMessages(t, "failures", r.Failures, "old/deny: terraform_data.b: delete", "old/deny: terraform_data.c: delete")
	wantMessages(t, "warnings", r.Warnings, "old/warn: old style")

	def.RegoVersion = ""
	_, err := Compile(context.Background(), []Definition{def})
	if err == nil || !strings.Contains(err.Error(), "old.rego:3:") || !strings.Contains(err.Error(), `policy "old"`) {
		t.Errorf("v0 syntax compiled as v1: %v; want an error naming the policy and old.rego:3", err)
	}
}

// Data files, JSON and YAML, are data.KEY; a key defined twice is refused.
func TestEvalDataFiles(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"p/limits.yaml": "limits:\n  max_deletions: 1\n",
		"p/owners.json": `{"owners": {"terraform_data.c": "team-db"}}`,
		"p/p.rego": `package main

deny contains sprintf("%d deletions > %d", [n, data.limits.max_deletions]) if {
	n := count([rc | some rc in input.resource_changes; "delete" in rc.change.actions])
	n > data.limits.max_deletions
}

warn contains sprintf("%s belongs to %s", [rc.address, data.owners[rc.address]]) if {
	some rc in input.resource_changes
	data.owners[rc.address]
}
`,
		"dup/a.json": `{"limits": {}}`,
		"dup/b.yaml": "limits: {}\n",
		"dup/p.rego": "package main\n",
	})
	r := evalFile(t, compile(t, Definition{Name: "p", Files: []string{"p"}, BaseDir: dir}), recordedPlan("mixed"))
	wantMessages(t, "failures", r.Failures, "p/deny: 2 deletions > 1")
	wantMessages(t, "warnings", r.Warnings, "p/warn: terraform_data.c belongs to team-db")

	_, err := Compile(context.Background(), []Definition{{Name: "dup", Files: []string{"dup/*"}, BaseDir: dir}})
	if err == nil || !strings.Contains(err.Error(), `"limits"`) {
		t.Errorf("a data key in two files: %v", err)
	}
}

// A policy whose evaluation fails is a failure naming the file and line, never a pass; under
// enforcement warn it is a warning. Rule values conftest would skip are errors too.
func TestEvalErrorFailsClosed(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"conflict.rego": `package main

address := rc.address if {
	some rc in input.resource_changes
}

deny contains "never" if address == "nothing"
`,
		"boolean.rego": "package main\n\ndeny := true\n",
		"nomsg.rego":   "package main\n\ndeny contains {\"message\": \"x\"} if true\n",
	})
	s := compile(t,
		Definition{Name: "conflict", Files: []string{"conflict.rego"}, BaseDir: dir},
		Definition{Name: "conflict-warn", Files: []string{"conflict.rego"}, BaseDir: dir, Enforcement: EnforceWarn},
		Definition{Name: "boolean", Files: []string{"boolean.rego"}, BaseDir: dir},
		Definition{Name: "nomsg", Files: []string{"nomsg.rego"}, BaseDir: dir},
	)
	r := evalFile(t, s, recordedPlan("mixed"))
	if len(r.Failures) != 3 || len(r.Warnings) != 1 {
		t.Fatalf("failures %q, warnings %q; want 3 and 1", messages(r.Failures), messages(r.Warnings))
	}
	for _, f := range append(r.Failures, r.Warnings...) {
		if f.Rule != RuleError {
			t.Errorf("%s: rule %q, want %q", f.Policy, f.Rule, RuleError)
		}
	}
	if got := r.Failures[0].Message; !strings.Contains(got, "conflict.rego:3:") || !strings.Contains(got, "conflict") {
		t.Errorf("the conflict's message %q does not name conflict.rego:3", got)
	}
	if r.Warnings[0].Policy != "conflict-warn" {
		t.Errorf("the warn policy's error went to %q", r.Warnings[0].Policy)
	}
	if got := r.Failures[1].Message; !strings.Contains(got, "a boolean") {
		t.Errorf("boolean rule: %q", got)
	}
	if got := r.Failures[2].Message; !strings.Contains(got, `without a string "msg"`) {
		t.Errorf("object without msg: %q", got)
	}
}

// A module that does not parse, or does not compile, stops Compile naming file and line.
func TestCompileErrorsNameFileAndLine(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"syntax/p.rego":   "package main\n\ndeny contains msg if {\n\tmsg := \n}\n",
		"unsafe/p.rego":   "package main\n\n\ndeny contains msg if { x == 1 }\n",
		"data/p.rego":     "package main\n",
		"data/bad.yaml":   "a: [\n",
		"other/p.txt":     "x",
		"nomodule/a.json": "{}",
	})
	for _, tc := range []struct {
		files []string
		want  []string
	}{
		{[]string{"syntax/*.rego"}, []string{"syntax/p.rego:5:"}},
		{[]string{"unsafe"}, []string{"unsafe/p.rego:4:", "unsafe"}},
		{[]string{"data"}, []string{"data/bad.yaml"}},
		{[]string{"other/p.txt"}, []string{"neither a Rego module"}},
		{[]string{"missing/*.rego"}, []string{"match nothing"}},
		{[]string{"nomodule"}, []string{"no Rego module"}},
	} {
		_, err := Compile(context.Background(), []Definition{{Name: "p", Files: tc.files, BaseDir: dir}})
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("files %q: error %v, want it to contain %q", tc.files, err, w)
			}
		}
	}
	for _, d := range []Definition{
		{Files: []string{"x"}},
		{Name: "p"},
		{Name: "p", Files: []string{"x"}, Enforcement: "block"},
		{Name: "p", Files: []string{"x"}, RegoVersion: "v2"},
		{Name: "p", Files: []string{"data"}, BaseDir: dir, Package: "main x"},
	} {
		if _, err := Compile(context.Background(), []Definition{d}); err == nil {
			t.Errorf("%+v compiled", d)
		}
	}
}

// A package without deny, violation or warn rules, or no module of that package, reports
// nothing (conftest's choice), and Rules says it has none.
func TestEvalPackageWithoutRules(t *testing.T) {
	dir := writeFiles(t, map[string]string{"p.rego": "package main\n\nallow if true\n\ndenied := true\n"})
	s := compile(t,
		Definition{Name: "helpers", Files: []string{"p.rego"}, BaseDir: dir},
		Definition{Name: "elsewhere", Files: []string{"p.rego"}, BaseDir: dir, Package: "terraform.checks"},
	)
	r := evalFile(t, s, recordedPlan("mixed"))
	if r.Failed() || len(r.Warnings) != 0 {
		t.Errorf("failures %q, warnings %q; want none", messages(r.Failures), messages(r.Warnings))
	}
	for _, name := range []string{"helpers", "elsewhere"} {
		if rules, ok := s.Rules()[name]; !ok || len(rules) != 0 {
			t.Errorf("Rules()[%q] = %q, %t; want none, listed", name, rules, ok)
		}
	}
}

// Enforcement warn turns a policy's failures into warnings; the package setting selects
// whose rules count.
func TestEvalEnforcementAndPackage(t *testing.T) {
	dir := writeFiles(t, map[string]string{"p.rego": `package terraform.deletes

deny contains "deletes" if {
	some rc in input.resource_changes
	"delete" in rc.change.actions
}
`})
	s := compile(t,
		Definition{Name: "warn-only", Files: []string{"p.rego"}, BaseDir: dir, Package: "terraform.deletes", Enforcement: EnforceWarn},
		Definition{Name: "deny", Files: []string{"p.rego"}, BaseDir: dir, Package: "terraform.deletes"},
	)
	r := evalFile(t, s, recordedPlan("delete"))
	wantMessages(t, "failures", r.Failures, "deny/deny: deletes")
	wantMessages(t, "warnings", r.Warnings, "warn-only/deny: deletes")
	r = evalFile(t, s, recordedPlan("update"))
	if r.Failed() || len(r.Warnings) != 0 {
		t.Errorf("an update-only plan: %q %q", messages(r.Failures), messages(r.Warnings))
	}
}

// The hash is the same for the same files elsewhere, and changes with a byte of a file, a
// file's name, or a setting.
func TestHash(t *testing.T) {
	files := map[string]string{"p/a.rego": "package main\n", "p/d.json": `{"x": 1}`}
	hash := func(dir string, mod func(*Definition)) string {
		d := Definition{Name: "p", Files: []string{"p"}, BaseDir: dir}
		if mod != nil {
			mod(&d)
		}
		return compile(t, d).Hash()
	}
	a, b := writeFiles(t, files), writeFiles(t, files)
	base := hash(a, nil)
	if !strings.HasPrefix(base, "sha256:") || base != hash(b, nil) {
		t.Fatalf("same files, two directories: %s, %s", base, hash(b, nil))
	}
	seen := map[string]string{base: "base"}
	differ := func(what, h string) {
		if prev, ok := seen[h]; ok {
			t.Errorf("%s has the hash of %s", what, prev)
		}
		seen[h] = what
	}
	differ("warn", hash(a, func(d *Definition) { d.Enforcement = EnforceWarn }))
	differ("v0", hash(a, func(d *Definition) { d.RegoVersion = RegoV0 }))
	differ("other name", hash(a, func(d *Definition) { d.Name = "q" }))
	differ("other package", hash(a, func(d *Definition) { d.Package = "x" }))
	if err := os.WriteFile(filepath.Join(b, "p", "d.json"), []byte(`{"x": 2}`), 0o644); err != nil {
		t.Fatal(err)
	}
	differ("a changed byte", hash(b, nil))
	if err := os.Rename(filepath.Join(b, "p", "d.json"), filepath.Join(b, "p", "e.json")); err != nil {
		t.Fatal(err)
	}
	differ("a renamed file", hash(b, nil))
}

// ReadInput builds the value that OPA's own conversion of the decoded JSON builds, on every
// recorded plan and on escapes, numbers and nesting.
func TestReadInputMatchesOPA(t *testing.T) {
	docs := []string{
		`{"a": "x\u00e9\n\"q\"", "b": [1, -2.5e10, 12345678901234567890, 0.1], "c": {"d": [], "e": {}, "f": null, "g": true, "h": false}, "": ""}`,
		`["` + strings.Repeat("long ", 40) + `", "` + strings.Repeat("long ", 40) + `"]`,
	}
	paths, _ := filepath.Glob(filepath.Join("..", "..", "testdata", "tofu", "*", "plan.json"))
	if len(paths) < 10 {
		t.Fatalf("only %d recorded plans", len(paths))
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	for i, doc := range docs {
		got, err := ReadInput(strings.NewReader(doc))
		if err != nil {
			t.Fatalf("doc %d: %v", i, err)
		}
		var x any
		dec := json.NewDecoder(strings.NewReader(doc))
		dec.UseNumber()
		if err := dec.Decode(&x); err != nil {
			t.Fatal(err)
		}
		want, err := ast.InterfaceToValue(x)
		if err != nil {
			t.Fatal(err)
		}
		if got.Compare(want) != 0 {
			t.Errorf("doc %d: ReadInput differs from OPA's conversion:\n got %v\nwant %v", i, got, want)
		}
	}
	for _, bad := range []string{``, `{`, `{"a": 1, "a": 2}`, `{} {}`, `[1,]`, "\"\xff\""} {
		if _, err := ReadInput(strings.NewReader(bad)); err == nil {
			t.Errorf("ReadInput(%q) succeeded", bad)
		}
	}
}

// The budget lets a plan larger than itself through alone, and waits for room otherwise.
func TestBudget(t *testing.T) {
	dir := writeFiles(t, map[string]string{"p.rego": `package main

deny contains rc.address if {
	some rc in input.resource_changes
	"delete" in rc.change.actions
}
`})
	s := compile(t, Definition{Name: "p", Files: []string{"p.rego"}, BaseDir: dir})
	b := NewBudget(10)
	r, err := b.EvalFile(context.Background(), s, recordedPlan("delete"))
	if err != nil {
		t.Fatal(err)
	}
	wantMessages(t, "failures", r.Failures, "p/deny: terraform_data.c")

	if err := b.sem.Acquire(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.EvalFile(ctx, s, recordedPlan("delete")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("with the budget in use: %v, want it to wait until the deadline", err)
	}
	b.sem.Release(1)
	if _, err := b.EvalFile(context.Background(), s, recordedPlan("delete")); err != nil {
		t.Errorf("after the release: %v", err)
	}
	if _, err := b.EvalFile(context.Background(), s, filepath.Join(dir, "missing.json")); err == nil {
		t.Error("a missing plan evaluated")
	}
}

// A huge plan: 100,000 deletions evaluate, and every one is seen.
func TestEvalHugePlan(t *testing.T) {
	if testing.Short() {
		t.Skip("generates and evaluates a plan of 100,000 deletions")
	}
	path, size := genPlanFile(t, t.TempDir(), planShape{Changes: 100_000, Payload: 300, DeleteOnly: true})
	dir := writeFiles(t, map[string]string{"p.rego": `package main

deletions := count([rc | some rc in input.resource_changes; "delete" in rc.change.actions])

deny contains sprintf("%d deletions", [deletions]) if deletions > 5

warn contains sprintf("%s is public", [rc.address]) if {
	some rc in input.resource_changes
	rc.change.before.public
}
`})
	r := evalFile(t, compile(t, Definition{Name: "p", Files: []string{"p.rego"}, BaseDir: dir}), path)
	wantMessages(t, "failures", r.Failures, "p/deny: 100000 deletions")
	if len(r.Warnings) != 100 {
		t.Errorf("%d public resources reported, want 100 (plan of %d bytes)", len(r.Warnings), size)
	}
}

// The documentation's examples (docs/policy-checks.md), evaluated on recorded plans.
func TestDocumentedExamples(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "docs", "policy-checks.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := doctest.Parse("docs/policy-checks.md", src)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, b := range blocks {
		if strings.HasPrefix(b.WriteFile, "policy/") {
			files[b.WriteFile] = b.Body
		}
	}
	if len(files) != 4 {
		t.Fatalf("the page's policy files: %d, want 4 (3 modules, 1 data file)", len(files))
	}
	s := compile(t, Definition{Name: "examples", Files: []string{"policy"}, BaseDir: writeFiles(t, files)})
	for _, tc := range []struct {
		plan               string
		failures, warnings []string
	}{
		{"mixed", []string{
			"examples/deny: 2 resources would be destroyed, more than 1: terraform_data.b, terraform_data.c",
			"examples/deny_protected: terraform_data.c is protected: this plan would delete it",
		}, []string{"examples/warn: terraform_data.b will be replaced (delete then create)"}},
		{"delete", []string{"examples/deny_protected: terraform_data.c is protected: this plan would delete it"}, nil},
		{"forget", []string{"examples/deny_protected: terraform_data.c is protected: this plan would forget it"}, nil},
		{"create-before-destroy", nil, []string{"examples/warn: terraform_data.b will be replaced (create then delete)"}},
		{"update", nil, nil},
	} {
		r := evalFile(t, s, recordedPlan(tc.plan))
		wantMessages(t, tc.plan+" failures", r.Failures, tc.failures...)
		wantMessages(t, tc.plan+" warnings", r.Warnings, tc.warnings...)
	}
	r := evalFile(t, s, recordedPlan("mixed"))
	if d := r.Failures[0].Details; d["deletions"] != json.Number("2") || d["limit"] != json.Number("1") {
		t.Errorf("the deletions finding's details %v", d)
	}
}

// One Set evaluates plans from several goroutines at once, within a budget that lets only some
// through at a time, with the results of sequential evaluation.
func TestEvalConcurrent(t *testing.T) {
	dir := writeFiles(t, map[string]string{"p.rego": `package main

deny contains rc.address if {
	some rc in input.resource_changes
	"delete" in rc.change.actions
}

warn contains rc.address if {
	some rc in input.resource_changes
	"create" in rc.change.actions
}
`})
	s := compile(t, Definition{Name: "p", Files: []string{"p.rego"}, BaseDir: dir})
	plans := []string{"mixed", "delete", "create", "update", "replace", "deposed"}
	want := map[string]*Result{}
	for _, p := range plans {
		want[p] = evalFile(t, s, recordedPlan(p))
	}
	b := NewBudget(12_000) // two or three of these plans at once
	errs := make(chan error, 4*len(plans))
	for range 4 {
		for _, p := range plans {
			go func() {
				r, err := b.EvalFile(context.Background(), s, recordedPlan(p))
				if err == nil && !reflect.DeepEqual(r, want[p]) {
					err = errors.New(p + ": the result differs from the sequential one")
				}
				errs <- err
			}()
		}
	}
	for range 4 * len(plans) {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
