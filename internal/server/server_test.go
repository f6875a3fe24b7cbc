package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

// testRepo is the repository the test tokens are limited to: a request that names none means it.
const testRepo = "acme/infra"

const testTokens = `
token "viewer" {
  secret = "viewer-secret-0123456789"
  roles  = ["viewer"]
}
token "runner" {
  secret    = "runner-secret-0123456789"
  principal = "ci-runner"
  repositories = ["acme/infra"]
  roles     = ["runner"]
}
token "runner2" {
  secret    = "runner2-secret-0123456789"
  principal = "other-runner"
  repositories = ["acme/infra"]
  roles     = ["runner"]
}
token "admin" {
  secret    = "admin-secret-0123456789"
  principal = "alice"
  repositories = ["acme/infra"]
  roles     = ["admin"]
}
identity "deployer@proj.iam.gserviceaccount.com" {
  roles = ["runner"]
}
`

var tokenOf = map[string]string{
	"viewer":  "viewer-secret-0123456789",
	"runner":  "runner-secret-0123456789",
	"runner2": "runner2-secret-0123456789",
	"admin":   "admin-secret-0123456789",
}

const serverPolicy = `
environment "prod" {
  requester = "deployer@proj.iam.gserviceaccount.com"
  gate {
    classes = ["destructive"]
    stacks  = ["**"]
  }
}
`

type testServer struct {
	*httptest.Server
	srv   *Server
	svc   *service.Service
	store store.Store

	sessions map[string]*http.Cookie // by token (session)
}

func newTestServer(t testing.TB, s store.Store, tweak func(*Config)) *testServer {
	t.Helper()
	a := &auth.Authenticator{}
	if err := a.ParseTokens("tokens.hcl", []byte(testTokens)); err != nil {
		t.Fatal(err)
	}
	p, err := service.ParsePolicy("policy.hcl", []byte(serverPolicy))
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(s, p)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = svc.Run(ctx) }()
	cfg := Config{Service: svc, Auth: a}
	if tweak != nil {
		tweak(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Served as `serve` serves it: its own http.Server settings and connection cap.
	ts := httptest.NewUnstartedServer(srv)
	ts.Config = srv.HTTPServer()
	ts.Listener = srv.Listener(ts.Listener)
	ts.Start()
	t.Cleanup(func() { ts.Close(); cancel() })
	return &testServer{Server: ts, srv: srv, svc: svc, store: s}
}

// call sends a JSON request as role ("" for none) and returns status and decoded body.
func (ts *testServer) call(t *testing.T, role, method, path string, body any) (int, map[string]any, http.Header) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		data, _ := json.Marshal(b)
		rd = bytes.NewReader(data)
	}
	req, _ := http.NewRequest(method, ts.URL+BasePath+path, rd)
	req.Header.Set("Content-Type", "application/json")
	if role != "" {
		req.Header.Set("Authorization", "Bearer "+tokenOf[role])
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := map[string]any{}
	_ = json.Unmarshal(raw, &out)
	if len(out) == 0 && len(raw) > 0 && raw[0] == '[' {
		var list []any
		_ = json.Unmarshal(raw, &list)
		out["list"] = list
	}
	return resp.StatusCode, out, resp.Header
}

func TestAuthorizationMatrix(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	rank := map[string]int{"": 0, "viewer": 1, "runner": 2, "admin": 3}
	need := map[auth.Role]int{"": 0, auth.RoleViewer: 1, auth.RoleRunner: 2, auth.RoleAdmin: 3}
	for key, role := range Routes() {
		method, path, _ := strings.Cut(key, " ")
		path = strings.ReplaceAll(path, "{id}", "some-execution")
		if strings.HasSuffix(path, "/log") {
			path += "?stack=a"
		}
		for _, who := range []string{"", "viewer", "runner", "admin"} {
			t.Run(fmt.Sprintf("%s as %q", key, who), func(t *testing.T) {
				var body any
				if method == http.MethodPost {
					body = "{}"
				}
				status, out, _ := ts.call(t, who, method, path, body)
				allowed := rank[who] >= need[role]
				switch {
				case allowed && (status == 401 || status == 403):
					t.Fatalf("%s may call %s but got %d %v", who, key, status, out)
				case !allowed && who == "" && (status != 401 || out["code"] != "UNAUTHENTICATED"):
					t.Fatalf("anonymous %s: got %d %v, want 401 UNAUTHENTICATED", key, status, out)
				case !allowed && who != "" && (status != 403 || out["code"] != "PERMISSION_DENIED"):
					t.Fatalf("%s calling %s: got %d %v, want 403 PERMISSION_DENIED", who, key, status, out)
				}
			})
		}
	}
}

func TestRequestValidation(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	cases := []struct {
		name, path, body, want string
	}{
		{"unknown field", "/events/init", `{"execution_id":"e","environment":"prod","op":"plan","bogus":1}`, "bogus"},
		{"trailing data", "/events/init", `{"execution_id":"e","environment":"prod","op":"plan"} {}`, "after the JSON"},
		{"wrong type", "/events/init", `{"execution_id":5}`, "execution_id"},
		{"bad enum", "/events/init", `{"execution_id":"e","environment":"prod","op":"destroy"}`, "op"},
		{"too large", "/events/phase", `{"execution_id":"` + strings.Repeat("x", MaxEventBody) + `"}`, "limit"},
		{"not JSON", "/events/log", `nope`, "invalid"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, out, _ := ts.call(t, "runner", "POST", tc.path, tc.body)
			if status != 400 || out["code"] != "INVALID_ARGUMENT" || !strings.Contains(fmt.Sprint(out["message"]), tc.want) {
				t.Fatalf("got %d %v, want 400 INVALID_ARGUMENT mentioning %q", status, out, tc.want)
			}
		})
	}
	status, out, _ := ts.call(t, "runner", "POST", "/events/phase", map[string]any{"execution_id": "missing", "stack": "a", "phase": "init"})
	if status != 404 || out["code"] != "NOT_FOUND" {
		t.Fatalf("unknown execution: %d %v", status, out)
	}
}

func TestRateLimitPerPrincipal(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), func(c *Config) { c.RateLimit, c.Burst = 0.001, 2 })
	for i := 0; i < 2; i++ {
		if status, out, _ := ts.call(t, "viewer", "GET", "/claims", nil); status != 200 {
			t.Fatalf("request %d: %d %v", i, status, out)
		}
	}
	status, out, hdr := ts.call(t, "viewer", "GET", "/claims", nil)
	if status != 429 || out["code"] != "RESOURCE_EXHAUSTED" || hdr.Get("Retry-After") == "" {
		t.Fatalf("third request: %d %v %v", status, out, hdr)
	}
	// Another principal has its own budget.
	if status, _, _ := ts.call(t, "runner", "GET", "/claims", nil); status != 200 {
		t.Fatalf("other principal limited too: %d", status)
	}
}

func TestIdempotentEventsAndCancelOverHTTP(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ts := newTestServer(t, b.Open(t), nil)
			init := map[string]any{"execution_id": "e1", "environment": "prod", "op": "plan", "pr": 5, "stacks": []string{"a", "b"}}
			chunk := map[string]any{"execution_id": "e1", "stack": "a", "generation": 1, "offset": 0, "data": base64.StdEncoding.EncodeToString([]byte("hello\n"))}
			for i := 0; i < 2; i++ {
				for path, body := range map[string]any{"/events/init": init} {
					if status, out, _ := ts.call(t, "runner", "POST", path, body); status != 200 {
						t.Fatalf("%s: %d %v", path, status, out)
					}
				}
				if status, out, _ := ts.call(t, "runner", "POST", "/events/log", chunk); status != 200 || len(out) != 0 {
					t.Fatalf("log: %d %v", status, out)
				}
			}
			batch := map[string]any{"chunks": []any{chunk, map[string]any{"execution_id": "e1", "stack": "b", "generation": 1, "offset": 0, "data": b64("bee\n")}}}
			for i := 0; i < 2; i++ {
				if status, out, _ := ts.call(t, "runner", "POST", "/events/logs", batch); status != 200 || len(out) != 0 {
					t.Fatalf("logs batch: %d %v", status, out)
				}
			}
			_, out, _ := ts.call(t, "viewer", "GET", "/executions/e1/log?stack=b", nil)
			if data, _ := base64.StdEncoding.DecodeString(fmt.Sprint(out["data"])); string(data) != "bee\n" {
				t.Fatalf("batched chunk read %v", out)
			}
			_, out, _ = ts.call(t, "viewer", "GET", "/executions/e1/log?stack=a", nil)
			data, _ := base64.StdEncoding.DecodeString(fmt.Sprint(out["data"]))
			if string(data) != "hello\n" || out["next_offset"] != float64(6) {
				t.Fatalf("log read %v (%q)", out, data)
			}
			status, out, _ := ts.call(t, "admin", "POST", "/admin/executions/cancel", map[string]any{"execution_id": "e1", "reason": "stop it"})
			if status != 200 || out["cancel"] != true {
				t.Fatalf("cancel: %d %v", status, out)
			}
			chunk["offset"] = 6
			status, out, _ = ts.call(t, "runner", "POST", "/events/log", chunk)
			if status != 200 || out["cancel"] != true || out["reason"] != "stop it" {
				t.Fatalf("event after cancel: %d %v", status, out)
			}
			_, out, _ = ts.call(t, "viewer", "GET", "/executions/e1", nil)
			if out["status"] != "cancelled" || out["cancel_reason"] != "stop it" {
				t.Fatalf("execution after cancel %v", out)
			}
			_, out, _ = ts.call(t, "viewer", "GET", "/audit", nil)
			list, _ := out["list"].([]any)
			if len(list) != 1 || list[0].(map[string]any)["principal"] != "alice" {
				t.Fatalf("audit %v", out)
			}
		})
	}
}

// client is a generated client of ts's API that authenticates with role's token.
func (ts *testServer) client(t *testing.T, role string) *api.ClientWithResponses {
	t.Helper()
	client, err := api.NewClientWithResponses(ts.URL+BasePath, api.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
		r.Header.Set("Authorization", "Bearer "+tokenOf[role])
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	return client
}

func TestGateVerdictCodesOverHTTP(t *testing.T) {
	s := storetest.OpenSQLite(t)
	ts := newTestServer(t, s, nil)
	client := ts.client(t, "runner")
	ctx := context.Background()
	check := api.GateCheck{ExecutionID: "apply-1", Environment: "prod", PR: 1, SHA: "s1",
		Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h", Class: "destructive"}}}
	verdict := func(want int, code string) {
		t.Helper()
		resp, err := client.GateCheckWithResponse(ctx, check)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != want {
			t.Fatalf("status %d (%s), want %d", resp.StatusCode(), resp.Body, want)
		}
		if code != "" && (resp.JSONDefault == nil || resp.JSONDefault.Code != code) {
			t.Fatalf("body %s, want code %s", resp.Body, code)
		}
	}
	verdict(412, "FAILED_PRECONDITION")
	if _, err := client.InitWithResponse(ctx, api.Init{ExecutionID: "p1", Environment: "prod", Op: "plan", PR: 1, SHA: "s1", Stacks: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.FinalizeWithResponse(ctx, api.Finalize{ExecutionID: "p1", Status: "succeeded",
		Stacks: []api.StackResult{{Stack: "a", Status: "succeeded", Class: "destructive", PlanHash: "h"}}}); err != nil {
		t.Fatal(err)
	}
	verdict(403, "PERMISSION_DENIED")
	status, out, _ := ts.call(t, "admin", "POST", "/admin/gates/satisfy", map[string]any{"pr": 1, "environment": "prod", "class": "destructive", "target": "**", "reason": "approved in review", "execution_id": "p1"})
	if status != 200 {
		t.Fatalf("satisfy %d %v", status, out)
	}
	resp, err := client.GateCheckWithResponse(ctx, check)
	if err != nil || resp.JSON200 == nil || resp.JSON200.Requester != "deployer@proj.iam.gserviceaccount.com" {
		t.Fatalf("allowed check: %v %s", err, resp.Body)
	}
	check.ExecutionID = "apply-2"
	_ = s.Close()
	verdict(503, "UNAVAILABLE")
}

func TestHealthMetricsAndReadiness(t *testing.T) {
	s := storetest.OpenSQLite(t)
	ts := newTestServer(t, s, nil)
	status, out, _ := ts.call(t, "", "GET", "/health", nil)
	if status != 200 || out["status"] != "ok" || out["store"] != "sqlite" {
		t.Fatalf("health %d %v", status, out)
	}
	get := func(path string) (int, string) {
		resp, err := ts.Client().Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, `tfstackplan_http_requests_total{code="200",operation="Health"} 1`) {
		t.Fatalf("metrics %d %s", code, body)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("readyz %d", code)
	}
	_ = s.Close()
	if code, _ := get("/readyz"); code != 503 {
		t.Fatalf("readyz with a closed store: %d", code)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("healthz %d", code)
	}
}

// With a metrics token, /metrics answers only requests bearing it (not a role's token); the
// health endpoints stay open.
func TestMetricsToken(t *testing.T) {
	const token = "metrics-scraper-secret-0123"
	ts := newTestServer(t, storetest.OpenSQLite(t), func(c *Config) { c.MetricsToken = token })
	get := func(path, authorization string) (int, string) {
		req, err := http.NewRequest("GET", ts.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if authorization != "" {
			req.Header.Set("Authorization", authorization)
		}
		return ts.do(t, req)
	}
	for _, a := range []string{"", "Bearer " + token[:len(token)-1], "Bearer " + token + "x", "bearer " + token, token, "Bearer " + tokenOf["admin"]} {
		if code, body := get("/metrics", a); code != 401 || strings.Contains(body, "tfstackplan_") {
			t.Errorf("/metrics with Authorization %q: %d %q, want 401 and no figures", a, code, body)
		}
	}
	if code, body := get("/metrics", "Bearer "+token); code != 200 || !strings.Contains(body, "tfstackplan_log_chunks_total 0") || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("/metrics with its token: %d %s", code, body)
	}
	if code, _ := get("/healthz", ""); code != 200 {
		t.Fatalf("healthz %d", code)
	}
}

// googleKeys serves a JWKS on 127.0.0.1 and signs ID tokens with its key.
type googleKeys struct {
	key *rsa.PrivateKey
	srv *httptest.Server
}

func newGoogleKeys(t *testing.T) *googleKeys {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	g := &googleKeys{key: key}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"keys": []map[string]string{testkit.JWK("k1", &key.PublicKey)}})
	}))
	t.Cleanup(g.srv.Close)
	return g
}

// sign signs claims with RS256 under kid k1, as Google does.
func (g *googleKeys) sign(t *testing.T, claims map[string]any) string {
	t.Helper()
	return testkit.SignRS256(t, g.key, "k1", claims)
}

// googleValidator returns a key server standing for Google's and a validator that reads it.
func googleValidator(t *testing.T) (*googleKeys, auth.IDTokenValidator) {
	t.Helper()
	t.Setenv("GCE_METADATA_HOST", "127.0.0.1:1")
	t.Setenv("GCE_METADATA_IP", "127.0.0.1:1")
	keys := newGoogleKeys(t)
	v, err := auth.NewGoogleValidator(context.Background(), auth.GoogleValidatorOptions{KeysURL: keys.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return keys, v
}

func TestGoogleIDTokens(t *testing.T) {
	keys, v := googleValidator(t)
	const aud = "https://tfstackplan.example.com"
	var logBuf testkit.SyncBuffer
	ts := newTestServer(t, storetest.OpenSQLite(t), func(c *Config) {
		c.FailureBurst = -1 // every refused token below fails from one address
		c.Auth.Audience, c.Auth.Validator = aud, v
		c.Auth.Log = slog.New(slog.NewTextHandler(&logBuf, nil))
	})
	now := time.Now().Unix()
	base := func() map[string]any {
		return map[string]any{"iss": "https://accounts.google.com", "aud": aud, "iat": now, "exp": now + 600,
			"sub": "1234", "email": "deployer@proj.iam.gserviceaccount.com", "email_verified": true}
	}
	with := func(mutate func(map[string]any)) map[string]any {
		c := base()
		mutate(c)
		return c
	}
	otherKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	valid := keys.sign(t, base())
	parts := strings.Split(valid, ".")
	// want is a fragment of the response; a token the validator refuses is answered with one
	// fixed message, and logged is a fragment of the reason the server logs, so each token is
	// refused for the reason it was built for.
	const refused = "the ID token is not valid"
	cases := []struct {
		name   string
		token  string
		status int
		want   string
		logged string
	}{
		{"valid runner identity", valid, 200, "[]", ""},
		{"issuer without scheme", keys.sign(t, with(func(c map[string]any) { c["iss"] = "accounts.google.com" })), 200, "[]", ""},
		{"wrong audience", keys.sign(t, with(func(c map[string]any) { c["aud"] = "https://other" })), 401, refused, "expected audience"},
		{"expired", keys.sign(t, with(func(c map[string]any) { c["exp"] = now - 10 })), 401, refused, "expired"},
		{"no exp", keys.sign(t, with(func(c map[string]any) { delete(c, "exp") })), 401, refused, "expired"},
		{"not Google", keys.sign(t, with(func(c map[string]any) { c["iss"] = "https://evil.example" })), 401, refused, "different provider"},
		{"unlisted identity", keys.sign(t, with(func(c map[string]any) { c["email"] = "someone@else.com" })), 403, "not listed", ""},
		{"unverified email", keys.sign(t, with(func(c map[string]any) { c["email_verified"] = false })), 401, "no verified email", ""},
		{"forged signature", parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(make([]byte, 256)), 401, refused, "verify signature"},
		{"alg none", testkit.B64JSON(t, map[string]string{"alg": "none", "typ": "JWT"}) + "." + parts[1] + ".", 401, refused, `algorithm \"none\"`},
		{"HS256 with the public modulus as secret", testkit.SignHS256(t, keys.key.N.Bytes(), "k1", base()), 401, refused, `algorithm \"HS256\"`},
		{"unknown kid", testkit.SignRS256(t, otherKey, "k2", base()), 401, refused, "verify signature"},
		{"two parts", parts[0] + "." + parts[1], 401, "unknown token", ""},
		{"four parts", valid + ".x", 401, "unknown token", ""},
		{"bad base64", "!!!." + parts[1] + "." + parts[2], 401, refused, "base64"},
		{"payload not JSON", parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte("{nope")) + "." + parts[2], 401, refused, "verify signature"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			logStart := len(logBuf.String())
			req, _ := http.NewRequest("GET", ts.URL+BasePath+"/claims", nil)
			req.Header.Set("Authorization", "Bearer "+tc.token)
			resp, err := ts.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.want) {
				t.Fatalf("status %d (%s), want %d mentioning %s", resp.StatusCode, b, tc.status, tc.want)
			}
			if logged := logBuf.String()[logStart:]; tc.logged != "" && !strings.Contains(logged, tc.logged) {
				t.Fatalf("the server log does not give the reason %s:\n%s", tc.logged, logged)
			}
			if strings.Contains(string(b), aud) || strings.Contains(string(b), keys.srv.URL) {
				t.Fatalf("the answer %s names the audience or the key server", b)
			}
		})
	}
}

func TestTokensFileErrors(t *testing.T) {
	for src, want := range map[string]string{
		"token \"a\" {\n secret = \"short\"\n roles = [\"runner\"]\n}":           "at least 16",
		"token \"a\" {\n secret = \"0123456789abcdefg\"\n roles = [\"root\"]\n}": "unknown role",
		"identity \"x@y\" {\n roles = []\n}":                                     "roles is empty",
		"token \"a\" {\n secret = \"0123456789abcdefg\"\n}":                      "roles",
	} {
		a := &auth.Authenticator{}
		if err := a.ParseTokens("t.hcl", []byte(src)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err %v, want mention of %q", src, err, want)
		}
	}
}

// An execution at the stack limit, with paths as long as a deep monorepo's, is taken: its
// Init (with edges and reasons), its Finalize and its gate check are megabytes, more than the
// 1 MiB of other events.
func TestExecutionAtTheStackLimitIsTaken(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	stacks := make([]string, service.MaxStacks)
	var edges []api.Edge
	var reasons []api.ChangeReason
	results := make([]api.StackResult, len(stacks))
	for i := range stacks {
		stacks[i] = fmt.Sprintf("stacks/platform/region-%02d/team-%03d/service-%05d/component", i%20, i%300, i)
		results[i] = api.StackResult{Stack: stacks[i], Status: "succeeded", Class: "no-changes"}
		reasons = append(reasons, api.ChangeReason{Stack: stacks[i], Kind: "unmerged", Raw: stacks[i] + " - stack has unmerged changes"})
		if i > 0 {
			edges = append(edges, api.Edge{From: stacks[i-1], To: stacks[i]}, api.Edge{From: stacks[0], To: stacks[i]})
		}
	}
	in := api.Init{ExecutionID: "big", Environment: "prod", Op: "plan", Stacks: stacks, Edges: edges, Reasons: reasons}
	if b, _ := json.Marshal(in); len(b) <= MaxEventBody {
		t.Fatalf("the Init is only %d bytes: not a test of the larger limit", len(b))
	}
	if status, out, _ := ts.call(t, "runner", "POST", "/events/init", in); status != 200 {
		t.Fatalf("init: %d %v", status, out)
	}
	if status, out, _ := ts.call(t, "runner", "POST", "/events/finalize", api.Finalize{ExecutionID: "big", Status: "succeeded", Stacks: results}); status != 200 {
		t.Fatalf("finalize: %d %v", status, out)
	}
}

// A log chunk whose bytes differ from the stored log is answered 409 naming the offset, and
// the log reads as before; a resend that repeats the stored bytes and goes on is stored.
func TestDifferingLogChunkOverHTTP(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ts := newTestServer(t, b.Open(t), nil)
			init := map[string]any{"execution_id": "e1", "environment": "prod", "op": "plan", "pr": 5, "stacks": []string{"a"}}
			if status, out, _ := ts.call(t, "runner", "POST", "/events/init", init); status != 200 {
				t.Fatalf("init: %d %v", status, out)
			}
			chunk := func(off int, data string) map[string]any {
				return map[string]any{"execution_id": "e1", "stack": "a", "generation": 0, "offset": off, "data": b64(data)}
			}
			read := func() string {
				_, out, _ := ts.call(t, "viewer", "GET", "/executions/e1/log?stack=a", nil)
				data, _ := base64.StdEncoding.DecodeString(fmt.Sprint(out["data"]))
				return string(data)
			}
			if status, out, _ := ts.call(t, "runner", "POST", "/events/log", chunk(0, "hello\n")); status != 200 {
				t.Fatalf("log: %d %v", status, out)
			}
			for path, body := range map[string]any{"/events/log": chunk(0, "hellO\nworld\n"), "/events/logs": map[string]any{"chunks": []any{chunk(2, "llo\nwor"), chunk(4, "O")}}} {
				status, out, _ := ts.call(t, "runner", "POST", path, body)
				if status != http.StatusConflict || out["code"] != "ALREADY_EXISTS" || !strings.Contains(fmt.Sprint(out["message"]), " at offset 4") {
					t.Fatalf("%s differing: %d %v, want 409 naming offset 4", path, status, out)
				}
				if got := read(); got != "hello\n" {
					t.Fatalf("after the refused %s the log reads %q", path, got)
				}
			}
			if status, out, _ := ts.call(t, "runner", "POST", "/events/log", chunk(0, "hello\nworld\n")); status != 200 {
				t.Fatalf("extending resend: %d %v", status, out)
			}
			if got := read(); got != "hello\nworld\n" {
				t.Fatalf("after the extending resend the log reads %q", got)
			}
		})
	}
}

// A principal past its executions-per-hour quota gets 429 with Retry-After, the seconds until
// one of its executions leaves the hour; an administrator is not counted.
func TestExecutionQuotaOverHTTP(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	ts.svc.Quotas = service.Quotas{ExecutionsPerHour: 1}
	init := func(role, id string) (int, map[string]any, http.Header) {
		return ts.call(t, role, "POST", "/events/init", map[string]any{"execution_id": id, "environment": "prod", "op": "plan", "pr": 5, "stacks": []string{"a"}})
	}
	if status, out, _ := init("runner", "e1"); status != 200 {
		t.Fatalf("first init: %d %v", status, out)
	}
	status, out, h := init("runner", "e2")
	retry, _ := strconv.Atoi(h.Get("Retry-After"))
	if status != http.StatusTooManyRequests || out["code"] != "RESOURCE_EXHAUSTED" || !strings.Contains(fmt.Sprint(out["message"]), "quota exceeded") ||
		retry < 3500 || retry > 3600 {
		t.Fatalf("second init: %d %v, Retry-After %q", status, out, h.Get("Retry-After"))
	}
	if status, out, _ := init("admin", "a1"); status != 200 {
		t.Fatalf("admin init: %d %v", status, out)
	}
}
