package job

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/runner"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

func shardStacks(m *Matrix) [][]string {
	var out [][]string
	for _, s := range m.Shards {
		out = append(out, s.Stacks)
	}
	return out
}

func TestCutKeepsDependencyChainsAndNestingTogether(t *testing.T) {
	stacks := []string{"s/a", "s/b", "s/c", "s/d", "s/d/inner", "s/e", "s/f"}
	edges := []events.Edge{{From: "s/a", To: "s/c"}, {From: "s/c", To: "s/f"}, {From: "s/x", To: "s/b"}}
	m := Cut(stacks, edges, nil, 3)
	// Heaviest first, each to the lightest shard so far: {a,c,f}, {d,d/inner}, {b}, then e
	// joins b's shard.
	want := [][]string{{"s/a", "s/c", "s/f"}, {"s/d", "s/d/inner"}, {"s/b", "s/e"}}
	if got := shardStacks(m); !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("cut %v, want %v", got, want)
	}
	if m.Basis != BasisCount {
		t.Errorf("basis %q, want %q", m.Basis, BasisCount)
	}
	for i, s := range m.Shards {
		if s.Shard != fmt.Sprintf("%d/3", i+1) || s.Weight != int64(len(s.Stacks)) {
			t.Errorf("shard %d: %+v", i, s)
		}
	}
	if len(m.Oversized) != 0 {
		t.Errorf("oversized %v: a chain of 3 in 7 stacks over 3 shards fits a share of 3", m.Oversized)
	}
	// The same inputs, the same cut.
	if again := Cut(stacks, edges, nil, 3); !slices.EqualFunc(shardStacks(again), want, slices.Equal) {
		t.Errorf("a second cut differs: %v", shardStacks(again))
	}
}

func TestCutNeverMakesMoreShardsThanComponents(t *testing.T) {
	stacks := []string{"a", "b", "c"}
	m := Cut(stacks, []events.Edge{{From: "a", To: "b"}, {From: "b", To: "c"}}, nil, 8)
	if got := shardStacks(m); len(got) != 1 || !slices.Equal(got[0], stacks) || m.Shards[0].Shard != "1/1" {
		t.Fatalf("cut %v (%+v), want one shard of all three", got, m.Shards)
	}
	// The chain weighs more than an eighth of the stacks: it is what limits this fan-out.
	if len(m.Oversized) != 1 || !slices.Equal(m.Oversized[0], stacks) {
		t.Errorf("oversized %v, want the chain", m.Oversized)
	}
	if m := Cut(nil, nil, nil, 4); len(m.Shards) != 0 || m.GitHub().Include == nil {
		t.Errorf("no stacks: %+v, want no shards and an empty (not null) include", m)
	}
}

func TestCutBalancesByDurationsAndReportsOversized(t *testing.T) {
	stacks := []string{"a", "b", "c", "d", "e"}
	edges := []events.Edge{{From: "a", To: "b"}}
	d := map[string]time.Duration{"a": 50 * time.Second, "b": 50 * time.Second, "c": 10 * time.Second, "d": 30 * time.Second}
	m := Cut(stacks, edges, d, 2)
	if m.Basis != BasisDurations {
		t.Fatalf("basis %q, want durations", m.Basis)
	}
	// e is unknown: it weighs the median of the known (10, 30, 50, 50 s: 50 s). {a,b} = 100 s
	// goes first, then e, d and c to the lighter shard.
	want := [][]string{{"a", "b"}, {"c", "d", "e"}}
	if got := shardStacks(m); !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("cut %v, want %v", got, want)
	}
	if m.Shards[0].Weight != 100_000 || m.Shards[1].Weight != 90_000 {
		t.Errorf("weights %d, %d ms; want 100000 and 90000", m.Shards[0].Weight, m.Shards[1].Weight)
	}
	if len(m.Oversized) != 1 || !slices.Equal(m.Oversized[0], []string{"a", "b"}) {
		t.Errorf("oversized %v, want [[a b]] (100 s over a share of 95 s)", m.Oversized)
	}
}

func TestParseShardAndFanOutUsage(t *testing.T) {
	for _, s := range []string{"", "1", "0/3", "4/3", "a/b", "1/0", "-1/2", "1/2/3"} {
		if _, _, err := parseShard(s); err == nil {
			t.Errorf("parseShard(%q) took it", s)
		}
	}
	if k, n, err := parseShard("2/8"); err != nil || k != 2 || n != 8 {
		t.Errorf("parseShard(2/8) = %d, %d, %v", k, n, err)
	}
	for _, c := range []struct {
		o    RunOptions
		want string
	}{
		{RunOptions{Matrix: -1}, "--matrix must be a positive"},
		{RunOptions{Matrix: 300}, "more shards than a GitHub Actions matrix"},
		{RunOptions{Matrix: 2, Shard: "1/2"}, "do not go together"},
		{RunOptions{MatrixResult: "m.json"}, "pass --shard"},
		{RunOptions{Shard: "3/2"}, "must be K/N"},
		{RunOptions{Matrix: 2, DryRun: true}, "drop --dry-run"},
		{RunOptions{Matrix: 2}, ""},
		{RunOptions{Shard: "1/2", MatrixResult: "m.json"}, ""},
	} {
		got := fanOutUsage(&c.o)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("fanOutUsage(%+v) = %q, want %q", c.o, got, c.want)
		}
	}
}

// scriptedExec stands in for terramate: each `-C STACK script run --no-recursive` prints two
// lines in pieces (so that lines of stacks running at once would mix were they not kept whole)
// and fails for the stacks in fail.
type scriptedExec struct {
	mu      sync.Mutex
	fail    map[string]bool
	order   []string // "start X" and "end X"
	running int
	peak    int
}

func (s *scriptedExec) exec(ctx context.Context, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
	if len(args) < 4 || !strings.HasPrefix(args[0], "--chdir=") || !slices.Equal(args[1:4], []string{"script", "run", "--no-recursive"}) {
		return fmt.Errorf("unexpected argv %q", args)
	}
	stack := strings.TrimPrefix(args[0], "--chdir=")
	s.mu.Lock()
	s.order = append(s.order, "start "+stack)
	s.running++
	s.peak = max(s.peak, s.running)
	s.mu.Unlock()
	for _, piece := range []string{"/" + stack, " (script:0 job:0.0)> ", "echo\n", "output of ", stack, "\n"} {
		_, _ = io.WriteString(stdout, piece)
		time.Sleep(time.Millisecond)
	}
	s.mu.Lock()
	s.order = append(s.order, "end "+stack)
	s.running--
	s.mu.Unlock()
	if s.fail[stack] {
		_, _ = fmt.Fprintf(stderr, "Error: one or more commands failed\n> execution failed: running false (in /%s): exit status 1\n", stack)
		return exitErr(1)
	}
	return nil
}

type exitErr int

func (e exitErr) Error() string { return fmt.Sprintf("exit status %d", int(e)) }
func (e exitErr) ExitCode() int { return int(e) }

func TestScriptRunStacksOrdersRunsInParallelAndKeepsLinesWhole(t *testing.T) {
	se := &scriptedExec{}
	tm := &runner.Terramate{Exec: se.exec}
	var out testkit.SyncBuffer
	stacks := []string{"a", "b", "c", "d", "e"}
	after := map[string][]string{"c": {"a"}, "e": {"c", "d", "elsewhere"}}
	if err := tm.ScriptRunStacks(context.Background(), &out, runner.ScriptRunOptions{Script: "plan", Parallel: 2}, stacks, after); err != nil {
		t.Fatal(err)
	}
	pos := func(ev string) int { return slices.Index(se.order, ev) }
	for _, dep := range [][2]string{{"a", "c"}, {"c", "e"}, {"d", "e"}} {
		if pos("end "+dep[0]) < 0 || pos("end "+dep[0]) > pos("start "+dep[1]) {
			t.Errorf("%s started before %s ended: %v", dep[1], dep[0], se.order)
		}
	}
	if se.peak != 2 {
		t.Errorf("at most %d ran at once, want 2 (--parallel 2)", se.peak)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2*len(stacks) {
		t.Fatalf("%d lines, want %d: %q", len(lines), 2*len(stacks), out.String())
	}
	for _, l := range lines {
		if !strings.HasSuffix(l, "> echo") && !strings.HasPrefix(l, "output of ") || strings.Count(l, "output of") > 1 {
			t.Errorf("a line mixes two stacks' output: %q", l)
		}
	}
}

func TestScriptRunStacksStopsAtTheFirstFailureUnlessToldToGoOn(t *testing.T) {
	stacks := []string{"a", "b", "c"}
	after := map[string][]string{"b": {"a"}, "c": {"b"}}
	se := &scriptedExec{fail: map[string]bool{"a": true}}
	err := (&runner.Terramate{Exec: se.exec}).ScriptRunStacks(context.Background(), io.Discard, runner.ScriptRunOptions{Script: "plan"}, stacks, after)
	var te *runner.TerramateError
	if !errors.As(err, &te) || !errors.Is(te, runner.ErrScriptFailed) || !slices.Equal(te.FailedStacks, []string{"/a"}) {
		t.Fatalf("error %v (%#v), want a script failure of /a", err, te)
	}
	if !slices.Equal(se.order, []string{"start a", "end a"}) {
		t.Errorf("ran %v after a failed; want nothing more", se.order)
	}

	se = &scriptedExec{fail: map[string]bool{"a": true, "c": true}}
	err = (&runner.Terramate{Exec: se.exec}).ScriptRunStacks(context.Background(), io.Discard, runner.ScriptRunOptions{Script: "plan", ContinueOnError: true}, stacks, after)
	if !errors.As(err, &te) || !slices.Equal(te.FailedStacks, []string{"/a", "/c"}) {
		t.Fatalf("error %v, want failures of /a and /c", err)
	}
	if len(se.order) != 6 {
		t.Errorf("with --continue-on-error every stack runs, like terramate: %v", se.order)
	}
}

func TestScriptRunStacksRefusesACycle(t *testing.T) {
	se := &scriptedExec{}
	err := (&runner.Terramate{Exec: se.exec}).ScriptRunStacks(context.Background(), io.Discard, runner.ScriptRunOptions{Script: "plan"},
		[]string{"a", "b", "c"}, map[string][]string{"b": {"c"}, "c": {"b"}})
	if err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Fatalf("error %v, want a cycle", err)
	}
	if len(se.order) != 2 {
		t.Errorf("ran %v; only a could start", se.order)
	}
}
