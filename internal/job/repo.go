package job

import (
	"context"
	"errors"
	"net/url"
	"os/exec"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
)

// ErrNoRepo is why a run with a server reports nothing (a plan) or is denied (an apply) when
// it cannot tell its repository: the server keys everything by repository.
var ErrNoRepo = errors.New("no repository: set --repo or GITHUB_REPOSITORY")

// RepoFromRemote returns the repository a git remote URL names, in lower case, or "" when it
// names none (a local path, a path of other than two segments): HOST/OWNER/NAME[.git] in
// https://, http://, ssh:// or git:// form, or git's scp-like [USER@]HOST:OWNER/NAME[.git].
func RepoFromRemote(remote string) string {
	remote = strings.TrimSpace(remote)
	var p string
	if strings.Contains(remote, "://") {
		u, err := url.Parse(remote)
		if err != nil || u.Host == "" {
			return ""
		}
		switch strings.ToLower(u.Scheme) {
		case "https", "http", "ssh", "git", "git+ssh", "ssh+git":
		default:
			return ""
		}
		p = u.Path
	} else {
		// git reads HOST:PATH as scp-like only when the colon comes before any slash.
		colon, slash := strings.Index(remote, ":"), strings.Index(remote, "/")
		if colon <= 0 || slash >= 0 && slash < colon {
			return ""
		}
		p = remote[colon+1:]
	}
	repo, err := events.CanonicalRepo(strings.TrimSuffix(strings.Trim(p, "/"), ".git"))
	if err != nil {
		return ""
	}
	return repo
}

// gitOrigin returns the URL of the origin remote of the git repository at dir, "" when there
// is none or git cannot tell (bounded).
func gitOrigin(dir string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", "remote", "get-url", "origin")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// repo resolves the run's repository: --repo, else GITHUB_REPOSITORY, else the origin remote
// of the git repository at the root ("" when it names none), in lower case; origin is the
// gitOrigin call setup started for that last case. A --repo that is no repository's name is a
// usage error, a GITHUB_REPOSITORY one a configuration error.
func (r *run) repo(origin *call[string]) (string, *ResultError) {
	if r.o.Repo != "" {
		repo, err := events.CanonicalRepo(r.o.Repo)
		if err != nil {
			return "", newResultError(KindUsage, "config", "--repo: "+err.Error())
		}
		return repo, nil
	}
	if env := strings.TrimSpace(r.gh.Repo); env != "" {
		repo, err := events.CanonicalRepo(env)
		if err != nil {
			return "", newResultError(KindConfig, "config", "GITHUB_REPOSITORY: "+err.Error())
		}
		return repo, nil
	}
	if origin == nil { // setup starts it whenever the flag and the environment are empty
		return "", nil
	}
	remote, err := origin.wait()
	if perr := panicError("config", err); perr != nil {
		return "", perr
	}
	return RepoFromRemote(remote), nil
}
