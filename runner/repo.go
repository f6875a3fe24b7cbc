package runner

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"strings"
	"time"
)

// ErrNoRepo is why a run with a server reports nothing (a plan) or is denied (an apply) when
// it cannot tell its repository: the server keys everything by repository.
var ErrNoRepo = errors.New("no repository: set --repo or GITHUB_REPOSITORY")

// Bounds of a repository's name, as GitHub sets them.
const (
	maxRepoOwner = 39
	maxRepoName  = 100
)

// ParseRepo checks a repository's name, OWNER/NAME, and returns it in lower case: an owner of
// letters, digits and '-' (at most 39), one slash, and a name of letters, digits, '-', '_' and
// '.' (at most 100, neither "." nor "..").
func ParseRepo(s string) (string, error) {
	owner, name, ok := strings.Cut(s, "/")
	switch {
	case !ok || strings.Contains(name, "/"):
		return "", fmt.Errorf("%q is not OWNER/NAME", truncate(s, 200))
	case owner == "" || len(owner) > maxRepoOwner || !repoChars(owner, "-"):
		return "", fmt.Errorf("%q: the owner must be 1 to %d letters, digits and '-'", truncate(s, 200), maxRepoOwner)
	case name == "" || len(name) > maxRepoName || name == "." || name == ".." || !repoChars(name, "-_."):
		return "", fmt.Errorf("%q: the name must be 1 to %d letters, digits, '-', '_' and '.'", truncate(s, 200), maxRepoName)
	}
	return strings.ToLower(s), nil
}

// repoChars reports whether s holds only ASCII letters, digits and the bytes of extra.
func repoChars(s, extra string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(extra, r)) {
			return false
		}
	}
	return true
}

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
	repo, err := ParseRepo(strings.TrimSuffix(strings.Trim(p, "/"), ".git"))
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
// of the git repository at the root ("" when it names none), in lower case. A --repo that is
// no repository's name is a usage error, a GITHUB_REPOSITORY one a configuration error.
func (r *run) repo() (string, *ResultError) {
	if r.o.Repo != "" {
		repo, err := ParseRepo(r.o.Repo)
		if err != nil {
			return "", newResultError(KindUsage, "config", "--repo "+err.Error())
		}
		return repo, nil
	}
	if env := strings.TrimSpace(r.gh.Repo); env != "" {
		repo, err := ParseRepo(env)
		if err != nil {
			return "", newResultError(KindConfig, "config", "GITHUB_REPOSITORY "+err.Error())
		}
		return repo, nil
	}
	return RepoFromRemote(gitOrigin(r.root.real)), nil
}
