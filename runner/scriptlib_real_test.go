package runner

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestScriptLibRealTools runs the script library (scripts/terramate) with the real terramate
// and the real tofu through a sequence of plans and applies, checks what the scripts leave in
// each stack, then runs the same sequence on a twin project with the fake terramate (and the
// real tofu) and requires terramate's stderr (the "Script 0 at ..." line, every
// "/stack (script:0 job:0.N)> argv" line and the errors) to be identical step by step.
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
	fakeTM := fakeTerramate(t)
	cli := filepath.Join(t.TempDir(), "tfstackplan")
	if out, err := exec.Command("go", "build", "-o", cli, "../cmd/tfstackplan").CombinedOutput(); err != nil {
		t.Fatalf("building tfstackplan: %v\n%s", err, out)
	}

	realRuns := slibRealSequence(t, "real-terramate", realTM, tofu, cli)
	fakeRuns := slibRealSequence(t, "fake-terramate", fakeTM, tofu, cli)
	for i := range realRuns {
		if realRuns[i] != fakeRuns[i] {
			t.Errorf("step %d: terramate stderr differs\nreal:\n%s\nfake:\n%s", i+1, realRuns[i], fakeRuns[i])
		}
	}
}

// slibRealSequence runs the steps on a new project with terramate tm and returns terramate's
// stderr of each step.
func slibRealSequence(t *testing.T, name, tm, tofu, cli string) []string {
	var stderrs []string
	t.Run(name, func(t *testing.T) {
		p := slibNewProject(t, tofu)
		stacks := slibStackPaths()
		class := func(stack string) string {
			t.Helper()
			out, err := exec.Command(cli, "render", "--plan", filepath.Join(p.root, stack, "tfstackplan.plan.json"), "--format", "json").Output()
			if err != nil {
				t.Errorf("render %s: %v", stack, err)
				return ""
			}
			var doc struct {
				Class string `json:"class"`
			}
			if err := json.Unmarshal(out, &doc); err != nil {
				t.Errorf("render %s: %v", stack, err)
			}
			return doc.Class
		}
		state := func(stack string) string {
			s, _ := p.read(t, stack, "terraform.tfstate")
			return s
		}
		clean := func() {
			if st := p.git(t, "status", "--porcelain"); st != "" {
				t.Errorf("files git does not ignore (terramate would refuse the next run):\n%s", st)
			}
		}
		run := func(script string, env []string, wantRC int) (string, []string) {
			t.Helper()
			stdout, stderr, rc := p.run(t, tm, env, "script", "run", script)
			if rc != wantRC {
				t.Fatalf("script run %s: exit %d, want %d\nstderr:\n%s\nstdout:\n%s", script, rc, wantRC, stderr, stdout)
			}
			stderrs = append(stderrs, stderr)
			return stderr, slibLines(t, p.ticks)
		}

		// 1. Plan from scratch: every stack gets its log, saved plan and plan JSON.
		stderr, ticks := run("plan", nil, 0)
		slibCheckCommandLines(t, stderr, "plan", stacks, 8)
		slibCheckTicks(t, ticks, stacks, slibPlanTicks)
		for _, s := range stacks {
			log, _ := p.read(t, s, "tfstackplan.log")
			if !strings.Contains(log, "has been successfully initialized") || !strings.Contains(log, "Saved the plan to: tfstackplan.tfplan") {
				t.Errorf("%s log lacks init or plan output:\n%s", s, log)
			}
			if strings.Contains(log, `"format_version"`) {
				t.Errorf("%s: the plan JSON went into the log", s)
			}
			if _, ok := p.read(t, s, "tfstackplan.tfplan"); !ok {
				t.Errorf("%s has no saved plan", s)
			}
			if c := class(s); c != "additive" {
				t.Errorf("%s classified %q, want additive", s, c)
			}
		}
		clean()

		// 2. Apply the saved plans.
		stderr, ticks = run("apply", nil, 0)
		slibCheckCommandLines(t, stderr, "apply", stacks, 6)
		slibCheckTicks(t, ticks, stacks, slibApplyTicks)
		for _, st := range slibStacks {
			if !strings.Contains(state(st.path), `"`+st.name+`-1"`) {
				t.Errorf("%s: state after apply lacks %q", st.path, st.name+"-1")
			}
			if log, _ := p.read(t, st.path, "tfstackplan.log"); strings.Contains(log, "Saved the plan") || !strings.Contains(log, "Apply complete! Resources: 1 added") {
				t.Errorf("%s apply log:\n%s", st.path, log)
			}
		}
		clean()

		// 3. Change one stack and plan with the driver's lock variables: a force-unlock that
		// finds no lock does not fail the stack; -lock-timeout reaches tofu.
		p.setInput(t, "stacks/app", "app-2")
		p.commit(t, "app-2")
		stderr, ticks = run("plan", []string{"TFSTACKPLAN_FORCE_UNLOCK=no-such-lock", "TFSTACKPLAN_LOCK_TIMEOUT=5s"}, 0)
		slibCheckCommandLines(t, stderr, "plan", stacks, 8)
		slibCheckTicks(t, ticks, stacks, slibPlanTicks)
		for _, s := range stacks {
			want := "no-changes"
			if s == "stacks/app" {
				want = "mutating"
			}
			if c := class(s); c != want {
				t.Errorf("%s classified %q, want %q", s, c, want)
			}
			if log, _ := p.read(t, s, "tfstackplan.log"); !strings.Contains(log, "lock no-such-lock not released here") {
				t.Errorf("%s log lacks the force-unlock note:\n%s", s, log)
			}
		}

		// 4. Change the stack again without planning: apply applies the saved plan (app-2),
		// not the configuration (app-3).
		p.setInput(t, "stacks/app", "app-3")
		p.commit(t, "app-3")
		run("apply", nil, 0)
		if s := state("stacks/app"); !strings.Contains(s, `"app-2"`) || strings.Contains(s, `"app-3"`) {
			t.Errorf("apply did not apply the saved plan: state\n%s", s)
		}

		// 5. The saved plan is now stale: tofu refuses it and the stack fails.
		stderr, ticks = run("apply", nil, 1)
		if !strings.Contains(stderr, "(in /stacks/app): exit status 1") {
			t.Errorf("stale apply stderr:\n%s", stderr)
		}
		if log, _ := p.read(t, "stacks/app", "tfstackplan.log"); !strings.Contains(log, "Saved plan is stale") {
			t.Errorf("stale apply log:\n%s", log)
		}
		if got := slibTicksOf(ticks, "stacks/sub/db"); len(got) != 0 {
			t.Errorf("a stack after the failed one ran: %q", got)
		}

		// 6. A configuration error fails tofu init, so the stack, and no stale plan survives.
		slibWrite(t, filepath.Join(p.root, "stacks/app/broken.tf"), "resource \"terraform_data\" \"y\" {\n", 0o644)
		p.commit(t, "broken")
		stderr, ticks = run("plan", nil, 1)
		if !strings.Contains(stderr, "Error: one or more commands failed") || !strings.Contains(stderr, "(in /stacks/app): exit status 1") {
			t.Errorf("failing plan stderr:\n%s", stderr)
		}
		if got := slibTicksOf(ticks, "stacks/app"); !slices.Equal(got, slibPlanTicks[:1]) {
			t.Errorf("failed stack ticks %q, want %q", got, slibPlanTicks[:1])
		}
		for _, f := range []string{"tfstackplan.tfplan", "tfstackplan.plan.json"} {
			if _, ok := p.read(t, "stacks/app", f); ok {
				t.Errorf("stacks/app: the previous %s survived a failed plan", f)
			}
		}
		if _, ok := p.read(t, "stacks/network", "tfstackplan.plan.json"); !ok {
			t.Errorf("stacks/network (before the failure) has no plan JSON")
		}
		clean()
	})
	if len(stderrs) != 6 {
		t.Fatalf("%s: the sequence stopped after %d steps", name, len(stderrs))
	}
	return stderrs
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
			if !strings.Contains(log, "Interrupt received") || !strings.Contains(log, "signal: interrupt") {
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
