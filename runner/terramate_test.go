package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
)

// tmFixture makes the fixture project changed as the named recorded case says, with the fake
// terramate's scenario in place; edit adjusts the scenario first.
func tmFixture(t *testing.T, caseName string, edit func(*tmScenario)) (tmp, proj string) {
	t.Helper()
	tmp, proj = tmMakeProject(t)
	sc := tmBaseScenario(t)
	tmApplyCase(t, proj, caseName, sc)
	if edit != nil {
		edit(sc)
	}
	tmWriteScenario(t, proj, sc)
	return tmp, proj
}

// tmRecordedLines returns the stdout lines of a recorded case.
func tmRecordedLines(t testing.TB, name string) []string {
	t.Helper()
	return tmReadLines(t, filepath.Join(tmFixtureDir, "cases", name+".stdout"))
}

func TestTerramateDiscoveryOnFixture(t *testing.T) {
	t.Parallel()
	_, proj := tmFixture(t, "02-list", nil)
	tm := &Terramate{Bin: fakeTerramate(t), Dir: proj}
	ctx := context.Background()

	list, err := tm.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := tmRecordedLines(t, "02-list"); !slices.Equal(list, want) {
		t.Errorf("List = %q, want %q", list, want)
	}
	for _, base := range []string{"", "main"} {
		changed, err := tm.ChangedStacks(ctx, base)
		if err != nil {
			t.Fatal(err)
		}
		if want := tmRecordedLines(t, "03-list-changed"); !slices.Equal(changed, want) {
			t.Errorf("ChangedStacks(%q) = %q, want %q", base, changed, want)
		}
	}

	why, err := tm.WhyChanged(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	module := events.ChangeReason{Kind: events.ReasonModule, Detail: "../../../../modules/net",
		Chain: []string{`module "../../../../modules/net" has unmerged changes`}}
	want := []events.ChangeReason{
		module,
		{Kind: events.ReasonWatchedFile, Detail: "/config/b.json"},
		module,
		{Kind: events.ReasonUnmerged},
	}
	stacks := tmRecordedLines(t, "03-list-changed")
	if len(why) != len(want) {
		t.Fatalf("WhyChanged = %+v, want %d reasons", why, len(want))
	}
	for i := range want {
		want[i].Stack = stacks[i]
		tmCheckReason(t, why[i], want[i])
	}

	r, err := tm.RunGraphDetailed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.Approximate || r.Source != EdgeSourceRunGraph {
		t.Errorf("small project: got source %q approximate=%v, want run-graph", r.Source, r.Approximate)
	}
	wantEdges := []events.Edge{
		{From: "stacks/nonprod/cluster/a", To: "stacks/nonprod/cluster/b"},
		{From: "stacks/nonprod/network", To: "stacks/nonprod/cluster/a"},
		{From: "stacks/nonprod/network", To: "stacks/nonprod/cluster/b"},
		{From: "stacks/prod/network", To: "stacks/prod/cluster/a"},
	}
	if got := NormalizeEdges(list, r.Edges); !slices.Equal(got, wantEdges) {
		t.Errorf("NormalizeEdges(List, RunGraph) = %v, want %v", got, wantEdges)
	}
}

func tmCheckReason(t *testing.T, got, want events.ChangeReason) {
	t.Helper()
	if got.Stack != want.Stack || got.Kind != want.Kind || got.Detail != want.Detail || !slices.Equal(got.Chain, want.Chain) {
		t.Errorf("reason = %+v, want %+v", got, want)
	}
	if got.Raw == "" {
		t.Errorf("reason %+v lost the raw text", got)
	}
}

// A tier: Dir is stacks/nonprod, so List is tier-relative while run-graph stays root-relative.
func TestTerramateTierNamespaces(t *testing.T) {
	t.Parallel()
	_, proj := tmFixture(t, "06-list-tier-chdir", nil)
	tm := &Terramate{Bin: fakeTerramate(t), Dir: filepath.Join(proj, "stacks", "nonprod")}
	ctx := context.Background()
	list, err := tm.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := tmRecordedLines(t, "06-list-tier-chdir"); !slices.Equal(list, want) {
		t.Errorf("List = %q, want %q", list, want)
	}
	why, err := tm.WhyChanged(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(why) != 2 || why[0].Stack != "cluster/a" || why[1].Stack != "cluster/b" || why[1].Kind != events.ReasonWatchedFile {
		t.Errorf("WhyChanged in the tier = %+v", why)
	}
	edges, err := tm.RunGraph(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []events.Edge{{From: "cluster/a", To: "cluster/b"}, {From: "network", To: "cluster/a"}, {From: "network", To: "cluster/b"}}
	if got := NormalizeEdges(list, edges); !slices.Equal(got, want) {
		t.Errorf("NormalizeEdges = %v (raw %v), want %v", got, edges, want)
	}
}

// Stack paths with spaces and " - " are resolved against the listed stacks.
func TestTerramateWhyChangedOddPaths(t *testing.T) {
	t.Parallel()
	const dash = "stacks/nonprod/a - b"
	_, proj := tmFixture(t, "32-trigger-list-changed-why", func(sc *tmScenario) {
		sc.Stacks = append(sc.Stacks, tmStack{Path: dash, Name: "dash", ID: "dash"})
		sc.Changed = append(sc.Changed, tmChange{Stack: dash, Why: "stack has unmerged changes"})
	})
	tm := &Terramate{Bin: fakeTerramate(t), Dir: proj}
	why, err := tm.WhyChanged(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]events.ChangeReason{}
	for _, r := range why {
		got[r.Stack] = r
	}
	if r := got[dash]; r.Kind != events.ReasonUnmerged {
		t.Errorf("%q: %+v", dash, r)
	}
	if r := got[tmOddStack]; r.Kind != events.ReasonUnmerged {
		t.Errorf("%q: %+v", tmOddStack, r)
	}
	if r := got["stacks/nonprod/network"]; r.Kind != events.ReasonTrigger || r.Detail != "/"+tmTriggerFile {
		t.Errorf("trigger: %+v", r)
	}
	if len(why) != 7 {
		t.Errorf("got %d reasons, want 7: %+v", len(why), why)
	}
}

// Every recorded project shape: run-graph and the metadata fallback find the same edges.
func TestRunGraphAndMetadataAgree(t *testing.T) {
	for _, c := range []string{"10-run-graph-dir", "12-run-graph-tier", "23-cycle-run-graph", "25-ordering-run-graph", "29-space-run-graph"} {
		t.Run(c, func(t *testing.T) {
			t.Parallel()
			_, proj := tmFixture(t, c, nil)
			dir := proj
			if strings.Contains(c, "tier") {
				dir = filepath.Join(proj, "stacks", "nonprod")
			}
			ctx := context.Background()
			exact, errExact := (&Terramate{Bin: fakeTerramate(t), Dir: dir}).RunGraphDetailed(ctx)
			// A budget of a nanosecond is always exceeded: the fallback runs.
			approx, errApprox := (&Terramate{Bin: fakeTerramate(t), Dir: dir, RunGraphBudget: time.Nanosecond}).RunGraphDetailed(ctx)
			if exact.Approximate || !approx.Approximate || approx.Source != EdgeSourceMetadata {
				t.Fatalf("sources: exact %q/%v, approx %q/%v", exact.Source, exact.Approximate, approx.Source, approx.Approximate)
			}
			if len(exact.Edges) == 0 || !slices.Equal(exact.Edges, approx.Edges) {
				t.Errorf("edges differ\nrun-graph: %v\nmetadata:  %v", exact.Edges, approx.Edges)
			}
			var c1, c2 *StackCycleError
			if errors.As(errExact, &c1) != errors.As(errApprox, &c2) {
				t.Fatalf("errors differ: %v / %v", errExact, errApprox)
			}
			if strings.Contains(c, "cycle") {
				want := []string{"/stacks/nonprod/cluster/a", "/stacks/nonprod/cluster/b", "/stacks/nonprod/network"}
				if c1 == nil || !slices.Equal(c1.Stacks, want) || !slices.Equal(c2.Stacks, want) || !errors.Is(errExact, ErrStackCycle) {
					t.Errorf("cycle errors: %v / %v, want stacks %v", errExact, errApprox, want)
				}
			} else if errExact != nil || errApprox != nil {
				t.Errorf("errors: %v / %v", errExact, errApprox)
			}
		})
	}
}

// tmDenseScenario is n stacks, each after 3 distinct random stacks among the previous 50 (the
// shape the fixtures README measured), and the edges that implies.
func tmDenseScenario(n int) (*tmScenario, []events.Edge) {
	sc := &tmScenario{}
	var edges []events.Edge
	seed := uint32(12345)
	rnd := func(k int) int { seed = seed*1664525 + 1013904223; return int(seed>>8) % k }
	name := func(i int) string { return fmt.Sprintf("stacks/dense/s%04d", i) }
	for i := range n {
		s := tmStack{Path: name(i), Name: fmt.Sprintf("s%04d", i), ID: fmt.Sprintf("s%04d", i)}
		lo := max(0, i-50)
		for len(s.After) < min(3, i) {
			d := "/" + name(lo+rnd(i-lo))
			if !slices.Contains(s.After, d) {
				s.After = append(s.After, d)
				edges = append(edges, events.Edge{From: d, To: "/" + s.Path})
			}
		}
		sc.Stacks = append(sc.Stacks, s)
	}
	slices.SortFunc(edges, compareEdges)
	return sc, edges
}

// 1000 densely linked stacks: run-graph would not finish (the fake hangs like the real one past
// its enumeration limit); with the default budget discovery falls back to the metadata.
func TestRunGraphDense1000FallsBack(t *testing.T) {
	t.Parallel()
	proj := t.TempDir()
	sc, want := tmDenseScenario(1000)
	tmWriteScenario(t, proj, sc)
	tm := &Terramate{Bin: fakeTerramate(t), Dir: proj}
	start := time.Now()
	r, err := tm.RunGraphDetailed(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("1000 dense stacks: %d edges from %s in %v", len(r.Edges), r.Source, time.Since(start))
	if !r.Approximate || r.Source != EdgeSourceMetadata {
		t.Errorf("want the approximate metadata source, got %q approximate=%v", r.Source, r.Approximate)
	}
	if !slices.Equal(r.Edges, want) {
		t.Errorf("got %d edges, want the %d the stacks declare", len(r.Edges), len(want))
	}
}

func TestTerramateScriptRunExecutesStacks(t *testing.T) {
	t.Parallel()
	_, proj := tmFixture(t, "15-script-run-changed", nil)
	tm := &Terramate{Bin: fakeTerramate(t), Dir: proj}
	var out bytes.Buffer
	if err := tm.ScriptRun(context.Background(), &out, ScriptRunOptions{Script: "plan", Changed: true}); err != nil {
		t.Fatalf("ScriptRun: %v\n%s", err, out.String())
	}
	for _, s := range tmRecordedLines(t, "03-list-changed") {
		b, err := os.ReadFile(filepath.Join(proj, s, "tfstackplan.log"))
		if err != nil || string(b) != "plan "+s+"\n" {
			t.Errorf("%s/tfstackplan.log = %q, %v", s, b, err)
		}
		if !strings.Contains(out.String(), "plan "+s+"\n") || !strings.Contains(out.String(), "/"+s+" (script:0 job:0.1)> bash -c test ! -f FAIL\n") {
			t.Errorf("output lacks %s's command or its output:\n%s", s, out.String())
		}
	}
	if _, err := os.Stat(filepath.Join(proj, "stacks/nonprod/network/tfstackplan.log")); err == nil {
		t.Error("an unchanged stack ran")
	}
}

// tmOrderScript logs the start and end of every stack to $ORDER_LOG, sleeping in between.
const tmOrderScript = `{"name": "order", "definedAt": "/order.tm.hcl:1,1-5,2", "jobs": [{"commands": [
  ["bash", "-c", "echo start $TFSTACKPLAN_STACK >> $ORDER_LOG; sleep 1; echo end $TFSTACKPLAN_STACK >> $ORDER_LOG"]]}]}`

func TestTerramateScriptRunParallelHonoursDAG(t *testing.T) {
	t.Parallel()
	_, proj := tmFixture(t, "16-script-run-parallel", func(sc *tmScenario) {
		sc.Scripts = append(sc.Scripts, json.RawMessage(tmOrderScript))
	})
	logFile := filepath.Join(t.TempDir(), "order.log")
	tm := &Terramate{Bin: fakeTerramate(t), Dir: proj}
	err := tm.ScriptRun(context.Background(), io.Discard, ScriptRunOptions{
		Script: "order", Changed: true, Parallel: 3, Env: []string{"ORDER_LOG=" + logFile},
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	seen := tmLines(b)
	at := func(ev string) int {
		i := slices.Index(seen, ev)
		if i < 0 {
			t.Fatalf("%q missing from %q", ev, seen)
		}
		return i
	}
	for _, e := range []events.Edge{
		{From: "stacks/nonprod/cluster/a", To: "stacks/nonprod/cluster/b"},
		{From: "stacks/prod/network", To: "stacks/prod/cluster/a"},
	} {
		if at("end "+e.From) > at("start "+e.To) {
			t.Errorf("%s started before %s ended: %q", e.To, e.From, seen)
		}
	}
	// The two independent roots run concurrently.
	if at("start stacks/prod/network") > at("end stacks/nonprod/cluster/a") && at("start stacks/nonprod/cluster/a") > at("end stacks/prod/network") {
		t.Errorf("no parallelism: %q", seen)
	}
}

func TestTerramateScriptRunFailures(t *testing.T) {
	t.Parallel()
	t.Run("stops at first failure", func(t *testing.T) {
		t.Parallel()
		_, proj := tmFixture(t, "19-script-run-fail", nil)
		tm := &Terramate{Bin: fakeTerramate(t), Dir: proj}
		err := tm.ScriptRun(context.Background(), io.Discard, ScriptRunOptions{Script: "plan", Changed: true})
		var te *TerramateError
		if !errors.As(err, &te) || !errors.Is(err, ErrScriptFailed) || te.ExitCode != 1 {
			t.Fatalf("err = %v", err)
		}
		if !slices.Equal(te.FailedStacks, []string{"/stacks/nonprod/cluster/a"}) || !strings.Contains(te.Stderr, "one or more commands failed") {
			t.Errorf("failed stacks %q, stderr tail %q", te.FailedStacks, te.Stderr)
		}
		if _, err := os.Stat(filepath.Join(proj, "stacks/prod/cluster/a/tfstackplan.log")); err == nil {
			t.Error("a stack after the failure ran")
		}
	})
	t.Run("continue on error", func(t *testing.T) {
		t.Parallel()
		_, proj := tmFixture(t, "20-script-run-fail-continue", nil)
		tm := &Terramate{Bin: fakeTerramate(t), Dir: proj}
		err := tm.ScriptRun(context.Background(), io.Discard, ScriptRunOptions{Script: "plan", Changed: true, ContinueOnError: true})
		if !errors.Is(err, ErrScriptFailed) {
			t.Fatalf("err = %v", err)
		}
		if _, err := os.Stat(filepath.Join(proj, "stacks/nonprod/cluster/b/tfstackplan.log")); err != nil {
			t.Error("the stacks after the failure did not run")
		}
	})
	t.Run("unknown script", func(t *testing.T) {
		t.Parallel()
		_, proj := tmFixture(t, "18-script-run-unknown", nil)
		tm := &Terramate{Bin: fakeTerramate(t), Dir: proj}
		err := tm.ScriptRun(context.Background(), io.Discard, ScriptRunOptions{Script: "nosuch"})
		var te *TerramateError
		if !errors.As(err, &te) || !errors.Is(err, ErrUnknownScript) || te.Script != "nosuch" || !strings.Contains(err.Error(), `"nosuch"`) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("untracked files", func(t *testing.T) {
		t.Parallel()
		_, proj := tmFixture(t, "21-script-run-untracked", nil)
		tm := &Terramate{Bin: fakeTerramate(t), Dir: proj}
		err := tm.ScriptRun(context.Background(), io.Discard, ScriptRunOptions{Script: "plan", Changed: true, StackFiles: []string{"tfstackplan.log", "plan.json"}})
		var te *TerramateError
		if !errors.As(err, &te) || !errors.Is(err, ErrUntrackedFiles) {
			t.Fatalf("err = %v", err)
		}
		msg := err.Error()
		for _, want := range []string{"git-ignore", "tfstackplan.log, plan.json", "stacks/prod/network/notes.txt"} {
			if !strings.Contains(msg, want) {
				t.Errorf("message %q lacks %q", msg, want)
			}
		}
	})
	t.Run("cycle", func(t *testing.T) {
		t.Parallel()
		_, proj := tmFixture(t, "24-cycle-script-run", nil)
		tm := &Terramate{Bin: fakeTerramate(t), Dir: proj}
		err := tm.ScriptRun(context.Background(), io.Discard, ScriptRunOptions{Script: "plan"})
		var ce *StackCycleError
		want := []string{"/stacks/nonprod/cluster/a", "/stacks/nonprod/network", "/stacks/nonprod/cluster/b"}
		if !errors.Is(err, ErrStackCycle) || !errors.As(err, &ce) || !slices.Equal(ce.Stacks, want) {
			t.Fatalf("err = %v, want a cycle through %v", err, want)
		}
	})
}

func TestTerramateScriptRunCancel(t *testing.T) {
	t.Parallel()
	_, proj := tmFixture(t, "15-script-run-changed", func(sc *tmScenario) {
		sc.Scripts = append(sc.Scripts, json.RawMessage(`{"name": "slow", "definedAt": "/slow.tm.hcl:1,1-5,2",
		  "jobs": [{"commands": [["bash", "-c", "echo started > started; exec sleep 60"]]}]}`))
	})
	tm := &Terramate{Bin: fakeTerramate(t), Dir: proj}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tm.ScriptRun(ctx, io.Discard, ScriptRunOptions{Script: "slow", Changed: true}) }()
	started := filepath.Join(proj, "stacks/prod/network/started")
	for i := 0; i < 300; i++ {
		if _, err := os.Stat(started); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) || errors.Is(err, ErrKilledAfterGrace) {
		t.Fatalf("err = %v, want context.Canceled, and not killed (the script stops at the interrupt)", err)
	}
	if _, err := os.Stat(filepath.Join(proj, "stacks/nonprod/cluster/a/started")); err == nil {
		t.Error("a stack started after the cancel")
	}
}

// A script that ignores the interrupt (a tofu still finishing a slow provider call) is killed
// with terramate's whole group once the interrupt grace ends, so the run can finalize before
// GitHub's SIGKILL.
func TestTerramateInterruptGraceKills(t *testing.T) {
	t.Parallel()
	_, proj := tmFixture(t, "15-script-run-changed", func(sc *tmScenario) {
		sc.Scripts = append(sc.Scripts, json.RawMessage(`{"name": "stubborn", "definedAt": "/stubborn.tm.hcl:1,1-5,2",
		  "jobs": [{"commands": [["bash", "-c", "trap '' INT TERM; echo $$ > started.tmp; mv started.tmp started; sleep 60; echo survived > survived"]]}]}`))
	})
	tm := &Terramate{Bin: fakeTerramate(t), Dir: proj, InterruptGrace: 300 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tm.ScriptRun(ctx, io.Discard, ScriptRunOptions{Script: "stubborn", Changed: true}) }()
	started := filepath.Join(proj, "stacks/prod/network/started")
	var pid []byte
	for i := 0; i < 500 && pid == nil; i++ {
		pid, _ = os.ReadFile(started)
		time.Sleep(20 * time.Millisecond)
	}
	if pid == nil {
		t.Fatal("the script never started")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrKilledAfterGrace) {
			t.Fatalf("err = %v, want context.Canceled and ErrKilledAfterGrace", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a script ignoring the interrupt was not killed") // a guard against hanging, not a speed check
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(pid)))
	if err != nil {
		t.Fatal(err)
	}
	// Killed, the process is gone or a zombie nobody reaped yet (its parent was killed too).
	alive := func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n))
		if err != nil {
			return syscall.Kill(n, 0) == nil // no /proc: as the kernel answers
		}
		_, after, _ := strings.Cut(string(stat), ") ")
		return !strings.HasPrefix(after, "Z") && !strings.HasPrefix(after, "X")
	}
	for i := 0; i < 250 && alive(); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	if alive() {
		t.Errorf("the script (pid %d) still runs after the interrupt grace", n)
	}
	if _, err := os.Stat(filepath.Join(proj, "stacks/prod/network/survived")); err == nil {
		t.Error("the script ran to its end")
	}
}

func TestTerramateErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("not installed", func(t *testing.T) {
		t.Parallel()
		for _, bin := range []string{"terramate-not-installed-here", filepath.Join(t.TempDir(), "terramate")} {
			_, err := (&Terramate{Bin: bin}).List(ctx)
			if !errors.Is(err, ErrTerramateNotInstalled) || !strings.Contains(err.Error(), "not installed") {
				t.Errorf("%s: err = %v", bin, err)
			}
		}
	})
	t.Run("not a project", func(t *testing.T) {
		t.Parallel()
		tmp, _ := tmFixture(t, "31-not-a-project", nil)
		_, err := (&Terramate{Bin: fakeTerramate(t), Dir: filepath.Join(tmp, "elsewhere")}).List(ctx)
		var te *TerramateError
		if !errors.Is(err, ErrNotTerramateProject) || !errors.As(err, &te) || te.ExitCode != 1 || !slices.Equal(te.Args, []string{"list"}) {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("config parse error", func(t *testing.T) {
		t.Parallel()
		_, proj := tmFixture(t, "30-parse-error-list", nil)
		_, err := (&Terramate{Bin: fakeTerramate(t), Dir: proj}).List(ctx)
		var te *TerramateError
		if !errors.Is(err, ErrTerramateConfig) || !errors.As(err, &te) || te.Location != "stacks/nonprod/network/stack.tm.hcl:2" {
			t.Fatalf("err = %v", err)
		}
		if !strings.Contains(err.Error(), "stacks/nonprod/network/stack.tm.hcl:2") {
			t.Errorf("message lacks file:line: %v", err)
		}
	})
	t.Run("cycle in run order", func(t *testing.T) {
		t.Parallel()
		_, proj := tmFixture(t, "22-cycle-list-run-order", nil)
		tm := &Terramate{Bin: fakeTerramate(t), Dir: proj}
		_, err := tm.output(ctx, "list", "--run-order")
		var ce *StackCycleError
		if !errors.As(err, &ce) || len(ce.Stacks) != 3 {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("stderr tail is bounded", func(t *testing.T) {
		t.Parallel()
		big := strings.Repeat("x", 3*stderrTailLimit) + "the end\n"
		tm := &Terramate{Exec: func(_ context.Context, _ string, _ []string, _ string, _ []string, _, stderr io.Writer) error {
			for i := 0; i < len(big); i += 1000 {
				io.WriteString(stderr, big[i:min(i+1000, len(big))])
			}
			return tmExitError(3)
		}}
		_, err := tm.List(ctx)
		var te *TerramateError
		if !errors.As(err, &te) || te.ExitCode != 3 || len(te.Stderr) != stderrTailLimit || !strings.HasSuffix(te.Stderr, "the end\n") {
			t.Fatalf("err = %v (tail %d bytes)", err, len(te.Stderr))
		}
		if msg := err.Error(); !strings.Contains(msg, "exit status 3: …") || !strings.HasSuffix(msg, "the end") || len(msg) > 2*maxMessageLine {
			t.Errorf("message: %v", err)
		}
	})
}

type tmExitError int

func (e tmExitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }
func (e tmExitError) ExitCode() int { return int(e) }

// The exec hook sees the argv, the directory and the environment of every invocation.
func TestTerramateArgv(t *testing.T) {
	t.Parallel()
	type call struct {
		name, dir string
		args, env []string
	}
	var calls []call
	tm := &Terramate{Dir: "/work/proj", Env: []string{"A=1"}, Exec: func(_ context.Context, name string, args []string, dir string, env []string, _, _ io.Writer) error {
		calls = append(calls, call{name, dir, args, env})
		return nil
	}}
	ctx := context.Background()
	if _, err := tm.ChangedStacks(ctx, "origin/main"); err != nil {
		t.Fatal(err)
	}
	if err := tm.ScriptRun(ctx, io.Discard, ScriptRunOptions{Script: "deploy plan", Changed: true, Base: "main", Parallel: 4, ContinueOnError: true, Env: []string{"B=2"}}); err != nil {
		t.Fatal(err)
	}
	if err := tm.ScriptRun(ctx, io.Discard, ScriptRunOptions{Script: " "}); err == nil {
		t.Error("an empty script name was accepted")
	}
	want := [][]string{
		{"list", "--changed", "-B", "origin/main"},
		{"script", "run", "--changed", "-B", "main", "--parallel", "4", "--continue-on-error", "deploy", "plan"},
	}
	if len(calls) != len(want) {
		t.Fatalf("calls = %+v", calls)
	}
	for i, c := range calls {
		if c.name != "terramate" || c.dir != "/work/proj" || !slices.Equal(c.args, want[i]) {
			t.Errorf("call %d = %+v, want terramate %q in /work/proj", i, c, want[i])
		}
		if !slices.Contains(c.env, "A=1") {
			t.Errorf("call %d lacks Env", i)
		}
	}
	if !slices.Contains(calls[1].env, "B=2") {
		t.Error("ScriptRun lacks its options' Env")
	}
}

// Past the budget RunGraph falls back to the metadata, even when run-graph never returns.
func TestRunGraphBudgetFallback(t *testing.T) {
	t.Parallel()
	metadata, err := os.ReadFile(filepath.Join(tmFixtureDir, "cases", "27-ordering-debug-show-metadata.stdout"))
	if err != nil {
		t.Fatal(err)
	}
	tm := &Terramate{RunGraphBudget: 50 * time.Millisecond, Exec: func(ctx context.Context, _ string, args []string, _ string, _ []string, stdout, _ io.Writer) error {
		if args[0] == "experimental" {
			<-ctx.Done()
			return tmExitError(-1)
		}
		_, err := stdout.Write(metadata)
		return err
	}}
	r, err := tm.RunGraphDetailed(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want, err := runGraphEdges(tmRecordedBytes(t, "25-ordering-run-graph"))
	if err != nil {
		t.Fatal(err)
	}
	if !r.Approximate || !slices.Equal(r.Edges, want) {
		t.Errorf("fallback = %+v, want approximate %v", r, want)
	}
	// A caller's cancellation is not a budget overrun.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tm.RunGraph(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: err = %v", err)
	}
}

func tmRecordedBytes(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(tmFixtureDir, "cases", name+".stdout"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every non-empty line of terramate's output is kept, a line longer than any buffer too (a
// scanner with a 16 MiB limit stopped there and dropped every stack listed after it).
func TestTmLinesKeepsEveryLine(t *testing.T) {
	long := strings.Repeat("d", 17<<20)
	got := tmLines([]byte("a\r\n\n" + long + "\nb\r\r\nc"))
	if len(got) != 4 || got[0] != "a" || got[1] != long || got[2] != "b" || got[3] != "c" {
		t.Fatalf("got %d lines: %.20q", len(got), got)
	}
	if got := tmLines(nil); got == nil || len(got) != 0 {
		t.Fatalf("no output: %#v, want an empty list", got)
	}
}
