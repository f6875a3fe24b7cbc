package runner

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/tofutest"
)

// TestScriptLibRealTools runs the script library (scripts/terramate) with the real terramate
// and the real tofu through a sequence of plans and applies (slibSequence), checking what the
// scripts leave in each stack, then runs the same sequence on twin projects with the fake
// terramate, first with the real tofu, then with the fake tofu (testdata/faketofu), and
// requires terramate's stderr (the "Script 0 at ..." line, every "/stack (script:0 job:0.N)>
// argv" line and the errors) to be identical step by step.
//
// Opt-in: set TFSTACKPLAN_TERRAMATE and TFSTACKPLAN_TOFU to the real binaries (terramate
// 0.17.2, OpenTofu 1.12.x). Nothing reaches the network: the stacks hold only the built-in
// terraform_data resource and terramate's update check and telemetry are disabled.
func TestScriptLibRealTools(t *testing.T) {
	realTM, tofu := os.Getenv("TFSTACKPLAN_TERRAMATE"), os.Getenv("TFSTACKPLAN_TOFU")
	if realTM == "" || tofu == "" {
		t.Skip("set TFSTACKPLAN_TERRAMATE and TFSTACKPLAN_TOFU to the real terramate and tofu to run this test")
	}
	for _, b := range []*string{&realTM, &tofu} {
		abs, err := exec.LookPath(*b)
		if err != nil {
			t.Fatal(err)
		}
		if *b, err = filepath.Abs(abs); err != nil {
			t.Fatal(err)
		}
	}
	fakeTM, fakeTofu, cli := fakeTerramate(t), tofutest.Build(t), slibBuildCLI(t)

	realRuns := slibSequence(t, "real-terramate-real-tofu", realTM, tofu, cli, false)
	for _, v := range []struct {
		name, tofu string
		fake       bool
	}{
		{"fake-terramate-real-tofu", tofu, false},
		{"fake-terramate-fake-tofu", fakeTofu, true},
	} {
		runs := slibSequence(t, v.name, fakeTM, v.tofu, cli, v.fake)
		for i := range realRuns {
			if realRuns[i] != runs[i] {
				t.Errorf("%s, step %d: terramate stderr differs from the real one\nreal:\n%s\nfake:\n%s", v.name, i+1, realRuns[i], runs[i])
			}
		}
	}
}

// TestScriptLibRealToolsCancel cancels an apply the way the driver does (SIGINT to terramate's
// process group, which holds every script command) while tofu runs a slow provisioner: tofu
// must shut down gracefully, so its output keeps reaching the log, the state is written and
// the state lock released. (A tee that died with the group would kill tofu with SIGPIPE.)
// Opt-in like TestScriptLibRealTools; runs with the real and with the fake terramate.
func TestScriptLibRealToolsCancel(t *testing.T) {
	realTM, tofu := os.Getenv("TFSTACKPLAN_TERRAMATE"), os.Getenv("TFSTACKPLAN_TOFU")
	if realTM == "" || tofu == "" {
		t.Skip("set TFSTACKPLAN_TERRAMATE and TFSTACKPLAN_TOFU to the real terramate and tofu to run this test")
	}
	for name, tm := range map[string]string{"real-terramate": realTM, "fake-terramate": fakeTerramate(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := slibNewProject(t, tofu)
			slibWrite(t, filepath.Join(p.root, "stacks/network/main.tf"), `resource "terraform_data" "slow" {
  provisioner "local-exec" {
    command = "for i in 1 2 3 4 5 6 7 8; do echo tick $i; sleep 1; done"
  }
}
`, 0o644)
			p.commit(t, "slow")
			if _, stderr, rc := p.run(t, tm, nil, "script", "run", "plan"); rc != 0 {
				t.Fatalf("plan: exit %d\n%s", rc, stderr)
			}
			if err := os.Remove(p.ticks); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(tm, "script", "run", "apply")
			cmd.Dir = p.root
			cmd.Env = p.env(nil)
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			deadline := time.Now().Add(60 * time.Second)
			for {
				if log, _ := p.read(t, "stacks/network", "tfstackplan.log"); strings.Contains(log, "tick 2") {
					break
				}
				if time.Now().After(deadline) {
					_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
					t.Fatal("the slow apply never started")
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err == nil {
					t.Errorf("the cancelled apply exited 0")
				}
			case <-time.After(60 * time.Second):
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				t.Fatal("terramate did not end after SIGINT")
			}
			// tofu may outlive terramate by a moment; wait for its lock to go.
			lock := filepath.Join(p.root, "stacks/network/.terraform.tfstate.lock.info")
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				if _, err := os.Stat(lock); os.IsNotExist(err) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the state lock is still held: tofu did not shut down gracefully")
				}
			}
			log, _ := p.read(t, "stacks/network", "tfstackplan.log")
			// tofu stops the provisioner itself: with the interrupt it forwarded, or, when the
			// command has not ended by the time tofu gives up on it (a loaded machine), by
			// killing it. Either way tofu shut down gracefully (the lock is gone, the state
			// kept, both checked here) and kept writing to the log. "Stopping operation..." is
			// not required: tofu prints it only when its stop reaches the running operation
			// before the provisioner, whose shell got the same SIGINT, failed it, and on a
			// loaded machine the provisioner may fail first.
			if !strings.Contains(log, "Interrupt received") ||
				!(strings.Contains(log, "signal: interrupt") || strings.Contains(log, "signal: killed")) {
				t.Errorf("the log lacks tofu's graceful shutdown:\n%s", log)
			}
			if s := p.stateOf(t, "stacks/network"); !strings.Contains(s, `"slow"`) {
				t.Errorf("the state does not record the interrupted resource:\n%s", s)
			}
			if got := slibTicksOf(slibLines(t, p.ticks), "stacks/app"); len(got) != 0 {
				t.Errorf("a stack ran after the cancel: %q", got)
			}
		})
	}
}
