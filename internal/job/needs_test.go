package job

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/runner"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/plan"
)

var updateGoldens = flag.Bool("update", false, "rewrite the golden files in testdata/needs/")

// goldenExec is the execution id of the golden runs.
const goldenExec = "0123456789abcdef0123456789abcdef"

// needsCase is one golden run: what the server answers (nil: no server), and whether stack b
// fails.
type needsCase struct {
	name   string
	answer func(x *api.ExecutionGates)
	server bool
	fail   bool
}

// prodGate is prod's gate on stacks/prod/** over stack a.
func prodGate() api.Gate {
	return api.Gate{Repo: "acme/infra", Environment: "prod", PR: 7, ExecutionID: goldenExec, Class: "destructive",
		Target: "stacks/prod/**", Stacks: []string{"stacks/prod/a"}}
}

var needsCases = []needsCase{
	{name: "offline"},
	{name: "not-satisfied", server: true, answer: func(x *api.ExecutionGates) { x.Gates = []api.Gate{prodGate()} }},
	{name: "satisfied", server: true, answer: func(x *api.ExecutionGates) {
		g := prodGate()
		g.Satisfied, g.GrantID, g.GrantedBy, g.GrantedAt = true, 12, "alice", time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
		x.Gates = []api.Gate{g}
	}},
	{name: "no-gate", server: true},
	{name: "no-policy", server: true, answer: func(x *api.ExecutionGates) { x.Policy = false }},
	{name: "conflicts", server: true, answer: func(x *api.ExecutionGates) {
		x.Gates = []api.Gate{prodGate()}
		x.Conflicts = []api.ClaimConflict{{PR: 5, ExecutionID: "fedcba9876543210fedcba9876543210", Stacks: []string{"stacks/prod/a", "stacks/prod/b"}}}
	}},
	{name: "failed", server: true, fail: true, answer: func(x *api.ExecutionGates) {
		x.Gates = []api.Gate{prodGate()}
		x.Blocked = `plan 0123456789abcdef0123456789abcdef of acme/infra prod PR #7 ended failed`
	}},
	{name: "failed-offline", fail: true},
}

// The PR comment and the step summary of a plan, with and without a server, with the server's
// gates satisfied and not, with another PR's claims and with a failed stack, against goldens
// (go test -update rewrites them); the result document and the annotations say the same.
func TestCommentAndSummaryGoldens(t *testing.T) {
	for _, tc := range needsCases {
		t.Run(tc.name, func(t *testing.T) {
			stacks := []string{"a", "b"}
			root := runRepo(t, stacks)
			var c *runner.Client
			base := ""
			if tc.server {
				m, client := memClient(t)
				x := api.ExecutionGates{ExecutionID: goldenExec, Repo: "acme/infra", Environment: "prod", PR: 7, Policy: true,
					Gates: []api.Gate{}, Conflicts: []api.ClaimConflict{}}
				if tc.answer != nil {
					tc.answer(&x)
				}
				m.execGates = map[string]api.ExecutionGates{goldenExec: x}
				c, base = client, client.BaseURL()
			}
			tmp := t.TempDir()
			summary, comment := filepath.Join(tmp, "summary.md"), filepath.Join(tmp, "comment.md")
			var out strings.Builder
			mixed, create := recordedPlan(t, "mixed"), recordedPlan(t, "create")
			res := runScriptedWith(t, c, root, stacks, OpPlan, goldenExec, func(o *RunOptions) {
				o.PR, o.Repo, o.CommentFile, o.Stdout = 7, "acme/infra", comment, &out
				o.Getenv = func(k string) string {
					return map[string]string{"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": summary}[k]
				}
			}, func(_, _ string, stdout io.Writer) error {
				fmt.Fprintln(stdout, "/stacks/prod/a (script:0 job:0.0)> plan")
				if err := os.WriteFile(filepath.Join(root, "stacks/prod/a", runner.DefaultPlanJSONFile), mixed, 0o644); err != nil {
					return err
				}
				fmt.Fprintln(stdout, "/stacks/prod/b (script:0 job:0.0)> plan")
				if !tc.fail {
					return os.WriteFile(filepath.Join(root, "stacks/prod/b", runner.DefaultPlanJSONFile), create, 0o644)
				}
				var log strings.Builder
				log.WriteString("::add-mask::hunter2\n")
				for i := range 40 {
					fmt.Fprintf(&log, "line %02d of the plan\n", i)
				}
				log.WriteString("Error: authenticating with password hunter2 failed\n")
				if err := os.WriteFile(filepath.Join(root, "stacks/prod/b", runner.DefaultLogFile), []byte(log.String()), 0o644); err != nil {
					return err
				}
				fmt.Fprintln(stdout, "Error: one or more commands failed")
				fmt.Fprintln(stdout, "> execution failed: running /usr/bin/bash -c plan (in /stacks/prod/b): exit status 1")
				return fmt.Errorf("exit status 1")
			})
			normalize := func(s string) string {
				if base != "" {
					s = strings.ReplaceAll(s, strings.TrimSuffix(base, "/"), "http://SERVER")
				}
				return s
			}
			for _, f := range []struct{ golden, path string }{{tc.name + ".comment.md", comment}, {tc.name + ".summary.md", summary}} {
				b, err := os.ReadFile(f.path)
				if err != nil {
					t.Fatal(err)
				}
				checkGolden(t, filepath.Join("testdata/needs", f.golden), normalize(string(b)))
				if strings.Contains(string(b), "hunter2") {
					t.Errorf("%s shows the masked value", f.golden)
				}
				if strings.Contains(string(b), "Gate needed") {
					t.Errorf("%s has the fixed gate rule", f.golden)
				}
			}
			stdout := out.String()
			if strings.Contains(stdout, "hunter2") && !strings.Contains(stdout, "::stop-commands::") {
				t.Errorf("the terminal shows the masked value")
			}
			checkNeedsResult(t, tc, res, stdout)
		})
	}
}

// checkNeedsResult holds the result document and the annotations of a golden run to what the
// server answered.
func checkNeedsResult(t *testing.T, tc needsCase, res *Result, stdout string) {
	t.Helper()
	g := res.Gates
	if g == nil {
		t.Fatal("no gates in the result")
	}
	want := GatesKnown
	switch {
	case !tc.server:
		want = GatesOffline
	case tc.name == "no-policy":
		want = GatesNoPolicy
	}
	if g.Status != want {
		t.Errorf("gates.status %q, want %q", g.Status, want)
	}
	switch tc.name {
	case "failed":
		if len(g.Required) != 1 || g.Required[0].Satisfied || g.Required[0].Command != "" || g.Required[0].ApproveURL != "" || !strings.Contains(g.Blocked, "ended failed") {
			t.Errorf("a failed plan's gates %+v: want no way to approve it", g)
		}
	case "not-satisfied", "conflicts":
		if len(g.Required) != 1 || g.Required[0].Satisfied || g.Required[0].Command != "tfstackplan admin gates satisfy --repo acme/infra --environment prod --pr 7 --execution "+goldenExec+" --class destructive --target 'stacks/prod/**' --reason '...'" ||
			!strings.HasSuffix(g.Required[0].ApproveURL, "/ui/executions/"+goldenExec) {
			t.Errorf("gates %+v", g.Required)
		}
	case "satisfied":
		if len(g.Required) != 1 || !g.Required[0].Satisfied || g.Required[0].GrantID != 12 || g.Required[0].GrantedBy != "alice" {
			t.Errorf("gates %+v", g.Required)
		}
	}
	conflict := "::warning title=tfstackplan plan%3A claimed by PR #5::PR #5 claims stacks/prod/a, stacks/prod/b in prod"
	if tc.name == "conflicts" {
		if len(res.Conflicts) != 1 || res.Conflicts[0].PR != 5 || strings.Join(res.Conflicts[0].Stacks, " ") != "stacks/prod/a stacks/prod/b" {
			t.Errorf("conflicts %+v", res.Conflicts)
		}
		if !strings.Contains(stdout, conflict) {
			t.Errorf("no conflict annotation in\n%s", stdout)
		}
	} else if len(res.Conflicts) != 0 || strings.Contains(stdout, "claimed by PR") {
		t.Errorf("conflicts %+v without any", res.Conflicts)
	}
	b := res.Stacks[1]
	if tc.fail {
		if b.Status != StatusFailed || !strings.HasSuffix(b.LogTail, "line 39 of the plan\nError: authenticating with password *** failed") ||
			strings.Count(b.LogTail, "\n") != MaxLogTailLines-1 {
			t.Errorf("stack b %s, log tail:\n%s", b.Status, b.LogTail)
		}
		if !strings.Contains(stdout, "::error title=tfstackplan plan%3A stacks/prod/b::stack stacks/prod/b failed: the script failed%0AThe last lines of its log:%0Aline 11 of the plan") {
			t.Errorf("no ::error:: annotation with the log tail in\n%s", stdout)
		}
	} else if b.LogTail != "" {
		t.Errorf("stack b succeeded with a log tail %q", b.LogTail)
	}
}

// checkGolden compares got with the golden file at path (rewritten with -update).
func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	if *updateGoldens {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
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
	if string(want) != got {
		t.Errorf("%s differs from the golden file (go test -update to rewrite, then review):\n%s", path, got)
	}
}

// A value is quoted for a shell only when it needs to be, and a quote in it cannot end the
// quoting.
func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"acme/infra": "acme/infra", "**": "'**'", "stacks/prod/**": "'stacks/prod/**'", "": "''",
		"it's": `'it'\''s'`, "a b": "'a b'", "$(rm -rf /)": "'$(rm -rf /)'", "x\ny": "'x\ny'",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

// A server's answer about another execution is not taken; a gate of no known class is dropped.
func TestNeedsOfDistrustsTheAnswer(t *testing.T) {
	m, c := memClient(t)
	x := api.ExecutionGates{ExecutionID: "someone-else", Policy: true, Gates: []api.Gate{}, Conflicts: []api.ClaimConflict{}}
	m.execGates = map[string]api.ExecutionGates{goldenExec: x}
	root := runRepo(t, []string{"a"})
	plan := recordedPlan(t, "mixed")
	res := runScripted(t, c, root, []string{"a"}, OpPlan, goldenExec, func(_, _ string, stdout io.Writer) error {
		fmt.Fprintln(stdout, "/stacks/prod/a (script:0 job:0.0)> plan")
		return os.WriteFile(filepath.Join(root, "stacks/prod/a", runner.DefaultPlanJSONFile), plan, 0o644)
	})
	if res.Gates == nil || res.Gates.Status != GatesUnavailable || !strings.Contains(res.Gates.Message, "not about execution") {
		t.Fatalf("gates %+v, want unavailable", res.Gates)
	}
	r := &run{res: &Result{Environment: "prod"}}
	g := r.needsOf(&api.ExecutionGates{ExecutionID: goldenExec, Policy: true, PR: 7, Gates: []api.Gate{{Class: "catastrophic", Target: "**"}, {Class: "destructive", Target: "**"}}})
	if len(g.Required) != 1 || g.Required[0].Class != "destructive" {
		t.Fatalf("required %+v, want the destructive gate alone", g.Required)
	}
}

// A log's tail is its last lines, at most MaxLogTailLines and MaxLogTailBytes, masked with the
// run's masks and every value an `::add-mask::` line announced, however early in the log and
// after however long a line; a missing or empty log has none.
func TestLogTail(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var log strings.Builder
	log.WriteString("  ::add-mask::early-secret\n")
	log.WriteString(strings.Repeat("x", 200<<10) + "\n") // longer than the reader's buffer
	log.WriteString("::add-mask::late%0Asecret\n")
	for i := range 100 {
		fmt.Fprintf(&log, "line %03d early-secret late secret run-secret\n", i)
	}
	m := runner.NewMasker("run-secret")
	got := logTail(write("long.log", log.String()), m)
	lines := strings.Split(got, "\n")
	if len(lines) != MaxLogTailLines || lines[len(lines)-1] != "line 099 *** *** *** ***" || lines[0] != "line 070 *** *** *** ***" {
		t.Fatalf("tail:\n%s", got)
	}
	wide := strings.Repeat("y", 300)
	var w strings.Builder
	for i := range 40 {
		fmt.Fprintf(&w, "%02d %s\n", i, wide)
	}
	got = logTail(write("wide.log", w.String()), runner.NewMasker())
	if len(got) > MaxLogTailBytes || !strings.HasSuffix(got, "39 "+wide) || !strings.HasPrefix(got, fmt.Sprint(40-strings.Count(got, "\n")-1)+" ") {
		t.Fatalf("a tail of %d bytes, want whole lines within %d:\n%.200s", len(got), MaxLogTailBytes, got)
	}
	if got := logTail(filepath.Join(dir, "missing.log"), runner.NewMasker()); got != "" {
		t.Errorf("a missing log has the tail %q", got)
	}
	if got := logTail(write("empty.log", ""), runner.NewMasker()); got != "" {
		t.Errorf("an empty log has the tail %q", got)
	}
}

// Whatever the server answers and however many stacks fail, the notes fit in the comment with
// its heading and totals, whole, and say how much they left out.
func TestNotesFitTheComment(t *testing.T) {
	long := strings.Repeat("n", 1000)
	x := &api.ExecutionGates{ExecutionID: goldenExec, Repo: "acme/infra", Environment: "prod", PR: 7, Policy: true}
	var stacks []string
	for i := range 500 {
		stacks = append(stacks, fmt.Sprintf("stacks/prod/%s/%03d", long, i))
	}
	for i := range 100 {
		x.Gates = append(x.Gates, api.Gate{Class: "destructive", Target: fmt.Sprintf("%s/%03d/**", long, i), Stacks: stacks})
		x.Conflicts = append(x.Conflicts, api.ClaimConflict{PR: 100 + i, ExecutionID: goldenExec, Stacks: stacks})
	}
	r := &run{res: &Result{Environment: "prod", Op: OpPlan, ExecutionURL: "https://tfstackplan.example.com/ui/executions/" + goldenExec}}
	r.res.Gates, r.res.Conflicts = r.needsOf(x), conflictsOf(x)
	report := &plan.Report{Environment: "prod", Dir: "stacks/prod"}
	for i := range 50 {
		e := StackEntry{Stack: fmt.Sprint(i), Path: fmt.Sprintf("stacks/prod/%s/%03d", long, i), Status: StatusFailed,
			Error: "the script failed", LogTail: strings.Repeat(strings.Repeat("t", 135)+"\n", 31)[:MaxLogTailBytes]}
		r.res.Stacks = append(r.res.Stacks, e)
		report.Stacks = append(report.Stacks, &plan.Stack{Name: e.Path, Class: "unclassified", Error: e.Error})
	}
	report.Notes = r.notes()
	size := 0
	for _, n := range report.Notes {
		size += len(n) + 2
	}
	if size > 56<<10 {
		t.Errorf("the notes are %d bytes, more than 56 KiB", size)
	}
	comment := plan.Comment(report)
	if len(comment) > plan.MaxCommentChars {
		t.Fatalf("the comment is %d bytes", len(comment))
	}
	for _, n := range report.Notes {
		if !strings.Contains(comment, strings.TrimRight(n, "\n")) {
			t.Fatalf("the comment lost a note:\n%.300s", n)
		}
	}
	for _, want := range []string{"- … and 90 more (see the execution page)", "> - … and 90 more pull requests", "_More stacks failed;", " and 499 more"} {
		if !strings.Contains(comment, want) {
			t.Errorf("the comment does not say %q", want)
		}
	}
}
