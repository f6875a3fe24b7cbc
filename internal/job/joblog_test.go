package job

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/testkit"
	"github.com/tfstackplan/tfstackplan/runner"
)

// In GitHub Actions the job's log has a line per stack as it starts and as it ends (status,
// class, seconds), each stack's own log, masked, as its own collapsed group that no line of it
// can end or turn into a workflow command, and terramate's interleaved stream only at the end,
// in one collapsed group.
func TestJobLogInActions(t *testing.T) {
	stacks := []string{"a", "b", "c"}
	root := runRepo(t, stacks)
	plan := recordedPlan(t, "create")
	var out testkit.SyncBuffer
	env := map[string]string{"GITHUB_ACTIONS": "true", "RUNNER_TEMP": t.TempDir()}
	res := runScriptedWith(t, nil, root, stacks, OpPlan, "", func(o *RunOptions) {
		o.Stdout, o.TickRelay = &out, 10*time.Millisecond
		o.Getenv = func(k string) string { return env[k] }
	}, func(_, tickDir string, stdout io.Writer) error {
		dir := func(s string) string { return filepath.Join(root, "stacks/prod", s) }
		fmt.Fprintln(stdout, "/stacks/prod/a (script:0 job:0.0)> tofu plan")
		fmt.Fprintln(stdout, "/stacks/prod/b (script:0 job:0.0)> tofu plan")
		must(t, os.WriteFile(filepath.Join(dir("a"), runner.DefaultLogFile), []byte("::add-mask::hunter2-secret\nPlan: 1 to add (password hunter2-secret)\n::endgroup::\n::error::forged by the log\n"), 0o644))
		must(t, os.WriteFile(filepath.Join(dir("a"), runner.DefaultPlanJSONFile), plan, 0o644))
		recordTick(tickDir, runner.TickRecord{Stack: "stacks/prod/a", Phase: "done", Status: "succeeded", At: time.Now().UnixNano()})
		// a's end comes from its tick, before terramate's run is over.
		for deadline := time.Now().Add(20 * time.Second); !strings.Contains(out.String(), "stacks/prod/a  plan  succeeded"); {
			if time.Now().After(deadline) {
				return fmt.Errorf("stack a's end was not printed while the run went on:\n%s", out.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
		must(t, os.WriteFile(filepath.Join(dir("b"), runner.DefaultLogFile), []byte("Error: boom\n"), 0o644))
		fmt.Fprintln(stdout, "> execution failed: running tofu plan (in /stacks/prod/b): exit status 1")
		return fmt.Errorf("%w: exit status 1", runner.ErrScriptFailed)
	})
	if res.Error == nil || res.Error.Kind != KindScript {
		t.Fatalf("error = %+v, want the script's failure", res.Error)
	}
	log := out.String()
	for _, re := range []string{
		`(?m)^\[ /3\] stacks/prod/a  plan  started$`,
		`(?m)^\[ /3\] stacks/prod/b  plan  started$`,
		`(?m)^\[1/3\] stacks/prod/a  plan  succeeded  additive  \d+ s$`,
		`(?m)^\[2/3\] stacks/prod/b  plan  failed  \d+ s$`,
		`(?m)^::group::stacks/prod/a \(plan, succeeded\)\n::stop-commands::(\w+)\n::add-mask::\*\*\*\nPlan: 1 to add \(password \*\*\*\)\n::endgroup::\n::error::forged by the log\n::(\w+)::\n::endgroup::$`,
		`(?m)^::group::stacks/prod/b \(plan, failed\)\n::stop-commands::\w+\nError: boom\n::\w+::\n::endgroup::$`,
		`(?m)^::group::terramate script run plan \(prod, 3 stacks\): terramate's own output\n::stop-commands::\w+\n/stacks/prod/a \(script:0 job:0.0\)> tofu plan\n`,
	} {
		if !regexp.MustCompile(re).MatchString(log) {
			t.Errorf("the job's log lacks %s:\n%s", re, log)
		}
	}
	if m := regexp.MustCompile(`::stop-commands::(\w+)\n::add-mask::\*\*\*\nPlan: 1 to add[^\n]*\n::endgroup::\n::error::forged by the log\n::(\w+)::`).FindStringSubmatch(log); m == nil || m[1] != m[2] {
		t.Errorf("stack a's log is not kept from becoming workflow commands: %v", m)
	}
	if strings.Contains(log, "hunter2-secret\n") || strings.Contains(log, "(password hunter2") {
		t.Errorf("a masked value was printed:\n%s", log)
	}
	rawAt := strings.Index(log, "terramate's own output")
	if i := strings.Index(log, "/stacks/prod/a (script:0"); i < rawAt {
		t.Errorf("terramate's stream was printed before its group at the end:\n%s", log)
	}
	if strings.Contains(log, "::::") {
		t.Errorf("an empty workflow command was printed:\n%s", log)
	}
	if strings.Contains(log, "stacks/prod/c  plan") {
		t.Errorf("stack c never started, yet has a line:\n%s", log)
	}
}

// On a terminal the stack lines sit under a status line that is redrawn, and terramate's
// stream goes to a file the run names (kept), with no workflow commands.
func TestJobLogOnTerminal(t *testing.T) {
	stacks := []string{"a"}
	root := runRepo(t, stacks)
	var out testkit.SyncBuffer
	runScriptedWith(t, nil, root, stacks, OpPlan, "", func(o *RunOptions) {
		o.Stdout, o.Terminal = &out, true
	}, func(_, tickDir string, stdout io.Writer) error {
		fmt.Fprintln(stdout, "/stacks/prod/a (script:0 job:0.0)> tofu plan")
		fmt.Fprintln(stdout, "> execution failed: running tofu plan (in /stacks/prod/a): exit status 1")
		return fmt.Errorf("%w: exit status 1", runner.ErrScriptFailed)
	})
	log := out.String()
	m := regexp.MustCompile(`tfstackplan: terramate's own output: (\S+)\n`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("the raw stream's file is not named:\n%q", log)
	}
	if raw, err := os.ReadFile(m[1]); err != nil || !bytes.Contains(raw, []byte("/stacks/prod/a (script:0 job:0.0)> tofu plan")) {
		t.Errorf("the raw stream's file: %v %q", err, raw)
	}
	os.Remove(m[1])
	for _, want := range []string{
		"[ /1] stacks/prod/a  plan  started\n0/1 done; running: stacks/prod/a",
		"\r\x1b[K[1/1] stacks/prod/a  plan  failed  0 s\n",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the terminal output lacks %q:\n%q", want, log)
		}
	}
	if strings.Contains(log, "::group::") || strings.Contains(log, "/stacks/prod/a (script:0") {
		t.Errorf("workflow commands or the raw stream on a terminal:\n%q", log)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
