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
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tfstackplan/tfstackplan/events"
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

// ErrDisabled is returned by operations that need a server when none is configured.
var ErrDisabled = errors.New("no tfstackplan server configured")

// ErrCircuitOpen is returned, fast, while the breaker is open after repeated transport failures.
var ErrCircuitOpen = errors.New("tfstackplan server unreachable recently; skipping call (circuit open)")

// ErrCancelRequested is wrapped by the error a runner event returns when an administrator
// cancelled the execution: the event was stored, and the runner should stop.
var ErrCancelRequested = errors.New("execution cancelled on the server")

// CancelledError carries the administrator's reason for a cancellation.
type CancelledError struct{ Reason string }

// Error says the execution was cancelled, with the reason when there is one.
func (e *CancelledError) Error() string {
	if e.Reason == "" {
		return ErrCancelRequested.Error()
	}
	return ErrCancelRequested.Error() + ": " + e.Reason
}

// Is makes errors.Is(err, ErrCancelRequested) true.
func (e *CancelledError) Is(target error) bool { return target == ErrCancelRequested }

// APIError is a non-2xx answer from the server.
type APIError struct {
	Op         string     // the operation, e.g. "Phase"
	StatusCode int        // HTTP status
	Code       codes.Code // the grpc code named in the body; codes.Unknown when absent or unparsable
	CodeName   string     // the code as the server spelled it
	Message    string     // the server's message, bounded
}

// Error names the operation, the HTTP status, the code and the server's message.
func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.StatusCode)
	}
	name := e.CodeName
	if name == "" {
		name = "no code"
	}
	return fmt.Sprintf("%s: server answered %d (%s): %s", e.Op, e.StatusCode, name, msg)
}

// TransportError is a failure to get any answer: refused, reset, timeout, TLS, DNS, redirect
// refused, or a body cut short.
type TransportError struct {
	Op  string
	Err error
}

// Error names the operation and the transport failure.
func (e *TransportError) Error() string { return e.Op + ": " + e.Err.Error() }

// Unwrap returns the transport failure.
func (e *TransportError) Unwrap() error { return e.Err }

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

func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: GateAttemptTimeout,
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       60 * time.Second,
		ForceAttemptHTTP2:     true,
	}
}

// sameHostRedirects follows a redirect only to the configured scheme and host: a bearer token
// must never reach another host.
func sameHostRedirects(base *url.URL) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if len(via) > MaxRedirects {
			return fmt.Errorf("stopped after %d redirects", MaxRedirects)
		}
		if !gauth.SameOrigin(base, req.URL) {
			// Not followed: the 3xx itself becomes the answer (a non-2xx, so an error).
			return http.ErrUseLastResponse
		}
		return nil
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

// Init announces the execution.
func (c *Client) Init(ctx context.Context, in events.Init) error {
	return c.eventJSON(ctx, "Init", in, c.api.InitWithBody)
}

// initBody is Init for an announcement already encoded as JSON (run.init measures it).
func (c *Client) initBody(ctx context.Context, body []byte) error {
	return c.eventBody(ctx, "Init", body, c.api.InitWithBody)
}

// Phase reports that a stack entered a phase.
func (c *Client) Phase(ctx context.Context, p events.PhaseEvent) error {
	return c.event(ctx, "Phase", func(ctx context.Context) (*http.Response, error) { return c.api.Phase(ctx, p) })
}

// MaxPhaseBatch bounds the phase events of one Phases request (the server takes up to 1000).
const MaxPhaseBatch = 500

// Phases reports several phase events of one execution (best-effort), in order, in as few
// requests as MaxPhaseBatch and MaxUpdateBatchBytes allow, falling back as Updates does.
func (c *Client) Phases(ctx context.Context, phases []events.PhaseEvent) error {
	return sendBatched(c, ctx, phases, batchOp{name: "Phases", field: "phases", max: MaxPhaseBatch, none: &c.noPhases,
		post: c.api.PhasesWithBody}, c.Phase)
}

// Update reports a stack's status and classification.
func (c *Client) Update(ctx context.Context, u events.Update) error {
	return c.event(ctx, "Update", func(ctx context.Context) (*http.Response, error) { return c.api.Update(ctx, u) })
}

// Bounds of one Updates request the client sends.
const (
	// MaxUpdateBatch bounds the updates of one request (the server takes up to 1000).
	MaxUpdateBatch = 500
	// MaxUpdateBatchBytes bounds the encoded updates of one request, below the server's body
	// limit; an update larger than it alone goes alone.
	MaxUpdateBatchBytes = 1 << 20
)

// Updates reports several stacks' updates of one execution (best-effort), in order, in as few
// requests as MaxUpdateBatch and MaxUpdateBatchBytes allow; the server stores each request's
// updates together or not at all. A server without the operation (it answers 403, 404 or 405:
// an older tfstackplan refuses a runner an unknown path with 403, where an Update goes through)
// gets one Update a request from then on; a batch refused as invalid is sent again one update
// a request, so that only the invalid update is lost, as with Update. It returns the first
// error, a server-side cancel before any other; every batch is sent whatever the earlier ones
// met.
func (c *Client) Updates(ctx context.Context, updates []events.Update) error {
	return sendBatched(c, ctx, updates, batchOp{name: "Updates", field: "updates", max: MaxUpdateBatch, none: &c.noUpdates,
		post: c.api.UpdatesWithBody}, c.Update)
}

// batchOp describes a batch operation of runner events: its name, the JSON field of its body
// that lists the events, the most events of one request, the flag set once the server showed
// it lacks the operation, and the generated call that posts an encoded body.
type batchOp struct {
	name, field string
	max         int
	none        *atomic.Bool
	post        bodySender
}

// sendBatched sends items with op as Updates describes it, and each one alone with single when
// op cannot carry it. A batch refused with 403, 404 or 405 is the server's lack of the
// operation only when its first event, sent alone, is not refused the same way; otherwise the
// refusal is the execution's (unknown, or another principal's) and the rest of the batch is not
// sent one by one to meet it again.
func sendBatched[T any](c *Client, ctx context.Context, items []T, op batchOp, single func(context.Context, T) error) error {
	if !c.Enabled() || len(items) == 0 {
		return nil
	}
	var errs batchErrors
	if op.none.Load() {
		for _, it := range items {
			errs.add(single(ctx, it))
		}
		return errs.first()
	}
	encoded := make([][]byte, len(items))
	for i, it := range items {
		b, err := json.Marshal(it)
		if err != nil {
			return fmt.Errorf("%s: %w", op.name, err)
		}
		encoded[i] = b
	}
	for start := 0; start < len(items); {
		end, size := start+1, len(encoded[start])
		for end < len(items) && end-start < op.max && size+1+len(encoded[end]) <= MaxUpdateBatchBytes {
			size += 1 + len(encoded[end])
			end++
		}
		body := append(append([]byte(`{"`+op.field+`":[`), bytes.Join(encoded[start:end], []byte(","))...), "]}"...)
		err := c.eventBody(ctx, op.name, body, op.post)
		var ae *APIError
		switch {
		case errors.As(err, &ae) && (ae.StatusCode == http.StatusForbidden || ae.StatusCode == http.StatusNotFound || ae.StatusCode == http.StatusMethodNotAllowed):
			// A server without the operation, or a refusal of the execution itself (not
			// announced, or another principal's), which the single operation meets too: the
			// first event, sent alone, tells them apart.
			first := single(ctx, items[start])
			var fe *APIError
			if errors.As(first, &fe) && fe.StatusCode == ae.StatusCode {
				errs.add(first)
				break
			}
			op.none.Store(true)
			errs.add(first)
			for _, it := range items[start+1 : end] {
				errs.add(single(ctx, it))
			}
		case errors.As(err, &ae) && ae.StatusCode == http.StatusBadRequest && end-start > 1:
			for _, it := range items[start:end] {
				errs.add(single(ctx, it))
			}
		default:
			errs.add(err)
		}
		start = end
	}
	return errs.first()
}

// batchErrors keeps the first error of a batch's calls, and the first server-side cancel.
type batchErrors struct{ err, cancel error }

func (e *batchErrors) add(err error) {
	if e.err == nil {
		e.err = err
	}
	if e.cancel == nil && errors.Is(err, ErrCancelRequested) {
		e.cancel = err
	}
}

func (e *batchErrors) first() error {
	if e.cancel != nil {
		return e.cancel
	}
	return e.err
}

// LogChunk posts a slice of one stack's log, or a gap (best-effort).
func (c *Client) LogChunk(ctx context.Context, lc events.LogChunk) error {
	return c.eventJSON(ctx, "LogChunk", lc, c.api.LogChunkWithBody)
}

// LogChunks posts several chunks of one execution's logs in one request (best-effort); the
// server stores them together or not at all.
func (c *Client) LogChunks(ctx context.Context, chunks []events.LogChunk) error {
	if len(chunks) == 0 {
		return nil
	}
	return c.eventJSON(ctx, "LogChunks", api.LogChunks{Chunks: chunks}, c.api.LogChunksWithBody)
}

// Heartbeat says that the run of an execution goes on (best-effort, through the breaker: while
// the server is unreachable it costs nothing).
func (c *Client) Heartbeat(ctx context.Context, id string) error {
	return c.event(ctx, "Heartbeat", func(ctx context.Context) (*http.Response, error) {
		return c.api.Heartbeat(ctx, events.Heartbeat{ExecutionID: id})
	})
}

// Finalize ends the execution.
func (c *Client) Finalize(ctx context.Context, f events.Finalize) error {
	return c.eventJSON(ctx, "Finalize", f, c.api.FinalizeWithBody)
}

// finalizeBody is Finalize for a body already encoded as JSON (run.finalize sizes its budget
// by it).
func (c *Client) finalizeBody(ctx context.Context, body []byte) error {
	return c.eventBody(ctx, "Finalize", body, c.api.FinalizeWithBody)
}

// finalizeRetrying is finalizeBody, tried again while it fails at the transport level (the
// server went away, the breaker is open) and ctx leaves time for another try: each retry goes
// once the breaker's cool-down lets a probe through, so an execution whose server came back
// within the budget is not left running. A cool-down that outlasts ctx ends it at once (a dead
// server costs no more than it did).
func (c *Client) finalizeRetrying(ctx context.Context, body []byte) error {
	for {
		err := c.finalizeBody(ctx, body)
		var te *TransportError
		if err == nil || !errors.As(err, &te) {
			return err
		}
		wait := max(c.breaker.untilProbe(), minFinalizeRetry)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait+c.attemptTimeout {
			return err
		}
		if c.sleep(ctx, wait) != nil {
			return err
		}
	}
}

// minFinalizeRetry spaces out Finalize's retries when the breaker lets calls through at once
// (it opens only after BreakerThreshold failures).
const minFinalizeRetry = time.Second

// GateRevoke ends the lease a gate check granted (best-effort post-apply cleanup).
func (c *Client) GateRevoke(ctx context.Context, g events.GateRevoke) error {
	return c.event(ctx, "GateRevoke", func(ctx context.Context) (*http.Response, error) { return c.api.GateRevoke(ctx, g) })
}

// ClaimsList returns the current apply-lock claims of a repository's environment (repo empty:
// the server's choice for the principal, see the contract); nil, nil when disabled.
func (c *Client) ClaimsList(ctx context.Context, repo, env string) ([]events.Claim, error) {
	if !c.Enabled() {
		return nil, nil
	}
	params := &api.ClaimsListParams{Repo: repo, Environment: env}
	body, err := c.call(ctx, "ClaimsList", false, func(ctx context.Context) (*http.Response, error) {
		return c.api.ClaimsList(ctx, params)
	})
	if err != nil {
		return nil, err
	}
	var claims []events.Claim
	if err := json.Unmarshal(body, &claims); err != nil {
		return nil, fmt.Errorf("ClaimsList: malformed answer: %w", err)
	}
	return claims, nil
}

// ExecutionGates asks what plan execution id needs before its apply: the gates it requires
// under the server's policy, satisfied or not, and the other PRs' claims on its stacks; nil,
// nil when disabled.
func (c *Client) ExecutionGates(ctx context.Context, id string) (*api.ExecutionGates, error) {
	if !c.Enabled() {
		return nil, nil
	}
	body, err := c.call(ctx, "ExecutionGates", true, func(ctx context.Context) (*http.Response, error) {
		return c.api.ExecutionGates(ctx, id)
	})
	if err != nil {
		return nil, err
	}
	var out api.ExecutionGates
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("ExecutionGates: malformed answer: %w", err)
	}
	return &out, nil
}

// Bounds of the reads of past executions (LastDurations, LatestExecution).
const (
	// HistoryBudget bounds one LastDurations or LatestExecution call as a whole: its list
	// requests and execution reads, retries included.
	HistoryBudget = 4 * time.Second
	// MaxDurationExecutions caps the finished plan executions LastDurations reads.
	MaxDurationExecutions = 5
	// historyPage is how many executions one list request asks for.
	historyPage = 50
	// maxHistoryPages caps the list pages LatestExecution walks looking for its op.
	maxHistoryPages = 4
	// maxDurationMS is the longest duration, in milliseconds, a time.Duration holds.
	maxDurationMS = math.MaxInt64 / int64(time.Millisecond)
)

// ErrNoExecution says the server has no execution of the PR, environment and op asked for
// (LatestExecution).
var ErrNoExecution = errors.New("no such execution on the server")

// LastDurations returns, per stack (its root-relative path, as the runner reports it), how
// long its most recent ended run took in a finished plan execution of repo's environment, any
// PR (repo empty: the server's choice for the principal). It lists the newest executions and
// reads the finished plans among them, newest first, until every stack of want (nil: every
// stack they name) has a duration or MaxDurationExecutions were read: an older plan fills only
// the stacks the newer ones left without one. It is best-effort: within HistoryBudget and
// through the breaker like every read, and a stack missing from the map is unknown. A disabled
// client returns nil, nil without a request. On an error the map holds what was read before it
// (possibly nothing).
func (c *Client) LastDurations(ctx context.Context, repo, environment string, want []string) (map[string]time.Duration, error) {
	const op = "LastDurations"
	if !c.Enabled() {
		return nil, nil
	}
	if environment == "" {
		return nil, fmt.Errorf("%s: the environment is required", op)
	}
	ctx, cancel := context.WithTimeout(ctx, c.historyBudget)
	defer cancel()
	list, err := c.executionsList(ctx, op, &api.ExecutionsListParams{Repo: repo, Environment: environment, Limit: new(int(historyPage))})
	if err != nil {
		return nil, err
	}
	out, seen, read := map[string]time.Duration{}, map[string]bool{}, 0
	for _, x := range list {
		if x.Op != api.ExecutionOpPlan || x.Status == api.ExecutionStatusRunning || x.Environment != environment {
			continue
		}
		if read == MaxDurationExecutions || read > 0 && known(out, seen, want) {
			break
		}
		full, err := c.executionGet(ctx, op, x.ExecutionID)
		if isNotFound(err) {
			continue // removed since it was listed
		}
		if err != nil {
			return out, err
		}
		read++
		for _, st := range full.Stacks {
			seen[st.Stack] = true
			if _, known := out[st.Stack]; !known && st.DurationMS != nil && *st.DurationMS >= 0 && *st.DurationMS <= maxDurationMS {
				out[st.Stack] = time.Duration(*st.DurationMS) * time.Millisecond
			}
		}
	}
	return out, nil
}

// known reports whether out has a duration for every stack of want, or with want nil for every
// stack seen.
func known(out map[string]time.Duration, seen map[string]bool, want []string) bool {
	if want == nil {
		return len(out) == len(seen)
	}
	for _, w := range want {
		if _, ok := out[w]; !ok {
			return false
		}
	}
	return true
}

// LatestExecution returns the newest execution of pr in repo's environment (repo empty: the
// server's choice for the principal) whose op is op (plan or apply), whatever its status, with
// its stacks and edges: the first of its op in the server's list of the PR's executions,
// newest first, among the newest few hundred. An error wrapping ErrNoExecution says there is
// none; a disabled client returns ErrDisabled. Within HistoryBudget, through the breaker.
func (c *Client) LatestExecution(ctx context.Context, repo, environment string, pr int, op string) (*api.Execution, error) {
	const name = "LatestExecution"
	if !c.Enabled() {
		return nil, ErrDisabled
	}
	switch {
	case environment == "":
		return nil, fmt.Errorf("%s: the environment is required", name)
	case pr <= 0:
		return nil, fmt.Errorf("%s: pr %d is not a pull request number", name, pr)
	case op != string(api.ExecutionOpPlan) && op != string(api.ExecutionOpApply):
		return nil, fmt.Errorf("%s: op %q is neither plan nor apply", name, op)
	}
	ctx, cancel := context.WithTimeout(ctx, c.historyBudget)
	defer cancel()
	none := fmt.Errorf("%w: no %s execution of PR %d in environment %q", ErrNoExecution, op, pr, environment)
	params := &api.ExecutionsListParams{Repo: repo, Environment: environment, Pr: pr, Limit: new(int(historyPage))}
	for range maxHistoryPages {
		list, err := c.executionsList(ctx, name, params)
		if err != nil {
			return nil, err
		}
		for _, x := range list {
			if string(x.Op) == op && x.Environment == environment && x.PR == pr {
				full, err := c.executionGet(ctx, name, x.ExecutionID)
				if isNotFound(err) {
					return nil, none // removed since it was listed
				}
				return full, err
			}
		}
		if len(list) < historyPage {
			break
		}
		last := list[len(list)-1]
		params.Before, params.BeforeID = &last.StartedAt, &last.ExecutionID
	}
	return nil, none
}

// executionsList reads one page of executions for the read op.
func (c *Client) executionsList(ctx context.Context, op string, params *api.ExecutionsListParams) ([]api.Execution, error) {
	body, err := c.call(ctx, op, true, func(ctx context.Context) (*http.Response, error) {
		return c.api.ExecutionsList(ctx, params)
	})
	if err != nil {
		return nil, err
	}
	var out []api.Execution
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("%s: malformed list of executions: %w", op, err)
	}
	return out, nil
}

// executionGet reads execution id with its stacks and edges for the read op.
func (c *Client) executionGet(ctx context.Context, op, id string) (*api.Execution, error) {
	body, err := c.callSized(ctx, op, true, 0, MaxExecutionBytes, func(ctx context.Context) (*http.Response, error) {
		return c.api.ExecutionGet(ctx, id)
	})
	if err != nil {
		return nil, err
	}
	var out api.Execution
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("%s: malformed execution %q: %w", op, id, err)
	}
	return &out, nil
}

// isNotFound says err is the server's answer that what was asked for does not exist.
func isNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound
}

// ClaimsRelease releases claims as body says: the claims of the runner's own execution.
func (c *Client) ClaimsRelease(ctx context.Context, body api.ClaimsRelease) error {
	return c.event(ctx, "ClaimsRelease", func(ctx context.Context) (*http.Response, error) { return c.api.ClaimsRelease(ctx, body) })
}

// AdminChecksOverride overrides a check's conclusion.
func (c *Client) AdminChecksOverride(ctx context.Context, body api.ChecksOverride) error {
	return c.admin(ctx, "AdminChecksOverride", func(ctx context.Context) (*http.Response, error) { return c.api.AdminChecksOverride(ctx, body) })
}

// AdminExecutionsCancel cancels a running execution.
func (c *Client) AdminExecutionsCancel(ctx context.Context, id, reason string) error {
	body := api.ExecutionsCancel{ExecutionID: id, Reason: reason}
	return c.admin(ctx, "AdminExecutionsCancel", func(ctx context.Context) (*http.Response, error) { return c.api.AdminExecutionsCancel(ctx, body) })
}

// AdminGatesSatisfy approves a plan's content for one of its gates.
func (c *Client) AdminGatesSatisfy(ctx context.Context, body api.GatesSatisfy) error {
	return c.admin(ctx, "AdminGatesSatisfy", func(ctx context.Context) (*http.Response, error) { return c.api.AdminGatesSatisfy(ctx, body) })
}

// AdminGrantsRelease ends an active grant.
func (c *Client) AdminGrantsRelease(ctx context.Context, body api.GrantsRelease) error {
	return c.admin(ctx, "AdminGrantsRelease", func(ctx context.Context) (*http.Response, error) { return c.api.AdminGrantsRelease(ctx, body) })
}

// admin runs an operator call. Like every call of a disabled client it is a no-op returning
// nil when no server is configured; the CLI checks Enabled first and tells the operator.
func (c *Client) admin(ctx context.Context, op string, send func(context.Context) (*http.Response, error)) error {
	if !c.Enabled() {
		return nil
	}
	_, err := c.call(ctx, op, true, send)
	return err
}

// event sends one best-effort runner event and interprets the Ack.
func (c *Client) event(ctx context.Context, op string, send func(context.Context) (*http.Response, error)) error {
	return c.eventSized(ctx, op, 0, send)
}

// eventJSON is event for a body encoded once here, so that the request gets time for its size
// (see callSized): an Init or Finalize of thousands of stacks, or a batch of log chunks, is
// megabytes.
func (c *Client) eventJSON(ctx context.Context, op string, v any, send bodySender) error {
	if !c.Enabled() {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return c.eventBody(ctx, op, b, send)
}

// bodySender is a generated client's ...WithBody operation.
type bodySender func(context.Context, string, io.Reader, ...api.RequestEditorFn) (*http.Response, error)

// eventBody is event for a JSON body, sent afresh on every attempt with time for its size.
func (c *Client) eventBody(ctx context.Context, op string, body []byte, send bodySender) error {
	return c.eventSized(ctx, op, len(body), func(ctx context.Context) (*http.Response, error) {
		return send(ctx, "application/json", bytes.NewReader(body))
	})
}

// uploadTime is how long size bytes take to upload at SlowestUpload: what a post of that size
// gets on top of the usual bounds, per attempt.
func uploadTime(size int) time.Duration {
	return time.Duration(int64(max(size, 0)) * int64(time.Second) / SlowestUpload)
}

// sizedBounds is the budget of a call of attempts attempts at a request of size bytes, and the
// timeout of each attempt: the usual bounds (budget, attempt) and, per attempt, uploadTime(size).
func sizedBounds(budget, attempt time.Duration, attempts, size int) (total, each time.Duration) {
	upload := uploadTime(size)
	return budget + time.Duration(attempts)*upload, attempt + upload
}

// eventSized is event for a request of about size bytes (see callSized).
func (c *Client) eventSized(ctx context.Context, op string, size int, send func(context.Context) (*http.Response, error)) error {
	if !c.Enabled() {
		return nil
	}
	body, err := c.callSized(ctx, op, true, size, MaxResponseBytes, send)
	if err != nil {
		return err
	}
	var ack events.Ack
	if len(bytes.TrimSpace(body)) > 0 {
		if err := json.Unmarshal(body, &ack); err != nil {
			return fmt.Errorf("%s: malformed answer: %w", op, err)
		}
	}
	if ack.Cancel {
		return &CancelledError{Reason: ack.Reason}
	}
	return nil
}

// call runs one best-effort request within CallBudget: bounded attempts, backoff honouring
// Retry-After, the breaker. It returns the 2xx body or an *APIError / *TransportError.
func (c *Client) call(ctx context.Context, op string, idempotent bool, send func(context.Context) (*http.Response, error)) ([]byte, error) {
	return c.callSized(ctx, op, idempotent, 0, MaxResponseBytes, send)
}

// callSized is call for a request body of about size bytes: each attempt, and the budget for
// each, get the time that many bytes take at SlowestUpload on top of the usual bounds. It reads
// at most maxBody bytes of the answer.
func (c *Client) callSized(ctx context.Context, op string, idempotent bool, size, maxBody int, send func(context.Context) (*http.Response, error)) ([]byte, error) {
	if !c.breaker.allow() {
		return nil, &TransportError{Op: op, Err: ErrCircuitOpen}
	}
	defer c.breaker.settle()
	attempts := 1
	if idempotent {
		attempts = MaxAttempts
	}
	budget, each := sizedBounds(c.callBudget, c.attemptTimeout, attempts, size)
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	select {
	case c.inflight <- struct{}{}:
		defer func() { <-c.inflight }()
	case <-ctx.Done():
		return nil, &TransportError{Op: op, Err: fmt.Errorf("waiting for a free connection: %w", ctx.Err())}
	}
	// The breaker may have opened while this call waited for a slot.
	if !c.breaker.allowWaiting() {
		return nil, &TransportError{Op: op, Err: ErrCircuitOpen}
	}
	res := c.attemptsUpTo(ctx, op, attempts, each, maxBody, send, c.breaker)
	if res.transport != nil {
		return nil, res.transport
	}
	if res.status < 200 || res.status > 299 {
		return nil, res.apiError(op)
	}
	if !isJSON(res.contentType) {
		return nil, fmt.Errorf("%s: answer is %q, not JSON", op, res.contentType)
	}
	return res.body, nil
}

// result is the outcome of the last attempt of a call.
type result struct {
	status      int
	contentType string
	body        []byte
	retryAfter  time.Duration
	transport   *TransportError
}

func (r result) apiError(op string) *APIError {
	e := &APIError{Op: op, StatusCode: r.status, Code: codes.Unknown}
	var body api.Error
	if err := json.Unmarshal(r.body, &body); err == nil && body.Code != "" {
		e.CodeName = body.Code
		e.Message = truncate(body.Message, 512)
		var code codes.Code
		if err := code.UnmarshalJSON([]byte(strconv.Quote(body.Code))); err == nil {
			e.Code = code
		}
	} else {
		e.Message = truncate(strings.TrimSpace(string(r.body)), 256)
	}
	return e
}

// retryable statuses: the server is overloaded or restarting.
func retryable(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// attempts sends up to n attempts within ctx, reading at most MaxResponseBytes of an answer.
// br, when not nil, records transport outcomes.
func (c *Client) attempts(ctx context.Context, op string, n int, perAttempt time.Duration, send func(context.Context) (*http.Response, error), br *breaker) result {
	return c.attemptsUpTo(ctx, op, n, perAttempt, MaxResponseBytes, send, br)
}

// attemptsUpTo is attempts reading at most maxBody bytes of an answer.
func (c *Client) attemptsUpTo(ctx context.Context, op string, n int, perAttempt time.Duration, maxBody int, send func(context.Context) (*http.Response, error), br *breaker) result {
	var res result
	backoff := 100 * time.Millisecond
	for i := 0; i < n; i++ {
		if i > 0 {
			wait := backoff
			if res.retryAfter > 0 {
				wait = res.retryAfter
			}
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait+10*time.Millisecond {
				break // the wait would outlast the budget: report what we have
			}
			if err := c.sleep(ctx, wait); err != nil {
				break
			}
			backoff *= 2
		}
		res = c.once(ctx, op, perAttempt, maxBody, send)
		if res.transport != nil {
			var te *gauth.TokenError
			if errors.As(res.transport, &te) {
				return res // local failure; retrying will not help and the server is not at fault
			}
			// A caller that cancelled is not evidence against the server.
			if br != nil && !errors.Is(ctx.Err(), context.Canceled) && br.failure() {
				return res
			}
			if ctx.Err() != nil {
				return res
			}
			continue
		}
		if br != nil {
			br.success()
		}
		if !retryable(res.status) {
			return res
		}
	}
	return res
}

// once sends one attempt and reads at most maxBody bytes of its body, all within perAttempt.
func (c *Client) once(ctx context.Context, op string, perAttempt time.Duration, maxBody int, send func(context.Context) (*http.Response, error)) result {
	actx, cancel := context.WithTimeout(ctx, perAttempt)
	defer cancel()
	resp, err := send(actx)
	if err != nil {
		return result{transport: &TransportError{Op: op, Err: err}}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(maxBody)+1))
	if err != nil {
		return result{transport: &TransportError{Op: op, Err: fmt.Errorf("reading answer (HTTP %d): %w", resp.StatusCode, err)}}
	}
	res := result{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: body}
	if len(body) > maxBody {
		// Too large to be one of ours: keep the status, drop the body so it cannot parse.
		res.body = nil
		res.contentType = "oversized"
	}
	res.retryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	return res
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// parseRetryAfter reads delay-seconds or an HTTP date; 0 when absent or invalid.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil {
		if secs < 0 {
			return 0
		}
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// breaker fails calls fast after consecutive transport failures, letting one probe through
// per cool-down; the cool-down doubles after each failed probe.
type breaker struct {
	threshold   int
	cooldown    time.Duration
	maxCooldown time.Duration
	now         func() time.Time

	mu       sync.Mutex
	failures int
	openTill time.Time
	current  time.Duration
	probing  bool
}

// allow reports whether a call may go out now.
func (b *breaker) allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures < b.threshold {
		return true
	}
	if b.probing || b.now().Before(b.openTill) {
		return false
	}
	b.probing = true
	return true
}

// untilProbe is how long until the breaker lets a call through (0: now, or it is closed).
func (b *breaker) untilProbe() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures < b.threshold {
		return 0
	}
	return max(b.openTill.Sub(b.now()), 0)
}

// open reports whether calls are being failed fast now.
func (b *breaker) open() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failures >= b.threshold && b.now().Before(b.openTill)
}

// allowWaiting re-checks a call admitted earlier: it fails once the breaker has opened,
// unless that call is the probe itself.
func (b *breaker) allowWaiting() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failures < b.threshold || b.probing
}

// failure records a transport failure and reports whether the breaker is (now) open.
func (b *breaker) failure() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures++
	if b.failures < b.threshold {
		return false
	}
	switch {
	case b.current == 0:
		b.current = b.cooldown
	case b.probing:
		b.current *= 2
		if b.current > b.maxCooldown {
			b.current = b.maxCooldown
		}
	}
	b.probing = false
	b.openTill = b.now().Add(b.current)
	return true
}

// settle ends a probe that neither failed nor succeeded at the transport level (e.g. the token
// could not be minted): the breaker stays open for another cool-down.
func (b *breaker) settle() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.probing {
		b.probing = false
		b.openTill = b.now().Add(b.current)
	}
}

// success closes the breaker.
func (b *breaker) success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures = 0
	b.current = 0
	b.probing = false
}
