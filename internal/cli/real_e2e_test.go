package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/job"
	"github.com/tfstackplan/tfstackplan/runner"
)

// TestRealToolsPlanApply is the end-to-end run with the REAL terramate and OpenTofu, opt-in:
// it runs only when TFSTACKPLAN_TERRAMATE and TFSTACKPLAN_TOFU name the binaries (build them
// with the shared build-real-tools.sh; see DEVELOPERS.md). A git project with four stacks
// (`after` ordering, a create, an update, a delete, one stack in a sub-directory), the script
// library of scripts/terramate installed as a user would, `run plan` then `run apply` against a
// real `serve`: classes, content hashes, the applied state, and a plan that changed between
// plan and apply refused at the gate.
func TestRealToolsPlanApply(t *testing.T) {
	rt := newRealTools(t)
	work, bin := rt.work, rt.bin
	run, mustRun := rt.run, rt.mustRun

	// The project: main has v1 of every stack, applied; the branch changes three of them.
	proj, write := rt.project(map[string]string{
		"stacks/prod/network": "name = \"network\"\n  id   = \"network\"",
		"stacks/prod/app":     "name  = \"app\"\n  id    = \"app\"\n  after = [\"/stacks/prod/network\"]",
		"stacks/prod/data/db": "name  = \"db\"\n  id    = \"db\"\n  after = [\"/stacks/prod/network\"]",
		"stacks/prod/monitor": "name = \"monitor\"\n  id   = \"monitor\"",
	}, map[string]string{
		"stacks/prod/network": `resource "terraform_data" "net" { input = "v1" }` + "\n",
		"stacks/prod/app":     `resource "terraform_data" "app" { input = "v1" }` + "\n" + `resource "terraform_data" "old" { input = "gone soon" }` + "\n",
		"stacks/prod/data/db": `resource "terraform_data" "db" { input = "v1" }` + "\n",
		"stacks/prod/monitor": `resource "terraform_data" "mon" { input = "v1" }` + "\n",
	})
	mustRun(proj, "git", "checkout", "-qb", "feature")
	write("stacks/prod/network/main.tf", `resource "terraform_data" "net" { input = "v1" }`+"\n"+`resource "terraform_data" "extra" { input = "new" }`+"\n") // create
	write("stacks/prod/app/main.tf", `resource "terraform_data" "app" { input = "v2" }`+"\n")                                                                // update + delete
	write("stacks/prod/data/db/main.tf", `resource "terraform_data" "db" { input = "v2" }`+"\n")                                                             // update
	mustRun(proj, "git", "add", "-A")
	mustRun(proj, "git", "commit", "-qm", "v2")

	// A real control plane.
	server := rt.serve(realTokens, realPolicy)
	// The project's origin is a local path, which names no repository.
	rt.env = append(rt.env, "TFSTACKPLAN_SERVER="+server, "TFSTACKPLAN_TOKEN=real-e2e-runner-secret", "GITHUB_REPOSITORY=acme/infra")

	readResult := func(p string) *job.Result {
		t.Helper()
		b, err := os.ReadFile(p)
		must(t, err)
		var r job.Result
		must(t, json.Unmarshal(b, &r))
		return &r
	}
	stackOf := func(r *job.Result, name string) job.StackEntry {
		t.Helper()
		for _, s := range r.Stacks {
			if s.Stack == name {
				return s
			}
		}
		t.Fatalf("no stack %s in %+v", name, r.Stacks)
		return job.StackEntry{}
	}

	// Plan.
	planRes := filepath.Join(work, "plan.json")
	out := mustRun(proj, "tfstackplan", "run", "plan", "-e", "prod", "--pr", "5", "--parallel", "2", "--result", planRes)
	t.Logf("run plan:\n%s", out)
	pr := readResult(planRes)
	if pr.Status != "succeeded" || len(pr.Stacks) != 3 {
		t.Fatalf("plan: status %s, stacks %+v, error %+v", pr.Status, pr.Stacks, pr.Error)
	}
	for name, want := range map[string]string{"network": "additive", "app": "destructive", "data/db": "mutating"} {
		s := stackOf(pr, name)
		if string(s.Class) != want || s.Status != "succeeded" || !strings.HasPrefix(s.PlanHash, "v1:") {
			t.Errorf("plan: stack %s: %+v, want class %s", name, s, want)
		}
	}
	if d := stackOf(pr, "app").Destructive; len(d) != 1 || d[0] != "terraform_data.old" {
		t.Errorf("plan: app destructive = %v", d)
	}
	if len(pr.Edges) != 2 {
		t.Errorf("plan: edges %+v, want network→app and network→data/db", pr.Edges)
	}

	// Apply without the approval: denied, nothing applied.
	denied := filepath.Join(work, "denied.json")
	out, err := run(proj, "tfstackplan", "run", "apply", "-e", "prod", "--pr", "5", "--result", denied)
	if code := exitCodeOf(err); code != ExitGateDenied {
		t.Fatalf("apply before approval exited %d, want 3\n%s", code, out)
	}
	if r := readResult(denied); r.Gate == nil || r.Gate.Verdict != "not-satisfied" {
		t.Fatalf("apply before approval: gate %+v", r.Gate)
	}

	// Approve, then apply.
	admin, err := runner.NewClientTokenSource(server, runner.StaticToken("real-e2e-admin-secret"))
	must(t, err)
	must(t, admin.AdminGatesSatisfy(context.Background(), api.GatesSatisfy{Repo: "acme/infra", PR: 5, Environment: "prod", Class: "destructive", Target: "**", Reason: "e2e", ExecutionID: pr.Execution}))
	applyRes := filepath.Join(work, "apply.json")
	out = mustRun(proj, "tfstackplan", "run", "apply", "-e", "prod", "--pr", "5", "--result", applyRes)
	t.Logf("run apply:\n%s", out)
	ar := readResult(applyRes)
	if ar.Status != "succeeded" || ar.Gate == nil || !ar.Gate.Allowed || !ar.Gate.Revoked {
		t.Fatalf("apply: %+v gate %+v error %+v", ar.Status, ar.Gate, ar.Error)
	}
	for _, name := range []string{"network", "app", "data/db"} {
		if a, p := stackOf(ar, name), stackOf(pr, name); a.PlanHash != p.PlanHash || a.Status != "succeeded" {
			t.Errorf("apply: stack %s hash %s status %s, plan hash %s", name, a.PlanHash, a.Status, p.PlanHash)
		}
	}
	state := mustRun(filepath.Join(proj, "stacks/prod/app"), "tofu", "state", "list")
	if strings.Contains(state, "terraform_data.old") || !strings.Contains(state, "terraform_data.app") {
		t.Errorf("app state after apply: %q", state)
	}
	state = mustRun(filepath.Join(proj, "stacks/prod/network"), "tofu", "state", "list")
	if !strings.Contains(state, "terraform_data.extra") {
		t.Errorf("network state after apply: %q", state)
	}
	// The apply's logs on the server: its plan script's first (the log `run plan` left was
	// not posted again), then its apply script's, in the generation after.
	logOf := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, "tfstackplan"), append([]string{"logs", ar.Execution, "stacks/prod/app"}, args...)...)
		cmd.Env = append(slices.Clone(rt.env), "TFSTACKPLAN_TOKEN=real-e2e-admin-secret")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("tfstackplan logs %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if l := logOf(); !strings.Contains(l, "Apply complete!") {
		t.Errorf("the apply's latest log of app is not its apply script's:\n%s", l)
	}
	if l := logOf("--generation", "0"); !strings.Contains(l, "Plan: ") || strings.Contains(l, "Apply complete!") {
		t.Errorf("the apply's first log of app is not its plan script's:\n%s", l)
	}

	// A change after the plan: the apply's fresh plan differs and the gate refuses it.
	write("stacks/prod/app/main.tf", `resource "terraform_data" "app" { input = "v3" }`+"\n")
	mustRun(proj, "git", "commit", "-qam", "v3")
	sha := strings.TrimSpace(mustRun(proj, "git", "rev-parse", "HEAD"))
	planRes2 := filepath.Join(work, "plan2.json")
	mustRun(proj, "tfstackplan", "run", "plan", "-e", "prod", "--pr", "6", "--sha", sha, "--result", planRes2)
	// v2 to v3 is an update: nothing destructive to approve, so no grant is needed (or given).
	pr2 := readResult(planRes2)
	if err := admin.AdminGatesSatisfy(context.Background(), api.GatesSatisfy{Repo: "acme/infra", PR: 6, Environment: "prod", Class: "destructive", Target: "**",
		Reason: "e2e", ExecutionID: pr2.Execution}); err == nil || !strings.Contains(err.Error(), "requires no gate destructive") {
		t.Fatalf("approving a plan with nothing destructive: %v", err)
	}
	write("stacks/prod/app/main.tf", `resource "terraform_data" "app" { input = "v4" }`+"\n"+`resource "terraform_data" "x" { input = "x" }`+"\n")
	mustRun(proj, "git", "commit", "-qam", "v4")
	stale := filepath.Join(work, "stale.json")
	out, err = run(proj, "tfstackplan", "run", "apply", "-e", "prod", "--pr", "6", "--sha", sha, "--result", stale)
	if code := exitCodeOf(err); code != ExitGateDenied {
		t.Fatalf("apply of a changed plan exited %d, want 3\n%s", code, out)
	}
	if r := readResult(stale); r.Gate == nil || !strings.Contains(r.Gate.Message, "stale plan") {
		t.Fatalf("apply of a changed plan: gate %+v", r.Gate)
	}
	if state := mustRun(filepath.Join(proj, "stacks/prod/app"), "tofu", "state", "list"); strings.Contains(state, "terraform_data.x") {
		t.Errorf("the refused apply changed the state: %q", state)
	}
}

// realTools is a working directory with tfstackplan built and the real terramate and tofu
// beside it, and an environment that keeps them to it.
type realTools struct {
	t         *testing.T
	work, bin string
	env       []string
}

// realTokens and realPolicy are the control plane's tokens and policy of the real-tools tests:
// a runner, an admin, and prod's destructive changes gated.
const (
	realTokens = `
token "runner" {
  secret = "real-e2e-runner-secret"
  roles  = ["runner"]
}
token "admin" {
  secret = "real-e2e-admin-secret"
  roles  = ["runner", "admin"]
}
`
	realPolicy = `
environment "prod" {
  requester = "deployer@proj.iam.gserviceaccount.com"
  gate {
    classes = ["destructive", "unclassified"]
    stacks  = ["**"]
  }
}
`
)

// serve starts a real control plane on a loopback port with these tokens and policy, stopped
// when the test ends, and returns its URL.
func (rt *realTools) serve(tokensHCL, policyHCL string) string {
	t := rt.t
	tokens := filepath.Join(rt.work, "tokens.hcl")
	must(t, os.WriteFile(tokens, []byte(tokensHCL), 0o600))
	policy := filepath.Join(rt.work, "policy.hcl")
	must(t, os.WriteFile(policy, []byte(policyHCL), 0o600))
	ready := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- runServe(ctx, &ServeOptions{IO: &IO{Out: io.Discard, ErrOut: io.Discard}, Listen: "127.0.0.1:0",
			DB: "sqlite:" + filepath.Join(rt.work, "db.sqlite"), Tokens: tokens, Policy: policy, RateLimit: 10000,
			ShutdownTimeout: 2 * time.Second, Ready: func(a string) { ready <- a }})
	}()
	select {
	case a := <-ready:
		t.Cleanup(func() { cancel(); <-errc })
		return "http://" + a
	case err := <-errc:
		cancel()
		t.Fatal(err)
		return ""
	}
}

// newRealTools skips the test unless TFSTACKPLAN_TERRAMATE and TFSTACKPLAN_TOFU name the real
// binaries, and builds tfstackplan.
func newRealTools(t *testing.T) *realTools {
	t.Helper()
	tmBin, tofuBin := os.Getenv("TFSTACKPLAN_TERRAMATE"), os.Getenv("TFSTACKPLAN_TOFU")
	if tmBin == "" || tofuBin == "" {
		t.Skip("set TFSTACKPLAN_TERRAMATE and TFSTACKPLAN_TOFU to the real terramate 0.17.2 and OpenTofu 1.12.6")
	}
	work := t.TempDir()
	bin := filepath.Join(work, "bin")
	must(t, os.MkdirAll(bin, 0o755))
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "tfstackplan"), "../../cmd/tfstackplan").CombinedOutput(); err != nil {
		t.Fatalf("building tfstackplan: %v\n%s", err, out)
	}
	for name, target := range map[string]string{"terramate": tmBin, "tofu": tofuBin} {
		abs, err := filepath.Abs(target)
		must(t, err)
		must(t, os.Symlink(abs, filepath.Join(bin, name)))
	}
	env := append(os.Environ(),
		"PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"HOME="+work, "CHECKPOINT_DISABLE=1", "TF_CLI_CONFIG_FILE=", "TF_IN_AUTOMATION=1",
		"GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=ci", "GIT_AUTHOR_EMAIL=ci@example.com",
		"GIT_COMMITTER_NAME=ci", "GIT_COMMITTER_EMAIL=ci@example.com",
		"GITHUB_ACTIONS=", "GITHUB_OUTPUT=", "GITHUB_STEP_SUMMARY=", "GITHUB_EVENT_PATH=", "GITHUB_SHA=",
		"TFSTACKPLAN_AUDIENCE=", "TFSTACKPLAN_AUTH=", "GCE_METADATA_HOST=127.0.0.1:1", "NO_COLOR=1",
	)
	return &realTools{t: t, work: work, bin: bin, env: env}
}

// command is name (one of bin's, else looked up on PATH) with args in dir, in the tools'
// environment, its stdout and stderr both to out.
func (rt *realTools) command(out io.Writer, dir, name string, args ...string) *exec.Cmd {
	if _, err := os.Stat(filepath.Join(rt.bin, name)); err == nil {
		name = filepath.Join(rt.bin, name) // exec.Command looks names up in this process's PATH
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = rt.env
	cmd.Stdout, cmd.Stderr = out, out
	return cmd
}

// run runs a command to its end and returns its output.
func (rt *realTools) run(dir string, name string, args ...string) (string, error) {
	var out bytes.Buffer
	err := rt.command(&out, dir, name, args...).Run()
	return out.String(), err
}

// mustRun is run, failing the test when the command fails.
func (rt *realTools) mustRun(dir, name string, args ...string) string {
	rt.t.Helper()
	out, err := rt.run(dir, name, args...)
	if err != nil {
		rt.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// project makes a terramate project in work/proj with the script library installed as a user
// would and environment prod at stacks/prod: one stack per key of stacks (its stack block's
// attributes) with main.tf v1, committed on main, pushed to a local origin and applied. It
// returns the project and a function that writes a file in it.
func (rt *realTools) project(stacks, v1 map[string]string) (string, func(rel, content string)) {
	t := rt.t
	t.Helper()
	proj := filepath.Join(rt.work, "proj")
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(proj, rel)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(content), 0o644))
	}
	lib, err := filepath.Abs("../../scripts/terramate")
	must(t, err)
	entries, err := os.ReadDir(lib)
	must(t, err)
	gitignore := "terraform.tfstate\nterraform.tfstate.backup\n.terraform.tfstate.lock.info\n"
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(lib, e.Name()))
		must(t, err)
		switch {
		case strings.HasSuffix(e.Name(), ".tm.hcl"):
			write(e.Name(), string(b))
		case e.Name() == "gitignore":
			gitignore += string(b)
		}
	}
	write(".gitignore", gitignore)
	write("terramate.tm.hcl", "terramate {\n  config {\n    git {\n      default_remote = \"origin\"\n      default_branch = \"main\"\n    }\n  }\n}\n")
	write("tfstackplan.hcl", "environment \"prod\" {\n  dir = \"stacks/prod\"\n}\n")
	for dir, attrs := range stacks {
		write(dir+"/stack.tm.hcl", "stack {\n  "+attrs+"\n}\n")
		write(dir+"/main.tf", v1[dir])
	}
	rt.mustRun(rt.work, "git", "init", "-q", "--bare", "-b", "main", "origin.git")
	rt.mustRun(proj, "git", "init", "-q", "-b", "main")
	rt.mustRun(proj, "git", "add", "-A")
	rt.mustRun(proj, "git", "commit", "-qm", "v1")
	rt.mustRun(proj, "git", "remote", "add", "origin", "../origin.git")
	rt.mustRun(proj, "git", "push", "-q", "origin", "main")
	for dir := range stacks {
		rt.mustRun(filepath.Join(proj, dir), "tofu", "init", "-input=false", "-no-color")
		rt.mustRun(filepath.Join(proj, dir), "tofu", "apply", "-input=false", "-no-color", "-auto-approve")
	}
	return proj, write
}

func exitCodeOf(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
