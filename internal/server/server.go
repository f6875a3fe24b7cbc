// Package server is the control plane's HTTP face: the generated strict server interface over
// the service, authentication and authorization, request limits, Prometheus metrics, health
// endpoints and the web pages.
package server

import (
	"bytes"
	"cmp"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"mime"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"golang.org/x/time/rate"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/throttle"
	"github.com/tfstackplan/tfstackplan/internal/server/web"
)

// BasePath is where the API is served (the contract's server URL).
const BasePath = "/api/v1"

// Body limits: a log chunk carries up to 1.5 MB of data, base64-encoded in JSON.
const (
	MaxLogBody   = 4 << 20
	MaxEventBody = 1 << 20
	// MaxPhasesBody bounds a Phases request: service.MaxPhases small events.
	MaxPhasesBody = 4 << 20
	// MaxUpdatesBody bounds an Updates request: up to service.MaxUpdates updates, most of them
	// small (a driver's batch stays within MaxEventBody unless one update alone is larger).
	MaxUpdatesBody = 4 << 20
	MaxLogsBody    = 12 << 20 // service.MaxBatchData of data, base64-encoded, plus JSON
	// MaxExecutionBody bounds the requests that name an execution's stacks (Init, Finalize, a
	// gate check): service.MaxStacks stacks with paths of a hundred bytes, and an Init's
	// edges and reasons on top, are megabytes.
	MaxExecutionBody = 12 << 20
)

// Config configures a Server.
type Config struct {
	Service *service.Service
	Auth    *auth.Authenticator
	// RateLimit is requests per second per principal (0: DefaultRateLimit); Burst defaults to
	// twice it.
	RateLimit float64
	Burst     int
	Logger    *slog.Logger

	// MaxConns caps the connections served at once (0: DefaultMaxConns); ConnHeadroom more are
	// accepted past it (0: as many as MaxConns) and only get /healthz or a 503. Listener lowers
	// both to fit the process's open-file limit.
	MaxConns     int
	ConnHeadroom int
	// MaxConnsPerAddr caps one client address's unauthenticated connections (0:
	// DefaultMaxConnsPerAddr), UnauthIdleTimeout how long one of them may stay idle (0:
	// DefaultUnauthIdleTimeout), and MaxRequestsPerPrincipal a principal's API requests in
	// progress at once (0: DefaultMaxRequestsPerPrincipal); see connTable.
	MaxConnsPerAddr         int
	UnauthIdleTimeout       time.Duration
	MaxRequestsPerPrincipal int
	// HeaderTimeout bounds reading a request's headers (0: DefaultHeaderTimeout), BodyTimeout its
	// body (0: DefaultBodyTimeout) and IdleTimeout a keep-alive connection's wait for its next
	// request (0: DefaultIdleTimeout).
	HeaderTimeout time.Duration
	BodyTimeout   time.Duration
	IdleTimeout   time.Duration
	// MaxStreams caps live (SSE) streams in all (0: web.DefaultMaxStreams) and
	// MaxStreamsPerPrincipal those of one principal (0: web.DefaultMaxStreamsPerPrincipal).
	MaxStreams             int
	MaxStreamsPerPrincipal int

	// SessionTTL is how long a web sign-in lasts (0: web.DefaultSessionTTL) and
	// SignInsPerMinute how many sessions a principal may start a minute (0:
	// web.DefaultSignInsPerMinute).
	SessionTTL       time.Duration
	SignInsPerMinute int
	// FailureBurst failed authentications from one client address, or of one principal, make
	// it refused (429) for FailureWindow, as the failures drain at FailureBurst per
	// FailureWindow (0: throttle.DefaultBurst and throttle.DefaultWindow; a negative
	// FailureBurst throttles nothing).
	FailureBurst  int
	FailureWindow time.Duration
	// Now is the clock of sessions and throttles (nil: time.Now).
	Now func() time.Time
	// MetricsToken, when set, is the bearer token /metrics requires ("": /metrics is open).
	// It is its own secret, not one of the tokens file's: a scraper needs no role.
	MetricsToken string
}

// DefaultRateLimit is the per-principal request rate when Config.RateLimit is zero.
const DefaultRateLimit = 1000

// Defaults of Config's limits.
const (
	DefaultMaxConns      = 4096
	DefaultHeaderTimeout = 10 * time.Second
	DefaultBodyTimeout   = 30 * time.Second
	DefaultIdleTimeout   = 2 * time.Minute
	// An unauthenticated connection has no business idling: browsers and the runner send
	// their credentials with their first request.
	DefaultUnauthIdleTimeout = 5 * time.Second
	// Enough for a NAT or a proxy in front of many callers, who authenticate at once.
	DefaultMaxConnsPerAddr = 64
	// A runner posts a few requests at once; a static token shared by many concurrent jobs
	// needs more, and each request's body has its deadline anyway.
	DefaultMaxRequestsPerPrincipal = 256
	// MaxHeaderBytes bounds a request's line and headers (a Google ID token is about 1 KiB).
	MaxHeaderBytes = 64 << 10
)

// Server is the control plane's HTTP handler.
type Server struct {
	errorMapper
	cfg      Config
	mux      *http.ServeMux
	metrics  *serverMetrics
	registry *prometheus.Registry
	ui       *web.UI
	throttle *throttle.Auth

	limMu    sync.Mutex
	limiters map[string]*rate.Limiter

	conns    *connTable
	inFlight *inFlight

	direct      map[string]directFunc
	streamsDone chan struct{}
	closeOnce   sync.Once
}

// CloseStreams ends every live (SSE) stream; call it when shutdown starts.
func (s *Server) CloseStreams() { s.closeOnce.Do(func() { close(s.streamsDone) }) }

// route describes one API operation: who may call it and what its body is.
type route struct {
	op    string
	role  auth.Role // empty: no authentication (health)
	body  func() any
	limit int64
}

func body[T any]() any { return new(T) }

// tooLarge is the error of a body past the route's limit.
func (rt route) tooLarge() error {
	return fmt.Errorf("%w: the limit for %s is %d bytes", errTooLarge, rt.op, rt.limit)
}

var routes = map[string]route{
	"POST /events/init":             {"Init", auth.RoleRunner, body[api.Init], MaxExecutionBody},
	"POST /events/phase":            {"Phase", auth.RoleRunner, body[api.PhaseEvent], MaxEventBody},
	"POST /events/phases":           {"Phases", auth.RoleRunner, body[api.PhaseEvents], MaxPhasesBody},
	"POST /events/update":           {"Update", auth.RoleRunner, body[api.Update], MaxEventBody},
	"POST /events/updates":          {"Updates", auth.RoleRunner, body[api.Updates], MaxUpdatesBody},
	"POST /events/log":              {"LogChunk", auth.RoleRunner, body[api.LogChunk], MaxLogBody},
	"POST /events/logs":             {"LogChunks", auth.RoleRunner, body[api.LogChunks], MaxLogsBody},
	"POST /events/heartbeat":        {"Heartbeat", auth.RoleRunner, body[api.Heartbeat], MaxEventBody},
	"POST /events/finalize":         {"Finalize", auth.RoleRunner, body[api.Finalize], MaxExecutionBody},
	"POST /gates/check":             {"GateCheck", auth.RoleRunner, body[api.GateCheck], MaxExecutionBody},
	"POST /gates/revoke":            {"GateRevoke", auth.RoleRunner, body[api.GateRevoke], MaxEventBody},
	"GET /gates":                    {"GatesList", auth.RoleViewer, nil, 0},
	"GET /grants":                   {"GrantsList", auth.RoleViewer, nil, 0},
	"GET /claims":                   {"ClaimsList", auth.RoleViewer, nil, 0},
	"POST /claims/release":          {"ClaimsRelease", auth.RoleRunner, body[api.ClaimsRelease], MaxEventBody},
	"GET /checks":                   {"ChecksList", auth.RoleViewer, nil, 0},
	"POST /admin/checks/override":   {"AdminChecksOverride", auth.RoleAdmin, body[api.ChecksOverride], MaxEventBody},
	"POST /admin/executions/cancel": {"AdminExecutionsCancel", auth.RoleAdmin, body[api.ExecutionsCancel], MaxEventBody},
	"POST /admin/gates/satisfy":     {"AdminGatesSatisfy", auth.RoleAdmin, body[api.GatesSatisfy], MaxEventBody},
	"POST /admin/grants/release":    {"AdminGrantsRelease", auth.RoleAdmin, body[api.GrantsRelease], MaxEventBody},
	"GET /executions":               {"ExecutionsList", auth.RoleViewer, nil, 0},
	"GET /executions/{id}":          {"ExecutionGet", auth.RoleViewer, nil, 0},
	"GET /executions/{id}/log":      {"LogRead", auth.RoleViewer, nil, 0},
	"GET /executions/{id}/gates":    {"ExecutionGates", auth.RoleViewer, nil, 0},
	"GET /plans/latest":             {"LatestPlan", auth.RoleViewer, nil, 0},
	"GET /drift":                    {"DriftList", auth.RoleViewer, nil, 0},
	"GET /audit":                    {"AuditList", auth.RoleViewer, nil, 0},
	"GET /notifications":            {"NotificationsList", auth.RoleAdmin, nil, 0},
	"GET /health":                   {"Health", "", nil, 0},
}

// Routes returns "METHOD /path" → required role for every API operation (tests build their
// authorization matrix from it).
func Routes() map[string]auth.Role {
	out := map[string]auth.Role{}
	for k, r := range routes {
		out[k] = r.role
	}
	return out
}

type serverMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	events   *prometheus.CounterVec
	gates    *prometheus.CounterVec
	chunks   prometheus.Counter
	logBytes prometheus.Counter
	conns    prometheus.Gauge
	overflow *prometheus.CounterVec
	evicted  *prometheus.CounterVec
}

// newMetrics registers the server's metrics, and the Go runtime's and the process's, on reg.
func newMetrics(reg *prometheus.Registry) *serverMetrics {
	f := promauto.With(reg)
	counters := func(name, help string, labels ...string) *prometheus.CounterVec {
		return f.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := &serverMetrics{
		requests: counters("tfstackplan_http_requests_total", "API requests by operation and answer code.", "operation", "code"),
		latency: f.NewHistogramVec(prometheus.HistogramOpts{Name: "tfstackplan_http_request_seconds", Help: "API request latency by operation.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"operation"}),
		events:   counters("tfstackplan_events_total", "Runner events accepted, by kind.", "kind"),
		gates:    counters("tfstackplan_gate_checks_total", "Gate checks by verdict code.", "code"),
		chunks:   f.NewCounter(prometheus.CounterOpts{Name: "tfstackplan_log_chunks_total", Help: "Log chunks accepted."}),
		logBytes: f.NewCounter(prometheus.CounterOpts{Name: "tfstackplan_log_bytes_total", Help: "Log bytes accepted."}),
		conns:    f.NewGauge(prometheus.GaugeOpts{Name: "tfstackplan_http_connections", Help: "Connections being served (under the connection cap)."}),
		overflow: counters("tfstackplan_http_overflow_connections_total", "Connections past the cap, by what they got: healthz, busy (503), lost, dropped (closed unanswered).", "outcome"),
		evicted:  counters("tfstackplan_http_evicted_connections_total", "Idle connections closed to admit a new one, by why: cap (every slot taken), address (the client address's share of unauthenticated connections).", "reason"),
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// metricsHandler serves reg in the Prometheus exposition formats, to requests bearing token
// when it is set.
func metricsHandler(reg *prometheus.Registry, token string) http.Handler {
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="metrics"`)
			http.Error(w, "/metrics needs the metrics token (serve --metrics-token)", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// New builds the server's handler tree.
func New(cfg Config) (*Server, error) {
	if cfg.Service == nil || cfg.Auth == nil {
		return nil, errors.New("server: Service and Auth are required")
	}
	if cfg.RateLimit <= 0 {
		cfg.RateLimit = DefaultRateLimit
	}
	if cfg.Burst <= 0 {
		cfg.Burst = int(2 * cfg.RateLimit)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	cfg.MaxConns = cmp.Or(cfg.MaxConns, DefaultMaxConns)
	cfg.ConnHeadroom = cmp.Or(cfg.ConnHeadroom, cfg.MaxConns)
	cfg.HeaderTimeout = cmp.Or(cfg.HeaderTimeout, DefaultHeaderTimeout)
	cfg.BodyTimeout = cmp.Or(cfg.BodyTimeout, DefaultBodyTimeout)
	cfg.IdleTimeout = cmp.Or(cfg.IdleTimeout, DefaultIdleTimeout)
	cfg.MaxConnsPerAddr = cmp.Or(cfg.MaxConnsPerAddr, DefaultMaxConnsPerAddr)
	cfg.UnauthIdleTimeout = cmp.Or(cfg.UnauthIdleTimeout, DefaultUnauthIdleTimeout)
	cfg.MaxRequestsPerPrincipal = cmp.Or(cfg.MaxRequestsPerPrincipal, DefaultMaxRequestsPerPrincipal)
	reg := prometheus.NewRegistry()
	em := errorMapper{log: cfg.Logger}
	s := &Server{errorMapper: em, cfg: cfg, mux: http.NewServeMux(), registry: reg, metrics: newMetrics(reg),
		limiters: map[string]*rate.Limiter{}, streamsDone: make(chan struct{}),
		conns:    newConnTable(cfg.MaxConnsPerAddr, cfg.UnauthIdleTimeout),
		inFlight: &inFlight{n: map[string]int{}, max: cfg.MaxRequestsPerPrincipal}}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tfstackplan_http_waiting_connections",
		Help: "Connections served that wait for a request (new or idle): the ones a new connection may replace."},
		func() float64 { return float64(s.conns.waiting()) }))
	if cfg.FailureBurst >= 0 {
		s.throttle = throttle.NewAuth(cfg.FailureBurst, cfg.FailureWindow, 0, cfg.Now)
	}
	h := &handlers{errorMapper: em, svc: cfg.Service, metrics: s.metrics}
	s.direct = h.direct()
	strict := api.NewStrictHandlerWithOptions(h, nil, api.StrictHTTPServerOptions{
		RequestErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			s.writeError(w, fmt.Errorf("%w: %v", errInvalidBody, err))
		},
		ResponseErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			cfg.Logger.Error("response", "path", r.URL.Path, "err", err)
			s.writeError(w, err)
		},
	})
	apiMux := http.NewServeMux()
	api.HandlerWithOptions(strict, api.StdHTTPServerOptions{
		BaseURL:    BasePath,
		BaseRouter: apiMux,
		ErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			s.writeError(w, fmt.Errorf("%w: %v", errInvalidBody, err))
		},
	})
	// The guard runs before the generated code parses parameters, so nothing of a request is
	// looked at before it is authenticated.
	for key, rt := range routes {
		method, path, _ := strings.Cut(key, " ")
		s.mux.Handle(method+" "+BasePath+path, s.guard(rt, apiMux))
	}
	s.mux.Handle(BasePath+"/", s.guard(route{op: "unknown", role: auth.RoleAdmin}, apiMux))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok\n")
	})
	s.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := h.ping(r.Context()); err != nil {
			s.writeError(w, err)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ready\n")
	})
	s.mux.Handle("GET /metrics", metricsHandler(reg, cfg.MetricsToken))
	s.ui = &web.UI{Service: cfg.Service, Auth: cfg.Auth, Done: s.streamsDone, Fail: s.errorText,
		MaxStreams: cfg.MaxStreams, MaxStreamsPerPrincipal: cfg.MaxStreamsPerPrincipal,
		SessionTTL: cfg.SessionTTL, SignInsPerMinute: cfg.SignInsPerMinute, Throttle: s.throttle, Now: cfg.Now}
	s.ui.Register(s.mux, s.webGuard)
	return s, nil
}

// errInvalidBody marks a request the contract rejects as INVALID_ARGUMENT.
var errInvalidBody = store.ErrInvalid

// ServeHTTP serves every route. A request's body must arrive within Config.BodyTimeout: the
// deadline is the connection's, set per request with a body, so that it bounds the body alone.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
		// http.Server lifts the deadline itself once the body is read.
		if http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout)) == nil {
			r.Body = &deadlineBody{ReadCloser: r.Body, timeout: s.cfg.BodyTimeout}
		}
	}
	s.mux.ServeHTTP(w, r)
}

// deadlineBody says which limit a body read that hit its deadline broke.
type deadlineBody struct {
	io.ReadCloser
	timeout time.Duration
}

// Read reads the body, naming a missed deadline bodyTimeoutError.
func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = bodyTimeoutError{b.timeout}
	}
	return n, err
}

// bodyTimeoutError is errBodyTimeout with its limit; it also is os.ErrDeadlineExceeded, which is
// what the web pages look for, and it does not repeat the connection's addresses.
type bodyTimeoutError struct{ limit time.Duration }

// Error says the body did not arrive within the limit.
func (e bodyTimeoutError) Error() string { return fmt.Sprintf("%v within %s", errBodyTimeout, e.limit) }

// Is matches errBodyTimeout and os.ErrDeadlineExceeded.
func (e bodyTimeoutError) Is(target error) bool {
	return target == errBodyTimeout || target == os.ErrDeadlineExceeded
}

// maxLimiters bounds the per-principal rate limiters kept. Every GitHub Actions run is a
// principal of its own, so over a server's life their number has no bound.
const maxLimiters = 10_000

// limiter returns the rate limiter of principal name. When maxLimiters are kept, the idle ones
// (their bucket full again: forgetting them loses nothing) are dropped first, and all of them
// if none is idle.
func (s *Server) limiter(name string) *rate.Limiter {
	s.limMu.Lock()
	defer s.limMu.Unlock()
	l, ok := s.limiters[name]
	if !ok {
		if len(s.limiters) >= maxLimiters {
			now := time.Now()
			maps.DeleteFunc(s.limiters, func(_ string, l *rate.Limiter) bool { return l.TokensAt(now) >= float64(l.Burst()) })
			if len(s.limiters) >= maxLimiters {
				clear(s.limiters)
			}
		}
		l = rate.NewLimiter(rate.Limit(s.cfg.RateLimit), s.cfg.Burst)
		s.limiters[name] = l
	}
	return l
}

// authorize authenticates r, checks the role and the principal's rate, and returns r carrying
// the principal (and the session, when one authenticated a page). It looks at headers only.
// Failed credentials count against the client address, and against their principal when one is
// known, and once either is throttled a failure is answered 429; credentials that verify are
// never refused by the throttle: tokens and session ids are random secrets, not passwords, and
// behind a load balancer or a NAT one misconfigured job would otherwise shut every job out.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, role auth.Role, page bool) (*http.Request, error) {
	if role == "" {
		return r, nil
	}
	p, sess, err := s.authenticate(w, r, page)
	if err != nil {
		if counted, principal := failure(r, p, err); counted {
			if terr := s.throttle.Fail(r, principal); terr != nil {
				return nil, terr
			}
		}
		return nil, err
	}
	markAuthenticated(r)
	if !p.Has(role) {
		return nil, fmt.Errorf("%w: %s lacks the %s role", auth.ErrNoRoles, p.Name, role)
	}
	if !s.limiter(p.Name).Allow() {
		return nil, errRateLimited
	}
	ctx := auth.With(r.Context(), p)
	if sess != nil {
		ctx = web.WithSession(ctx, sess)
	}
	return r.WithContext(ctx), nil
}

// authenticate returns the principal of r's bearer token or, for a page read without one, of
// its session cookie (the session too).
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, page bool) (auth.Principal, *web.Session, error) {
	_, header := r.Header["Authorization"]
	if page && !header && !s.cfg.Auth.Insecure && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		sess, err := s.ui.PageSession(w, r)
		if err != nil {
			return auth.Principal{}, nil, err
		}
		if sess != nil {
			return sess.Principal, sess, nil
		}
	}
	p, err := s.cfg.Auth.Authenticate(r)
	return p, nil, err
}

// failure says whether an authentication error counts as a failed attempt, and of which
// principal: a token or session id that does not verify counts, a request without credentials
// or with a session that ended does not; a token whose principal has no roles here counts for
// that principal too.
func failure(r *http.Request, p auth.Principal, err error) (counted bool, principal string) {
	_, header := r.Header["Authorization"]
	switch {
	case errors.Is(err, auth.ErrNoRoles):
		return true, p.Name
	case errors.Is(err, web.ErrUnknownSession):
		return true, ""
	case errors.Is(err, auth.ErrUnauthenticated):
		return header, ""
	}
	return false, ""
}

// refuse answers a request before its body is read, and then closes the connection.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, err error) {
	web.EndConnection(w, r)
	s.writeError(w, err)
}

// guard wraps every API operation: authentication, authorization, rate limit, content type and
// body size limit (all on headers, before the body is read), strict body decoding (unknown fields
// rejected) and metrics.
func (s *Server) guard(rt route, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			s.metrics.requests.WithLabelValues(rt.op, fmt.Sprint(rec.status)).Inc()
			s.metrics.latency.WithLabelValues(rt.op).Observe(time.Since(start).Seconds())
		}()
		r2, err := s.authorize(rec, r, rt.role, false)
		if err == nil && rt.body != nil {
			err = checkBodyHeaders(r, rt)
		}
		if err == nil {
			if p, ok := auth.From(r2.Context()); ok {
				release, free := s.inFlight.acquire(p.QuotaKey())
				if !free {
					err = fmt.Errorf("%w: %d requests of %s are in progress", errRateLimited, s.cfg.MaxRequestsPerPrincipal, p.QuotaKey())
				} else {
					defer release()
				}
			}
		}
		if err != nil {
			s.refuse(rec, r, err)
			return
		}
		r = r2.WithContext(context.WithValue(r2.Context(), writerKey{}, http.ResponseWriter(rec)))
		if rt.body != nil {
			body, err := strictBody(r, rt)
			if err != nil {
				s.writeError(rec, err)
				return
			}
			if direct := s.direct[rt.op]; direct != nil {
				if err := direct(r.Context(), rec, body); err != nil {
					s.writeError(rec, err)
				}
				return
			}
		}
		ctx := context.WithValue(r.Context(), queryKey{}, r.URL.Query())
		next.ServeHTTP(rec, r.WithContext(ctx))
	})
}

// checkBodyHeaders refuses, on its headers, a body the route would not read: not JSON, or
// declaring more than the route's limit.
func checkBodyHeaders(r *http.Request, rt route) error {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return fmt.Errorf("%w %q: %s takes application/json", errMediaType, r.Header.Get("Content-Type"), rt.op)
	}
	if r.ContentLength > rt.limit {
		return rt.tooLarge()
	}
	return nil
}

// strictBody reads the body within the route's limit, decodes it rejecting unknown fields and
// trailing data, and puts the bytes back for the generated decoder.
func strictBody(r *http.Request, rt route) (any, error) {
	data, err := readBody(r, rt.limit)
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return nil, rt.tooLarge()
		case errors.Is(err, errBodyTimeout):
			return nil, err
		}
		return nil, fmt.Errorf("%w: reading body: %v", errInvalidBody, err)
	}
	body := rt.body()
	// json v2 decodes in one pass (v1 scans every byte twice), which matters for log batches;
	// it also rejects unknown and duplicate members and invalid UTF-8.
	dec := jsontext.NewDecoder(bytes.NewReader(data))
	if err := jsonv2.UnmarshalDecode(dec, body, jsonv2.RejectUnknownMembers(true), presentTimes); err != nil {
		return nil, fmt.Errorf("%w: %s body: %v", errInvalidBody, rt.op, err)
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		return nil, fmt.Errorf("%w: %s body: data after the JSON object", errInvalidBody, rt.op)
	}
	r.Body = io.NopCloser(bytes.NewReader(data))
	return body, nil
}

// presentTimes refuses the zero time (0001-01-01T00:00:00Z) where a body gives it: a request
// field left out decodes to the zero time too and means "absent", so a zero time sent would be
// read as absent, while it is outside the times the server stores (1970 to 2200) and refused.
var presentTimes = jsonv2.WithUnmarshalers(jsonv2.UnmarshalFunc(func(data []byte, t *time.Time) error {
	if string(data) == "null" {
		return nil
	}
	if err := t.UnmarshalJSON(data); err != nil {
		return err
	}
	if t.IsZero() {
		return errors.New("the zero time is outside 1970-01-01 to 2200-01-01, the times the server stores: leave the field out instead")
	}
	return nil
}))

// maxPreallocBody bounds the buffer readBody allocates before the body's bytes arrive: a client
// that announces a large body and sends it slowly must not have the server hold its size.
const maxPreallocBody = 1 << 20

// readBody reads a request body of at most limit bytes (else an *http.MaxBytesError) into a
// buffer of the size its Content-Length announces, up to maxPreallocBody: a log batch is tens
// of kilobytes, which io.ReadAll would copy through a series of growing buffers.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	body := http.MaxBytesReader(nil, r.Body, limit)
	if r.ContentLength <= 0 || r.ContentLength > min(limit, maxPreallocBody) {
		return io.ReadAll(body)
	}
	data := make([]byte, r.ContentLength)
	_, err := io.ReadFull(body, data)
	return data, err
}

// webGuard authenticates web pages: viewers may read them, by bearer token or session. A
// request without usable credentials, or from a throttled client, gets the sign-in form; a
// rate-limited page, a live stream or a failure of the store is answered like the API.
func (s *Server) webGuard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r2, err := s.authorize(w, r, auth.RoleViewer, true)
		switch {
		case err == nil:
			next.ServeHTTP(w, r2)
		case r.Header.Get("Accept") == "text/event-stream", errors.Is(err, errRateLimited):
			s.refuse(w, r, err)
		case errors.Is(err, throttle.ErrThrottled), errors.Is(err, auth.ErrUnauthenticated), errors.Is(err, auth.ErrNoRoles):
			web.LoginPage(w, r, err)
		default:
			s.refuse(w, r, err)
		}
	})
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// Flush lets streaming responses through.
func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
