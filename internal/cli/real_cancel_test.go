package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/job"
)

// TestRealToolsCancel cancels `run plan` as GitHub Actions does (SIGINT, then SIGTERM), with the
// REAL terramate and OpenTofu, opt-in like TestRealToolsPlanApply. The stack's plan evaluates a
// slow local, so the interrupt lands while tofu holds the state lock:
//   - with an interrupt grace longer than the plan, tofu stops by itself and releases the lock:
//     the run ends cancelled in step plan (exit 130) and names no lock;
//   - with a grace shorter than the plan, tofu is killed holding the lock: the result names the
//     lock's ID (from the local backend's lock file) and the command that releases it, and that
//     command, run as given, plans the stack and releases the lock.
func TestRealToolsCancel(t *testing.T) {
	rt := newRealTools(t)
	const slowStack = "stacks/prod/slow"
	proj, write := rt.project(map[string]string{slowStack: "name = \"slow\"\n  id   = \"slow\""},
		map[string]string{slowStack: `resource "terraform_data" "seed" { input = 700 }` + "\n"})
	rt.mustRun(proj, "git", "checkout", "-qb", "feature")
	// The slow local depends on the seed's output: unknown (and so instant) while tofu validates,
	// slow in the plan walk, with the state locked.
	write(slowStack+"/main.tf", `resource "terraform_data" "seed" { input = 700 }
locals {
  slow = sum(flatten([for i in range(terraform_data.seed.output) : [for j in range(terraform_data.seed.output) : i * j]]))
}
resource "terraform_data" "a" {
  input = local.slow
}
`)
	rt.mustRun(proj, "git", "commit", "-qam", "slow")
	stackDir := filepath.Join(proj, slowStack)
	lockFile := filepath.Join(stackDir, ".terraform.tfstate.lock.info")

	// cancel runs `run plan` with grace, and once the plan walk began sends SIGINT, then SIGTERM a
	// second later (GitHub's cadence, compressed), and returns the exit code, result and output.
	cancel := func(name, grace string) (int, *job.Result, string) {
		t.Helper()
		resPath := filepath.Join(rt.work, name+".json")
		logFile := filepath.Join(stackDir, "tfstackplan.log")
		must(t, os.RemoveAll(logFile)) // the wait below must see this run's log
		var out bytes.Buffer
		cmd := rt.command(&out, proj, "tfstackplan", "run", "plan", "-e", "prod", "--pr", "1", "--result", resPath, "--interrupt-grace", grace)
		must(t, cmd.Start())
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if b, _ := os.ReadFile(logFile); bytes.Contains(b, []byte("terraform_data.seed: Refreshing state")) {
				break
			}
			if time.Now().After(deadline) {
				_ = cmd.Process.Kill()
				t.Fatalf("%s: the plan walk never began\n%s", name, out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond) // into the slow local
		must(t, cmd.Process.Signal(syscall.SIGINT))
		time.Sleep(time.Second)
		_ = cmd.Process.Signal(syscall.SIGTERM) // it may have ended by now
		var err error
		select {
		case err = <-done:
		case <-time.After(3 * time.Minute):
			_ = cmd.Process.Kill()
			t.Fatalf("%s: the run did not end after the signals\n%s", name, out.String())
		}
		t.Logf("%s:\n%s", name, out.String())
		b, rerr := os.ReadFile(resPath)
		must(t, rerr)
		var res job.Result
		must(t, json.Unmarshal(b, &res))
		return exitCodeOf(err), &res, out.String()
	}

	code, res, out := cancel("graceful", "5m")
	if code != 130 || res.Status != "cancelled" || res.Error == nil || res.Error.Step != "plan" {
		t.Fatalf("graceful: exit %d, status %s, error %+v\n%s", code, res.Status, res.Error, out)
	}
	if len(res.Stacks) != 1 || res.Stacks[0].Status != "cancelled" || res.Stacks[0].Lock != nil {
		t.Errorf("graceful: stacks %+v, want one cancelled with no lock", res.Stacks)
	}
	if _, err := os.Stat(lockFile); err == nil {
		t.Errorf("graceful: tofu left its state locked")
	}
	if log, _ := os.ReadFile(filepath.Join(stackDir, "tfstackplan.log")); !bytes.Contains(log, []byte("Interrupt received")) {
		t.Errorf("graceful: tofu never saw the interrupt:\n%s", log)
	}

	code, res, out = cancel("killed", "200ms")
	if code != 130 || res.Error == nil || res.Error.Step != "plan" || len(res.Stacks) != 1 {
		t.Fatalf("killed: exit %d, error %+v, stacks %+v\n%s", code, res.Error, res.Stacks, out)
	}
	held, err := os.ReadFile(lockFile)
	if err != nil {
		t.Fatalf("killed: tofu was killed, yet no lock file: %v", err)
	}
	var info struct{ ID string }
	must(t, json.Unmarshal(held, &info))
	lock := res.Stacks[0].Lock
	want := "tfstackplan run plan --environment prod --force-unlock " + info.ID
	if lock == nil || lock.ID != info.ID || lock.Command != want || !strings.Contains(res.Error.Tail, want) {
		t.Fatalf("killed: lock %+v, error tail %q; want ID %s and command %q", lock, res.Error.Tail, info.ID, want)
	}

	// The command, as given, releases the lock and plans.
	args := strings.Fields(lock.Command)
	resPath := filepath.Join(rt.work, "unlock.json")
	out = rt.mustRun(proj, args[0], append(args[1:], "--pr", "1", "--result", resPath)...)
	if _, err := os.Stat(lockFile); err == nil {
		t.Errorf("after %s the state is still locked\n%s", lock.Command, out)
	}
	b, err := os.ReadFile(resPath)
	must(t, err)
	var after job.Result
	must(t, json.Unmarshal(b, &after))
	if after.Status != "succeeded" || len(after.Stacks) != 1 || after.Stacks[0].Class != "additive" {
		t.Errorf("the plan after the unlock: %s, stacks %+v, error %+v", after.Status, after.Stacks, after.Error)
	}
}
