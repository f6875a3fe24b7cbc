package runner

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/tofutest"
)

// Tests of the terramate script library users copy (scripts/terramate): a project with the
// library installed runs `terramate script run plan|apply` through the fake terramate (which
// reads the library's HCL: testdata/faketerramate/hcl.go) and a stand-in `tfstackplan` that
// records the ticks, with a shell stand-in tofu that records its arguments (TestScriptLibFake)
// or with the fake tofu replaying real OpenTofu recordings (TestScriptLibFakeTools).
// scriptlib_real_test.go runs the same sequence with the real terramate and tofu and compares
// what terramate prints with the fake's.

const slibLibDir = "../scripts/terramate"

// slibStacks are the project's stacks in run order: app runs after network, db (in a
// sub-directory whose globals switch the binary to "terraform") after app.
var slibStacks = []struct{ path, name, after string }{
	{"stacks/network", "network", ""},
	{"stacks/app", "app", "/stacks/network"},
	{"stacks/sub/db", "db", "/stacks/app"},
}

// slibProject is a git repository with the library installed.
type slibProject struct {
	root  string // the project root
	tools string // first on PATH: tfstackplan (records ticks), tofu, terraform
	ticks string // where the tfstackplan stub appends "<TFSTACKPLAN_STACK> <args>"
	calls string // where the stand-in tofu appends "<stack dir>|<args>" (stand-in only)
	home  string
	// extraEnv is added to every run's environment.
	extraEnv []string
}

// slibTickStub is the `tfstackplan` the scripts call until the driver lands.
const slibTickStub = `#!/bin/sh
printf '%s %s\n' "${TFSTACKPLAN_STACK:-<unset>}" "$*" >> "$SLIB_TICKS"
`

// slibStandinTofu stands in for tofu/terraform: it records its arguments, writes the saved plan,
// prints STANDIN_PLAN_JSON for `show -json`, fails `plan` in a stack holding a FAIL file, fails
// `apply` without the saved plan, and releases a lock only in the stack STANDIN_LOCKED_STACK.
const slibStandinTofu = `#!/usr/bin/env bash
printf '%s|%s %s\n' "${PWD#"$SLIB_ROOT"/}" "$(basename "$0")" "$*" >> "$STANDIN_CALLS"
cmd=$1; shift
last=${!#}
case $cmd in
init) echo "stand-in: initialised";;
force-unlock)
  if [ "${PWD#"$SLIB_ROOT"/}" = "${STANDIN_LOCKED_STACK:-}" ]; then echo "stand-in: unlocked $last"; exit 0; fi
  echo "Error: Failed to unlock state: LocalState not locked" >&2; exit 1;;
plan)
  if [ -f FAIL ]; then echo "Error: stand-in plan failed" >&2; exit 1; fi
  for a in "$@"; do case $a in -out=*) out=${a#-out=};; esac; done
  echo "stand-in plan of $PWD" > "$out"
  echo "Plan: 1 to add, 0 to change, 0 to destroy.";;
show)
  if [ ! -f "$last" ]; then echo "Error: no plan file $last" >&2; exit 1; fi
  cat "$STANDIN_PLAN_JSON";;
apply)
  if [ ! -f "$last" ]; then echo "Error: Failed to load \"$last\" as a plan file" >&2; exit 1; fi
  echo "Apply complete! Resources: 1 added, 0 changed, 0 destroyed.";;
*) echo "stand-in tofu: unexpected command $cmd" >&2; exit 2;;
esac
`

// slibNewProject lays out and commits the project. tofu is the binary installed as `tofu` and
// `terraform` (a symlink); empty installs the stand-in.
func slibNewProject(t *testing.T, tofu string) *slibProject {
	t.Helper()
	dir := t.TempDir()
	p := &slibProject{
		root:  filepath.Join(dir, "proj"),
		tools: filepath.Join(dir, "bin"),
		ticks: filepath.Join(dir, "ticks.txt"),
		calls: filepath.Join(dir, "calls.txt"),
		home:  filepath.Join(dir, "home"),
	}
	for _, d := range []string{p.root, p.tools, p.home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	slibWrite(t, filepath.Join(p.tools, "tfstackplan"), slibTickStub, 0o755)
	if tofu == "" {
		slibWrite(t, filepath.Join(p.tools, "tofu"), slibStandinTofu, 0o755)
		tofu = filepath.Join(p.tools, "tofu")
	} else if err := os.Symlink(tofu, filepath.Join(p.tools, "tofu")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(tofu, filepath.Join(p.tools, "terraform")); err != nil {
		t.Fatal(err)
	}
	// terramate's own CLI configuration: no update check, no telemetry (no network).
	slibWrite(t, filepath.Join(p.home, "terramate.rc"), fmt.Sprintf(
		"disable_checkpoint = true\ndisable_checkpoint_signature = true\ndisable_telemetry = true\nuser_terramate_dir = %q\n", p.home), 0o644)

	for _, f := range []string{"tfstackplan.tm.hcl", "tfstackplan.scripts.tm.hcl"} {
		b, err := os.ReadFile(filepath.Join(slibLibDir, f))
		if err != nil {
			t.Fatal(err)
		}
		slibWrite(t, filepath.Join(p.root, f), string(b), 0o644)
	}
	ignore, err := os.ReadFile(filepath.Join(slibLibDir, "gitignore"))
	if err != nil {
		t.Fatal(err)
	}
	slibWrite(t, filepath.Join(p.root, ".gitignore"), string(ignore), 0o644)
	for _, s := range slibStacks {
		after := ""
		if s.after != "" {
			after = fmt.Sprintf("  after = [%q]\n", s.after)
		}
		slibWrite(t, filepath.Join(p.root, s.path, "stack.tm.hcl"),
			fmt.Sprintf("stack {\n  name = %q\n  id   = %q\n%s}\n", s.name, s.name, after), 0o644)
		p.setInput(t, s.path, s.name+"-1")
	}
	// The README's way to switch a part of the project to terraform.
	slibWrite(t, filepath.Join(p.root, "stacks/sub/terraform.tm.hcl"), "globals {\n  tfstackplan_tf = \"terraform\"\n}\n", 0o644)

	p.git(t, "init", "-q", "-b", "main")
	p.git(t, "config", "user.email", "ci@example.com")
	p.git(t, "config", "user.name", "ci")
	p.commit(t, "init")
	// The fake's scenario describes the same stacks; real terramate must not see it untracked.
	// So must the fake tofu's case and state files.
	slibWrite(t, filepath.Join(p.root, ".git/info/exclude"), ".faketerramate.json\nfaketofu.*\n", 0o644)
	sc := &tmScenario{}
	for _, s := range slibStacks {
		st := tmStack{Path: s.path, Name: s.name, ID: s.name}
		if s.after != "" {
			st.After = []string{s.after}
		}
		sc.Stacks = append(sc.Stacks, st)
	}
	tmWriteScenario(t, p.root, sc)
	return p
}

func slibWrite(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// setInput writes the stack's configuration: one built-in terraform_data resource.
func (p *slibProject) setInput(t *testing.T, stack, input string) {
	t.Helper()
	slibWrite(t, filepath.Join(p.root, stack, "main.tf"),
		fmt.Sprintf("resource \"terraform_data\" \"x\" {\n  input = %q\n}\n", input), 0o644)
}

func (p *slibProject) git(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = p.root
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// commit commits everything git does not ignore.
func (p *slibProject) commit(t *testing.T, msg string) {
	t.Helper()
	p.git(t, "add", "-A")
	p.git(t, "commit", "-qm", msg)
}

// env is the environment terramate runs with: the test's, without anything tfstackplan, git
// or terramate related that could leak in, plus the stubs first on PATH and extra.
func (p *slibProject) env(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "TFSTACKPLAN_") || strings.HasPrefix(k, "GIT_") || strings.HasPrefix(k, "TM_") ||
			strings.HasPrefix(k, "TF_") || k == "PATH" || k == "GOOGLE_IMPERSONATE_SERVICE_ACCOUNT" {
			continue
		}
		env = append(env, kv)
	}
	abs, err := filepath.Abs(filepath.Join("..", "testdata", "tofu", "sensitive", "plan.json"))
	if err != nil {
		panic(err)
	}
	env = append(env,
		"PATH="+p.tools+string(os.PathListSeparator)+os.Getenv("PATH"),
		"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"CHECKPOINT_DISABLE=1", "TM_CLI_CONFIG_FILE="+filepath.Join(p.home, "terramate.rc"),
		"SLIB_ROOT="+p.root, "SLIB_TICKS="+p.ticks,
		"STANDIN_CALLS="+p.calls, "STANDIN_PLAN_JSON="+abs,
	)
	env = append(env, p.extraEnv...)
	return append(env, extra...)
}

// run runs terramate (bin) in the project root and returns what it printed and its exit code;
// the tick and call records start afresh.
func (p *slibProject) run(t *testing.T, bin string, extraEnv []string, args ...string) (stdout, stderr string, rc int) {
	t.Helper()
	for _, f := range []string{p.ticks, p.calls} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Dir = p.root
	cmd.Env = p.env(extraEnv)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("%s %v: %v", bin, args, err)
		}
		rc = ee.ExitCode()
	}
	return out.String(), errb.String(), rc
}

// lines reads a record file ("" when missing) as lines.
func slibLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

func (p *slibProject) read(t *testing.T, stack, name string) (string, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.root, stack, name))
	if errors.Is(err, os.ErrNotExist) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b), true
}

// ticksOf returns the tick arguments recorded for stack, in order.
func slibTicksOf(ticks []string, stack string) []string {
	var out []string
	for _, l := range ticks {
		if rest, ok := strings.CutPrefix(l, stack+" "); ok {
			out = append(out, rest)
		}
	}
	return out
}

var (
	slibPlanTicks  = []string{"run tick --phase init", "run tick --phase plan", "run tick --phase show", "run tick --phase done --status succeeded"}
	slibApplyTicks = []string{"run tick --phase init", "run tick --phase apply", "run tick --phase done --status succeeded"}
)

// checkTicks checks each stack reported want, stack after stack in run order.
func slibCheckTicks(t *testing.T, ticks []string, stacks []string, want []string) {
	t.Helper()
	var all []string
	for _, s := range stacks {
		if got := slibTicksOf(ticks, s); !slices.Equal(got, want) {
			t.Errorf("ticks of %s: %q, want %q", s, got, want)
		}
		for _, w := range want {
			all = append(all, s+" "+w)
		}
	}
	if !slices.Equal(ticks, all) {
		t.Errorf("ticks %q, want %q", ticks, all)
	}
}

// slibScriptLine is the line terramate prints for the library's script block named name:
// "Script 0 at /tfstackplan.scripts.tm.hcl:L,1-M,2 having 1 job(s)", from the block's lines.
func slibScriptLine(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(slibLibDir, "tfstackplan.scripts.tm.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	start := slices.Index(lines, fmt.Sprintf("script %q {", name))
	if start < 0 {
		t.Fatalf("no script %q block in the library", name)
	}
	end := slices.Index(lines[start:], "}")
	if end < 0 {
		t.Fatalf("script %q block does not end", name)
	}
	return fmt.Sprintf("Script 0 at /tfstackplan.scripts.tm.hcl:%d,1-%d,2 having 1 job(s)", start+1, start+end+1)
}

// checkCommandLines checks terramate echoed the script line, then n commands per stack, the
// stacks in run order, every stack the same commands (up to the tofu/terraform binary).
func slibCheckCommandLines(t *testing.T, stderr, script string, stacks []string, n int) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	if len(lines) == 0 || lines[0] != slibScriptLine(t, script) {
		t.Fatalf("stderr starts %q, want %q", lines[0], slibScriptLine(t, script))
	}
	lines = lines[1:]
	if len(lines) != n*len(stacks) {
		t.Fatalf("%d command lines, want %d per stack for %v:\n%s", len(lines), n, stacks, stderr)
	}
	for i, s := range stacks {
		for k := range n {
			l := lines[i*n+k]
			prefix := fmt.Sprintf("/%s (script:0 job:0.%d)> ", s, k)
			if !strings.HasPrefix(l, prefix) {
				t.Errorf("line %q, want prefix %q", l, prefix)
				continue
			}
			first := strings.TrimPrefix(lines[k], fmt.Sprintf("/%s (script:0 job:0.%d)> ", stacks[0], k))
			if norm := func(s string) string { return strings.ReplaceAll(s, "terraform ", "tofu ") }; norm(strings.TrimPrefix(l, prefix)) != norm(first) {
				t.Errorf("stack %s command %d differs from %s's: %q vs %q", s, k, stacks[0], l, first)
			}
		}
	}
}

func slibStackPaths() []string {
	var out []string
	for _, s := range slibStacks {
		out = append(out, s.path)
	}
	return out
}

// TestScriptLibFake runs the library end to end through the fake terramate with the stand-in
// tofu: plan then apply, the driver's variables, a failing stack, an apply without a plan.
func TestScriptLibFake(t *testing.T) {
	bin := fakeTerramate(t)
	stacks := slibStackPaths()
	planJSON, err := os.ReadFile(filepath.Join("..", "testdata", "tofu", "sensitive", "plan.json"))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		p := slibNewProject(t, "")
		stdout, stderr, rc := p.run(t, bin, nil, "script", "run", "plan")
		if rc != 0 {
			t.Fatalf("plan: exit %d\n%s", rc, stderr)
		}
		slibCheckCommandLines(t, stderr, "plan", stacks, 8)
		if !strings.Contains(stderr, "/stacks/sub/db (script:0 job:0.1)> bash -c set -o pipefail; umask 077; rm -f -- \"${TFSTACKPLAN_PLAN_OUT:-tfstackplan.tfplan}\" \"${TFSTACKPLAN_PLAN_JSON:-tfstackplan.plan.json}\"; terraform init ") {
			t.Errorf("db (globals: terraform) does not run terraform:\n%s", stderr)
		}
		slibCheckTicks(t, slibLines(t, p.ticks), stacks, slibPlanTicks)
		var wantCalls []string
		for _, s := range stacks {
			tf := "tofu"
			if s == "stacks/sub/db" {
				tf = "terraform"
			}
			wantCalls = append(wantCalls,
				s+"|"+tf+" init -input=false -no-color",
				s+"|"+tf+" plan -input=false -no-color -lock-timeout=0s -out=tfstackplan.tfplan",
				s+"|"+tf+" show -json -no-color tfstackplan.tfplan")
		}
		if calls := slibLines(t, p.calls); !slices.Equal(calls, wantCalls) {
			t.Errorf("tofu calls:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(wantCalls, "\n"))
		}
		for _, s := range stacks {
			log, _ := p.read(t, s, "tfstackplan.log")
			if !strings.Contains(log, "stand-in: initialised") || !strings.Contains(log, "Plan: 1 to add") {
				t.Errorf("%s log lacks init or plan output: %q", s, log)
			}
			if js, _ := p.read(t, s, "tfstackplan.plan.json"); js != string(planJSON) {
				t.Errorf("%s plan JSON is not show's output: %.80q", s, js)
			}
			if _, ok := p.read(t, s, "tfstackplan.tfplan"); !ok {
				t.Errorf("%s has no saved plan", s)
			}
			if _, ok := p.read(t, s, "tfstackplan.plan.json.tmp"); ok {
				t.Errorf("%s: temporary plan JSON left behind", s)
			}
			if strings.Contains(log, "hunter2") {
				t.Errorf("%s log holds the plan JSON's secret", s)
			}
		}
		if strings.Contains(stdout, "hunter2") {
			t.Errorf("terramate's output holds the plan JSON's secret")
		}
		if st := p.git(t, "status", "--porcelain"); st != "" {
			t.Errorf("the plan left files git does not ignore (terramate would refuse the next run):\n%s", st)
		}

		_, stderr, rc = p.run(t, bin, nil, "script", "run", "apply")
		if rc != 0 {
			t.Fatalf("apply: exit %d\n%s", rc, stderr)
		}
		slibCheckCommandLines(t, stderr, "apply", stacks, 6)
		slibCheckTicks(t, slibLines(t, p.ticks), stacks, slibApplyTicks)
		wantCalls = nil
		for _, s := range stacks {
			tf := "tofu"
			if s == "stacks/sub/db" {
				tf = "terraform"
			}
			wantCalls = append(wantCalls,
				s+"|"+tf+" init -input=false -no-color",
				s+"|"+tf+" apply -input=false -no-color -lock-timeout=0s tfstackplan.tfplan")
		}
		if calls := slibLines(t, p.calls); !slices.Equal(calls, wantCalls) {
			t.Errorf("tofu calls:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(wantCalls, "\n"))
		}
		for _, s := range stacks {
			log, _ := p.read(t, s, "tfstackplan.log")
			if strings.Contains(log, "Plan: 1 to add") || !strings.Contains(log, "Apply complete!") {
				t.Errorf("%s apply log: %q, want the apply's output only (the log starts afresh)", s, log)
			}
		}
		if st := p.git(t, "status", "--porcelain"); st != "" {
			t.Errorf("the apply left files git does not ignore:\n%s", st)
		}
	})

	t.Run("driver-variables", func(t *testing.T) {
		t.Parallel()
		p := slibNewProject(t, "")
		env := []string{
			"TFSTACKPLAN_LOG_FILE=custom.log", "TFSTACKPLAN_PLAN_OUT=custom.tfplan",
			"TFSTACKPLAN_PLAN_JSON=custom.json", "TFSTACKPLAN_LOCK_TIMEOUT=7s",
			"TFSTACKPLAN_FORCE_UNLOCK=lock-1", "STANDIN_LOCKED_STACK=stacks/app",
		}
		_, stderr, rc := p.run(t, bin, env, "script", "run", "plan")
		if rc != 0 {
			t.Fatalf("plan: exit %d (a force-unlock that finds no lock must not fail the stack)\n%s", rc, stderr)
		}
		calls := slibLines(t, p.calls)
		for _, s := range stacks {
			tf := "tofu"
			if s == "stacks/sub/db" {
				tf = "terraform"
			}
			for _, want := range []string{
				s + "|" + tf + " force-unlock -force -no-color lock-1",
				s + "|" + tf + " plan -input=false -no-color -lock-timeout=7s -out=custom.tfplan",
				s + "|" + tf + " show -json -no-color custom.tfplan",
			} {
				if !slices.Contains(calls, want) {
					t.Errorf("no call %q in %q", want, calls)
				}
			}
			log, _ := p.read(t, s, "custom.log")
			released := strings.Contains(log, "stand-in: unlocked lock-1")
			if released != (s == "stacks/app") || (!released && !strings.Contains(log, "lock lock-1 not released here")) {
				t.Errorf("%s log after force-unlock: %q", s, log)
			}
			if js, _ := p.read(t, s, "custom.json"); js != string(planJSON) {
				t.Errorf("%s: custom.json is not show's output", s)
			}
			for _, f := range []string{"tfstackplan.log", "tfstackplan.tfplan", "tfstackplan.plan.json"} {
				if _, ok := p.read(t, s, f); ok {
					t.Errorf("%s: default file %s written although the driver named another", s, f)
				}
			}
		}
	})

	t.Run("failing-stack", func(t *testing.T) {
		t.Parallel()
		p := slibNewProject(t, "")
		if _, stderr, rc := p.run(t, bin, nil, "script", "run", "plan"); rc != 0 {
			t.Fatalf("plan: exit %d\n%s", rc, stderr)
		}
		slibWrite(t, filepath.Join(p.root, "stacks/app/FAIL"), "", 0o644)
		p.commit(t, "fail app")
		_, stderr, rc := p.run(t, bin, nil, "script", "run", "plan")
		if rc != 1 || !strings.Contains(stderr, "Error: one or more commands failed") || !strings.Contains(stderr, "(in /stacks/app): exit status 1") {
			t.Fatalf("plan with a failing tofu: exit %d\n%s", rc, stderr)
		}
		ticks := slibLines(t, p.ticks)
		if got := slibTicksOf(ticks, "stacks/app"); !slices.Equal(got, slibPlanTicks[:2]) {
			t.Errorf("failed stack ticks %q, want %q", got, slibPlanTicks[:2])
		}
		if got := slibTicksOf(ticks, "stacks/sub/db"); len(got) != 0 {
			t.Errorf("the stack after the failed one ran: %q", got)
		}
		for _, f := range []string{"tfstackplan.tfplan", "tfstackplan.plan.json"} {
			if _, ok := p.read(t, "stacks/app", f); ok {
				t.Errorf("stacks/app: the previous run's %s survived a failed plan", f)
			}
		}
		if log, _ := p.read(t, "stacks/app", "tfstackplan.log"); !strings.Contains(log, "Error: stand-in plan failed") {
			t.Errorf("the failed stack's log lacks the error: %q", log)
		}
	})

	t.Run("apply-without-plan", func(t *testing.T) {
		t.Parallel()
		p := slibNewProject(t, "")
		_, stderr, rc := p.run(t, bin, nil, "script", "run", "apply")
		if rc != 1 || !strings.Contains(stderr, "(in /stacks/network): exit status 1") {
			t.Fatalf("apply without a saved plan: exit %d\n%s", rc, stderr)
		}
		for _, c := range slibLines(t, p.calls) {
			if strings.Contains(c, " plan ") {
				t.Errorf("apply planned: %q", c)
			}
		}
	})
}

// stateOf returns the stack's local state file ("" when there is none).
func (p *slibProject) stateOf(t *testing.T, stack string) string {
	t.Helper()
	s, _ := p.read(t, stack, "terraform.tfstate")
	return s
}

// slibSequence runs six steps (plan, apply, plan of a change with the driver's lock variables,
// apply of the saved plan after a further change, apply of the now stale plan, plan with a
// configuration error) on a new project with terramate tm and tofu, checks each, and returns
// terramate's stderr of each step. fakeTofu says tofu is testdata/faketofu: each stack's
// faketofu.case then names the recording that stands for the step's configuration, and the
// checks of real state files are skipped. cli is a tfstackplan binary (for render).
func slibSequence(t *testing.T, name, tm, tofu, cli string, fakeTofu bool) []string {
	var stderrs []string
	t.Run(name, func(t *testing.T) {
		p := slibNewProject(t, tofu)
		stacks := slibStackPaths()
		setCase := func(stack, c string) {
			if fakeTofu {
				tofutest.WriteCase(t, filepath.Join(p.root, stack), c)
			}
		}
		if fakeTofu {
			p.extraEnv = tofutest.Env(t)
			for _, s := range stacks {
				setCase(s, "create")
			}
		}
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
			if !fakeTofu && !strings.Contains(state(st.path), `"`+st.name+`-1"`) {
				t.Errorf("%s: state after apply lacks %q", st.path, st.name+"-1")
			}
			if log, _ := p.read(t, st.path, "tfstackplan.log"); strings.Contains(log, "Saved the plan") || !strings.Contains(log, "Apply complete! Resources: ") {
				t.Errorf("%s apply log:\n%s", st.path, log)
			}
		}
		clean()

		// 3. Change one stack and plan with the driver's lock variables: a force-unlock that
		// finds no lock does not fail the stack; -lock-timeout reaches tofu.
		p.setInput(t, "stacks/app", "app-2")
		p.commit(t, "app-2")
		setCase("stacks/network", "no-changes")
		setCase("stacks/app", "update")
		setCase("stacks/sub/db", "no-changes")
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
		if s := state("stacks/app"); !fakeTofu && (!strings.Contains(s, `"app-2"`) || strings.Contains(s, `"app-3"`)) {
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

		// 6. A configuration error that tofu finds when planning fails the stack, and no stale
		// plan survives.
		slibWrite(t, filepath.Join(p.root, "stacks/app/broken.tf"), "resource \"terraform_data\" \"broken\" {\n  input = undefined_thing.x\n}\n", 0o644)
		p.commit(t, "broken")
		setCase("stacks/app", "error")
		stderr, ticks = run("plan", nil, 1)
		if !strings.Contains(stderr, "Error: one or more commands failed") || !strings.Contains(stderr, "(in /stacks/app): exit status 1") {
			t.Errorf("failing plan stderr:\n%s", stderr)
		}
		if got := slibTicksOf(ticks, "stacks/app"); !slices.Equal(got, slibPlanTicks[:2]) {
			t.Errorf("failed stack ticks %q, want %q", got, slibPlanTicks[:2])
		}
		if log, _ := p.read(t, "stacks/app", "tfstackplan.log"); !strings.Contains(log, "Reference to undeclared resource") {
			t.Errorf("failing plan log:\n%s", log)
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

// slibBuildCLI builds cmd/tfstackplan (for `render`).
func slibBuildCLI(t *testing.T) string {
	t.Helper()
	cli := filepath.Join(t.TempDir(), "tfstackplan")
	if out, err := exec.Command("go", "build", "-o", cli, "../cmd/tfstackplan").CombinedOutput(); err != nil {
		t.Fatalf("building tfstackplan: %v\n%s", err, out)
	}
	return cli
}

// TestScriptLibFakeTools runs slibSequence with the fake terramate and the fake tofu
// (testdata/faketofu, which replays real OpenTofu recordings): the library end to end, plan to
// stale apply, without the real tools.
func TestScriptLibFakeTools(t *testing.T) {
	slibSequence(t, "fake-terramate-fake-tofu", fakeTerramate(t), tofutest.Build(t), slibBuildCLI(t), true)
}
