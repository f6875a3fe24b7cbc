package cli

// The operator commands (claims, admin, executions, logs) talk to the control plane through the
// generated API client, not through the runner's reporting client: an operator's call is not
// best-effort. It is not retried behind a circuit breaker, it has its own time budget
// (--timeout), and a refusal is shown with the server's message.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/gauth"
	"github.com/tfstackplan/tfstackplan/internal/httpcap"
	"github.com/tfstackplan/tfstackplan/internal/plan"
	"github.com/tfstackplan/tfstackplan/runner"
)

// DefaultOperatorTimeout is the default --timeout of an operator request.
const DefaultOperatorTimeout = 30 * time.Second

// Bounds of an operator connection.
const (
	// maxAnswerBytes caps an answer's body; the largest legitimate one, a 4 MiB log slice, is
	// about 5.6 MB once base64-encoded.
	maxAnswerBytes = 64 << 20
	// maxRedirects caps the redirects followed, all to the configured server.
	maxRedirects = 5
	// maxMessageLen caps the server's message shown in an error.
	maxMessageLen = 1024
)

// ErrNoServer reports that an operator command has no control plane to talk to.
var ErrNoServer = errors.New("no server configured: set TFSTACKPLAN_SERVER or --server")

// ConnOptions say how an operator command reaches the control plane. Authentication follows
// the runner's rules: TFSTACKPLAN_TOKEN (a static bearer) or ID tokens for an audience
// (Google's, or a GitHub Actions job's), never both, and credentials only ever go to the
// configured server.
type ConnOptions struct {
	// Server is the control plane's base URL (--server); empty: TFSTACKPLAN_SERVER.
	Server string
	// Audience selects ID tokens minted for it (--audience); empty: TFSTACKPLAN_AUDIENCE.
	Audience string
	// Auth says how those ID tokens are minted, runner.AuthGoogle or runner.AuthGitHubActions
	// (--auth); empty: TFSTACKPLAN_AUTH, else Google's.
	Auth string
	// Timeout bounds each request, from connecting to the answer's last byte (--timeout).
	Timeout time.Duration
	// Getenv reads the environment (nil: os.Getenv).
	Getenv func(string) string
}

// addConnFlags registers the connection flags of an operator command.
func addConnFlags(f *pflag.FlagSet, c *ConnOptions) {
	f.StringVar(&c.Server, "server", "", "control plane base `URL` (default: $TFSTACKPLAN_SERVER)")
	f.StringVar(&c.Audience, "audience", "", "authenticate with ID tokens for this audience (default: $TFSTACKPLAN_AUDIENCE; the static alternative is $TFSTACKPLAN_TOKEN)")
	f.StringVar(&c.Auth, "auth", "", "how the ID tokens are minted: google (Application Default Credentials) or github-actions (the job's OIDC token) (default: $TFSTACKPLAN_AUTH, else google)")
	f.DurationVar(&c.Timeout, "timeout", DefaultOperatorTimeout, "how long each request to the server may take")
}

// opClient is an operator's connection to the control plane.
type opClient struct {
	api     *api.ClientWithResponses
	server  string
	timeout time.Duration
}

// dial checks the connection options and builds the client; nothing is sent yet.
func (c *ConnOptions) dial() (*opClient, error) {
	getenv := c.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	server := strings.TrimSpace(c.Server)
	if server == "" {
		server = strings.TrimSpace(getenv(runner.EnvServer))
	}
	if server == "" {
		return nil, &UsageError{Err: ErrNoServer}
	}
	if c.Timeout <= 0 {
		return nil, Usagef("--timeout must be positive, not %s", c.Timeout)
	}
	base, err := gauth.ParseServerURL(server)
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	a := runner.AuthFor(runner.Environment{}, getenv)
	if v := strings.TrimSpace(c.Audience); v != "" {
		a.Audience = v
	}
	if v := strings.TrimSpace(c.Auth); v != "" {
		a.Mode = v
	}
	if err := a.Check(); err != nil {
		return nil, &UsageError{Err: err}
	}
	tok, err := a.TokenFunc(getenv)
	if err != nil {
		return nil, err
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	hc := &http.Client{
		Transport:     &gauth.Transport{Origin: base, Token: tok, Next: httpcap.Transport(transport, maxAnswerBytes)},
		CheckRedirect: sameServerRedirects(base),
	}
	gen, err := api.NewClientWithResponses(strings.TrimSuffix(base.String(), "/")+"/api/v1", api.WithHTTPClient(hc))
	if err != nil {
		return nil, &UsageError{Err: fmt.Errorf("server URL %q: %w", server, err)}
	}
	return &opClient{api: gen, server: base.String(), timeout: c.Timeout}, nil
}

// redirectError is a redirect the client refused to follow.
type redirectError struct{ to, server string }

func (e *redirectError) Error() string {
	return fmt.Sprintf("the server redirected to %s; not followed: credentials go only to %s", e.to, e.server)
}

// sameServerRedirects follows redirects only within the configured scheme and host: a bearer
// token must never reach another host.
func sameServerRedirects(base *url.URL) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if !gauth.SameOrigin(base, req.URL) {
			return &redirectError{to: req.URL.Redacted(), server: base.Redacted()}
		}
		if len(via) >= maxRedirects {
			return fmt.Errorf("stopped after %d redirects", maxRedirects)
		}
		return nil
	}
}

// APIError is the control plane's refusal of an operator's request (a non-2xx answer): Main
// exits 2 for INVALID_ARGUMENT (the request as given is wrong), 1 otherwise.
type APIError struct {
	// Op is the command, e.g. "claims release".
	Op string
	// StatusCode is the HTTP status.
	StatusCode int
	// Code is the grpc code name the server gave ("" when it gave none).
	Code string
	// Message is the server's message, bounded and printable.
	Message string
}

// Error names the command, what the status means and the server's message.
func (e *APIError) Error() string {
	var what string
	switch e.StatusCode {
	case http.StatusBadRequest:
		what = "invalid argument"
	case http.StatusUnauthorized:
		what = "unauthenticated"
	case http.StatusForbidden:
		what = "permission denied"
	case http.StatusNotFound:
		what = "not found"
	case http.StatusConflict:
		what = "already exists"
	case http.StatusPreconditionFailed:
		what = "failed precondition"
	case http.StatusTooManyRequests:
		what = "rate limited (retry later)"
	default:
		what = fmt.Sprintf("the server failed (HTTP %d)", e.StatusCode)
	}
	// The server's messages start with the same words (its error kinds): say them once.
	s := e.Op + ": " + what
	if msg := strings.TrimPrefix(e.Message, what+": "); msg != "" && msg != what {
		s += ": " + msg
	}
	if e.StatusCode == http.StatusUnauthorized {
		s += " (set TFSTACKPLAN_TOKEN to a token of the server's tokens file, or --audience/TFSTACKPLAN_AUDIENCE for Google ID tokens)"
	}
	return s
}

// apiAnswer is what every generated <Op>Response offers.
type apiAnswer[T any] interface {
	GetJSON200() *T
	GetJSONDefault() *api.Error
	GetBody() []byte
	StatusCode() int
	ContentType() string
}

// call sends one request within the connection's budget and returns the 200 answer, or the
// error that says why there is none.
func call[T any, R apiAnswer[T]](ctx context.Context, c *opClient, op string, send func(context.Context) (R, error)) (*T, error) {
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	r, err := send(rctx)
	if err != nil {
		return nil, c.transportError(ctx, rctx, op, err)
	}
	if r.StatusCode() != http.StatusOK {
		e := &APIError{Op: op, StatusCode: r.StatusCode()}
		if d := r.GetJSONDefault(); d != nil {
			e.Code, e.Message = d.Code, d.Message
		} else {
			e.Message = strings.TrimSpace(string(r.GetBody()))
		}
		e.Message = clipText(plan.Printable(e.Message), maxMessageLen)
		return nil, e
	}
	v := r.GetJSON200()
	if v == nil {
		return nil, fmt.Errorf("%s: the answer of %s is not JSON (%q)", op, c.server, r.ContentType())
	}
	return v, nil
}

// transportError explains a request that got no usable answer: the caller gave up (ctx), the
// budget ran out (rctx), a redirect was refused, no token could be minted, the server is out of
// reach, or its answer could not be read.
func (c *opClient) transportError(ctx, rctx context.Context, op string, err error) error {
	var re *redirectError
	var te *gauth.TokenError
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", op, ctx.Err())
	case errors.Is(rctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("%s: no answer from %s within %s (--timeout): %w", op, c.server, c.timeout, context.DeadlineExceeded)
	case errors.As(err, &re):
		return fmt.Errorf("%s: %w", op, re)
	case errors.As(err, &te):
		return fmt.Errorf("%s: %w", op, te)
	}
	var ue *url.Error
	if !errors.As(err, &ue) {
		// Not the HTTP client's: the body could not be read or decoded.
		return fmt.Errorf("%s: reading the answer of %s: %w", op, c.server, err)
	}
	return fmt.Errorf("%s: cannot reach %s: %w", op, c.server, ue.Err)
}

func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// addEnvPRFlags registers the required --environment and --pr of an action on a PR.
func addEnvPRFlags(f *pflag.FlagSet, env *string, pr *int) {
	f.StringVarP(env, "environment", "e", "", "the environment (required)")
	f.IntVar(pr, "pr", 0, "the pull request (required)")
}

// addRepoFlag registers --repo, the repository a command acts in or lists.
func addRepoFlag(f *pflag.FlagSet, repo *string) {
	f.StringVar(repo, "repo", "", "the repository, owner/name (default: $GITHUB_REPOSITORY; without either, the server's "+
		"answer for a principal limited to one repository)")
}

// repoOr is the repository a command names: --repo, else $GITHUB_REPOSITORY, else "" (the server
// then takes the one repository the principal is limited to, or says that it needs one). A
// malformed name is a usage error.
func (c *ConnOptions) repoOr(flag string) (string, error) {
	getenv := c.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	repo := strings.TrimSpace(flag)
	if repo == "" {
		repo = strings.TrimSpace(getenv("GITHUB_REPOSITORY"))
	}
	if repo == "" {
		return "", nil
	}
	canon, err := events.CanonicalRepo(repo)
	if err != nil {
		return "", Usagef("--repo: %v", err)
	}
	return canon, nil
}

// requireReason refuses an admin action without a reason: it is what the audit log keeps.
func requireReason(reason string) error {
	if strings.TrimSpace(reason) == "" {
		return Usagef("--reason is required: say why (the server's audit log records it)")
	}
	return nil
}

// requirePR refuses a missing or non-positive --pr.
func requirePR(pr int) error {
	if pr <= 0 {
		return Usagef("--pr must be a pull request number (got %d)", pr)
	}
	return nil
}

// requireFlag refuses an empty value of a required flag.
func requireFlag(name, v string) error {
	if strings.TrimSpace(v) == "" {
		return Usagef("--%s is required", name)
	}
	return nil
}

// orBackground lets run functions be called with the nil context cobra may leave.
func orBackground(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}

// writeJSON writes v as indented JSON, the --json output of every operator command.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// newTable returns a writer aligning tab-separated columns; Flush writes the table.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// row writes one table row: the cells, made printable (a server's text never drives the
// terminal), "-" for an empty one.
func row(w io.Writer, cells ...string) {
	for i, c := range cells {
		if c == "" {
			c = "-"
		}
		cells[i] = plan.Printable(c)
	}
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// stamp formats a time for a table: UTC to the second, "" when unset.
func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// short cuts an identifier to n characters for a table.
func short(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// countsCell is "+create ~update ±replace -delete", with the rarer actions when present; ""
// when nothing changes.
func countsCell(c api.Counts) string {
	if c == (api.Counts{}) {
		return ""
	}
	s := fmt.Sprintf("+%d ~%d ±%d -%d", c.Create, c.Update, c.Replace, c.Delete)
	for _, x := range []struct {
		n    int
		name string
	}{{c.Forget, "forget"}, {c.Import, "import"}, {c.Read, "read"}} {
		if x.n > 0 {
			s += fmt.Sprintf(" %d %s", x.n, x.name)
		}
	}
	return s
}
