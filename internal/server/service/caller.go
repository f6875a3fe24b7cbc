package service

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Caller is the authenticated principal of a request, as the service's rules need it. Nothing
// in a request body says who the caller is or where it may act: only this does.
type Caller struct {
	// Name identifies the principal in the audit log and in what it owns.
	Name string
	// Admin reports the admin role: it may end what other principals took.
	Admin bool
	// Repositories limits the caller to these repositories (canonical owner/name); nil: any.
	Repositories []string
	// GitHub is set for a GitHub Actions job: the verified claims of its ID token.
	GitHub *GitHubJob
}

// GitHubJob is what a GitHub Actions job's verified ID token says of it.
type GitHubJob struct {
	// Repository is owner/name, lowercased.
	Repository string
	// Ref is the ref the job ran on (refs/pull/N/merge for a pull request's job).
	Ref string
	// EventName is the event that started the workflow (pull_request, push, ...).
	EventName string
	// JobWorkflowRef is the workflow file the job came from, at its ref
	// (owner/name/.github/workflows/apply.yml@refs/heads/main).
	JobWorkflowRef string
	// Environment is the job's GitHub environment ("" for none).
	Environment string
	// RunID and RunAttempt name the workflow run.
	RunID, RunAttempt string
	// SHA is the commit; Actor who started the run.
	SHA, Actor string
	// Claims is a one-line rendering of the verified claims, for the audit log.
	Claims string
}

// allows reports whether the caller may act in repo.
func (c Caller) allows(repo string) bool {
	return c.Repositories == nil || slices.Contains(c.Repositories, repo)
}

// writeRepo is the repository a request that changes something acts in: repo as the request
// names it (canonical), or, when it names none, the caller's one repository. A repository the
// caller may not act in is denied; none at all is invalid.
func (c Caller) writeRepo(repo string) (string, error) {
	if repo == "" {
		if len(c.Repositories) == 1 {
			return c.Repositories[0], nil
		}
		return "", invalid("repo is required (owner/name)")
	}
	canon, err := events.CanonicalRepo(repo)
	if err != nil {
		return "", invalid("repo: %v", err)
	}
	if !c.allows(canon) {
		return "", fmt.Errorf("%w: %s may not act in repository %s", store.ErrDenied, c.Name, canon)
	}
	return canon, nil
}

// checkPRFilter refuses a read that names a PR without its repository: once repositories share
// the server, a PR number alone names as many pull requests as they have.
func checkPRFilter(repo string, pr int) error {
	if pr != 0 && repo == "" {
		return invalid("pr %d needs repo: a pull request is named with its repository (owner/name)", pr)
	}
	return nil
}

// ReadRepo is the repository a read selects: repo as the request names it (canonical), or,
// when it names none, the caller's one repository, or every repository ("") for a caller
// limited to none. A caller limited to several repositories must name one.
func (c Caller) ReadRepo(repo string) (string, error) {
	if repo == "" && len(c.Repositories) > 1 {
		return "", invalid("repo is required: %s may read %d repositories, name one", c.Name, len(c.Repositories))
	}
	if repo == "" && c.Repositories == nil {
		return "", nil
	}
	return c.writeRepo(repo)
}

// prOfRef returns N of a pull request's ref, refs/pull/N/merge or refs/pull/N/head; 0 for any
// other ref.
func prOfRef(ref string) int {
	rest, ok := strings.CutPrefix(ref, "refs/pull/")
	if !ok {
		return 0
	}
	num, kind, _ := strings.Cut(rest, "/")
	n, err := strconv.Atoi(num)
	if err != nil || n <= 0 || (kind != "merge" && kind != "head") || strconv.Itoa(n) != num {
		return 0
	}
	return n
}

// prConfined says why caller may not act on PR pr ("" when it may): a GitHub Actions job of a
// pull request acts on that pull request alone, whatever workflow it runs (a reusable workflow
// allowed by apply_from included). Every request of a job that names a PR is held to it.
func prConfined(caller Caller, pr int) string {
	if caller.GitHub == nil {
		return ""
	}
	if n := prOfRef(caller.GitHub.Ref); n > 0 && n != pr {
		return fmt.Sprintf("a job of pull request #%d acts only on PR #%d, not #%d", n, n, pr)
	}
	return ""
}

// mayAnnounce says why caller may not announce an execution of op of PR pr of repo in environment
// env ("" when it may). A drift execution comes only from a caller the environment's apply_from
// allows (or an admin): it overwrites what the drift page says of every stack, and the code of
// any branch's workflow is nobody's review. A GitHub Actions job of a pull request reports only
// that pull request; a job on another ref reports executions of no PR, or of any PR of its
// repository when it matches the environment's apply_from (an apply after the merge, a re-run).
// Other principals are limited by their repositories alone.
func (s *Service) mayAnnounce(caller Caller, repo, env, op string, pr int) string {
	if api.ExecutionOp(op) == OpDrift && !caller.Admin {
		if why := s.Policy.Environments[env].MayCheckGate(env, repo, caller); why != "" {
			return fmt.Sprintf("a drift execution is reported only by a caller environment %q's apply_from allows: %s", env, why)
		}
	}
	j := caller.GitHub
	if j == nil {
		return ""
	}
	if n := prOfRef(j.Ref); n > 0 {
		if pr != n {
			return fmt.Sprintf("a job of pull request #%d reports only PR #%d, not #%d", n, n, pr)
		}
		return ""
	}
	if pr == 0 || s.Policy.Environments[env].MayCheckGate(env, repo, caller) == "" {
		return ""
	}
	return fmt.Sprintf("a job on %q (not a pull request's ref) reports PR #%d only when it matches environment %q's apply_from", j.Ref, pr, env)
}
