package job

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/runner"
)

// TestRunAsksGitForHeadAndOrigin: with neither flags nor GitHub's environment naming them, the
// result records the commit and the repository git names (HEAD, the origin remote) whether
// discovery succeeds or fails, or setup fails after asking: setup starts both git calls at
// once and waits for HEAD's only after discovery (or in finish).
func TestRunAsksGitForHeadAndOrigin(t *testing.T) {
	t.Parallel()
	root := discoveryProject(t, 3)
	gitOut(t, root, "remote", "set-url", "origin", "https://github.com/Acme/Infra.git")
	head := strings.TrimSpace(gitOut(t, root, "rev-parse", "HEAD"))
	server, err := runner.NewClient("http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		tune     func(*RunOptions)
		stacks   int
		failStep string
	}{
		{"discovered", func(*RunOptions) {}, 3, ""},
		{"terramate missing", func(o *RunOptions) { o.Terramate.Bin = filepath.Join(t.TempDir(), "no-terramate") }, 0, "discover"},
		{"setup failed", func(o *RunOptions) { o.Op, o.Client = OpApply, server }, 0, "config"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := RunOptions{
				Op: OpPlan, Environment: "bench", WorkDir: root, DryRun: true,
				ResultPath: filepath.Join(t.TempDir(), "result.json"), Terramate: &runner.Terramate{Bin: fakeTerramate(t)},
				Getenv: func(string) string { return "" },
			}
			c.tune(&o)
			res := Run(context.Background(), o)
			step := ""
			if res.Error != nil {
				step = res.Error.Step
			}
			if step != c.failStep {
				t.Fatalf("failed in step %q (%+v), want %q", step, res.Error, c.failStep)
			}
			if res.SHA != head || res.Repo != "acme/infra" || len(res.Stacks) != c.stacks {
				t.Errorf("sha %q, repo %q, %d stacks; want %q, acme/infra, %d", res.SHA, res.Repo, len(res.Stacks), head, c.stacks)
			}
		})
	}
}

// gitOut runs git in dir (no user or system configuration) and returns its stdout.
func gitOut(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=bench", "-c", "user.email=bench@example.invalid",
		"-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return string(out)
}

// discoveryProject lays out a git repository of n stacks, stacks/sNNNN, for both the real
// terramate (stack.tm.hcl) and the fake (.faketerramate.json): main pushed to a bare origin,
// and a branch, feature, that changes every stack. As in scripts/bench/genproject.sh every 20th
// stack runs after the one before it and the one 10 before it (few edges, so real run-graph's
// path enumeration stays cheap).
func discoveryProject(b testing.TB, n int) string {
	b.Helper()
	tmp := b.TempDir()
	root, origin := filepath.Join(tmp, "repo"), filepath.Join(tmp, "origin.git")
	write := func(rel, content string) {
		p := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	git := func(dir string, args ...string) { gitOut(b, dir, args...) }
	write("tfstackplan.hcl", "environment \"bench\" {\n  dir = \"stacks\"\n}\n")
	write("terramate.tm.hcl", "terramate {\n  config {\n    experiments = [\"scripts\"]\n  }\n}\n\n"+
		"script \"plan\" {\n  description = \"plan\"\n  job {\n    command = [\"/bin/true\"]\n  }\n}\n")
	sc := tmScenario{}
	name := func(i int) string { return fmt.Sprintf("s%04d", i) }
	for i := range n {
		s := tmStack{Path: "stacks/" + name(i), Name: name(i), ID: name(i)}
		after := ""
		if i > 0 && i%20 == 0 {
			s.After = []string{"/stacks/" + name(i-1), "/stacks/" + name(i-10)}
			after = fmt.Sprintf("  after = [%q, %q]\n", s.After[0], s.After[1])
		}
		sc.Stacks = append(sc.Stacks, s)
		sc.Changed = append(sc.Changed, tmChange{Stack: s.Path, Why: "stack has unmerged changes"})
		write(s.Path+"/stack.tm.hcl", tmStackHCL(s.Name, after))
	}
	js, err := json.MarshalIndent(sc, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	write(".faketerramate.json", string(js))
	git(tmp, "init", "-q", "--bare", "-b", "main", origin)
	git(root, "init", "-q", "-b", "main")
	git(root, "add", "-A")
	git(root, "commit", "-qm", "stacks")
	git(root, "remote", "add", "origin", origin)
	git(root, "push", "-q", "origin", "main")
	git(root, "checkout", "-qb", "feature")
	for i := range n {
		write("stacks/"+name(i)+"/main.tf", "# changed on feature\n")
	}
	git(root, "add", "-A")
	git(root, "commit", "-qm", "change every stack")
	return root
}
