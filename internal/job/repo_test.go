package job

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/runner"
)

func TestRepoFromRemote(t *testing.T) {
	for remote, want := range map[string]string{
		"https://github.com/Acme/Infra.git":                       "acme/infra",
		"https://github.com/acme/infra":                           "acme/infra",
		"https://github.com/acme/infra/":                          "acme/infra",
		"https://x-access-token:s3cret@github.com/acme/infra.git": "acme/infra",
		"http://ghe.example.com:8080/acme/infra.git":              "acme/infra",
		"ssh://git@github.com/acme/infra.git":                     "acme/infra",
		"ssh://git@ghe.example.com:2222/acme/infra":               "acme/infra",
		"git://github.com/acme/infra.git":                         "acme/infra",
		"git@github.com:Acme/Infra.git":                           "acme/infra",
		"github.com:acme/infra":                                   "acme/infra",
		" git@github.com:acme/infra.git\n":                        "acme/infra",
		"":                                                        "",
		"../origin.git":                                           "",
		"/srv/git/acme/infra.git":                                 "",
		"file://localhost/acme/infra.git":                         "",
		"file:///srv/git/acme/infra.git":                          "",
		"./acme:x/infra":                                          "",
		"https://gitlab.com/group/sub/infra.git":                  "",
		"https://github.com/acme":                                 "",
		"git@github.com:acme/in fra.git":                          "",
		`C:\repos\infra`:                                          "",
	} {
		if got := RepoFromRemote(remote); got != want {
			t.Errorf("RepoFromRemote(%q) = %q, want %q", remote, got, want)
		}
	}
}

// git runs git in dir.
func gitIn(t *testing.T, dir string, args ...string) {
	t.Helper()
	if out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// runRepoOpts runs op over one stack of root with the options tune sets (Client nil: the one
// the environment gives, offline unless getenv names a server).
func runRepoOpts(t *testing.T, root, op string, tune func(*RunOptions)) *Result {
	t.Helper()
	plan := recordedPlan(t, "create") // changes: an apply asks the gate
	return runScriptedWith(t, nil, root, []string{"a"}, op, "", tune, func(_, _ string, stdout io.Writer) error {
		fmt.Fprintln(stdout, "/stacks/prod/a (script:0 job:0.0)> plan")
		return os.WriteFile(filepath.Join(root, "stacks/prod/a", runner.DefaultPlanJSONFile), plan, 0o644)
	})
}

// The repository is --repo, else GITHUB_REPOSITORY, else the origin remote's (each form git
// takes), lower case; without any, it is empty, which offline is no matter.
func TestRunRepo(t *testing.T) {
	root := runRepo(t, []string{"a"})
	for _, tc := range []struct {
		name, flag, env, remote, want string
	}{
		{"--repo wins", "Flag/Repo", "env/repo", "https://github.com/remote/repo.git", "flag/repo"},
		{"then GITHUB_REPOSITORY", "", "Env/Repo", "https://github.com/remote/repo.git", "env/repo"},
		{"then origin, https", "", "", "https://github.com/Remote/Repo.git", "remote/repo"},
		{"then origin, https with credentials", "", "", "https://x-access-token:s3cret@github.com/remote/repo", "remote/repo"},
		{"then origin, scp-like ssh", "", "", "git@github.com:Remote/Repo.git", "remote/repo"},
		{"then origin, ssh URL", "", "", "ssh://git@ghe.example.com:2222/remote/repo.git", "remote/repo"},
		{"origin a local path", "", "", "../origin.git", ""},
		{"no origin", "", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gitIn(t, root, "remote", "remove", "origin")
			if tc.remote != "" {
				gitIn(t, root, "remote", "add", "origin", tc.remote)
			}
			res := runRepoOpts(t, root, OpPlan, func(o *RunOptions) {
				o.Repo = tc.flag
				o.Getenv = mapEnv(map[string]string{"GITHUB_REPOSITORY": tc.env})
			})
			if res.Error != nil || res.Repo != tc.want || len(res.Warnings) != 0 {
				t.Fatalf("error %+v, repo %q, warnings %q; want %q", res.Error, res.Repo, res.Warnings, tc.want)
			}
		})
	}
}

// A --repo that is no repository's name is a usage error naming it, a GITHUB_REPOSITORY one a
// configuration error; neither runs anything.
func TestRunRepoInvalid(t *testing.T) {
	root := runRepo(t, []string{"a"})
	res := runRepoOpts(t, root, OpPlan, func(o *RunOptions) { o.Repo = "acme/infra/live" })
	if res.Error == nil || res.Error.Kind != KindUsage || !strings.Contains(res.Error.Tail, `--repo: repository "acme/infra/live": want owner/name`) {
		t.Errorf("--repo: error %+v", res.Error)
	}
	res = runRepoOpts(t, root, OpPlan, func(o *RunOptions) { o.Getenv = mapEnv(map[string]string{"GITHUB_REPOSITORY": "acme corp/infra"}) })
	if res.Error == nil || res.Error.Kind != KindConfig || !strings.Contains(res.Error.Tail, `GITHUB_REPOSITORY: repository "acme corp/infra": want owner/name`) {
		t.Errorf("GITHUB_REPOSITORY: error %+v", res.Error)
	}
}

// With a server, a run without a repository reports nothing (a plan, with the warning) or is
// denied (an apply); with one, the announcement and the gate check carry it.
func TestRunRepoWithServer(t *testing.T) {
	m := newMemServer()
	srv := m.start(t)
	getenv := mapEnv(map[string]string{runner.EnvServer: srv.URL})
	root := runRepo(t, []string{"a"})

	res := runRepoOpts(t, root, OpPlan, func(o *RunOptions) { o.Getenv = getenv; o.ExecutionID = "with-repo" })
	m.mu.Lock()
	in, announced := m.inits["with-repo"]
	m.mu.Unlock()
	if res.Error != nil || res.Repo != "acme/infra" || !announced || in.Repo != "acme/infra" {
		t.Fatalf("error %+v, repo %q; Init %v with repo %q", res.Error, res.Repo, announced, in.Repo)
	}
	res = runRepoOpts(t, root, OpApply, func(o *RunOptions) { o.Getenv = getenv; o.Repo = "Acme/Other" })
	m.mu.Lock()
	checks := len(m.checks)
	var checked string
	if checks > 0 {
		checked = m.checks[checks-1].Repo
	}
	m.mu.Unlock()
	if checks != 1 || checked != "acme/other" || res.Repo != "acme/other" {
		t.Fatalf("gate checks %d, the last for %q; result repo %q", checks, checked, res.Repo)
	}

	gitIn(t, root, "remote", "remove", "origin")
	m.mu.Lock()
	before := len(m.auth)
	m.mu.Unlock()
	res = runRepoOpts(t, root, OpPlan, func(o *RunOptions) { o.Getenv = getenv })
	if res.Error != nil || res.Server != "" || len(res.Warnings) != 1 || res.Warnings[0] != "no repository: set --repo or GITHUB_REPOSITORY; reporting disabled" {
		t.Errorf("plan: error %+v, server %q, warnings %q", res.Error, res.Server, res.Warnings)
	}
	res = runRepoOpts(t, root, OpApply, func(o *RunOptions) { o.Getenv = getenv })
	if res.Error == nil || res.Error.Kind != KindGate || res.Error.Tail != "the gate cannot be checked: "+ErrNoRepo.Error() ||
		res.Gate == nil || res.Gate.Verdict != runner.VerdictNotSatisfied.String() {
		t.Errorf("apply: error %+v, gate %+v", res.Error, res.Gate)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.auth) != before {
		t.Errorf("the server got %d requests without a repository", len(m.auth)-before)
	}
}
