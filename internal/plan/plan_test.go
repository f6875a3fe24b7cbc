package plan

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/events"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// planTofuDir holds the recorded OpenTofu plans (copied from the shared fixtures).
const planTofuDir = "../../testdata/tofu"

// planScenario is one recorded plan and what its human output (plan.txt) says.
type planScenario struct {
	name string
	file string // plan.json, or plan.txt when the plan failed
	rc   int
	// from plan.txt
	add, change, destroy, forget, imports int
	outputs                               bool
	outputDeleted                         bool
	noChanges                             bool
	perAction                             Counts
	// a refresh-only plan, and the objects its drift note says were deleted or changed
	refreshOnly                bool
	driftDeleted, driftChanged int
}

var (
	planLineRE   = regexp.MustCompile(`(?m)^Plan: (?:(\d+) to import, )?(\d+) to add, (\d+) to change, (\d+) to destroy(?:, (\d+) to forget)?\.$`)
	planHeaderRE = regexp.MustCompile(`^  # (\S+)(?: \(deposed object [0-9a-f]+\))? (will be created|will be updated in-place|will be destroyed|must be replaced|is tainted, so it must be replaced|will be removed from the OpenTofu state but will not be destroyed|will be read during apply|will be imported|has moved to \S+)`)
	// planImportRE is the line under the header of every change that imports.
	planImportRE = regexp.MustCompile(`^  # \(imported from `)
	// planOutputDeleteRE is a deleted output under "Changes to Outputs:".
	planOutputDeleteRE = regexp.MustCompile(`(?m)^  - \S+ += `)
	// planDriftRE is a drift header under "Objects have changed outside of OpenTofu".
	planDriftRE = regexp.MustCompile(`(?m)^  # \S+ has (been deleted|changed)$`)
)

// planScenarios parses every recorded scenario's plan.txt and plan.rc.
func planScenarios(t *testing.T) []planScenario {
	t.Helper()
	entries, err := os.ReadDir(planTofuDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []planScenario
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(planTofuDir, e.Name())
		sc := planScenario{name: e.Name(), file: filepath.Join(dir, "plan.json")}
		rc, err := os.ReadFile(filepath.Join(dir, "plan.rc"))
		if errors.Is(err, os.ErrNotExist) {
			continue // not a plan scenario (e.g. _cli, the recorded CLI commands)
		}
		if err != nil {
			t.Fatal(err)
		}
		if sc.rc, err = strconv.Atoi(strings.TrimSpace(string(rc))); err != nil {
			t.Fatal(err)
		}
		txt, err := os.ReadFile(filepath.Join(dir, "plan.txt"))
		if err != nil {
			t.Fatal(err)
		}
		if sc.rc != 0 {
			sc.file = filepath.Join(dir, "plan.txt")
		}
		if m := planLineRE.FindStringSubmatch(string(txt)); m != nil {
			sc.imports, _ = strconv.Atoi(m[1] + "0")
			sc.imports /= 10
			sc.add, _ = strconv.Atoi(m[2])
			sc.change, _ = strconv.Atoi(m[3])
			sc.destroy, _ = strconv.Atoi(m[4])
			sc.forget, _ = strconv.Atoi(m[5] + "0")
			sc.forget /= 10
		}
		sc.noChanges = strings.Contains(string(txt), "No changes.")
		_, outs, ok := strings.Cut(string(txt), "\nChanges to Outputs:\n")
		sc.outputs = ok
		sc.outputDeleted = ok && planOutputDeleteRE.MatchString(outs)
		sc.perAction = headerCounts(t, txt)
		sc.refreshOnly = strings.Contains(string(txt), "\nThis is a refresh-only plan,")
		for _, m := range planDriftRE.FindAllStringSubmatch(string(txt), -1) {
			if m[1] == "been deleted" {
				sc.driftDeleted++
			} else {
				sc.driftChanged++
			}
		}
		out = append(out, sc)
	}
	if len(out) < 17 {
		t.Fatalf("found %d scenarios in %s, want all 17", len(out), planTofuDir)
	}
	return out
}

// headerCounts counts the "# addr will be ..." headers of a human plan by action.
func headerCounts(t *testing.T, txt []byte) Counts {
	var c Counts
	sc := bufio.NewScanner(bytes.NewReader(txt))
	for sc.Scan() {
		if planImportRE.MatchString(sc.Text()) {
			// Every import (tofu's "to import"), whatever else the change does.
			c.Import++
			continue
		}
		m := planHeaderRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		switch m[2] {
		case "will be imported":
			// Counted on its "(imported from" line.
		case "will be created":
			c.Create++
		case "will be updated in-place":
			c.Update++
		case "will be destroyed":
			c.Delete++
		case "must be replaced", "is tainted, so it must be replaced":
			c.Replace++
		case "will be read during apply":
			c.Read++
		case "will be removed from the OpenTofu state but will not be destroyed":
			c.Forget++
		default:
			c.Move++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return c
}

// expectedClass derives the class from the human plan's summary lines and headers.
func (sc planScenario) expectedClass() events.Class {
	switch {
	case sc.rc != 0:
		return events.ClassUnclassified
	case sc.destroy > 0 || sc.forget > 0 || sc.perAction.Replace > 0 || (sc.refreshOnly && sc.driftDeleted > 0):
		return events.ClassDestructive
	case sc.change > 0 || sc.perAction.Move > 0 || sc.outputDeleted || (sc.refreshOnly && sc.driftChanged > 0):
		return events.ClassMutating
	case sc.add > 0 || sc.imports > 0 || sc.outputs:
		return events.ClassAdditive
	}
	return events.ClassNoChanges
}

func classifyScenario(t *testing.T, sc planScenario) (*Stack, error) {
	t.Helper()
	f, err := os.Open(sc.file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A stable display path, independent of where the test runs.
	return Classify(sc.name, filepath.ToSlash(filepath.Join("testdata/tofu", sc.name, filepath.Base(sc.file))), f)
}

func TestPlanScenariosMatchHumanPlan(t *testing.T) {
	for _, sc := range planScenarios(t) {
		t.Run(sc.name, func(t *testing.T) {
			s, err := classifyScenario(t, sc)
			if sc.rc != 0 {
				if err == nil || s.Class != events.ClassUnclassified {
					t.Fatalf("failed plan: err %v, class %s; want an error and unclassified", err, s.Class)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c := s.Counts
			// A replace whose old object is forgotten (lifecycle destroy = false) is "to
			// forget" in tofu's line, the others "to destroy".
			forgetReplaces := 0
			for _, ch := range s.Destructive {
				if ch.Action == ActionReplace && strings.Contains(ch.Order, "forget") {
					forgetReplaces++
				}
			}
			if got := c.Create + c.Replace; got != sc.add {
				t.Errorf("create+replace = %d, plan.txt says %d to add", got, sc.add)
			}
			if c.Update != sc.change {
				t.Errorf("update = %d, plan.txt says %d to change", c.Update, sc.change)
			}
			if got := c.Delete + c.Replace - forgetReplaces; got != sc.destroy {
				t.Errorf("delete+replace = %d, plan.txt says %d to destroy", got, sc.destroy)
			}
			if got := c.Forget + forgetReplaces; got != sc.forget {
				t.Errorf("forget = %d, plan.txt says %d to forget", got, sc.forget)
			}
			if c.Import != sc.imports {
				t.Errorf("import = %d, plan.txt says %d to import", c.Import, sc.imports)
			}
			if (s.OutputsDeleted > 0) != sc.outputDeleted {
				t.Errorf("%d outputs deleted, plan.txt deletes an output: %v", s.OutputsDeleted, sc.outputDeleted)
			}
			if c != sc.perAction {
				t.Errorf("counts %+v, plan.txt resource headers give %+v", c, sc.perAction)
			}
			if sc.noChanges != (c.Total() == 0 && s.OutputsChanged == 0 && s.DriftRecorded == 0) {
				t.Errorf("plan.txt no-changes %v, counts %+v outputs %d", sc.noChanges, c, s.OutputsChanged)
			}
			if sc.outputs != (s.OutputsChanged > 0) {
				t.Errorf("plan.txt output changes %v, outputs changed %d", sc.outputs, s.OutputsChanged)
			}
			if want := sc.expectedClass(); s.Class != want {
				t.Errorf("class %s, want %s", s.Class, want)
			}
			if len(s.Destructive) != c.Destructive()+outsideForgets(s) {
				t.Errorf("%d destructive addresses for %d destructive changes", len(s.Destructive), c.Destructive())
			}
			if sc.refreshOnly && (outsideForgets(s) != sc.driftDeleted || s.DriftRecorded != sc.driftDeleted+sc.driftChanged) {
				t.Errorf("refresh-only: %d forgotten and %d drift recorded, plan.txt says %d deleted and %d changed outside",
					outsideForgets(s), s.DriftRecorded, sc.driftDeleted, sc.driftChanged)
			}
			if !planHashRE.MatchString(s.PlanHash) {
				t.Errorf("plan hash %q, want %s: and 64 hex digits", s.PlanHash, PlanHashVersion)
			}
		})
	}
}

// TestPlanReplaceOrder checks both replace orders of the recorded plans.
func TestPlanReplaceOrder(t *testing.T) {
	for name, order := range map[string]string{"replace": "delete-then-create", "create-before-destroy": "create-then-delete"} {
		s, err := ClassifyFile(name, filepath.Join(planTofuDir, name, "plan.json"))
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Destructive) != 1 || s.Destructive[0].Action != ActionReplace || s.Destructive[0].Order != order {
			t.Errorf("%s: destructive %+v, want one replace %s", name, s.Destructive, order)
		}
	}
}

// planRenders renders a report in every form.
func planRenders(t *testing.T, r *Report) map[string]string {
	t.Helper()
	var text, color, js bytes.Buffer
	if err := Text(&text, r, false); err != nil {
		t.Fatal(err)
	}
	if err := Text(&color, r, true); err != nil {
		t.Fatal(err)
	}
	if err := JSON(&js, r); err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		".md": Markdown(r), ".comment.md": Comment(r), ".txt": text.String(), ".color.txt": color.String(), ".json": js.String(),
	}
}

const planExecutionURL = "https://tfstackplan.example.com/executions/ex-123"

func TestPlanGolden(t *testing.T) {
	var all []*Stack
	for _, sc := range planScenarios(t) {
		s, _ := classifyScenario(t, sc)
		all = append(all, s)
		for ext, got := range planRenders(t, &Report{Stacks: []*Stack{s}, ExecutionURL: planExecutionURL}) {
			if ext == ".color.txt" {
				continue
			}
			planGolden(t, sc.name+ext, got)
		}
	}
	for ext, got := range planRenders(t, &Report{Stacks: all, ExecutionURL: planExecutionURL}) {
		planGolden(t, "all"+ext, got)
	}
}

func planGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file (go test -update to rewrite, then review):\n%s", path, got)
	}
}

func TestPlanSensitiveNeverPrinted(t *testing.T) {
	s, err := ClassifyFile("sensitive", filepath.Join(planTofuDir, "sensitive", "plan.json"))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(planTofuDir, "sensitive", "plan.json"))
	if !bytes.Contains(raw, []byte("hunter2")) {
		t.Fatal("the fixture no longer carries the secret; the test would prove nothing")
	}
	r := &Report{Stacks: []*Stack{s}, ExecutionURL: planExecutionURL}
	for ext, out := range planRenders(t, r) {
		if strings.Contains(out, "hunter2") {
			t.Errorf("render %s leaks the secret:\n%s", ext, out)
		}
		if !strings.Contains(out, "terraform_data.s") {
			t.Errorf("render %s does not show the change at all", ext)
		}
	}
	// The unflagged attribute that carries the secret (before.output) is masked, not dropped.
	for _, c := range s.Changes {
		for _, a := range c.Attributes {
			if a.Path == "output" && a.Before != Masked {
				t.Errorf("output before = %q, want %q", a.Before, Masked)
			}
		}
	}
}

func TestPlanSensitiveGenerated(t *testing.T) {
	const secret = "s3cr3t-Pa55word"
	var buf bytes.Buffer
	if _, err := writePlan(&buf, genOptions{Changes: 300, Seed: 3, Payload: 600, Secret: secret, Outputs: 2}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(buf.Bytes(), []byte(`"rotated from `+secret)) {
		t.Fatal("generated plan does not carry the unflagged secret")
	}
	s, err := Classify("gen", "gen.json", &buf)
	if err != nil {
		t.Fatal(err)
	}
	for ext, out := range planRenders(t, &Report{Stacks: []*Stack{s}}) {
		if strings.Contains(out, secret) {
			t.Errorf("render %s leaks the secret", ext)
		}
		if !strings.Contains(out, Masked) {
			t.Errorf("render %s masks nothing; the generated secrets should show as %q", ext, Masked)
		}
	}
}

// planWriteTemp writes content to a file in a temp dir and returns its path.
func planWriteTemp(t *testing.T, name string, content []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, content, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPlanBadInput(t *testing.T) {
	mixed, err := os.ReadFile(filepath.Join(planTofuDir, "mixed", "plan.json"))
	if err != nil {
		t.Fatal(err)
	}
	human, err := os.ReadFile(filepath.Join(planTofuDir, "mixed", "plan.txt"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		path     string
		sentinel error
		mention  string
	}{
		{"truncated", planWriteTemp(t, "plan.json", mixed[:len(mixed)/2]), ErrNotJSON, "truncated"},
		{"major", planWriteTemp(t, "plan.json", bytes.Replace(mixed, []byte(`"format_version":"1.2"`), []byte(`"format_version":"2.0"`), 1)), ErrFormatVersion, `"2.0"`},
		{"human", planWriteTemp(t, "plan.json", human), ErrNotJSON, "human-readable"},
		{"empty", planWriteTemp(t, "plan.json", nil), ErrEmpty, "empty"},
		{"blank", planWriteTemp(t, "plan.json", []byte("\n  \n")), ErrEmpty, "empty"},
		{"directory", t.TempDir(), nil, "directory"},
		{"missing", filepath.Join(t.TempDir(), "nope.json"), os.ErrNotExist, "no such file"},
		{"state", planWriteTemp(t, "plan.json", []byte(`{"format_version":"1.0","values":{"root_module":{}}}`)), ErrNotPlan, "state"},
		{"no version", planWriteTemp(t, "plan.json", []byte(`{"planned_values":{}}`)), ErrNotPlan, "format_version"},
		{"trailing", planWriteTemp(t, "plan.json", append(bytes.Clone(mixed), []byte("{}")...)), ErrNotJSON, "after the plan"},
		{"array", planWriteTemp(t, "plan.json", []byte(`[1,2]`)), ErrNotJSON, "object"},
		{"syntax", planWriteTemp(t, "plan.json", bytes.Replace(mixed, []byte(`"actions":["update"]`), []byte(`"actions":[update]`), 1)), ErrNotJSON, "invalid JSON at byte"},
		{"actions not an array", planWriteTemp(t, "plan.json", bytes.Replace(mixed, []byte(`"actions":["update"]`), []byte(`"actions":"update"`), 1)), nil, "/change/actions: expected an array, got a string"},
		{"syntax in a skipped value", planWriteTemp(t, "plan.json", bytes.Replace(mixed, []byte(`"configuration":{`), []byte(`"configuration":{,`), 1)), ErrNotJSON, "invalid JSON at byte"},
		{"unknown action", planWriteTemp(t, "plan.json", bytes.Replace(mixed, []byte(`"actions":["update"]`), []byte(`"actions":["explode"]`), 1)), nil, "explode"},
		{"errored", planWriteTemp(t, "plan.json", bytes.Replace(mixed, []byte(`"errored":false`), []byte(`"errored":true`), 1)), nil, "errored"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ClassifyFile("stacks/app", tc.path)
			if err == nil {
				t.Fatalf("no error; class %s", s.Class)
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Stack != "stacks/app" || pe.File != tc.path {
				t.Errorf("error %v is not an *Error naming the stack and file", err)
			}
			for _, want := range []string{"stacks/app", tc.path, tc.mention} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			if tc.sentinel != nil && !errors.Is(err, tc.sentinel) {
				t.Errorf("error %v is not %v", err, tc.sentinel)
			}
			if s == nil || s.Class != events.ClassUnclassified || s.Error != err.Error() {
				t.Fatalf("stack %+v: want unclassified carrying the error", s)
			}
			r := &Report{Stacks: []*Stack{s}}
			if r.Class() != events.ClassUnclassified {
				t.Errorf("report class %s: an unreadable plan must never look harmless", r.Class())
			}
		})
	}
}

func TestPlanClassOf(t *testing.T) {
	cases := []struct {
		c       Counts
		outputs int
		want    events.Class
	}{
		{Counts{}, 0, events.ClassNoChanges},
		{Counts{}, 1, events.ClassAdditive},
		{Counts{Create: 1, Import: 1, Read: 1}, 0, events.ClassAdditive},
		{Counts{Read: 1}, 0, events.ClassAdditive},
		{Counts{Create: 3, Update: 1}, 0, events.ClassMutating},
		{Counts{Update: 1, Forget: 1}, 0, events.ClassDestructive},
		{Counts{Replace: 1}, 0, events.ClassDestructive},
		{Counts{Delete: 1}, 0, events.ClassDestructive},
		{Counts{Move: 1}, 0, events.ClassMutating},
		{Counts{Move: 1, Create: 1}, 1, events.ClassMutating},
		{Counts{Move: 1, Delete: 1}, 0, events.ClassDestructive},
		{Counts{Import: 1, Update: 1}, 0, events.ClassMutating},
	}
	for _, tc := range cases {
		if got := ClassOf(tc.c, tc.outputs); got != tc.want {
			t.Errorf("ClassOf(%+v, %d) = %s, want %s", tc.c, tc.outputs, got, tc.want)
		}
	}
	// A deleted output makes the stack mutating at least.
	for _, tc := range []struct {
		c    Counts
		want events.Class
	}{{Counts{}, events.ClassMutating}, {Counts{Create: 1}, events.ClassMutating}, {Counts{Forget: 1}, events.ClassDestructive}} {
		if got := ClassOfOutputs(tc.c, 1, 1); got != tc.want {
			t.Errorf("ClassOfOutputs(%+v, 1, 1) = %s, want %s", tc.c, got, tc.want)
		}
	}
}

// TestPlanRecordedFixes holds the recorded plans of real OpenTofu 1.12.6 to what they must
// classify as: a replace with lifecycle destroy = false (["forget","create"], with and without
// create_before_destroy), a plan that only moves, a move with an update, a deleted output and
// imports that update.
func TestPlanRecordedFixes(t *testing.T) {
	classify := func(name string) *Stack {
		t.Helper()
		s, err := ClassifyFile(name, filepath.Join(planTofuDir, name, "plan.json"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := classify("replace-destroy-false")
	if s.Class != events.ClassDestructive || s.Counts != (Counts{Replace: 2}) || len(s.Destructive) != 2 {
		t.Errorf("replace-destroy-false: class %s counts %+v destructive %+v", s.Class, s.Counts, s.Destructive)
	}
	for _, c := range s.Destructive {
		if c.Order != "forget-then-create" || c.Reason != "replace_because_cannot_update" {
			t.Errorf("replace-destroy-false: %+v, want a forget-then-create replace", c)
		}
	}

	s = classify("moved")
	if s.Class != events.ClassMutating || s.Counts != (Counts{Move: 1}) || len(s.Changes) != 1 ||
		s.Changes[0].Action != ActionMove || s.Changes[0].Address != "terraform_data.x" || s.Changes[0].PreviousAddress != "terraform_data.a" {
		t.Errorf("moved: class %s counts %+v changes %+v", s.Class, s.Counts, s.Changes)
	}
	if ev := s.Event(); ev.Class != events.ClassMutating || ev.Counts != (events.Counts{}) {
		t.Errorf("moved: event %+v: the class is mutating, the wire counts carry no move", ev)
	}
	s = classify("moved-update")
	if s.Class != events.ClassMutating || s.Counts != (Counts{Update: 1, Move: 1}) {
		t.Errorf("moved-update: class %s counts %+v", s.Class, s.Counts)
	}
	for _, c := range s.Changes {
		if c.Address == "terraform_data.c" && (c.Action != ActionUpdate || c.PreviousAddress != "terraform_data.b") {
			t.Errorf("moved-update: %+v, want the update moved from terraform_data.b", c)
		}
	}
	for ext, out := range planRenders(t, &Report{Stacks: []*Stack{s}}) {
		if !strings.Contains(out, "terraform_data.b") || !strings.Contains(out, "terraform_data.a") {
			t.Errorf("moved-update: render %s does not show the previous addresses:\n%s", ext, out)
		}
	}

	s = classify("output-delete")
	if s.Class != events.ClassMutating || s.OutputsDeleted != 1 || s.OutputsChanged != 1 || s.Counts.Total() != 0 {
		t.Errorf("output-delete: class %s outputs deleted %d changed %d counts %+v", s.Class, s.OutputsDeleted, s.OutputsChanged, s.Counts)
	}

	s = classify("import-update")
	if s.Class != events.ClassMutating || s.Counts != (Counts{Update: 1, Import: 2}) || len(s.Changes) != 2 {
		t.Errorf("import-update: class %s counts %+v changes %+v", s.Class, s.Counts, s.Changes)
	}
}

// TestPlanSavedPlanFile: a binary saved plan (a zip) is named as such, with the command that
// turns it into the JSON plan.
func TestPlanSavedPlanFile(t *testing.T) {
	zip := append([]byte("PK\x03\x04\x14\x00\x08\x00"), bytes.Repeat([]byte{0, 0xff}, 64)...)
	s, err := ClassifyFile("stacks/app", planWriteTemp(t, "tfstackplan.tfplan", zip))
	if err == nil || s.Class != events.ClassUnclassified || !errors.Is(err, ErrNotJSON) {
		t.Fatalf("err %v class %s", err, s.Class)
	}
	for _, want := range []string{"saved plan file", "tofu show -json PLANFILE"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "human-readable") {
		t.Errorf("error %q calls a saved plan human-readable output", err)
	}
}

func TestPlanReportAndEvent(t *testing.T) {
	var stacks []*Stack
	for _, name := range []string{"create", "update", "mixed", "no-changes"} {
		s, err := ClassifyFile(name, filepath.Join(planTofuDir, name, "plan.json"))
		if err != nil {
			t.Fatal(err)
		}
		stacks = append(stacks, s)
	}
	r := &Report{Stacks: stacks}
	if r.Class() != events.ClassDestructive {
		t.Errorf("report class %s, want destructive", r.Class())
	}
	want := Counts{}
	for _, s := range stacks {
		want.Add(s.Counts)
	}
	if r.Totals() != want || r.Totals().Total() != 4+1+4 {
		t.Errorf("totals %+v, want %+v with 9 changes", r.Totals(), want)
	}
	ev := stacks[2].Event()
	if ev.Stack != "mixed" || ev.Class != events.ClassDestructive || ev.Counts.Replace != 1 || ev.Counts.Delete != 1 ||
		ev.PlanHash != stacks[2].PlanHash || len(ev.Destructive) != 2 || ev.Destructive[0] != "terraform_data.b" || ev.OutputsChanged != 1 {
		t.Errorf("event %+v does not carry the classification", ev)
	}
}

func TestPlanActionOf(t *testing.T) {
	cases := []struct {
		actions   actionList
		importing bool
		want      Action
		order     string
	}{
		{actionList{"no-op"}, false, ActionNoOp, ""},
		{actionList{"no-op"}, true, ActionImport, ""},
		{actionList{"update"}, true, ActionUpdate, ""},
		{actionList{"create"}, false, ActionCreate, ""},
		{actionList{"read"}, false, ActionRead, ""},
		{actionList{"delete"}, false, ActionDelete, ""},
		{actionList{"forget"}, false, ActionForget, ""},
		{actionList{"delete", "create"}, false, ActionReplace, "delete-then-create"},
		{actionList{"create", "delete"}, false, ActionReplace, "create-then-delete"},
		{actionList{"forget", "create"}, false, ActionReplace, "forget-then-create"},
		{actionList{"create", "forget"}, false, ActionReplace, "create-then-forget"},
	}
	for _, tc := range cases {
		got, order, err := actionOf(tc.actions, tc.importing, false)
		if err != nil || got != tc.want || order != tc.order {
			t.Errorf("actionOf(%v, %v) = %s %q %v, want %s %q", tc.actions, tc.importing, got, order, err, tc.want, tc.order)
		}
	}
	// A no-op whose previous address differs is a move, unless it also imports.
	for _, tc := range []struct {
		importing bool
		actions   actionList
		want      Action
	}{{false, actionList{"no-op"}, ActionMove}, {true, actionList{"no-op"}, ActionImport}, {false, actionList{"update"}, ActionUpdate}} {
		if got, _, err := actionOf(tc.actions, tc.importing, true); err != nil || got != tc.want {
			t.Errorf("actionOf(%v, %v, moved) = %s %v, want %s", tc.actions, tc.importing, got, err, tc.want)
		}
	}
	for _, bad := range []actionList{nil, {"create", "create"}, {"forget", "delete"}, {"explode"}} {
		if a, _, err := actionOf(bad, false, false); err == nil {
			t.Errorf("actionOf(%v) = %s, want an error", bad, a)
		}
	}
}

// TestPlanForgottenOutput: an output with actions ["forget"] has no attribute lines; every
// render shows it without panicking.
func TestPlanForgottenOutput(t *testing.T) {
	s, err := ClassifyFile("forget", filepath.Join("testdata", "forget-output.json"))
	if err != nil {
		t.Fatal(err)
	}
	for ext, out := range planRenders(t, &Report{Stacks: []*Stack{s}}) {
		if ext != ".json" && !strings.Contains(out, "output.o (forget)") {
			t.Errorf("render %s does not show the forgotten output:\n%s", ext, out)
		}
	}
}

// TestPlanCreateThenForget: ["create","forget"] (a replace with lifecycle destroy = false) is a
// destructive replace, counted as replace.
func TestPlanCreateThenForget(t *testing.T) {
	s, err := ClassifyFile("cf", filepath.Join("testdata", "create-forget.json"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Class != events.ClassDestructive || s.Counts != (Counts{Replace: 1}) {
		t.Fatalf("class %s counts %+v, want destructive with one replace", s.Class, s.Counts)
	}
	if len(s.Destructive) != 1 || s.Destructive[0].Order != "create-then-forget" {
		t.Errorf("destructive %+v, want the replace create-then-forget", s.Destructive)
	}
}

func TestReadBufferSizeFitsTheInput(t *testing.T) {
	small := filepath.Join(t.TempDir(), "small.json")
	if err := os.WriteFile(small, make([]byte, 7000), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(small)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pr, pw := io.Pipe()
	defer pw.Close()
	for _, tc := range []struct {
		name string
		r    io.Reader
		want int
	}{
		{"a small file", f, 7001},
		{"a tiny reader", strings.NewReader("{}"), 4 << 10},
		{"a large reader", bytes.NewReader(make([]byte, 1<<20)), maxReadBuffer},
		{"an unknown size", pr, maxReadBuffer},
	} {
		if got := readBufferSize(tc.r); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestClassifyReadsAsEncodingJSON: the classifier reads a plan as encoding/json does (see
// readAsV1), which the plan hash's definition relies on: a repeated key counts with its last
// value (so a change cannot list a harmless action first and a destructive one after it),
// keys match fields without regard to case, and invalid UTF-8 becomes U+FFFD.
func TestClassifyReadsAsEncodingJSON(t *testing.T) {
	plan := func(changes string) string {
		return `{"format_version":"1.2","planned_values":{},"resource_changes":[` + changes + `]}`
	}
	cases := []struct {
		name, plan string
		want       []Change
	}{
		{"repeated actions", plan(`{"address":"x.a","change":{"actions":["no-op"],"actions":["delete"]}}`),
			[]Change{{Address: "x.a", Action: ActionDelete}}},
		{"repeated change", plan(`{"address":"x.a","change":{"actions":["delete"]},"change":{"actions":["create"]}}`),
			[]Change{{Address: "x.a", Action: ActionCreate}}},
		{"repeated address", plan(`{"address":"x.a","address":"x.b","change":{"actions":["delete"]}}`),
			[]Change{{Address: "x.b", Action: ActionDelete}}},
		{"null after the address", plan(`{"address":"x.a","address":null,"change":{"actions":["delete"]}}`),
			[]Change{{Address: "x.a", Action: ActionDelete}}},
		{"null after the change", plan(`{"address":"x.a","change":{"actions":["delete"]},"change":null}`),
			[]Change{{Address: "x.a", Action: ActionDelete}}},
		{"keys in another case", plan(`{"ADDRESS":"x.a","Change":{"Actions":["delete"]}}`),
			[]Change{{Address: "x.a", Action: ActionDelete}}},
		{"invalid UTF-8", plan("{\"address\":\"x.a\xff\",\"change\":{\"actions\":[\"delete\"]}}"),
			[]Change{{Address: "x.a\uFFFD", Action: ActionDelete}}},
		{"unpaired surrogate", plan(`{"address":"x.a\ud800","change":{"actions":["delete"]}}`),
			[]Change{{Address: "x.a\uFFFD", Action: ActionDelete}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Classify("stacks/app", "plan.json", strings.NewReader(tc.plan))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(s.Changes, tc.want) {
				t.Errorf("changes %+v, want %+v", s.Changes, tc.want)
			}
			if want := planHashOf(t, []byte(plan(`{"address":"`+tc.want[0].Address+`","change":{"actions":["`+string(tc.want[0].Action)+`"]}}`))); s.PlanHash != want {
				t.Errorf("plan hash %s, want %s (the plan as read)", s.PlanHash, want)
			}
		})
	}
}

// A null after a value leaves the value as encoding/json leaves it: a plan cannot undo what
// it said (errored, a move, a sensitive output) by repeating the key with null.
func TestClassifyNullAfterAValueKeepsIt(t *testing.T) {
	head := `{"format_version":"1.2",`
	if _, err := Classify("s", "plan.json", strings.NewReader(head+`"planned_values":{},"errored":true,"errored":null}`)); err == nil || !strings.Contains(err.Error(), "errored") {
		t.Errorf("an errored plan with a null after errored: %v, want the errored refusal", err)
	}
	s, err := Classify("s", "plan.json", strings.NewReader(head+`"planned_values":{},"resource_changes":[{"address":"x.a","previous_address":"x.b","previous_address":null,"change":{"actions":["no-op"]}}]}`))
	if err != nil || len(s.Changes) != 1 || s.Changes[0].Action != ActionMove || s.Changes[0].PreviousAddress != "x.b" {
		t.Errorf("a move with a null after previous_address: %v %+v, want the move from x.b", err, s.Changes)
	}
	s, err = Classify("s", "plan.json", strings.NewReader(head+`"planned_values":{"outputs":{"o":{"sensitive":true,"value":"hunter2secret","sensitive":null}}},`+
		`"resource_changes":[{"address":"x.a","change":{"actions":["create"],"before":null,"after":{"v":"hunter2secret"},"after_unknown":{},"before_sensitive":false,"after_sensitive":{}}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if md := Markdown(&Report{Stacks: []*Stack{s}}); strings.Contains(md, "hunter2secret") {
		t.Errorf("a sensitive output with a null after sensitive is shown:\n%s", md)
	}
}

// A type error names where the value is, clipped: the names on the way are the plan's.
func TestTypeErrorClipsItsPlace(t *testing.T) {
	name := strings.Repeat("k", 5000)
	_, err := Classify("s", "plan.json", strings.NewReader(`{"format_version":"1.2","planned_values":{"outputs":{"`+name+`":{"sensitive":"x"}}}}`))
	if err == nil || !strings.Contains(err.Error(), "/planned_values/outputs/kkk") || !strings.Contains(err.Error(), "…: expected true or false, got a string") || len(err.Error()) > 400 {
		t.Errorf("error (%d bytes): %.300v", len(err.Error()), err)
	}
}
