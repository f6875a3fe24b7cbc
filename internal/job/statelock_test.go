package job

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tfstackplan/tfstackplan/runner"
)

// unlockError is what tofu prints when it fails to release its own lock (clistate's
// UnlockErrorMessage around a LockError that names the lock).
const unlockError = "\nError: Error releasing the state lock\n\nError message: lock ID mismatch\nLock Info:\n  ID:        11111111-2222-3333-4444-555555555555\n  Path:      terraform.tfstate\n\nOpenTofu acquires a lock when accessing your state...\n"

// The lock ID comes from tofu's failure to release its own lock or, for a killed stack, the
// local backend's lock file. The ID of a lock tofu failed to acquire (another run's: recorded
// from the real tofu) is never taken, nor anything unfit for a command line.
func TestLockIDs(t *testing.T) {
	acquire, err := os.ReadFile("../../testdata/tofu/_cli/plan-locked-0s.stderr")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(acquire), "Lock Info:") {
		t.Fatal("the recorded lock error has no Lock Info block")
	}
	if got := lockIDInLog(acquire); got != "" {
		t.Errorf("lock ID taken from a failure to acquire (another run's lock): %q", got)
	}
	if got := lockIDInLog([]byte(unlockError)); got != "11111111-2222-3333-4444-555555555555" {
		t.Errorf("lock ID of a failure to release = %q", got)
	}
	if got := lockIDInLog([]byte("Error releasing the state lock\n" + string(acquire))); got != "" {
		t.Errorf("a Lock Info block after a later failure to acquire was taken: %q", got)
	}
	for _, log := range []string{
		"",
		"ID: not-in-a-lock-block\n",
		"Error releasing the state lock\nLock Info:\n  ID:        $(touch /tmp/pwned)\n",
		"Error releasing the state lock\nLock Info:\n  ID:        a;b\n",
		"Error releasing the state lock\nLock Info:\n  Path: terraform.tfstate\n",
	} {
		if got := lockIDInLog([]byte(log)); got != "" {
			t.Errorf("lockIDInLog(%q) = %q, want none", log, got)
		}
	}
	file := `{"ID":"5c1f0d5e-27c2-2d5b-1e0a-0e3c7c0b8a11","Operation":"OperationTypePlan","Info":"","Who":"root@vm","Version":"1.12.6","Created":"2026-12-04T15:00:00Z","Path":"terraform.tfstate"}`
	if got := lockIDInFile([]byte(file)); got != "5c1f0d5e-27c2-2d5b-1e0a-0e3c7c0b8a11" {
		t.Errorf("lock file ID = %q", got)
	}
	for _, f := range []string{"", "garbage", `{"ID":""}`, `{"ID":"x y"}`, `{"ID":"` + strings.Repeat("a", 129) + `"}`} {
		if got := lockIDInFile([]byte(f)); got != "" {
			t.Errorf("lockIDInFile(%q) = %q, want none", f, got)
		}
	}
	if got := shellWord("prod"); got != "prod" {
		t.Errorf("shellWord(prod) = %q", got)
	}
	if got := shellWord("it's $prod"); got != `'it'\''s $prod'` {
		t.Errorf("shellWord = %q", got)
	}
}

// An interrupt during the plan: the result names the plan step (not the classification that
// ran after it). When terramate's processes were killed after the interrupt grace, every stack
// caught mid-script may hold its lock: the result gives the ID (from tofu's failure to release
// it, else the local backend's lock file) and the command that releases it, or says the ID is
// unknown; a stack that never started holds nothing. When they stopped by themselves, tofu
// released its locks: only a stack whose log says it failed to is named.
func TestRunInterruptNamesStepAndLocks(t *testing.T) {
	for _, killed := range []bool{true, false} {
		t.Run(fmt.Sprintf("killed=%v", killed), func(t *testing.T) {
			stacks := []string{"a", "b", "c", "d"}
			root := runRepo(t, stacks)
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			res := Run(ctx, RunOptions{
				Op: OpPlan, Environment: "prod", WorkDir: root, Dir: filepath.Join(root, "stacks/prod"),
				ResultPath: filepath.Join(t.TempDir(), "r.json"), SHA: "abc",
				Terramate: &runner.Terramate{Exec: scriptedTerramate(stacks, func(ctx context.Context, stdout, _ io.Writer) error {
					for _, s := range []string{"a", "b", "c"} {
						fmt.Fprintf(stdout, "/stacks/prod/%s (script:0 job:0.0)> tofu plan\n", s)
					}
					for _, f := range []struct{ stack, name, content string }{
						{"a", runner.DefaultLogFile, unlockError},
						{"b", localLockFile, `{"ID":"b-lock-id"}`},
						{"c", runner.DefaultLogFile, "Stopping operation...\n"},
					} {
						if err := os.WriteFile(filepath.Join(root, "stacks/prod", f.stack, f.name), []byte(f.content), 0o644); err != nil {
							return err
						}
					}
					cancel(runner.SignalCause{Signal: syscall.SIGINT})
					<-ctx.Done()
					if killed {
						return fmt.Errorf("%w after 6s: %w", runner.ErrKilledAfterGrace, ctx.Err())
					}
					return ctx.Err()
				})},
				Getenv: func(string) string { return "" },
			})
			if res.Error == nil || res.Error.Kind != KindCancelled || res.Error.Step != "plan" {
				t.Fatalf("error = %+v, want cancelled in plan", res.Error)
			}
			lockOf := map[string]*StateLock{}
			for _, e := range res.Stacks {
				lockOf[e.Path] = e.Lock
			}
			const aID = "11111111-2222-3333-4444-555555555555"
			if l := lockOf["stacks/prod/a"]; l == nil || l.ID != aID || l.Command != "tfstackplan run plan --environment prod --force-unlock "+aID {
				t.Errorf("stack a's lock = %+v", l)
			}
			if !strings.Contains(res.Error.Tail, "stack stacks/prod/a may hold state lock "+aID+"; release it with: tfstackplan run plan --environment prod --force-unlock "+aID) {
				t.Errorf("error tail lacks stack a's lock:\n%s", res.Error.Tail)
			}
			if l := lockOf["stacks/prod/d"]; l != nil {
				t.Errorf("stack d never started, yet lock = %+v", l)
			}
			b, c := lockOf["stacks/prod/b"], lockOf["stacks/prod/c"]
			if !killed {
				if b != nil || c != nil {
					t.Errorf("stopped by themselves, yet b's lock = %+v, c's = %+v", b, c)
				}
				return
			}
			if b == nil || b.ID != "b-lock-id" || !strings.Contains(res.Error.Tail, "stack stacks/prod/b may hold state lock b-lock-id") {
				t.Errorf("stack b's lock = %+v; tail:\n%s", b, res.Error.Tail)
			}
			if c == nil || c.ID != "" || c.Command != "" || !strings.Contains(res.Error.Tail, "stack stacks/prod/c was interrupted and may hold its state lock") {
				t.Errorf("stack c's lock = %+v; tail:\n%s", c, res.Error.Tail)
			}
		})
	}
}

// A stack that fails after the interrupt (tofu exits 1 with "execution halted") was stopped by
// it: cancelled. One that had failed before stays failed, as does every failure of a run that
// was not interrupted.
func TestOutcomeFailedAfterInterruptIsCancelled(t *testing.T) {
	failed := map[string]bool{"a": true, "b": true}
	started := map[string]bool{"a": true, "b": true}
	o := scriptOutcome{started: started, failed: failed, cancelled: true, failedBefore: map[string]bool{"a": true}}
	if got := o.status("a", false); got != StatusFailed {
		t.Errorf("failed before the interrupt: %s", got)
	}
	if got := o.status("b", false); got != StatusCancelled {
		t.Errorf("failed after the interrupt: %s", got)
	}
	o = scriptOutcome{started: started, failed: failed}
	if got := o.status("b", false); got != StatusFailed {
		t.Errorf("failed in a run not interrupted: %s", got)
	}
	w := newScriptWatcher(io.Discard)
	fmt.Fprintln(w, "> execution failed: running tofu plan (in /a): exit status 1")
	w.interrupt()
	fmt.Fprintln(w, "> execution failed: running tofu plan (in /b): exit status 1")
	if before := w.failedBefore(); !before["a"] || before["b"] {
		t.Errorf("failed at the interrupt = %v, want only a", before)
	}
}
