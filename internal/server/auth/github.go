package auth

import (
	"context"
	"errors"
	"fmt"
	"github.com/tfstackplan/tfstackplan/events"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"

	"github.com/tfstackplan/tfstackplan/internal/httpcap"
	"github.com/tfstackplan/tfstackplan/internal/textfit"
)

// GitHubIssuer is the issuer of GitHub Actions ID tokens.
const GitHubIssuer = "https://token.actions.githubusercontent.com"

const (
	// defaultDiscoveryTimeout bounds one fetch of the discovery document.
	defaultDiscoveryTimeout = 10 * time.Second
	// defaultDiscoveryRetry is the least time between a failed discovery and the next: while
	// GitHub is unreachable, a stream of tokens must not become a stream of requests.
	defaultDiscoveryRetry = 10 * time.Second
	// maxFetchBody bounds a discovery document or key set: go-oidc reads whole answers into
	// memory. GitHub's are a few kilobytes.
	maxFetchBody = 1 << 20
	// maxRedirects bounds the redirects of one fetch.
	maxRedirects = 5
)

// GitHubClaims are the verified claims of a GitHub Actions ID token, as issued (the
// repository in its original case). Optional claims the token lacks are "".
type GitHubClaims struct {
	// Repository is owner/name of the repository whose workflow asked for the token.
	Repository string
	// RepositoryOwner is the owner part of Repository; RepositoryID and RepositoryOwnerID are
	// GitHub's stable IDs of the repository and its owner, which a repository deleted and
	// created again under the same name does not keep.
	RepositoryOwner, RepositoryID, RepositoryOwnerID string
	// Ref is the git ref the workflow runs on (refs/heads/main, refs/pull/7/merge, ...) and
	// RefType its kind (branch, tag).
	Ref, RefType string
	// EventName is the event that started the workflow (push, pull_request, ...).
	EventName string
	// WorkflowRef is the workflow (owner/name/.github/workflows/F.yml@ref); JobWorkflowRef the
	// one the job runs, which differs for a job of a reusable workflow.
	WorkflowRef, JobWorkflowRef string
	// Environment is the job's deployment environment.
	Environment string
	// RunID identifies the workflow run (digits); RunAttempt counts its re-runs.
	RunID, RunAttempt string
	// SHA is the commit the workflow runs on; Actor the account that started it.
	SHA, Actor string
	// Subject is the sub claim (repo:owner/name:ref:..., or :environment:...).
	Subject string
	// IssuedAt and Expires are the iat and exp claims.
	IssuedAt, Expires time.Time
}

// GitHubValidatorOptions configure NewGitHubValidator.
type GitHubValidatorOptions struct {
	// Issuer is the OIDC issuer whose tokens are accepted (default GitHubIssuer). It must be
	// https, or http on a loopback host (127.0.0.1, ::1, localhost) for tests.
	Issuer string
	// Client fetches the discovery document and the keys (default: a client with a 10s
	// timeout). It is copied, not modified: the copies refuse redirects to another host and
	// answers over 1 MiB, and the keys' copy has the refetch limit.
	Client *http.Client
}

// GitHubValidator verifies GitHub Actions ID tokens: RS256 signature by a key of the issuer's
// JWKS (found by OIDC discovery on the first token), iss exactly the issuer, aud exactly the
// requested audience, exp in the future, nbf and iat not in the future, and the claims
// repository, repository_owner, run_id, ref and sub present. It is safe for concurrent use.
type GitHubValidator struct {
	rotatingKeys
	issuer string
	// loopbackHTTP: the issuer is http on a loopback host, and so may its JWKS be.
	loopbackHTTP bool
	// discoveryCtx carries the client that fetches the discovery document.
	discoveryCtx     context.Context
	discoveryTimeout time.Duration
	discoveryRetry   time.Duration

	mu          sync.Mutex
	jwksURL     string         // "" until a discovery succeeds
	discovering *discoveryCall // the discovery under way, if any
	failed      error          // the last discovery's error
	failedAt    time.Time
}

// discoveryCall is one discovery, awaited by every token that arrives while it runs.
type discoveryCall struct {
	done    chan struct{}
	jwksURL string
	err     error
}

// NewGitHubValidator returns a validator that discovers the issuer's keys lazily, on the first
// token it verifies; constructing it makes no request, so a server starts while GitHub is
// unreachable. A discovery that fails is tried again on a later token, at most once every 10s.
func NewGitHubValidator(ctx context.Context, opts GitHubValidatorOptions) (*GitHubValidator, error) {
	issuer := opts.Issuer
	if issuer == "" {
		issuer = GitHubIssuer
	}
	loopbackHTTP, err := checkFetchURL(issuer, true)
	if err != nil {
		return nil, fmt.Errorf("GitHub OIDC issuer %q: %w", issuer, err)
	}
	v := &GitHubValidator{
		issuer:           issuer,
		loopbackHTTP:     loopbackHTTP,
		discoveryTimeout: defaultDiscoveryTimeout,
		discoveryRetry:   defaultDiscoveryRetry,
	}
	v.rotatingKeys = newRotatingKeys(ctx, sameHostClient(opts.Client), v.discover)
	v.discoveryCtx = context.WithoutCancel(oidc.ClientContext(ctx, sameHostClient(opts.Client)))
	return v, nil
}

// Issuer is the issuer whose tokens v accepts.
func (v *GitHubValidator) Issuer() string { return v.issuer }

// Validate verifies token for audience and returns its claims. ctx bounds the wait for the
// discovery and the keys.
func (v *GitHubValidator) Validate(ctx context.Context, token, audience string) (*GitHubClaims, error) {
	idt, err := v.verify(ctx, v.issuer, token, audience)
	if err != nil {
		return nil, err
	}
	var c struct {
		Repository      string `json:"repository"`
		RepositoryOwner string `json:"repository_owner"`
		RepositoryID    string `json:"repository_id"`
		RepositoryOwnID string `json:"repository_owner_id"`
		Ref             string `json:"ref"`
		RefType         string `json:"ref_type"`
		EventName       string `json:"event_name"`
		JobWorkflowRef  string `json:"job_workflow_ref"`
		WorkflowRef     string `json:"workflow_ref"`
		Environment     string `json:"environment"`
		RunID           string `json:"run_id"`
		RunAttempt      string `json:"run_attempt"`
		SHA             string `json:"sha"`
		Actor           string `json:"actor"`
	}
	if err := idt.Claims(&c); err != nil {
		return nil, fmt.Errorf("GitHub ID token claims: %w", err)
	}
	for _, req := range []struct{ name, value string }{
		{"repository", c.Repository}, {"repository_owner", c.RepositoryOwner},
		{"run_id", c.RunID}, {"ref", c.Ref}, {"sub", idt.Subject},
	} {
		if req.value == "" {
			return nil, fmt.Errorf("GitHub ID token has no %s", req.name)
		}
	}
	repo, err := events.CanonicalRepo(c.Repository)
	if err != nil {
		return nil, fmt.Errorf("GitHub ID token: %w", err)
	}
	if owner, _, _ := strings.Cut(repo, "/"); owner != strings.ToLower(c.RepositoryOwner) {
		return nil, fmt.Errorf("GitHub ID token repository_owner %q is not the owner of repository %q", clip(c.RepositoryOwner), c.Repository)
	}
	// The run ID goes into the principal's name: digits only keep names unambiguous.
	if !allDigits(c.RunID) {
		return nil, fmt.Errorf("GitHub ID token run_id %q is not a number", clip(c.RunID))
	}
	return &GitHubClaims{
		Repository: c.Repository, RepositoryOwner: c.RepositoryOwner, RepositoryID: c.RepositoryID, RepositoryOwnerID: c.RepositoryOwnID,
		Ref: c.Ref, RefType: c.RefType, EventName: c.EventName,
		WorkflowRef: c.WorkflowRef, JobWorkflowRef: c.JobWorkflowRef, Environment: c.Environment,
		RunID: c.RunID, RunAttempt: c.RunAttempt, SHA: c.SHA, Actor: c.Actor,
		Subject: idt.Subject, IssuedAt: idt.IssuedAt, Expires: idt.Expiry,
	}, nil
}

func allDigits(s string) bool {
	if s == "" || len(s) > 20 {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// clip is s cut for an error message.
func clip(s string) string {
	if len(s) > 100 {
		return textfit.Prefix(s, 100) + "…"
	}
	return s
}

// discover returns the JWKS URL of the issuer's discovery document, fetching the document
// once; after a failure, again no sooner than discoveryRetry later. Tokens that arrive during
// a discovery wait for it (each at most as long as its ctx allows).
func (v *GitHubValidator) discover(ctx context.Context) (string, error) {
	v.mu.Lock()
	if v.jwksURL != "" {
		defer v.mu.Unlock()
		return v.jwksURL, nil
	}
	call := v.discovering
	if call == nil {
		if since := v.now().Sub(v.failedAt); v.failed != nil && since < v.discoveryRetry {
			err := v.failed
			v.mu.Unlock()
			return "", fmt.Errorf("%w (not retrying for %s)", err, (v.discoveryRetry - since).Round(time.Millisecond))
		}
		call = &discoveryCall{done: make(chan struct{})}
		v.discovering = call
		go v.runDiscovery(call)
	}
	v.mu.Unlock()
	select {
	case <-call.done:
		return call.jwksURL, call.err
	case <-ctx.Done():
		return "", fmt.Errorf("waiting for the OIDC discovery of %s: %w", v.issuer, ctx.Err())
	}
}

func (v *GitHubValidator) runDiscovery(call *discoveryCall) {
	call.jwksURL, call.err = v.fetchDiscovery()
	v.mu.Lock()
	if call.err == nil {
		v.jwksURL = call.jwksURL
	} else {
		v.failed, v.failedAt = call.err, v.now()
	}
	v.discovering = nil
	v.mu.Unlock()
	close(call.done)
}

// fetchDiscovery fetches the discovery document, which must name the configured issuer
// exactly, and returns its JWKS URL.
func (v *GitHubValidator) fetchDiscovery() (string, error) {
	ctx, cancel := context.WithTimeout(v.discoveryCtx, v.discoveryTimeout)
	defer cancel()
	p, err := oidc.NewProvider(ctx, v.issuer)
	if err != nil {
		return "", fmt.Errorf("OIDC discovery of %s: %w", v.issuer, err)
	}
	var doc struct {
		JWKSURL string `json:"jwks_uri"`
	}
	if err := p.Claims(&doc); err != nil {
		return "", fmt.Errorf("OIDC discovery of %s: %w", v.issuer, err)
	}
	if _, err := checkFetchURL(doc.JWKSURL, v.loopbackHTTP); err != nil {
		return "", fmt.Errorf("OIDC discovery of %s: jwks_uri %q: %w", v.issuer, clip(doc.JWKSURL), err)
	}
	return doc.JWKSURL, nil
}

// checkFetchURL checks that s is an absolute https URL without user, query or fragment, or, when
// loopbackHTTPOK, such an http URL on a loopback host. It returns whether s is http.
func checkFetchURL(s string, loopbackHTTPOK bool) (loopbackHTTP bool, err error) {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return false, errors.New("want an absolute https URL without user, query or fragment")
	}
	switch {
	case u.Scheme == "https":
		return false, nil
	case u.Scheme == "http" && loopbackHTTPOK && isLoopbackHost(u.Hostname()):
		return true, nil
	case loopbackHTTPOK:
		return false, errors.New("want https (http only on a loopback host: 127.0.0.1, ::1 or localhost)")
	}
	return false, errors.New("want https")
}

func isLoopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// sameHostClient is a copy of c (nil: an empty client) that follows redirects only within the
// host asked, and fails an answer whose body exceeds maxFetchBody.
func sameHostClient(c *http.Client) *http.Client {
	out := copyClient(c)
	out.Transport = httpcap.Transport(out.Transport, maxFetchBody)
	theirs := out.CheckRedirect
	out.CheckRedirect = func(r *http.Request, via []*http.Request) error {
		first := via[0].URL
		if r.URL.Scheme != first.Scheme || r.URL.Host != first.Host {
			return fmt.Errorf("refusing the redirect from %s://%s to another host (%s://%s)", first.Scheme, first.Host, r.URL.Scheme, clip(r.URL.Host))
		}
		if len(via) >= maxRedirects {
			return fmt.Errorf("stopped after %d redirects", maxRedirects)
		}
		if theirs != nil {
			return theirs(r, via)
		}
		return nil
	}
	return out
}
