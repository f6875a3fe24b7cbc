// Package runner is the CI-side driver of tfstackplan: it runs the terramate scripts a human
// runs, captures each stack's output, classifies plans in-process, and reports progress to the
// control plane.
//
// This file is the server client. Reporting is best-effort: a down, slow or broken server
// degrades a build to "no live progress", never to failure, and costs bounded time (per-call
// budgets, bounded idempotent retries, a circuit breaker). The apply-time gate check (gate.go)
// is the exception: it is fail-closed. An empty server URL disables the client: no network.
package runner

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/gauth"
)

// Environment variables the orchestrator sets for the scripts and `run tick` reads.
const (
	EnvServer      = "TFSTACKPLAN_SERVER"      // control-plane base URL ("" = offline, no-op)
	EnvAudience    = "TFSTACKPLAN_AUDIENCE"    // OIDC ID-token audience; set = authenticate with ID tokens
	EnvAuth        = "TFSTACKPLAN_AUTH"        // how ID tokens are minted: google (the default) or github-actions
	EnvExecution   = "TFSTACKPLAN_EXECUTION"   // execution id this run reports under
	EnvStack       = "TFSTACKPLAN_STACK"       // current stack path (fallback for `run tick --stack`)
	EnvEnvironment = "TFSTACKPLAN_ENVIRONMENT" // deployment environment for the execution
	EnvToken       = "TFSTACKPLAN_TOKEN"       // static bearer token (a server using a tokens file)
)

// Time and size bounds of the client.
const (
	// CallBudget bounds one best-effort call, retries included.
	CallBudget = 1500 * time.Millisecond
	// AttemptTimeout bounds one HTTP attempt of a best-effort call (connect to last body byte).
	AttemptTimeout = 500 * time.Millisecond
	// SlowestUpload is the upload rate, in bytes per second, that a log post is given time for
	// on top of AttemptTimeout (and of CallBudget, per attempt): the log pump posts in the
	// background, and a chunk that cannot be split must not time out on every attempt over a
	// slow uplink (and open the breaker for every other call) just because it is large.
	SlowestUpload = 256 << 10
	// MaxAttempts bounds the attempts of one idempotent call.
	MaxAttempts = 3
	// GateBudget bounds the gate check, retries included; it is fail-closed, so it may wait longer.
	GateBudget = 15 * time.Second
	// GateAttemptTimeout bounds one gate-check attempt.
	GateAttemptTimeout = 5 * time.Second
	// BreakerThreshold is the number of consecutive transport failures that opens the breaker.
	BreakerThreshold = 2
	// BreakerCooldown is how long an open breaker fails calls fast before one probe is let
	// through; it doubles after each failed probe up to BreakerMaxCooldown.
	BreakerCooldown = 30 * time.Second
	// BreakerMaxCooldown caps the breaker's cool-down.
	BreakerMaxCooldown = 10 * time.Minute
	// MaxResponseBytes caps how much of a response body the client reads.
	MaxResponseBytes = 1 << 20
	// MaxExecutionBytes caps the body of an execution read with its stacks (LatestExecution,
	// LastDurations): the server takes executions of up to 10,000 stacks, about 500 bytes each
	// with their edge and change reason.
	MaxExecutionBytes = 16 << 20
	// MaxRedirects caps same-host redirects.
	MaxRedirects = 3
	// MaxInFlight caps concurrent best-effort requests, so a black-holed server sees a handful
	// of connections before the breaker opens rather than one per waiting event.
	MaxInFlight = 16
)

// TokenFunc returns a bearer token for one request.
type TokenFunc = gauth.TokenFunc

// Client posts execution lifecycle events to the control plane. It wraps the client generated
// from api/openapi.yaml with the runner's conventions: disabled on an empty URL, bearer tokens
// sent only to the configured host, bounded time per call, and non-2xx answers as errors.
type Client struct {
	base     *url.URL
	api      *api.Client
	token    TokenFunc
	gated    bool
	broken   error // why a configured server cannot be used; GateCheck then denies
	breaker  *breaker
	inflight chan struct{}
	// noUpdates and noPhases are set once the server showed it lacks the batch operation.
	noUpdates, noPhases atomic.Bool

	mu       sync.Mutex
	audience string
	authMode string // how the ID tokens for audience are minted (AuthGoogle, AuthGitHubActions)

	// budgets, overridable by tests in this package
	callBudget, attemptTimeout time.Duration
	gateBudget, gateAttempt    time.Duration
	historyBudget              time.Duration
	sleep                      func(context.Context, time.Duration) error
}

// NewClient builds an unauthenticated client for the server at baseURL. An empty baseURL
// returns a disabled client (every call a no-op) and no error; a malformed one is an error.
func NewClient(baseURL string) (*Client, error) {
	return NewClientTokenSource(baseURL, nil)
}

// NewClientTokenSource builds a client whose requests carry bearer tokens from token (nil:
// unauthenticated). The token is sent only to baseURL's scheme and host, never on a redirect
// elsewhere.
func NewClientTokenSource(baseURL string, token TokenFunc) (*Client, error) {
	c := &Client{
		token:          token,
		breaker:        &breaker{threshold: BreakerThreshold, cooldown: BreakerCooldown, maxCooldown: BreakerMaxCooldown, now: time.Now},
		inflight:       make(chan struct{}, MaxInFlight),
		callBudget:     CallBudget,
		attemptTimeout: AttemptTimeout,
		gateBudget:     GateBudget,
		gateAttempt:    GateAttemptTimeout,
		historyBudget:  HistoryBudget,
		sleep:          sleepCtx,
	}
	baseURL = strings.TrimSpace(baseURL)
	if baseURL == "" {
		return c, nil
	}
	u, err := gauth.ParseServerURL(baseURL)
	if err != nil {
		return nil, err
	}
	c.base = u
	hc := &http.Client{
		Transport:     &gauth.Transport{Origin: u, Token: token, Next: newTransport()},
		CheckRedirect: sameHostRedirects(u),
	}
	server := strings.TrimSuffix(u.String(), "/") + "/api/v1"
	gen, err := api.NewClient(server, api.WithHTTPClient(hc))
	if err != nil {
		return nil, fmt.Errorf("server URL %q: %w", baseURL, err)
	}
	c.api = gen
	return c, nil
}

// newTransport is the client's transport. It sets no bound on the wait for an answer: each
// call's context bounds its attempts (an attempt of a best-effort call, the gate check's, the
// operator's --timeout of a strict one).
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     60 * time.Second,
		ForceAttemptHTTP2:   true,
	}
}

// ClientFromEnv builds a Client from TFSTACKPLAN_SERVER (empty: disabled). Auth comes from
// TFSTACKPLAN_TOKEN, TFSTACKPLAN_AUDIENCE and TFSTACKPLAN_AUTH as for RunClient, except that ID
// tokens that cannot be obtained give a warning on stderr and unauthenticated requests
// (best-effort reporting degrades; the fail-closed gate check will be denied by the server). A
// server that is set but cannot be used (a malformed URL, settings that contradict each other)
// gives a client that reports nothing and whose GateCheck denies.
func ClientFromEnv() *Client {
	c, err := clientFor(os.Getenv(EnvServer), AuthFor(Environment{}, os.Getenv), os.Getenv, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tfstackplan: warning: %v; reporting disabled\n", err)
		return BrokenClient(err)
	}
	return c
}

// BrokenClient returns a client for a server that is configured but cannot be used (why says
// why): every best-effort call is a no-op, and GateCheck denies with why, because an apply
// must never pass a gate that could not be asked.
func BrokenClient(why error) *Client {
	c, _ := NewClient("")
	c.broken = why
	return c
}

// Broken returns why a configured server cannot be used, or nil.
func (c *Client) Broken() error {
	if c == nil {
		return nil
	}
	return c.broken
}

// StaticToken returns a TokenFunc that always sends token (TFSTACKPLAN_TOKEN: a static bearer
// for a server configured with a tokens file); nil for an empty token.
func StaticToken(token string) TokenFunc { return gauth.Static(token) }

// clientFor builds a client of server authenticated as a says (see ClientFromEnv).
func clientFor(server string, a ServerAuth, getenv func(string) string, warn io.Writer) (*Client, error) {
	if strings.TrimSpace(server) == "" {
		return NewClient("")
	}
	if err := a.Check(); err != nil {
		return nil, err
	}
	tok, err := a.TokenFunc(getenv)
	if err != nil {
		fmt.Fprintf(warn, "tfstackplan: warning: %v; requests go unauthenticated\n", err)
		tok = nil
	}
	c, err := NewClientTokenSource(server, tok)
	if err != nil {
		return nil, err
	}
	c.setAuth(a)
	return c, nil
}

// APITokenFunc returns the bearer source for the API: a non-empty audience selects Google OIDC
// ID tokens from Application Default Credentials, discovery bounded to 10 s; an empty audience
// returns nil, nil and probes nothing.
func APITokenFunc(audience string) (TokenFunc, error) {
	return gauth.IDTokenFunc(audience)
}

// Enabled reports whether a server is configured. When false every call is a no-op.
func (c *Client) Enabled() bool { return c != nil && c.api != nil }

// Unreachable reports whether the breaker is open: the server failed at the transport level
// recently and calls are failed fast.
func (c *Client) Unreachable() bool { return c != nil && c.breaker.open() }

// SetAudience records the audience this client's tokens are minted for (used in messages).
func (c *Client) SetAudience(aud string) {
	c.mu.Lock()
	c.audience = aud
	c.mu.Unlock()
}

// Audience returns the audience set with SetAudience.
func (c *Client) Audience() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.audience
}

// setAuth records the audience a's ID tokens are minted for, and how.
func (c *Client) setAuth(a ServerAuth) {
	c.mu.Lock()
	c.audience, c.authMode = a.Audience, a.Resolved()
	c.mu.Unlock()
}

// AuthMode returns how the ID tokens for Audience are minted (AuthGoogle, AuthGitHubActions;
// AuthGoogle for an audience set with SetAudience alone), "" without an audience.
func (c *Client) AuthMode() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ServerAuth{Mode: c.authMode, Audience: c.audience}.Resolved()
}

// BaseURL returns the configured server URL, or "" when disabled.
func (c *Client) BaseURL() string {
	if !c.Enabled() {
		return ""
	}
	return c.base.String()
}
