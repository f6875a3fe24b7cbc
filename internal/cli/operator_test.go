package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/gauth"
	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

// Tokens of the control plane startOpServe starts.
const (
	opRunnerToken = "operator-test-runner-token"
	opOtherToken  = "operator-test-other-runner-token"
	opAdminToken  = "operator-test-admin-token"
)

const opPolicy = `
environment "prod" {
  requester = "deployer@proj.iam.gserviceaccount.com"
  gate {
    classes = ["destructive", "unclassified"]
    stacks  = ["**"]
  }
}
`

// opServe is a real control plane (`serve`, SQLite in a temporary directory) on 127.0.0.1.
type opServe struct {
	URL string
}

// startOpServe starts serve in-process with a runner, another runner and an admin token, and
// stops it when the test ends.
func startOpServe(t *testing.T) *opServe {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.hcl")
	src := fmt.Sprintf(`
token "runner" {
  secret       = %q
  roles        = ["runner"]
  repositories = ["acme/infra"]
}
token "other-runner" {
  secret       = %q
  roles        = ["runner"]
  repositories = ["acme/infra"]
}
token "admin" {
  secret       = %q
  roles        = ["admin"]
  repositories = ["acme/infra"]
}
`, opRunnerToken, opOtherToken, opAdminToken)
	policy := filepath.Join(dir, "policy.hcl")
	for p, s := range map[string]string{tokens: src, policy: opPolicy} {
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ready := make(chan string, 1)
	opts := &ServeOptions{IO: &IO{Out: io.Discard, ErrOut: io.Discard}, Listen: "127.0.0.1:0",
		DB: "sqlite:" + filepath.Join(dir, "serve.db"), Tokens: tokens, Policy: policy, RateLimit: 10000,
		ShutdownTimeout: 2 * time.Second, Ready: func(addr string) { ready <- addr }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runServe(ctx, opts) }()
	select {
	case addr := <-ready:
		t.Cleanup(func() {
			cancel()
			<-done
		})
		return &opServe{URL: "http://" + addr}
	case err := <-done:
		cancel()
		t.Fatalf("serve: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("serve did not start")
	}
	return nil
}

// conn is how a command reaches s as the holder of token.
func (s *opServe) conn(token string) ConnOptions {
	return connTo(s.URL, token)
}

func connTo(server, token string) ConnOptions {
	env := map[string]string{"TFSTACKPLAN_TOKEN": token}
	return ConnOptions{Server: server, Timeout: 10 * time.Second, Getenv: func(k string) string { return env[k] }}
}

// client is the generated client as the holder of token, for setting up and checking state.
func (s *opServe) client(t *testing.T, token string) *api.ClientWithResponses {
	t.Helper()
	c, err := api.NewClientWithResponses(s.URL+"/api/v1", api.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
		r.Header.Set("Authorization", "Bearer "+token)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// stack is one stack of a seeded execution.
type seedStack struct {
	name  string
	class api.Class
	log   string
}

// seed announces an execution as the runner (token), reports its stacks as succeeded with
// their classes, hashes and logs, and finalizes it unless running is set.
func (s *opServe) seed(t *testing.T, token, id, env string, op api.ExecutionOp, pr int, running bool, stacks ...seedStack) {
	t.Helper()
	c := s.client(t, token)
	ctx := context.Background()
	names := make([]string, len(stacks))
	for i, st := range stacks {
		names[i] = st.name
	}
	var edges []api.Edge
	if len(names) > 1 {
		edges = []api.Edge{{From: names[0], To: names[1]}}
	}
	ok := func(what string, status int, body []byte, err error) {
		t.Helper()
		if err != nil || status != http.StatusOK {
			t.Fatalf("%s: %d %s %v", what, status, body, err)
		}
	}
	r, err := c.InitWithResponse(ctx, api.Init{ExecutionID: id, Environment: env, Op: api.InitOp(op), PR: pr,
		SHA: "0123456789abcdef0123456789abcdef01234567", Actor: "ci", Stacks: names, Edges: edges})
	ok("init", r.StatusCode(), r.Body, err)
	var results []api.StackResult
	var total api.Counts
	for _, st := range stacks {
		hash := fmt.Sprintf("v1:%x", sha256.Sum256([]byte(id+"\x00"+st.name)))
		counts := api.Counts{Create: 1}
		if st.class == api.Destructive {
			counts = api.Counts{Create: 1, Delete: 2}
		}
		pr, err := c.PhaseWithResponse(ctx, api.PhaseEvent{ExecutionID: id, Stack: st.name, Phase: "plan", Status: "ok"})
		ok("phase", pr.StatusCode(), pr.Body, err)
		if st.log != "" {
			lr, err := c.LogChunkWithResponse(ctx, api.LogChunk{ExecutionID: id, Stack: st.name, Data: []byte(st.log)})
			ok("log", lr.StatusCode(), lr.Body, err)
		}
		ur, err := c.UpdateWithResponse(ctx, api.Update{ExecutionID: id, Stack: st.name, Status: api.StackStatusSucceeded,
			Class: st.class, Counts: counts, PlanHash: hash})
		ok("update", ur.StatusCode(), ur.Body, err)
		total.Create, total.Delete = total.Create+counts.Create, total.Delete+counts.Delete
		results = append(results, api.StackResult{Stack: st.name, Status: api.StackStatusSucceeded, Class: st.class, Counts: counts, PlanHash: hash})
	}
	if running {
		return
	}
	fr, err := c.FinalizeWithResponse(ctx, api.Finalize{ExecutionID: id, Status: api.ExecutionStatusSucceeded, Counts: total, Stacks: results})
	ok("finalize", fr.StatusCode(), fr.Body, err)
}

// testIO returns streams writing to buffers.
func testIO() (*IO, *bytes.Buffer, *bytes.Buffer) {
	var out, errOut bytes.Buffer
	return &IO{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}, &out, &errOut
}

// wantAPIError checks err is the server's refusal with status, naming msg.
func wantAPIError(t *testing.T, err error, status int, msg string) {
	t.Helper()
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != status || !strings.Contains(err.Error(), msg) {
		t.Fatalf("err = %v, want HTTP %d naming %q", err, status, msg)
	}
}

func TestOperatorNoServerConfigured(t *testing.T) {
	ios, _, _ := testIO()
	ctx := context.Background()
	wantNoServer(t, "claims list", runClaimsList(ctx, &ClaimsListOptions{IO: ios, Conn: noServer}))
	wantNoServer(t, "executions list", runExecutionsList(ctx, &ExecutionsListOptions{IO: ios, Conn: noServer, Limit: 5}))
	wantNoServer(t, "executions show", runExecutionsShow(ctx, &ExecutionsShowOptions{IO: ios, Conn: noServer, Execution: "x"}))
	if !strings.Contains(ErrNoServer.Error(), "set TFSTACKPLAN_SERVER or --server") {
		t.Fatal(ErrNoServer)
	}

	// Through Main, with the process's environment.
	t.Setenv("TFSTACKPLAN_SERVER", "")
	code, out, errOut := runMain("claims", "list")
	if code != ExitUsage || out != "" || !strings.Contains(errOut, "no server configured: set TFSTACKPLAN_SERVER or --server") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestOperatorConnectionConfig(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	cases := []struct {
		name string
		conn ConnOptions
		want string
	}{
		{"bad scheme", ConnOptions{Server: "ftp://x", Timeout: time.Second, Getenv: env()}, "scheme must be http or https"},
		{"credentials in URL", ConnOptions{Server: "http://u:p@127.0.0.1", Timeout: time.Second, Getenv: env()}, "must not carry credentials"},
		{"both ways to authenticate", ConnOptions{Server: "http://127.0.0.1", Timeout: time.Second,
			Getenv: env("TFSTACKPLAN_TOKEN", "t", "TFSTACKPLAN_AUDIENCE", "aud")}, "both TFSTACKPLAN_TOKEN and an ID-token audience"},
		{"no timeout", ConnOptions{Server: "http://127.0.0.1", Getenv: env()}, "--timeout must be positive"},
		{"unknown --auth", ConnOptions{Server: "http://127.0.0.1", Timeout: time.Second, Auth: "aws", Audience: "aud", Getenv: env()},
			`auth "aws" is not a way to authenticate`},
		{"unknown TFSTACKPLAN_AUTH", ConnOptions{Server: "http://127.0.0.1", Timeout: time.Second,
			Getenv: env("TFSTACKPLAN_AUTH", "oidc", "TFSTACKPLAN_AUDIENCE", "aud")}, `auth "oidc" is not a way to authenticate`},
		{"--auth without an audience", ConnOptions{Server: "http://127.0.0.1", Timeout: time.Second, Auth: "github-actions", Getenv: env()},
			`auth "github-actions" needs an audience`},
		{"--auth with a token", ConnOptions{Server: "http://127.0.0.1", Timeout: time.Second, Auth: "github-actions", Audience: "aud",
			Getenv: env("TFSTACKPLAN_TOKEN", "t")}, "both TFSTACKPLAN_TOKEN and an ID-token audience"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.conn.dial()
			if ExitCode(err) != ExitUsage || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want a usage error naming %q", err, tc.want)
			}
		})
	}
	// --server wins over TFSTACKPLAN_SERVER.
	c, err := (&ConnOptions{Server: "http://127.0.0.1:9", Timeout: time.Second, Getenv: env("TFSTACKPLAN_SERVER", "http://127.0.0.1:8")}).dial()
	if err != nil || c.server != "http://127.0.0.1:9" {
		t.Fatalf("dial: %v %+v", err, c)
	}
}

// wantUsage runs tfstackplan with args (TFSTACKPLAN_SERVER set, nothing listening there) and
// checks it is a usage error (exit 2, nothing on stdout) whose message names want.
func wantUsage(t *testing.T, want string, args ...string) {
	t.Helper()
	t.Setenv("TFSTACKPLAN_SERVER", "http://127.0.0.1:1")
	code, out, errOut := runMain(args...)
	if code != ExitUsage || out != "" || !strings.Contains(errOut, want) {
		t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 naming %q", args, code, out, errOut, want)
	}
}

// noServer is a connection with nothing configured.
var noServer = ConnOptions{Timeout: time.Second, Getenv: func(string) string { return "" }}

// wantNoServer checks err says that no server is configured, as a usage error.
func wantNoServer(t *testing.T, name string, err error) {
	t.Helper()
	if !errors.Is(err, ErrNoServer) || ExitCode(err) != ExitUsage {
		t.Errorf("%s: err %v (exit %d), want ErrNoServer and exit 2", name, err, ExitCode(err))
	}
}

// TestOperatorGitHubActionsAuth: --auth github-actions (over TFSTACKPLAN_AUTH) sends the job's
// OIDC token for --audience to the server, and the request token to the token endpoint only;
// without `permissions: id-token: write` the command fails naming the missing variables.
func TestOperatorGitHubActionsAuth(t *testing.T) {
	e := testkit.NewActionsOIDC(t)
	var seen []string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, "[]")
	}))
	t.Cleanup(srv.Close)
	conn := ConnOptions{Server: srv.URL, Audience: "tfstackplan", Auth: "github-actions", Timeout: 10 * time.Second,
		Getenv: e.Getenv(map[string]string{"TFSTACKPLAN_AUTH": "google"})}
	ios, _, _ := testIO()
	if err := runClaimsList(context.Background(), &ClaimsListOptions{IO: ios, Conn: conn}); err != nil {
		t.Fatal(err)
	}
	tokens := e.Tokens()
	mu.Lock()
	defer mu.Unlock()
	if len(tokens) != 1 || len(seen) != 1 || seen[0] != "Bearer "+tokens[0] {
		t.Fatalf("the server saw %q; tokens %q", seen, tokens)
	}
	if r := e.Requests(); len(r) != 1 || r[0].Authorization != "Bearer "+e.RequestToken || r[0].Query.Get("audience") != "tfstackplan" {
		t.Fatalf("the token endpoint saw %+v", r)
	}

	conn.Getenv = func(k string) string {
		return map[string]string{"TFSTACKPLAN_AUTH": "github-actions", "TFSTACKPLAN_AUDIENCE": "tfstackplan"}[k]
	}
	conn.Auth, conn.Audience = "", ""
	err := runClaimsList(context.Background(), &ClaimsListOptions{IO: ios, Conn: conn})
	if !errors.Is(err, gauth.ErrNoGitHubToken) || ExitCode(err) != ExitFailure || !strings.Contains(err.Error(), "permissions: id-token: write") ||
		!strings.Contains(err.Error(), "ACTIONS_ID_TOKEN_REQUEST_URL and ACTIONS_ID_TOKEN_REQUEST_TOKEN are not set") {
		t.Fatalf("err %v (exit %d), want the missing variables named", err, ExitCode(err))
	}
	if len(seen) != 1 {
		t.Fatalf("the server saw %d requests, want still 1", len(seen))
	}
}

func TestOperatorUnauthenticated(t *testing.T) {
	s := startOpServe(t)
	ios, _, _ := testIO()
	err := runClaimsList(context.Background(), &ClaimsListOptions{IO: ios, Conn: s.conn("not-a-token-of-this-server")})
	wantAPIError(t, err, http.StatusUnauthorized, "claims list: unauthenticated")
	if !strings.Contains(err.Error(), "TFSTACKPLAN_TOKEN") || ExitCode(err) != ExitFailure {
		t.Fatalf("err %v (exit %d): want a hint and exit 1", err, ExitCode(err))
	}
}

// TestOperatorSlowServer: an operator's call waits as long as --timeout allows, not the
// runner's 1.5 s budget; past --timeout it fails with a clear timeout error.
func TestOperatorSlowServer(t *testing.T) {
	s := startOpServe(t)
	target, _ := url.Parse(s.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(3 * time.Second):
		case <-r.Context().Done():
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(slow.Close)

	t.Run("within the budget", func(t *testing.T) {
		t.Parallel()
		ios, out, _ := testIO()
		conn := connTo(slow.URL, opRunnerToken)
		conn.Timeout = DefaultOperatorTimeout
		start := time.Now()
		if err := runExecutionsList(context.Background(), &ExecutionsListOptions{IO: ios, Conn: conn, Limit: 10, JSON: true}); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d < 3*time.Second {
			t.Fatalf("answered in %s: the delay did not apply", d)
		}
		if strings.TrimSpace(out.String()) != "[]" {
			t.Fatalf("stdout %q", out)
		}
	})
	t.Run("beyond --timeout", func(t *testing.T) {
		t.Parallel()
		ios, _, _ := testIO()
		conn := connTo(slow.URL, opRunnerToken)
		conn.Timeout = time.Second
		start := time.Now()
		err := runExecutionsList(context.Background(), &ExecutionsListOptions{IO: ios, Conn: conn, Limit: 10})
		if err == nil || !strings.Contains(err.Error(), "no answer from "+slow.URL+" within 1s (--timeout)") || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err %v, want the timeout named", err)
		}
		if d := time.Since(start); d > 2500*time.Millisecond {
			t.Fatalf("gave up after %s", d)
		}
		if ExitCode(err) != ExitFailure {
			t.Fatalf("exit %d", ExitCode(err))
		}
	})
}

// TestOperatorRedirects: a redirect within the server is followed with the token; one to
// another host is refused, and the other host never sees the token.
func TestOperatorRedirects(t *testing.T) {
	var leaked atomic.Bool
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			leaked.Store(true)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, "[]")
	}))
	t.Cleanup(other.Close)
	var sawToken atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/v1/claims":
			http.Redirect(w, r, "/moved/api/v1/claims", http.StatusTemporaryRedirect)
		case "/moved/api/v1/claims":
			sawToken.Store(r.Header.Get("Authorization") == "Bearer "+opRunnerToken)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, "[]")
		default:
			http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
		}
	}))
	t.Cleanup(srv.Close)

	ios, _, _ := testIO()
	if err := runClaimsList(context.Background(), &ClaimsListOptions{IO: ios, Conn: connTo(srv.URL, opRunnerToken)}); err != nil {
		t.Fatal(err)
	}
	if !sawToken.Load() {
		t.Fatal("the same-host redirect lost the token")
	}
	err := runExecutionsList(context.Background(), &ExecutionsListOptions{IO: ios, Conn: connTo(srv.URL, opRunnerToken), Limit: 1})
	if err == nil || !strings.Contains(err.Error(), "not followed: credentials go only to "+srv.URL) {
		t.Fatalf("err %v, want the cross-host redirect refused", err)
	}
	if leaked.Load() {
		t.Fatal("the token reached another host")
	}
}

func TestOperatorServerErrors(t *testing.T) {
	for _, tc := range []struct {
		status int
		code   string
		want   string
		exit   int
	}{
		{400, "INVALID_ARGUMENT", "invalid argument: bad thing", ExitUsage},
		{403, "PERMISSION_DENIED", "permission denied: bad thing", ExitFailure},
		{404, "NOT_FOUND", "not found: bad thing", ExitFailure},
		{409, "ALREADY_EXISTS", "already exists: bad thing", ExitFailure},
		{412, "FAILED_PRECONDITION", "failed precondition: bad thing", ExitFailure},
		{503, "UNAVAILABLE", "the server failed (HTTP 503): bad thing", ExitFailure},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(tc.status)
			fmt.Fprintf(w, `{"code":%q,"message":"bad thing\u001b[31m"}`, tc.code)
		}))
		ios, _, _ := testIO()
		err := runExecutionsShow(context.Background(), &ExecutionsShowOptions{IO: ios, Conn: connTo(srv.URL, opRunnerToken), Execution: "e1"})
		srv.Close()
		wantAPIError(t, err, tc.status, "executions show: "+tc.want)
		if strings.Contains(err.Error(), "\x1b") {
			t.Errorf("%d: control characters reach the terminal: %q", tc.status, err)
		}
		if ExitCode(err) != tc.exit {
			t.Errorf("%d: exit %d, want %d", tc.status, ExitCode(err), tc.exit)
		}
	}
}
