package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/web"

	"github.com/spf13/cobra"

	"github.com/tfstackplan/tfstackplan/internal/server"
	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/granter"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/postgres"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlite"
	"github.com/tfstackplan/tfstackplan/internal/server/throttle"
)

// ServeOptions are the options of `tfstackplan serve`.
type ServeOptions struct {
	IO             *IO
	Listen         string
	DB             string
	Policy         string
	Tokens         string
	Audience       string
	InsecureNoAuth bool
	RateLimit      float64
	// MaxConns, MaxStreams and MaxStreamsPerPrincipal cap connections and live streams (0:
	// the server's defaults).
	MaxConns, MaxStreams, MaxStreamsPerPrincipal int
	// MaxConnsPerAddr, UnauthIdleTimeout and MaxRequestsPerPrincipal keep idle and slow
	// callers from holding the connections (0: the server's defaults).
	MaxConnsPerAddr, MaxRequestsPerPrincipal int
	UnauthIdleTimeout                        time.Duration
	// SessionTTL is how long a web sign-in lasts (0: the server's default).
	SessionTTL time.Duration
	// AuthFailureBurst failed authentications from one client address, or of one principal,
	// have it refused for AuthFailureWindow (0: nothing is throttled; a zero window: the
	// server's default).
	AuthFailureBurst  int
	AuthFailureWindow time.Duration
	LogRetention      time.Duration
	// StaleAfter fails an execution the server heard nothing of for this long (0: never).
	StaleAfter time.Duration
	// Retain deletes finished executions, with their logs, older than this (0: keeps them).
	Retain time.Duration
	// Quotas bound what one principal may make the server store (zero fields: unbounded).
	Quotas          service.Quotas
	ShutdownTimeout time.Duration
	// Ready, when set, is called with the bound address once the server accepts connections.
	Ready func(addr string)
	// Validator replaces Google's ID token validator (tests use a loopback key server).
	Validator auth.IDTokenValidator
	// GitHubIssuer is the issuer of the GitHub Actions ID tokens accepted ("": GitHub's, when
	// the tokens file has github blocks).
	GitHubIssuer string
	// GranterSetupTimeout bounds the granter's start-up, for gcp-iam the lookup of its
	// credentials (0: DefaultGranterSetupTimeout).
	GranterSetupTimeout time.Duration
	// MetricsToken, when set, is the bearer token /metrics requires (the command line takes it
	// from --metrics-token, else from EnvMetricsToken).
	MetricsToken string
}

// EnvMetricsToken is where `serve` reads the metrics token when --metrics-token is not given:
// a flag's value is visible to every user of the machine in the process list.
const EnvMetricsToken = "TFSTACKPLAN_METRICS_TOKEN"

// minMetricsToken is the shortest metrics token accepted, as for the tokens file's secrets.
const minMetricsToken = 16

// DefaultGranterSetupTimeout bounds the granter's start-up: off Google Cloud a lookup of
// Application Default Credentials probes the metadata server for a few seconds, and a
// credentials file on a stalled network mount would hang it for good.
const DefaultGranterSetupTimeout = time.Minute

func newServeCmd(ios *IO) *cobra.Command {
	opts := &ServeOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the control plane: API, live web pages, metrics",
		Long: "serve runs the tfstackplan control plane. It stores executions, logs, claims, gates, grants,\n" +
			"checks and an audit log in SQLite (default) or PostgreSQL (several replicas may share one).",
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if !cmd.Flags().Changed("metrics-token") {
				opts.MetricsToken = os.Getenv(EnvMetricsToken)
			}
			return runServe(ctx, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Listen, "listen", "127.0.0.1:8080", "address to listen on")
	f.StringVar(&opts.DB, "db", "sqlite:./tfstackplan.db", "store: sqlite:PATH or postgres://URL")
	f.StringVar(&opts.Policy, "policy", "", "HCL policy file: gates per environment and the service account a satisfied gate leases")
	f.StringVar(&opts.Tokens, "tokens", "", "HCL tokens file: static bearer tokens, Google identities and GitHub repositories with their roles")
	f.StringVar(&opts.Audience, "audience", "", "accept Google ID tokens, and GitHub Actions ID tokens, issued for this audience")
	f.StringVar(&opts.GitHubIssuer, "github-issuer", "", "accept GitHub Actions ID tokens of this OIDC issuer for the tokens file's github blocks, with --audience as their audience (default "+auth.GitHubIssuer+" when the tokens file has github blocks)")
	f.BoolVar(&opts.InsecureNoAuth, "insecure-no-auth", false, "accept every request as an administrator (only on a loopback --listen)")
	f.Float64Var(&opts.RateLimit, "rate-limit", server.DefaultRateLimit, "requests per second allowed per principal")
	f.IntVar(&opts.MaxConns, "max-conns", server.DefaultMaxConns, "connections served at once (lowered to fit the open-file limit); /healthz still answers past it")
	f.IntVar(&opts.MaxConnsPerAddr, "max-conns-per-address", server.DefaultMaxConnsPerAddr, "unauthenticated connections one client address may hold; past it a new one replaces the address's oldest idle one")
	f.DurationVar(&opts.UnauthIdleTimeout, "unauthenticated-idle-timeout", server.DefaultUnauthIdleTimeout, "how long a connection that has carried no authenticated request may stay idle")
	f.IntVar(&opts.MaxRequestsPerPrincipal, "max-requests-per-principal", server.DefaultMaxRequestsPerPrincipal, "API requests of one principal in progress at once; more are answered 429")
	f.IntVar(&opts.MaxStreams, "max-streams", web.DefaultMaxStreams, "live page streams open at once, in all")
	f.IntVar(&opts.MaxStreamsPerPrincipal, "max-streams-per-principal", web.DefaultMaxStreamsPerPrincipal, "live page streams open at once per principal")
	f.DurationVar(&opts.SessionTTL, "session-ttl", web.DefaultSessionTTL, "how long a sign-in to the web pages lasts")
	f.IntVar(&opts.AuthFailureBurst, "auth-failure-burst", throttle.DefaultBurst, "failed authentications after which a client address or a principal is refused (429) for --auth-failure-window; 0 throttles nothing")
	f.DurationVar(&opts.AuthFailureWindow, "auth-failure-window", throttle.DefaultWindow, "how long a throttled client address or principal is refused; failures are forgotten at --auth-failure-burst per window")
	f.DurationVar(&opts.LogRetention, "log-retention", 30*24*time.Hour, "delete logs of executions started longer ago than this (0 keeps them)")
	f.DurationVar(&opts.StaleAfter, "stale-after", DefaultStaleAfter, "fail a running execution whose runner sent nothing (no event, no heartbeat) for this long, with the error \""+service.StaleError+"\" (0 never does; at least "+service.MinStaleAfter.String()+")")
	f.DurationVar(&opts.Retain, "retain", DefaultRetain, "delete finished executions, with their stacks, phases and logs, that started and finished longer ago than this, but for those a claim, gate, active grant or lease still names and each PR's latest plan (0 keeps them)")
	f.IntVar(&opts.Quotas.ExecutionsPerHour, "max-executions-per-hour", DefaultExecutionsPerHour, "executions one principal may announce in any hour; past it Init is refused with 429 and Retry-After (0: unbounded; admins are not counted)")
	f.Int64Var(&opts.Quotas.LogBytesPerExecution, "max-log-bytes-per-execution", DefaultLogBytesPerExecution, "log bytes stored for one execution, counted by each replica; past it logs are refused with 429 (0: unbounded)")
	f.DurationVar(&opts.ShutdownTimeout, "shutdown-timeout", 20*time.Second, "how long to let requests finish on SIGTERM")
	f.StringVar(&opts.MetricsToken, "metrics-token", "", "bearer token /metrics requires (default: $"+EnvMetricsToken+", which keeps it out of the process list; unset: /metrics is open)")
	return cmd
}

// isLoopbackListen reports whether addr only accepts local connections: its host is a loopback
// IP, or a name every address of which is loopback (runServe checks the bound address again).
func isLoopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil || len(ips) == 0 {
		return false
	}
	for _, ip := range ips {
		if !ip.IP.IsLoopback() {
			return false
		}
	}
	return true
}

// isLoopbackAddr reports whether a bound listener address is a loopback IP.
func isLoopbackAddr(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// OpenStore opens the store a --db value names.
func OpenStore(ctx context.Context, db string) (store.Store, error) {
	switch {
	case strings.HasPrefix(db, "sqlite:"):
		return sqlite.Open(ctx, strings.TrimPrefix(db, "sqlite:"))
	case strings.HasPrefix(db, "postgres://"), strings.HasPrefix(db, "postgresql://"):
		return postgres.Open(ctx, db, postgres.Options{MinConns: postgres.DefaultMaxConns})
	default:
		return nil, Usagef("--db %q: want sqlite:PATH or postgres://URL", db)
	}
}

func (o *ServeOptions) authenticator(ctx context.Context) (*auth.Authenticator, error) {
	a := &auth.Authenticator{Insecure: o.InsecureNoAuth, Audience: o.Audience, Validator: o.Validator}
	if o.InsecureNoAuth {
		if !isLoopbackListen(o.Listen) {
			return nil, Usagef("--insecure-no-auth is only allowed when --listen is a loopback address (got %q)", o.Listen)
		}
		return a, nil
	}
	if o.Tokens == "" && o.Audience == "" {
		return nil, Usagef("no authentication configured: give --tokens FILE and/or --audience AUD (or --insecure-no-auth on loopback)")
	}
	if o.Tokens != "" {
		if err := a.LoadTokens(o.Tokens); err != nil {
			return nil, &UsageError{Err: err}
		}
	}
	if err := o.githubValidator(ctx, a); err != nil {
		return nil, err
	}
	if o.Audience != "" && a.Validator == nil {
		v, err := auth.NewGoogleValidator(ctx, auth.GoogleValidatorOptions{})
		if err != nil {
			return nil, fmt.Errorf("google ID token validator: %w", err)
		}
		a.Validator = v
	}
	return a, nil
}

// checkLimits refuses session, throttle and connection settings that cannot be meant.
func (o *ServeOptions) checkLimits() error {
	switch {
	case o.SessionTTL < 0:
		return Usagef("--session-ttl %s: want a positive duration", o.SessionTTL)
	case o.AuthFailureBurst < 0:
		return Usagef("--auth-failure-burst %d: want 0 (no throttling) or more", o.AuthFailureBurst)
	case o.StaleAfter != 0 && o.StaleAfter < service.MinStaleAfter:
		return Usagef("--stale-after %s: want 0 (never) or at least %s, a few of the runners' heartbeats", o.StaleAfter, service.MinStaleAfter)
	case o.Retain < 0:
		return Usagef("--retain %s: want 0 (keep everything) or a positive duration", o.Retain)
	case o.Quotas.ExecutionsPerHour < 0:
		return Usagef("--max-executions-per-hour %d: want 0 (unbounded) or more", o.Quotas.ExecutionsPerHour)
	case o.Quotas.LogBytesPerExecution < 0:
		return Usagef("--max-log-bytes-per-execution %d: want 0 (unbounded) or more", o.Quotas.LogBytesPerExecution)
	case o.AuthFailureWindow < 0:
		return Usagef("--auth-failure-window %s: want a positive duration", o.AuthFailureWindow)
	case o.MaxConnsPerAddr < 0:
		return Usagef("--max-conns-per-address %d: want 1 or more", o.MaxConnsPerAddr)
	case o.UnauthIdleTimeout < 0:
		return Usagef("--unauthenticated-idle-timeout %s: want a positive duration", o.UnauthIdleTimeout)
	case o.MaxRequestsPerPrincipal < 0:
		return Usagef("--max-requests-per-principal %d: want 1 or more", o.MaxRequestsPerPrincipal)
	case o.MetricsToken != "" && len(o.MetricsToken) < minMetricsToken:
		return Usagef("the metrics token (--metrics-token or %s) is %d bytes: want at least %d", EnvMetricsToken, len(o.MetricsToken), minMetricsToken)
	case strings.ContainsFunc(o.MetricsToken, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return Usagef("the metrics token (--metrics-token or %s) holds a space or a control character", EnvMetricsToken)
	}
	return nil
}

// githubValidator gives a a GitHub Actions ID token validator when --github-issuer is set or
// the tokens file has github blocks. It makes no request: GitHub may be unreachable at start.
func (o *ServeOptions) githubValidator(ctx context.Context, a *auth.Authenticator) error {
	repos := a.GitHubRepositories()
	if o.GitHubIssuer == "" && len(repos) == 0 {
		return nil
	}
	if o.Audience == "" {
		if len(repos) > 0 {
			return Usagef("the tokens file %s has github blocks: give --audience, the audience their ID tokens are issued for", o.Tokens)
		}
		return Usagef("--github-issuer needs --audience, the audience GitHub ID tokens are issued for")
	}
	v, err := auth.NewGitHubValidator(ctx, auth.GitHubValidatorOptions{Issuer: o.GitHubIssuer})
	if err != nil {
		return Usagef("--github-issuer: %v", err)
	}
	a.GitHub = v
	return nil
}

// newGranter makes the granter policy names, within GranterSetupTimeout.
func (o *ServeOptions) newGranter(ctx context.Context, policy *service.Policy) (granter.Granter, error) {
	timeout := o.GranterSetupTimeout
	if timeout <= 0 {
		timeout = DefaultGranterSetupTimeout
	}
	gctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	g, err := granter.New(gctx, policy.Granter, policy.GranterConfig)
	if err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return nil, fmt.Errorf("granter %q did not start within %s: %w", policy.Granter, timeout, err)
	}
	return g, err
}

func runServe(ctx context.Context, o *ServeOptions) error {
	logger := slog.New(slog.NewTextHandler(o.IO.ErrOut, nil))
	a, err := o.authenticator(ctx)
	if err != nil {
		return err
	}
	a.Log = logger
	if err := o.checkLimits(); err != nil {
		return err
	}
	policy, err := service.LoadPolicy(o.Policy)
	if err != nil {
		return &UsageError{Err: err}
	}
	st, err := OpenStore(ctx, o.DB)
	if err != nil {
		return err
	}
	defer st.Close()
	svc := service.New(st, policy)
	svc.Quotas = o.Quotas
	if svc.Granter, err = o.newGranter(ctx, policy); err != nil {
		return fmt.Errorf("policy %s: %w", o.Policy, err)
	}
	burst := o.AuthFailureBurst
	if burst == 0 {
		burst = -1 // the server's "throttle nothing"
	}
	srv, err := server.New(server.Config{Service: svc, Auth: a, RateLimit: o.RateLimit, Logger: logger,
		MaxConns: o.MaxConns, MaxStreams: o.MaxStreams, MaxStreamsPerPrincipal: o.MaxStreamsPerPrincipal,
		MaxConnsPerAddr: o.MaxConnsPerAddr, UnauthIdleTimeout: o.UnauthIdleTimeout, MaxRequestsPerPrincipal: o.MaxRequestsPerPrincipal,
		SessionTTL: o.SessionTTL, FailureBurst: burst, FailureWindow: o.AuthFailureWindow, MetricsToken: o.MetricsToken})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if o.InsecureNoAuth && !isLoopbackAddr(ln.Addr()) {
		_ = ln.Close()
		return Usagef("--insecure-no-auth is only allowed on a loopback address; --listen %q bound %s", o.Listen, ln.Addr())
	}
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	go func() { _ = svc.Run(bg) }()
	// Bindings of revoked or expired leases whose removal failed are retried until they go.
	go svc.RunSweeper(bg, SweepInterval)
	if o.LogRetention > 0 || o.Retain > 0 {
		go prune(bg, st, svc, o.LogRetention, o.Retain, logger)
	}
	if o.StaleAfter > 0 {
		go svc.RunStaleSweeper(bg, o.StaleAfter, min(o.StaleAfter/4, time.Minute), func(err error) { logger.Warn("stale executions", "err", err) })
	}
	hs := srv.HTTPServer()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(srv.Listener(ln)) }()
	logger.Info("serving", "addr", ln.Addr().String(), "store", st.Kind(), "insecure_no_auth", o.InsecureNoAuth)
	if o.Ready != nil {
		o.Ready(ln.Addr().String())
	}
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// Defaults of the retention and quota flags (see docs/deploy.md, Limits, for the sizing).
const (
	DefaultRetain               = 90 * 24 * time.Hour
	DefaultExecutionsPerHour    = 1000
	DefaultLogBytesPerExecution = 1 << 30
)

// DefaultStaleAfter is --stale-after's default: ten of the runner's heartbeats (every 30 s)
// missed, so that a runner whose server was unreachable for a while is not taken for gone.
const DefaultStaleAfter = 5 * time.Minute

// SweepInterval is how often serve retries removing the granter bindings of ended leases.
const SweepInterval = time.Minute

// prune deletes old logs (logRetention) and old finished executions (retain) at start and then
// hourly; a zero duration keeps them.
func prune(ctx context.Context, st store.Store, svc *service.Service, logRetention, retain time.Duration, logger *slog.Logger) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		if logRetention > 0 {
			n, err := st.PruneLogs(ctx, time.Now().Add(-logRetention))
			if err != nil {
				logger.Warn("log retention", "err", err)
			} else if n > 0 {
				logger.Info("log retention", "deleted_chunks", n)
			}
		}
		if retain > 0 {
			n, err := svc.PruneExecutions(ctx, retain)
			if err != nil {
				logger.Warn("retention", "err", err)
			} else if n > 0 {
				logger.Info("retention", "deleted_executions", n)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
