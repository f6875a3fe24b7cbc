package runner

import (
	"encoding/json"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The fixture project of testdata/terramate: make-project.sh lays it out (with git history),
// scenario.json describes the same project to the fake terramate, and tmApplyCase applies the
// project change a recorded case was made on, to the files (so a real terramate sees it) and to
// the scenario (so the fake does).

const tmFixtureDir = "../testdata/terramate"

// tmScenario mirrors the fake terramate's scenario file (testdata/faketerramate).
type tmScenario struct {
	Stacks            []tmStack             `json:"stacks"`
	Scripts           []json.RawMessage     `json:"scripts,omitempty"`
	RunEnv            map[string]string     `json:"runEnv,omitempty"`
	Changed           []tmChange            `json:"changed,omitempty"`
	ChangedByBase     map[string][]tmChange `json:"changedByBase,omitempty"`
	ParseError        *tmParseError         `json:"parseError,omitempty"`
	Untracked         bool                  `json:"untracked,omitempty"`
	RunGraphStepLimit int                   `json:"runGraphStepLimit,omitempty"`
}

type tmStack struct {
	Path   string   `json:"path"`
	Name   string   `json:"name,omitempty"`
	ID     string   `json:"id,omitempty"`
	Tags   []string `json:"tags,omitempty"`
	After  []string `json:"after,omitempty"`
	Before []string `json:"before,omitempty"`
}

type tmChange struct {
	Stack string `json:"stack"`
	Why   string `json:"why"`
}

type tmParseError struct {
	File    string `json:"file"`
	Range   string `json:"range"`
	Message string `json:"message"`
}

// tmBaseScenario loads the scenario of the unchanged fixture project.
func tmBaseScenario(t testing.TB) *tmScenario {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(tmFixtureDir, "scenario.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sc tmScenario
	if err := json.Unmarshal(b, &sc); err != nil {
		t.Fatalf("scenario.json: %v", err)
	}
	return &sc
}

// tmMakeProject lays out the fixture project under a new temporary directory and returns that
// directory (what the transcripts call <tmp>) and the project root (<tmp>/proj).
func tmMakeProject(t testing.TB) (tmp, proj string) {
	t.Helper()
	tmp = t.TempDir()
	script, err := filepath.Abs(filepath.Join(tmFixtureDir, "make-project.sh"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", script, tmp)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make-project.sh: %v\n%s", err, out)
	}
	return tmp, filepath.Join(tmp, "proj")
}

// tmWriteScenario writes sc as the fake's scenario file at the project root.
func tmWriteScenario(t testing.TB, proj string, sc *tmScenario) {
	t.Helper()
	b, err := json.MarshalIndent(sc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proj, ".faketerramate.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func tmWriteFile(t testing.TB, proj, rel, content string) {
	t.Helper()
	p := filepath.Join(proj, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func tmGitCommit(t testing.TB, proj, msg string) {
	t.Helper()
	for _, args := range [][]string{{"add", "-A", "--", ".", ":!.faketerramate.json"}, {"commit", "-qm", msg}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = proj
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
}

const (
	tmTriggerFile = ".tmtriggers/stacks/nonprod/network/changed-984756b4-e859-4d93-9761-1ec00a3cbbb2.tm.hcl"
	tmOddStack    = "stacks/nonprod/odd name"
)

func tmStackHCL(name string, extra string) string {
	return "stack {\n  name = \"" + name + "\"\n  id   = \"" + name + "\"\n" + extra + "}\n"
}

// tmApplyCase applies the project change the recorded case name (e.g. "22-cycle-list-run-order")
// was made on, to proj's files and to sc: the stacks it adds or reorders by hand, the changed
// stacks derived from the project's history (tmDeriveChanged).
func tmApplyCase(t testing.TB, proj, name string, sc *tmScenario) {
	t.Helper()
	stack := func(p string) *tmStack {
		for i := range sc.Stacks {
			if sc.Stacks[i].Path == p {
				return &sc.Stacks[i]
			}
		}
		t.Fatalf("no stack %s in the scenario", p)
		return nil
	}
	addOdd := func() {
		tmWriteFile(t, proj, tmOddStack+"/stack.tm.hcl", tmStackHCL("odd-name", ""))
		tmWriteFile(t, proj, tmOddStack+"/main.tf", "resource \"terraform_data\" \"x\" { input = 1 }\n")
		tmGitCommit(t, proj, "odd name")
		sc.Stacks = append(sc.Stacks, tmStack{Path: tmOddStack, Name: "odd-name", ID: "odd-name"})
	}
	kind := name
	if i := strings.IndexByte(name, '-'); i >= 0 {
		kind = name[i+1:]
	}
	switch {
	case strings.HasPrefix(kind, "script-run-fail"):
		tmWriteFile(t, proj, "stacks/nonprod/cluster/a/FAIL", "")
	case kind == "script-run-untracked":
		tmWriteFile(t, proj, "stacks/prod/network/notes.txt", "not committed\n")
	case strings.HasPrefix(kind, "cycle-"):
		tmWriteFile(t, proj, "stacks/nonprod/network/stack.tm.hcl",
			tmStackHCL("nonprod-network", "  after = [\"/stacks/nonprod/cluster/b\"]\n"))
		tmGitCommit(t, proj, "cycle")
		stack("stacks/nonprod/network").After = []string{"/stacks/nonprod/cluster/b"}
	case strings.HasPrefix(kind, "ordering-"):
		tmWriteFile(t, proj, "stacks/bootstrap/stack.tm.hcl", tmStackHCL("bootstrap", "  before = [\"/stacks/nonprod\"]\n"))
		tmWriteFile(t, proj, "stacks/prod/monitoring/stack.tm.hcl", tmStackHCL("prod-monitoring", "  after = [\"tag:prod\"]\n"))
		tmGitCommit(t, proj, "ordering")
		sc.Stacks = append(sc.Stacks,
			tmStack{Path: "stacks/bootstrap", Name: "bootstrap", ID: "bootstrap", Before: []string{"/stacks/nonprod"}},
			tmStack{Path: "stacks/prod/monitoring", Name: "prod-monitoring", ID: "prod-monitoring", After: []string{"tag:prod"}})
	case strings.HasPrefix(kind, "space-"):
		addOdd()
	case strings.HasPrefix(kind, "parse-error-"):
		tmWriteFile(t, proj, "stacks/nonprod/network/stack.tm.hcl", "stack {\n  name = \n}\n")
		sc.ParseError = &tmParseError{
			File:    "stacks/nonprod/network/stack.tm.hcl",
			Range:   "2,10-3,1",
			Message: "Expected the start of an expression, but found an invalid expression token.",
		}
	case kind == "not-a-project":
		if err := os.MkdirAll(filepath.Join(filepath.Dir(proj), "elsewhere"), 0o755); err != nil {
			t.Fatal(err)
		}
	case strings.HasPrefix(kind, "trigger-"):
		addOdd()
		// What `terramate experimental trigger --change --reason test stacks/nonprod/network`
		// writes (0.17.2 requires ctime; type and context are bare words).
		tmWriteFile(t, proj, tmTriggerFile, "trigger {\n  ctime   = 1796096840\n  reason  = \"test\"\n  type    = changed\n  context = stack\n}\n")
		tmGitCommit(t, proj, "trigger")
	}
	tmDeriveChanged(t, proj, sc)
}

const (
	tmWhyUnmerged  = "stack has unmerged changes"
	tmWhyTriggered = "stack has been triggered by: /"
)

// tmDeriveChanged sets sc.Changed to what terramate 0.17.2 computes for the committed changes
// of proj's branch against main (the default base: origin/main is main), as far as the files
// say it without reading Terraform: a changed file marks the nearest stack at or above it "stack
// has unmerged changes" (a file outside every stack marks none; uncommitted and untracked files
// mark none), and a changed trigger file under .tmtriggers/<stack>/ marks that stack "triggered
// by" it. The reasons that come from Terraform and stack attributes (a local module's or a
// watched file's change) are not derived: they are kept from sc, as scenario.json states them
// for the base project, unless the stack has changes of its own (terramate reports those
// first). A case that changes a module or a watched file would have to state its reasons itself.
func tmDeriveChanged(t testing.TB, proj string, sc *tmScenario) {
	t.Helper()
	cmd := exec.Command("git", "diff", "--name-only", "-z", "main...HEAD")
	cmd.Dir = proj
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git diff main...HEAD: %v", err)
	}
	isStack := map[string]bool{}
	for _, s := range sc.Stacks {
		isStack[s.Path] = true
	}
	derived := map[string]string{}
	mark := func(stack, why string) {
		if prev, ok := derived[stack]; ok && prev != why {
			t.Fatalf("tmDeriveChanged: %s is both %q and %q: not modelled", stack, prev, why)
		}
		derived[stack] = why
	}
	for f := range strings.SplitSeq(strings.TrimRight(string(out), "\x00"), "\x00") {
		if f == "" {
			continue
		}
		if rest, ok := strings.CutPrefix(f, ".tmtriggers/"); ok {
			if stack := path.Dir(rest); isStack[stack] {
				mark(stack, tmWhyTriggered+f)
			}
			continue
		}
		for dir := path.Dir(f); dir != "."; dir = path.Dir(dir) {
			if isStack[dir] {
				mark(dir, tmWhyUnmerged)
				break
			}
		}
	}
	var changed []tmChange
	for _, c := range sc.Changed {
		if _, own := derived[c.Stack]; !own && c.Why != tmWhyUnmerged && !strings.HasPrefix(c.Why, tmWhyTriggered) {
			changed = append(changed, c)
		}
	}
	for stack, why := range derived {
		changed = append(changed, tmChange{Stack: stack, Why: why})
	}
	slices.SortFunc(changed, func(a, b tmChange) int { return strings.Compare(a.Stack, b.Stack) })
	sc.Changed = changed
}

// tmCase is one recorded transcript.
type tmCase struct {
	name           string
	dir            string   // relative to the project root
	args           []string // after "terramate"
	stdout, stderr string
	rc             int
}

func tmLoadCases(t testing.TB) []tmCase {
	t.Helper()
	cmds, err := filepath.Glob(filepath.Join(tmFixtureDir, "cases", "*.cmd"))
	if err != nil || len(cmds) == 0 {
		t.Fatalf("no recorded cases under %s: %v", tmFixtureDir, err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	var cases []tmCase
	for _, cmdFile := range cmds {
		base := strings.TrimSuffix(cmdFile, ".cmd")
		cmdline := strings.TrimSpace(read(cmdFile))
		dir, rest, ok := strings.Cut(strings.TrimPrefix(cmdline, "cd "), " && terramate")
		if !ok {
			t.Fatalf("%s: unexpected command %q", cmdFile, cmdline)
		}
		c := tmCase{
			name:   filepath.Base(base),
			dir:    dir,
			args:   strings.Fields(rest),
			stdout: read(base + ".stdout"),
			stderr: read(base + ".stderr"),
		}
		if c.rc, err = strconv.Atoi(strings.TrimSpace(read(base + ".rc"))); err != nil {
			t.Fatalf("%s.rc: %v", base, err)
		}
		cases = append(cases, c)
	}
	return cases
}
