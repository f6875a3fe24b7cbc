package cli

// The operator commands (claims, admin, executions, logs) talk to the control plane through
// runner.Client, the driver's client, with the strict call policy: an operator's call is not
// best-effort. It is not retried behind a circuit breaker, it has its own time budget
// (--timeout), and a refusal is shown with the server's message. Each command takes one path:
// operate checks its flags, dials, and runs its calls, which print.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/gauth"
	"github.com/tfstackplan/tfstackplan/internal/termsafe"
	"github.com/tfstackplan/tfstackplan/runner"
)

// DefaultOperatorTimeout is the default --timeout of an operator request.
const DefaultOperatorTimeout = 30 * time.Second

// ErrNoServer reports that an operator command has no control plane to talk to.
var ErrNoServer = errors.New("no server configured: set TFSTACKPLAN_SERVER or --server")

// APIError is the control plane's refusal of a request (a non-2xx answer), the one type the
// driver and the operator commands share. An operator command's INVALID_ARGUMENT (the request
// as given is wrong) is a usage error: Main exits 2 for it, 1 for the others.
type APIError = runner.APIError

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
	rc      *runner.Client
	server  string
	timeout time.Duration
}

// operate is the one path of an operator command: the first of checks that failed (its flags,
// in the order the command checks them) ends it; otherwise it dials the control plane and
// runs call, which makes the requests (through opCall) and prints.
func operate(ctx context.Context, conn *ConnOptions, checks []error, call func(context.Context, *opClient) error) error {
	if err := firstError(checks...); err != nil {
		return err
	}
	c, err := conn.dial()
	if err != nil {
		return err
	}
	return call(orBackground(ctx), c)
}

// opCall makes one request of an operator command, named op in its errors: strict, within the
// connection's --timeout. The error says why there is no answer.
func opCall[T any](ctx context.Context, c *opClient, op string, send func(context.Context, *runner.Client) (T, error)) (T, error) {
	rctx, cancel := context.WithTimeout(runner.WithCallOptions(ctx, runner.CallOptions{Strict: true, Op: op}), c.timeout)
	defer cancel()
	v, err := send(rctx, c.rc)
	if err != nil {
		return v, c.explain(ctx, rctx, op, err)
	}
	return v, nil
}

// opDo is opCall for a request whose answer is only its success.
func opDo(ctx context.Context, c *opClient, op string, send func(context.Context, *runner.Client) error) error {
	_, err := opCall(ctx, c, op, func(ctx context.Context, rc *runner.Client) (struct{}, error) {
		return struct{}{}, send(ctx, rc)
	})
	return err
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
	rc, err := runner.NewClientTokenSource(base.String(), tok)
	if err != nil {
		return nil, &UsageError{Err: fmt.Errorf("server URL %q: %w", server, err)}
	}
	return &opClient{rc: rc, server: base.String(), timeout: c.Timeout}, nil
}

// explain says why a request got no usable answer: the server refused it (an INVALID_ARGUMENT
// is the operator's mistake, a usage error), the caller gave up (ctx), the budget ran out
// (rctx), a redirect was refused, no token could be minted, the server is out of reach, or its
// answer could not be read.
func (c *opClient) explain(ctx, rctx context.Context, op string, err error) error {
	var ae *APIError
	if errors.As(err, &ae) {
		if ae.StatusCode == 400 {
			return &UsageError{Err: err}
		}
		return err
	}
	var te *runner.TransportError
	if !errors.As(err, &te) {
		return err // a malformed answer: its error says so
	}
	var re *runner.RedirectError
	var tokErr *gauth.TokenError
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", op, ctx.Err())
	case errors.Is(rctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("%s: no answer from %s within %s (--timeout): %w", op, c.server, c.timeout, context.DeadlineExceeded)
	case errors.As(err, &re):
		return fmt.Errorf("%s: %w", op, re)
	case errors.As(err, &tokErr):
		return fmt.Errorf("%s: %w", op, tokErr)
	}
	var ue *url.Error
	if !errors.As(err, &ue) {
		// Not the HTTP client's: the body could not be read.
		return fmt.Errorf("%s: reading the answer of %s: %w", op, c.server, te.Err)
	}
	return fmt.Errorf("%s: cannot reach %s: %w", op, c.server, ue.Err)
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

// row writes one table row: the cells, through the one sanitizer (a server's text never
// drives the terminal), "-" for an empty one.
func row(w io.Writer, cells ...string) {
	for i, c := range cells {
		if c == "" {
			c = "-"
		}
		cells[i] = termsafe.Line(c)
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
