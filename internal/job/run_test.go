package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/runner"
)

// scriptedTerramate is an ExecFunc that answers the discovery commands for the stacks under
// the tier "stacks/prod" and runs script with the script run's arguments.
func scriptedTerramate(stacks []string, script func(ctx context.Context, stdout, stderr io.Writer) error) runner.ExecFunc {
	return func(ctx context.Context, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
		switch {
		case slices.Equal(args, []string{"list", "--changed"}):
			for _, s := range stacks {
				fmt.Fprintln(stdout, s)
			}
		case slices.Equal(args, []string{"list", "--changed", "--why"}):
			for _, s := range stacks {
				fmt.Fprintf(stdout, "%s - stack has unmerged changes\n", s)
			}
		case len(args) > 1 && args[0] == "experimental":
			fmt.Fprint(stdout, "digraph  {\n\t\n")
			for i, s := range stacks {
				fmt.Fprintf(stdout, "\tn%d[label=\"/stacks/prod/%s\"];\n", i+1, s)
			}
			fmt.Fprint(stdout, "\t\n}\n")
		case len(args) > 1 && args[0] == "script":
			return script(ctx, stdout, stderr)
		default:
			return fmt.Errorf("unexpected terramate %v", args)
		}
		return nil
	}
}

// runRepo makes a git repository with the stack directories of stacks under stacks/prod, and
// an origin remote on GitHub (acme/infra).
func runRepo(t *testing.T, stacks []string) string {
	t.Helper()
	root := t.TempDir()
	for _, args := range [][]string{{"init", "-q", root}, {"-C", root, "remote", "add", "origin", "https://github.com/acme/infra.git"}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	for _, s := range stacks {
		if err := os.MkdirAll(filepath.Join(root, "stacks/prod", s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// recordedPlan is the plan JSON recorded for kind (testdata/tofu/KIND/plan.json).
func recordedPlan(t *testing.T, kind string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../../testdata/tofu", kind, "plan.json"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// runPlanScripted runs `run plan` over stacks (see runRepo) against c as execution id ("": a
// new one), with script as the script run; script gets the tick directory the driver set.
func runPlanScripted(t *testing.T, c *runner.Client, root string, stacks []string, id string, script func(tickDir string, stdout io.Writer) error) *Result {
	t.Helper()
	return runScripted(t, c, root, stacks, OpPlan, id, func(_, tickDir string, stdout io.Writer) error { return script(tickDir, stdout) })
}

// runScripted runs `run op` (an apply for PR 5) as runPlanScripted does; script also gets the
// name of the script terramate runs.
func runScripted(t *testing.T, c *runner.Client, root string, stacks []string, op, id string, script func(name, tickDir string, stdout io.Writer) error) *Result {
	t.Helper()
	return runScriptedWith(t, c, root, stacks, op, id, nil, script)
}

// runScriptedWith is runScripted with the run's options changed by tune (nil: none).
func runScriptedWith(t *testing.T, c *runner.Client, root string, stacks []string, op, id string, tune func(*RunOptions), script func(name, tickDir string, stdout io.Writer) error) *Result {
	t.Helper()
	exec := scriptedTerramate(stacks, nil)
	pr := 0
	if op == OpApply {
		pr = 5
	}
	o := RunOptions{
		Op: op, Environment: "prod", WorkDir: root, Dir: filepath.Join(root, "stacks/prod"), Client: c,
		ResultPath: filepath.Join(t.TempDir(), "r.json"), SHA: "abc", PR: pr, ExecutionID: id,
		Getenv: func(string) string { return "" },
		Terramate: &runner.Terramate{Exec: func(ctx context.Context, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
			if len(args) < 2 || args[0] != "script" {
				return exec(ctx, name, args, dir, env, stdout, stderr)
			}
			tickDir := ""
			for _, kv := range env {
				if v, ok := strings.CutPrefix(kv, runner.EnvTickDir+"="); ok {
					tickDir = v
				}
			}
			return script(args[len(args)-1], tickDir, stdout)
		}},
	}
	if tune != nil {
		tune(&o)
	}
	return Run(context.Background(), o)
}

// runPlanWith runs `run plan` for environment prod of root, terramate's calls going to exec;
// c nil reports to no server.
func runPlanWith(t *testing.T, c *runner.Client, root string, exec runner.ExecFunc, dryRun bool) *Result {
	t.Helper()
	return Run(context.Background(), RunOptions{
		Op: OpPlan, Environment: "prod", WorkDir: root, Dir: filepath.Join(root, "stacks/prod"), Client: c, DryRun: dryRun,
		ResultPath: filepath.Join(t.TempDir(), "result.json"), Terramate: &runner.Terramate{Exec: exec},
		Getenv: func(string) string { return "" },
	})
}

// memClient starts an in-memory control plane and returns it with a client of it.
func memClient(t *testing.T) (*memServer, *runner.Client) {
	t.Helper()
	m := newMemServer()
	c, err := runner.NewClient(m.start(t).URL)
	if err != nil {
		t.Fatal(err)
	}
	return m, c
}

func readResultFile(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// A panic inside the flow still finalizes the execution (failed), and the result says
// internal, with the step it happened in.
func TestRunRecoversPanicAndFinalizes(t *testing.T) {
	m, c := memClient(t)
	stacks := []string{"a", "b"}
	root := runRepo(t, stacks)
	resPath := filepath.Join(t.TempDir(), "result.json")
	res := Run(context.Background(), RunOptions{
		Op: OpPlan, Environment: "prod", WorkDir: root, Dir: filepath.Join(root, "stacks/prod"), Client: c,
		ResultPath: resPath, SHA: "abc", PR: 3,
		Terramate: &runner.Terramate{Exec: scriptedTerramate(stacks, func(context.Context, io.Writer, io.Writer) error {
			panic("boom in the script run")
		})},
		Getenv: func(string) string { return "" },
	})
	if res.Error == nil || res.Error.Kind != KindInternal || res.Error.Step != "plan" || !strings.Contains(res.Error.Tail, "boom") {
		t.Fatalf("error = %+v, want internal in plan", res.Error)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.finals) != 1 || m.finals[0].Status != events.ExecutionFailed || m.finals[0].ExecutionID != res.Execution {
		t.Fatalf("finals = %+v, want one failed Finalize of %s", m.finals, res.Execution)
	}
	if doc := readResultFile(t, resPath); doc["status"] != "failed" || doc["error"].(map[string]any)["kind"] != "internal" {
		t.Fatalf("result document = %v", doc)
	}
}

// An administrator's cancel seen on any event stops the run: terramate's context ends, and the
// execution is finalized cancelled.
func TestRunStopsWhenTheServerCancels(t *testing.T) {
	m, c := memClient(t)
	stacks := []string{"a"}
	root := runRepo(t, stacks)
	const id = "exec-cancelled"
	m.mu.Lock()
	m.cancels[id] = "stop it"
	m.mu.Unlock()
	started := time.Now()
	res := Run(context.Background(), RunOptions{
		Op: OpPlan, Environment: "prod", WorkDir: root, Dir: filepath.Join(root, "stacks/prod"), Client: c,
		ResultPath: filepath.Join(t.TempDir(), "r.json"), ExecutionID: id, SHA: "abc",
		Terramate: &runner.Terramate{Exec: scriptedTerramate(stacks, func(ctx context.Context, _, _ io.Writer) error {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Minute):
				return errors.New("the run was not cancelled")
			}
		})},
		Getenv: func(string) string { return "" },
	})
	if res.Error == nil || res.Error.Kind != KindCancelled || !strings.Contains(res.Error.Tail, "stop it") {
		t.Fatalf("error = %+v, want cancelled with the reason", res.Error)
	}
	if time.Since(started) > 50*time.Second {
		t.Fatal("the script run was not stopped") // a guard against hanging, not a speed check
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.finals) != 1 || m.finals[0].Status != events.ExecutionCancelled {
		t.Fatalf("finals = %+v, want one cancelled Finalize", m.finals)
	}
	// A cancelled run does not stay to ask what its plan needs, and says so.
	if m.requests["/executions/"+id+"/gates"] != 0 || res.Gates == nil || res.Gates.Status != GatesUnavailable || !strings.Contains(res.Gates.Message, "cancelled") {
		t.Fatalf("asked %d times, gates %+v", m.requests["/executions/"+id+"/gates"], res.Gates)
	}
}

// Each stack's status comes from terramate's output and the ticks.
func TestScriptOutcomeStatus(t *testing.T) {
	records := map[string][]runner.TickRecord{
		"done":      {{Phase: "plan"}, {Phase: "done", Status: "succeeded"}},
		"tickfail":  {{Phase: "plan", Status: "FAILED"}, {Phase: "done"}},
		"ticked":    {{Phase: "done"}},
		"half":      {{Phase: "plan"}},
		"failedtoo": {{Phase: "done"}},
	}
	ticks := map[string]runner.TickStatus{}
	for stack, rs := range records {
		var s runner.TickStatus
		for _, r := range rs {
			s = s.Add(r)
		}
		ticks[stack] = s
	}
	started := map[string]bool{"done": true, "tickfail": true, "half": true, "failed": true, "failedtoo": true, "fresh": true}
	failed := map[string]bool{"failed": true, "failedtoo": true}
	for _, tc := range []struct {
		name        string
		exitOK, cxl bool
		stack       string
		fresh       bool
		want        string
	}{
		{"terramate ok", true, false, "half", false, StatusSucceeded},
		{"named failed", false, false, "failed", false, StatusFailed},
		{"named failed beats a done tick", false, false, "failedtoo", false, StatusFailed},
		{"a failed tick", true, false, "tickfail", false, StatusFailed},
		{"never started", false, false, "other", false, StatusNotRun},
		{"never started even when terramate is ok", true, false, "other", false, StatusNotRun},
		{"done tick after a stop", false, false, "done", false, StatusSucceeded},
		{"fresh plan after a stop", false, false, "fresh", true, StatusSucceeded},
		{"started and stopped", false, false, "half", false, StatusCancelled},
		{"interrupted", false, true, "half", false, StatusCancelled},
		{"interrupted though terramate exited 0", true, true, "half", false, StatusCancelled},
		{"ticked done, echo not seen", false, false, "ticked", false, StatusSucceeded},
	} {
		o := scriptOutcome{started: started, failed: failed, ticks: ticks, exitOK: tc.exitOK, cancelled: tc.cxl}
		if got := o.status(tc.stack, tc.fresh); got != tc.want {
			t.Errorf("%s: status(%s) = %s, want %s", tc.name, tc.stack, got, tc.want)
		}
	}
}

// The watcher reads which stacks started and failed from what real terramate printed
// (testdata/terramate/cases/19-script-run-fail), however the output is split into writes.
func TestScriptWatcherRecordedFailure(t *testing.T) {
	b, err := os.ReadFile("../../testdata/terramate/cases/19-script-run-fail.stderr")
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{1, 7, 64, len(b)} {
		w := newScriptWatcher(io.Discard)
		for i := 0; i < len(b); i += size {
			if _, err := w.Write(b[i:min(i+size, len(b))]); err != nil {
				t.Fatal(err)
			}
		}
		started, failed := w.snapshot()
		if !started["stacks/prod/network"] || !started["stacks/nonprod/cluster/a"] || len(started) != 2 {
			t.Errorf("writes of %d: started = %v", size, started)
		}
		if !failed["stacks/nonprod/cluster/a"] || len(failed) != 1 {
			t.Errorf("writes of %d: failed = %v", size, failed)
		}
	}
}

// A stack path with spaces and a script output line that only looks like terramate's.
func TestScriptWatcherOddLines(t *testing.T) {
	w := newScriptWatcher(io.Discard)
	fmt.Fprint(w, "/stacks/my stack (script:0 job:0.0)> bash -c x\r\n")
	fmt.Fprint(w, "plain output mentioning (script:0 job:0.0)> but not at the start\n")
	fmt.Fprint(w, strings.Repeat("x", maxWatchedLine+10)+"\n")
	fmt.Fprint(w, "> execution failed: running /usr/bin/bash -c x (in /stacks/my stack): exit status 2")
	started, failed := w.snapshot()
	if !started["stacks/my stack"] || len(started) != 1 {
		t.Errorf("started = %v", started)
	}
	if !failed["stacks/my stack"] || len(failed) != 1 {
		t.Errorf("failed = %v (an unterminated last line is read at the end)", failed)
	}
}

// Listing under a tier, two listed stacks that are both suffixes of one endpoint keep their
// edges, and a stack of another tier is not taken for a listed one.
func TestNormalizeEdgesInTier(t *testing.T) {
	listed := []string{"a", "cluster/a", "net"}
	edges := []events.Edge{
		{From: "/stacks/nonprod/net", To: "/stacks/nonprod/cluster/a"},
		{From: "/stacks/nonprod/net", To: "/stacks/nonprod/a"},
		{From: "/stacks/prod/net", To: "/stacks/prod/cluster/a"},
	}
	got := runner.NormalizeEdgesIn("stacks/nonprod", listed, edges)
	want := []events.Edge{{From: "net", To: "a"}, {From: "net", To: "cluster/a"}}
	if !slices.Equal(got, want) {
		t.Errorf("NormalizeEdgesIn = %v, want %v", got, want)
	}
	if old := runner.NormalizeEdges(listed, edges); len(old) >= len(want) {
		t.Logf("NormalizeEdges (no tier) = %v", old)
	}
	root := runner.NormalizeEdgesIn("", []string{"stacks/x", "stacks/y"}, []events.Edge{{From: "/stacks/x", To: "/stacks/y"}})
	if !slices.Equal(root, []events.Edge{{From: "stacks/x", To: "stacks/y"}}) {
		t.Errorf("at the root: %v", root)
	}
}

func TestRunClientRefusesAmbiguousOrBrokenServers(t *testing.T) {
	env := mapEnv
	if _, err := runner.RunClient(runner.Environment{}, env(map[string]string{runner.EnvServer: "http://127.0.0.1:1", runner.EnvToken: "t", runner.EnvAudience: "aud"})); !errors.Is(err, runner.ErrAmbiguousAuth) {
		t.Errorf("token and audience: err = %v", err)
	}
	if _, err := runner.RunClient(runner.Environment{Audience: "aud"}, env(map[string]string{runner.EnvServer: "http://127.0.0.1:1", runner.EnvToken: "t"})); !errors.Is(err, runner.ErrAmbiguousAuth) {
		t.Errorf("token and the block's audience: err = %v", err)
	}
	if _, err := runner.RunClient(runner.Environment{}, env(map[string]string{runner.EnvServer: "ftp://x"})); err == nil {
		t.Error("a malformed server is accepted")
	}
	c, err := runner.RunClient(runner.Environment{Gated: true}, env(nil))
	if err != nil || c.Enabled() {
		t.Fatalf("no server: %v, enabled %v", err, c.Enabled())
	}
	if v := c.GateCheck(context.Background(), events.GateCheck{}); v.Allowed() {
		t.Error("a gated environment without a server allowed the apply")
	}
	b := runner.BrokenClient(errors.New("server URL is malformed"))
	if v := b.GateCheck(context.Background(), events.GateCheck{}); v.Allowed() || !strings.Contains(v.String(), "malformed") {
		t.Errorf("broken client: verdict %v", v)
	}
	ok, err := runner.RunClient(runner.Environment{}, env(map[string]string{runner.EnvServer: "http://127.0.0.1:1", runner.EnvToken: "t"}))
	if err != nil || !ok.Enabled() {
		t.Fatalf("static token: %v", err)
	}
}

// GitHub Actions context: the pull request's number and head commit from the event file; the
// run URL from the server, repository and run id.
func TestGitHubFromEnv(t *testing.T) {
	ev := filepath.Join(t.TempDir(), "event.json")
	if err := os.WriteFile(ev, []byte(`{"pull_request":{"number":12,"head":{"sha":"headsha"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	kv := map[string]string{
		"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": "o/r", "GITHUB_SHA": "mergesha", "GITHUB_EVENT_PATH": ev,
		"GITHUB_SERVER_URL": "https://github.example", "GITHUB_RUN_ID": "5", "GITHUB_RUN_ATTEMPT": "2",
		"GITHUB_REF": "refs/pull/99/merge",
	}
	g := GitHubFromEnv(func(k string) string { return kv[k] })
	if g.PR != 12 || g.SHA != "headsha" || g.RunURL != "https://github.example/o/r/actions/runs/5/attempts/2" || !g.Actions {
		t.Errorf("GitHubFromEnv = %+v", g)
	}
	delete(kv, "GITHUB_EVENT_PATH")
	if g := GitHubFromEnv(func(k string) string { return kv[k] }); g.PR != 99 || g.SHA != "mergesha" {
		t.Errorf("without the event file: %+v", g)
	}
}

// An output value cannot inject another output, whatever it holds.
func TestWriteOutputsDelimits(t *testing.T) {
	p := filepath.Join(t.TempDir(), "out")
	evil := "x\nhas-destructive=false\nother<<EOF\ny"
	if err := writeOutputs(p, [][2]string{{"changed-stacks", evil}, {"has-destructive", "true"}}); err != nil {
		t.Fatal(err)
	}
	parsed := parseGitHubOutput(t, p)
	if parsed["changed-stacks"] != evil || parsed["has-destructive"] != "true" || len(parsed) != 2 {
		t.Errorf("outputs = %q", parsed)
	}
}

// parseGitHubOutput reads the file the way the Actions runner does (name<<DELIM ... DELIM).
func parseGitHubOutput(t *testing.T, p string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		name, delim, ok := strings.Cut(lines[i], "<<")
		if !ok {
			t.Fatalf("line %q is not name<<DELIM", lines[i])
		}
		var val []string
		for i++; i < len(lines) && lines[i] != delim; i++ {
			val = append(val, lines[i])
		}
		out[name] = strings.Join(val, "\n")
	}
	return out
}

// `run plan` reports a stack's class as soon as the stack ticks done, while terramate still
// runs the others.
func TestRunPlanReportsStacksAsTheyFinish(t *testing.T) {
	m, c := memClient(t)
	stacks := []string{"a", "b"}
	root := runRepo(t, stacks)
	planJSON := recordedPlan(t, "create")
	var seenWhileRunning []string
	res := runPlanScripted(t, c, root, stacks, "", func(tickDir string, stdout io.Writer) error {
		fmt.Fprintln(stdout, "/stacks/prod/a (script:0 job:0.0)> plan")
		if err := os.WriteFile(filepath.Join(root, "stacks/prod/a", runner.DefaultPlanJSONFile), planJSON, 0o644); err != nil {
			return err
		}
		recordTick(tickDir, runner.TickRecord{Stack: "stacks/prod/a", Phase: "done", Status: "succeeded", At: time.Now().UnixNano()})
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) && len(seenWhileRunning) == 0 {
			m.mu.Lock()
			for _, u := range m.updates {
				seenWhileRunning = append(seenWhileRunning, u.Stack+"="+string(u.Class))
			}
			m.mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
		// b never runs: terramate stops, as after another stack's failure.
		return errors.New("stopped")
	})
	if !slices.Equal(seenWhileRunning, []string{"stacks/prod/a=additive"}) {
		t.Fatalf("updates while terramate ran = %v, want a's additive class", seenWhileRunning)
	}
	if res.Stacks[0].Status != StatusSucceeded || res.Stacks[0].Class != events.ClassAdditive || res.Stacks[1].Status != StatusNotRun {
		t.Errorf("stacks = %+v", res.Stacks)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var aUpdates int
	for _, u := range m.updates {
		if u.Stack == "stacks/prod/a" {
			aUpdates++
		}
	}
	if aUpdates != 1 {
		t.Errorf("a was reported %d times, want once", aUpdates)
	}
	if len(m.phases) != 1 || m.phaseBatches != 1 || m.phases[0].Phase != "done" {
		t.Errorf("phases = %+v in %d batches, want the done tick relayed in one Phases request", m.phases, m.phaseBatches)
	}
}

// Without a server, a plan still classifies each stack when it ticks done, while terramate
// runs on. The stack's plan file is a named pipe: the driver opening it (to classify it)
// while the script runs is what the script waits for. A pipe is not a regular file, so that
// early look leaves the stack unclassified, and the run classifies it again at its end, from
// the plan written there by then.
func TestRunPlanOfflineClassifiesAsStacksFinish(t *testing.T) {
	c, err := runner.NewClient("")
	if err != nil {
		t.Fatal(err)
	}
	stacks := []string{"a"}
	root := runRepo(t, stacks)
	planJSON := recordedPlan(t, "create")
	planPath := filepath.Join(root, "stacks/prod/a", runner.DefaultPlanJSONFile)
	openedWhileRunning := false
	res := runPlanScripted(t, c, root, stacks, "", func(tickDir string, stdout io.Writer) error {
		if err := syscall.Mkfifo(planPath, 0o600); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "/stacks/prod/a (script:0 job:0.0)> plan")
		recordTick(tickDir, runner.TickRecord{Stack: "stacks/prod/a", Phase: "done", Status: "succeeded", At: time.Now().UnixNano()})
		// Opening a pipe's write end without blocking fails until someone reads it.
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if f, err := os.OpenFile(planPath, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				openedWhileRunning = true
				_ = f.Close()
				break
			}
		}
		if err := os.Remove(planPath); err != nil {
			return err
		}
		return os.WriteFile(planPath, planJSON, 0o644)
	})
	if !openedWhileRunning {
		t.Error("the driver did not look at the plan of a stack that ticked done while terramate ran")
	}
	if len(res.Stacks) != 1 || res.Stacks[0].Status != StatusSucceeded || res.Stacks[0].Class != events.ClassAdditive {
		t.Errorf("stacks = %+v, want a succeeded and additive", res.Stacks)
	}
}

// The pump's poster holds every post until the execution's Init was answered (the pump starts
// while Init is in flight), and gives up with the context.
func TestPumpPostsWaitForInit(t *testing.T) {
	m, c := memClient(t)
	announced := make(chan struct{})
	p := cancellingPoster{c: c, cancel: func(error) {}, announced: announced}
	chunk := events.LogChunk{ExecutionID: "e", Stack: "a", Data: []byte("x")}
	posted := make(chan error, 2)
	go func() { posted <- p.LogChunks(context.Background(), []events.LogChunk{chunk}) }()
	go func() { posted <- p.LogChunk(context.Background(), chunk) }()
	time.Sleep(50 * time.Millisecond)
	m.mu.Lock()
	early := len(m.logs)
	m.mu.Unlock()
	if early != 0 {
		t.Fatalf("%d chunks posted before Init was answered", early)
	}
	close(announced)
	for range 2 {
		if err := <-posted; err != nil {
			t.Fatal(err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.logs) != 2 {
		t.Fatalf("the server got %d chunks, want 2", len(m.logs))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := (cancellingPoster{c: c, cancel: func(error) {}, announced: make(chan struct{})}).LogChunk(ctx, chunk); !errors.Is(err, context.Canceled) {
		t.Fatalf("a post waiting for Init after its context ended: %v", err)
	}
}

// Discovery asks for the run graph while it asks why the stacks changed: a failure of either
// is the run's terramate error (why's first, the graph's call then stopped), and a panic in
// the graph's call is recovered by Run as any other.
func TestDiscoverAsksTheGraphAlongside(t *testing.T) {
	stacks := []string{"a", "b"}
	for _, c := range []struct {
		name     string
		why      error
		graph    func(ctx context.Context) error
		kind     string
		contains string
	}{
		{"why fails, graph waits for its end", errors.New("why broke"),
			func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, KindTerramate, "why broke"},
		{"graph fails", nil, func(context.Context) error { return errors.New("graph broke") }, KindTerramate, "graph broke"},
		{"graph panics", nil, func(context.Context) error { panic("graph boom") }, KindInternal, "graph boom\n\n[raised in another goroutine]"},
		{"graph panics, why fails", errors.New("why broke"), func(context.Context) error { panic("graph boom") }, KindInternal, "graph boom"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, cl := memClient(t)
			root := runRepo(t, stacks)
			base := scriptedTerramate(stacks, func(context.Context, io.Writer, io.Writer) error { return nil })
			exec := func(ctx context.Context, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
				switch {
				case len(args) > 2 && args[2] == "--why" && c.why != nil:
					return c.why
				case len(args) > 1 && args[0] == "experimental":
					return c.graph(ctx)
				}
				return base(ctx, name, args, dir, env, stdout, stderr)
			}
			res := runPlanWith(t, cl, root, exec, false)
			if res.Error == nil || res.Error.Kind != c.kind || res.Error.Step != "discover" || !strings.Contains(res.Error.Tail, c.contains) {
				t.Fatalf("error = %+v, want %s in discover naming %q", res.Error, c.kind, c.contains)
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			if len(m.inits) != 0 {
				t.Fatalf("a run that failed discovery announced itself: %v", m.inits)
			}
		})
	}
}

// The list, the reasons and the run graph are asked for at once: each call here waits until
// all three have started (a driver asking one after another would wait out the 10 s guard
// and fail). When the list fails or is empty, the other two are stopped, not waited out.
func TestDiscoverRunsItsThreeCallsAtOnce(t *testing.T) {
	kind := func(args []string) string {
		switch {
		case slices.Equal(args, []string{"list", "--changed"}):
			return "list"
		case len(args) > 2 && args[2] == "--why":
			return "why"
		case len(args) > 1 && args[0] == "experimental":
			return "graph"
		}
		return ""
	}
	t.Run("at once", func(t *testing.T) {
		stacks := []string{"a", "b"}
		var mu sync.Mutex
		started := map[string]bool{}
		all := make(chan struct{})
		base := scriptedTerramate(stacks, func(context.Context, io.Writer, io.Writer) error { return nil })
		exec := func(ctx context.Context, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
			if k := kind(args); k != "" {
				mu.Lock()
				started[k] = true
				if len(started) == 3 {
					close(all)
				}
				mu.Unlock()
				select {
				case <-all:
				case <-time.After(10 * time.Second):
					return fmt.Errorf("%s: the other calls did not start alongside", k)
				}
			}
			return base(ctx, name, args, dir, env, stdout, stderr)
		}
		root := runRepo(t, stacks)
		res := runPlanWith(t, nil, root, exec, true)
		if res.Error != nil || len(res.Stacks) != 2 || len(res.Stacks[0].Why) != 1 {
			t.Fatalf("error %+v, stacks %+v", res.Error, res.Stacks)
		}
	})
	for _, c := range []struct {
		name   string
		listed []string
		list   error
	}{
		{"nothing listed", nil, nil},
		{"the list fails", []string{"a"}, errors.New("list broke")},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			stopped := map[string]bool{}
			base := scriptedTerramate(c.listed, func(context.Context, io.Writer, io.Writer) error { return nil })
			exec := func(ctx context.Context, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
				switch k := kind(args); k {
				case "list":
					if c.list != nil {
						return c.list
					}
				case "why", "graph":
					select {
					case <-ctx.Done():
						mu.Lock()
						stopped[k] = true
						mu.Unlock()
						return ctx.Err()
					case <-time.After(10 * time.Second):
						return fmt.Errorf("%s was not stopped", k)
					}
				}
				return base(ctx, name, args, dir, env, stdout, stderr)
			}
			root := runRepo(t, []string{"a"})
			res := runPlanWith(t, nil, root, exec, false)
			if c.list != nil {
				if res.Error == nil || res.Error.Step != "discover" || !strings.Contains(res.Error.Tail, "list broke") {
					t.Fatalf("error = %+v, want the list's failure in discover", res.Error)
				}
			} else if res.Error != nil || len(res.Stacks) != 0 || res.Class != events.ClassNoChanges {
				t.Fatalf("error %+v, stacks %+v, class %q; want a run with nothing to do, of class no-changes", res.Error, res.Stacks, res.Class)
			}
			mu.Lock()
			defer mu.Unlock()
			if !stopped["why"] || !stopped["graph"] {
				t.Fatalf("stopped %v: the reasons and the graph must be stopped", stopped)
			}
		})
	}
}

// A run whose graph or reasons exceed what the server takes in one Init announces what fits,
// marks the edges approximate and says so, instead of having its Init refused whole.
func TestRunClipsWhatInitCannotCarry(t *testing.T) {
	var stacks []string
	for i := range 320 { // 51,040 edges between them
		stacks = append(stacks, fmt.Sprintf("s%03d", i))
	}
	base := scriptedTerramate(stacks, func(context.Context, io.Writer, io.Writer) error { return nil })
	exec := func(ctx context.Context, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
		switch {
		case len(args) > 1 && args[0] == "experimental":
			var b strings.Builder
			b.WriteString("digraph {\n")
			for i, s := range stacks {
				fmt.Fprintf(&b, "\tn%d[label=\"/stacks/prod/%s\"];\n", i, s)
			}
			for i := range stacks {
				for j := i + 1; j < len(stacks); j++ {
					fmt.Fprintf(&b, "\tn%d -> n%d;\n", i, j)
				}
			}
			b.WriteString("}\n")
			_, err := io.WriteString(stdout, b.String())
			return err
		case len(args) > 2 && args[2] == "--why":
			for i := range maxInitReasons + 1 {
				fmt.Fprintf(stdout, "%s - stack has unmerged changes\n", stacks[i%len(stacks)])
			}
			return nil
		}
		return base(ctx, name, args, dir, env, stdout, stderr)
	}
	m, cl := memClient(t)
	root := runRepo(t, stacks)
	res := runPlanWith(t, cl, root, exec, false)
	// The script writes no plans: the run fails in classify, after Init.
	if res.Error == nil || res.Error.Step == "discover" || len(res.Edges) != 320*319/2 {
		t.Fatalf("error %+v, %d edges in the result", res.Error, len(res.Edges))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	in, ok := m.inits[res.Execution]
	if !ok || len(in.Edges) != maxInitEdges || !in.EdgesApproximate || len(in.Reasons) != maxInitReasons || len(in.Stacks) != 320 {
		t.Fatalf("init stored %v: %d edges (approximate %v), %d reasons, %d stacks", ok, len(in.Edges), in.EdgesApproximate, len(in.Reasons), len(in.Stacks))
	}
	if w := strings.Join(res.Warnings, "\n"); !strings.Contains(w, "edges are more than the server takes") || !strings.Contains(w, "change reasons are more than") {
		t.Fatalf("warnings %q", res.Warnings)
	}
}

// startedLineRE is the line startedStack recognizes, as a regular expression.
var startedLineRE = regexp.MustCompile(`^/(.*) \(script:\d+ job:\d+\.\d+\)> `)

// startedStack agrees with startedLineRE on every line: whether it matches, and the stack.
func FuzzStartedStack(f *testing.F) {
	for _, seed := range []string{
		"/stacks/prod/network (script:0 job:0.0)> bash -c echo plan",
		"/ (script:0 job:0.0)> x",
		"/a (script:1 job:2.3)> echo /b (script:4 job:5.6)> y",
		"/a (script:1 job:2.3)> echo (script:x job:5.6)> y",
		"/a (script:12 job:2.)> x",
		"/a (script: job:2.3)> x",
		"/a (script:1 job:2.3)>x",
		"a (script:1 job:2.3)> x",
		"/dir with spaces (script:0 job:0.1)> tfstackplan run tick",
		"/\xff\xfe (script:0 job:0.0)> \x00",
		"> execution failed: running x (in /a): boom",
		"",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		got, ok := startedStack(line)
		m := startedLineRE.FindStringSubmatch(line)
		if ok != (m != nil) || (ok && got != m[1]) {
			t.Fatalf("startedStack(%q) = %q, %v; the expression says %q", line, got, ok, m)
		}
	})
}

// heldInitClient is memClient with a server that holds its answers to Init until hold is
// closed.
func heldInitClient(t *testing.T) (*memServer, *runner.Client, chan struct{}) {
	t.Helper()
	m, c := memClient(t)
	hold := make(chan struct{})
	m.mu.Lock()
	m.initHold = hold
	m.mu.Unlock()
	return m, c, hold
}

// Init goes out as the scripts start, and nothing else for the execution before its answer:
// the server holds Init's answer until the script has begun and has written its log, plan and
// done tick. A driver that waited for Init before starting terramate would see Init time out
// here (a warning); one that did not wait for the answer before posting would have its phases,
// updates or logs arrive first.
func TestRunSendsInitAsTheScriptsStart(t *testing.T) {
	m, c, hold := heldInitClient(t)
	stacks := []string{"a"}
	root := runRepo(t, stacks)
	planJSON := recordedPlan(t, "create")
	const relay = 100 * time.Millisecond // the relay looks several times while Init is held
	res := runScriptedWith(t, c, root, stacks, OpPlan, "", func(o *RunOptions) { o.TickRelay = relay }, func(_, tickDir string, stdout io.Writer) error {
		fmt.Fprintln(stdout, "/stacks/prod/a (script:0 job:0.0)> plan")
		dir := filepath.Join(root, "stacks/prod/a")
		if err := os.WriteFile(filepath.Join(dir, runner.DefaultLogFile), []byte("planning a\n"), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, runner.DefaultPlanJSONFile), planJSON, 0o644); err != nil {
			return err
		}
		recordTick(tickDir, runner.TickRecord{Stack: "stacks/prod/a", Phase: "done", Status: "succeeded", At: time.Now().UnixNano()})
		// The relay and the pump have had something to send for a while (the pump's chunk is
		// due Coalesce, 250 ms, after it was read); Init's attempt (500 ms) has not timed out.
		time.Sleep(3*relay + 50*time.Millisecond)
		close(hold)
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			m.mu.Lock()
			n := len(m.phases)
			m.mu.Unlock()
			if n > 0 {
				break
			}
		}
		return nil
	})
	if len(res.Warnings) != 0 || res.Error != nil {
		t.Fatalf("warnings %q, error %+v; want a clean run", res.Warnings, res.Error)
	}
	if len(res.Stacks) != 1 || res.Stacks[0].Class != events.ClassAdditive {
		t.Errorf("stacks = %+v, want a additive", res.Stacks)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	answered := slices.Index(m.arrivals, "answered /init")
	if answered < 0 {
		t.Fatalf("Init was never answered: %q", m.arrivals)
	}
	for i, a := range m.arrivals {
		if i < answered && a != "/events/init" {
			t.Errorf("%s arrived before Init was answered: %q", a, m.arrivals)
		}
	}
	if len(m.phases) == 0 || len(m.updates) == 0 || len(m.logs) == 0 || len(m.finals) != 1 {
		t.Errorf("phases %d, updates %d, log chunks %d, finals %d; want all sent", len(m.phases), len(m.updates), len(m.logs), len(m.finals))
	}
}

// panicOn is an HTTP transport that panics on requests for path and passes the others on.
type panicOn struct {
	path string
	next http.RoundTripper
}

func (p panicOn) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Path == p.path {
		panic("boom in Init")
	}
	return p.next.RoundTrip(req)
}

// A panic while sending Init (in flight as the scripts start) stops the scripts at once, is
// the run's internal error at step init, and leaves nothing but Finalize to be sent.
func TestRunInitPanicStopsTheRun(t *testing.T) {
	m, c := memClient(t)
	if err := c.SetTransport(panicOn{path: "/api/v1/events/init", next: http.DefaultTransport}); err != nil {
		t.Fatal(err)
	}
	stacks := []string{"a"}
	root := runRepo(t, stacks)
	stopped := false
	script := func(ctx context.Context, stdout, _ io.Writer) error {
		fmt.Fprintln(stdout, "/stacks/prod/a (script:0 job:0.0)> plan")
		if err := os.WriteFile(filepath.Join(root, "stacks/prod/a", runner.DefaultLogFile), []byte("planning a\n"), 0o644); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			stopped = true
			return ctx.Err()
		case <-time.After(20 * time.Second):
			return nil
		}
	}
	res := Run(context.Background(), RunOptions{
		Op: OpPlan, Environment: "prod", WorkDir: root, Dir: filepath.Join(root, "stacks/prod"), Client: c,
		ResultPath: filepath.Join(t.TempDir(), "r.json"), SHA: "abc",
		Terramate: &runner.Terramate{Exec: scriptedTerramate(stacks, script)},
		Getenv:    func(string) string { return "" },
	})
	if !stopped {
		t.Error("the script run was not stopped after Init panicked")
	}
	if res.Error == nil || res.Error.Kind != KindInternal || res.Error.Step != "init" || !strings.Contains(res.Error.Tail, "boom in Init") {
		t.Fatalf("error = %+v, want internal at init naming the panic", res.Error)
	}
	// The pump stopped posting at once, rather than retrying until the drain gave up on it.
	if len(res.Warnings) != 0 {
		t.Errorf("warnings %q, want none", res.Warnings)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.inits) != 0 || len(m.phases) != 0 || len(m.updates) != 0 || len(m.logs) != 0 {
		t.Errorf("inits %d, phases %d, updates %d, log chunks %d; want none", len(m.inits), len(m.phases), len(m.updates), len(m.logs))
	}
	if len(m.finals) != 1 || m.finals[0].Status != events.ExecutionFailed {
		t.Errorf("finals = %+v, want one failed Finalize", m.finals)
	}
}

// Without a tick directory (it could not be made) the scripts' ticks go to the server
// themselves, so the scripts start only once the server has answered Init: the server holds
// that answer a while, and the script finds the execution announced when it starts.
func TestRunWithoutTickDirWaitsForInit(t *testing.T) {
	m, c, hold := heldInitClient(t)
	time.AfterFunc(300*time.Millisecond, func() { close(hold) }) // within Init's first attempt
	t.Setenv("TMPDIR", filepath.Join(t.TempDir(), "missing"))
	stacks := []string{"a"}
	root := runRepo(t, stacks)
	announced := false
	res := runScripted(t, c, root, stacks, OpPlan, "", func(_, tickDir string, stdout io.Writer) error {
		if tickDir != "" {
			return fmt.Errorf("tick dir %q, want none", tickDir)
		}
		m.mu.Lock()
		announced = len(m.inits) == 1
		m.mu.Unlock()
		fmt.Fprintln(stdout, "/stacks/prod/a (script:0 job:0.0)> plan")
		return nil
	})
	if !announced {
		t.Error("the scripts started before the server answered Init, with ticks going to it directly")
	}
	if len(res.Warnings) == 0 || !strings.Contains(res.Warnings[0], "ticks:") {
		t.Errorf("warnings %q, want the tick directory's failure", res.Warnings)
	}
}

// A server that never answers Init is said to be so first, when the relay first waits for
// Init's answer while the scripts run, not after the phases it then could not send either.
func TestRunSaysInitFailedFirst(t *testing.T) {
	_, c, _ := heldInitClient(t) // never answered
	stacks := []string{"a"}
	root := runRepo(t, stacks)
	res := runPlanScripted(t, c, root, stacks, "", func(tickDir string, stdout io.Writer) error {
		fmt.Fprintln(stdout, "/stacks/prod/a (script:0 job:0.0)> plan")
		recordTick(tickDir, runner.TickRecord{Stack: "stacks/prod/a", Phase: "plan", At: time.Now().UnixNano()})
		// Init's call budget, and a relay interval for the tick to be posted after it.
		time.Sleep(runner.CallBudget + 2*TickRelayInterval)
		return nil
	})
	if len(res.Warnings) < 2 || !strings.HasPrefix(res.Warnings[0], "Init not reported") || !strings.HasPrefix(res.Warnings[1], "Phase not reported") {
		t.Fatalf("warnings %q; want Init's failure, then the phase's", res.Warnings)
	}
}

// In GitHub Actions a failed stack is an ::error:: annotation and each warning a ::warning::
// one, after the script run's folded output; what they quote is escaped, so that a server's
// or a script's text cannot become a workflow command.
func TestRunAnnotatesFailuresAndWarnings(t *testing.T) {
	_, c, _ := heldInitClient(t) // never answered: warnings
	stacks := []string{"a", "b"}
	root := runRepo(t, stacks)
	var out strings.Builder
	tm := scriptedTerramate(stacks, func(_ context.Context, stdout, _ io.Writer) error {
		fmt.Fprintln(stdout, "/stacks/prod/b (script:0 job:0.0)> plan")
		fmt.Fprintln(stdout, "Error: one or more commands failed")
		fmt.Fprintln(stdout, "> execution failed: running /usr/bin/bash -c plan (in /stacks/prod/b): exit status 1")
		return errors.New("exit status 1")
	})
	res := Run(context.Background(), RunOptions{
		Op: OpPlan, Environment: "prod", WorkDir: root, Dir: filepath.Join(root, "stacks/prod"), Client: c,
		ResultPath: filepath.Join(t.TempDir(), "r.json"), SHA: "abc", Stdout: &out, Stderr: io.Discard,
		Terramate: &runner.Terramate{Exec: tm},
		Getenv: func(k string) string {
			if k == "GITHUB_ACTIONS" {
				return "true"
			}
			return ""
		},
	})
	if len(res.Warnings) == 0 {
		t.Fatal("no warnings: the test needs some")
	}
	s := out.String()
	end := strings.Index(s, "::endgroup::")
	if end < 0 {
		t.Fatalf("no folded group in %q", s)
	}
	after := s[end:]
	for _, w := range res.Warnings {
		want := "::warning title=tfstackplan plan::" + escapeData(w) + "\n"
		if !strings.Contains(after, want) {
			t.Errorf("no %q after the group in %q", want, after)
		}
	}
	if !strings.Contains(after, "::error title=tfstackplan plan%3A ") {
		t.Errorf("no ::error:: annotation after the group in %q", after)
	}
	if got := escapeData("x\n::add-mask::y%"); got != "x%0A::add-mask::y%25" {
		t.Errorf("escapeData = %q", got)
	}
}

// An Init larger than one request carries loses edges first (then marked approximate), then
// reasons, never stacks; one that fits is left alone.
func TestFitInit(t *testing.T) {
	in := events.Init{ExecutionID: "e", Environment: "prod", Op: "plan"}
	for i := range 40 {
		s := fmt.Sprintf("stacks/%s/%02d", strings.Repeat("p", 40), i)
		in.Stacks = append(in.Stacks, s)
		in.Edges = append(in.Edges, events.Edge{From: s, To: s + "/x"})
		in.Reasons = append(in.Reasons, events.ChangeReason{Stack: s, Raw: s + " - stack has unmerged changes"})
	}
	size := func(in events.Init) int { b, _ := json.Marshal(in); return len(b) }
	whole := in
	if _, cut, _ := fitInit(&whole, size(in)); cut || len(whole.Edges) != 40 || whole.EdgesApproximate {
		t.Fatalf("an Init that fits was cut: %d edges", len(whole.Edges))
	}
	noEdges := in
	noEdges.Edges = nil
	for _, c := range []struct {
		name  string
		limit int
	}{
		{"edges go", size(noEdges) + 200},
		{"then reasons", size(noEdges) - 1000},
		{"stacks stay", 10},
	} {
		got := in
		body, cut, err := fitInit(&got, c.limit)
		if err != nil || len(body) != size(got) {
			t.Fatalf("%s: %d bytes returned for a %d-byte Init: %v", c.name, len(body), size(got), err)
		}
		if !cut {
			t.Fatalf("%s: nothing cut", c.name)
		}
		if len(got.Stacks) != 40 || (len(got.Reasons) < 40 && len(got.Edges) > 0) || !got.EdgesApproximate {
			t.Fatalf("%s: %d stacks, %d edges, %d reasons, approximate %v", c.name, len(got.Stacks), len(got.Edges), len(got.Reasons), got.EdgesApproximate)
		}
		if s := size(got); s > c.limit && (len(got.Edges) > 0 || len(got.Reasons) > 0) {
			t.Fatalf("%s: %d bytes, over %d with something left to cut", c.name, s, c.limit)
		}
	}
}

// A Finalize gets CleanupBudget plus what each of its attempts is given for its size: about
// 6 s more per attempt for 10,000 stacks (1.5 MB), next to nothing for a few.
func TestFinalizeBudgetGrowsWithItsSize(t *testing.T) {
	small := events.Finalize{ExecutionID: "e", Status: "succeeded", Stacks: []events.StackResult{{Stack: "a", Status: "succeeded"}}}
	sb, _ := json.Marshal(small)
	if d := finalizeBudget(len(sb)); d < CleanupBudget || d > CleanupBudget+100*time.Millisecond {
		t.Fatalf("a small Finalize gets %v, want about %v", d, CleanupBudget)
	}
	big := events.Finalize{ExecutionID: "e", Status: "succeeded"}
	for i := range 10000 {
		big.Stacks = append(big.Stacks, events.StackResult{Stack: fmt.Sprintf("stacks/platform/region-%02d/service-%05d", i%20, i), Status: "succeeded", Class: "no-changes", PlanHash: "v1:" + strings.Repeat("0", 64)})
	}
	b, _ := json.Marshal(big)
	perAttempt := time.Duration(int64(len(b)) * int64(time.Second) / runner.SlowestUpload)
	if d := finalizeBudget(len(b)); d != CleanupBudget+runner.MaxAttempts*perAttempt || perAttempt < 4*time.Second {
		t.Fatalf("a %d-byte Finalize gets %v (%v per attempt)", len(b), d, perAttempt)
	}
}
