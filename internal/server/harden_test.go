package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
	"github.com/tfstackplan/tfstackplan/internal/server/throttle"
	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

// Regression tests of issue 37 over HTTP, on every store: each attack here once succeeded.

// 3: a control character (an escape sequence that hides what a terminal prints after it) in
// a sha, a base, an actor or a plan hash is refused with 400, and the refused request changes
// nothing.
func TestControlCharactersInReportedFieldsAreRefused(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ts := newTestServer(t, b.Open(t), nil)
			init := func(id string) map[string]any {
				return map[string]any{"execution_id": id, "environment": "prod", "op": "plan", "pr": 3, "sha": "abc", "stacks": []string{"a"}}
			}
			for _, c := range []struct{ field, value string }{{"sha", "abc\x1b[8m"}, {"base", "main\x07"}, {"actor", "mallory\r"}, {"sha", "abc\u009b8m"}} {
				body := init("ctl")
				body[c.field] = c.value
				if code, out, _ := ts.call(t, "runner", "POST", "/events/init", body); code != 400 || out["code"] != "INVALID_ARGUMENT" {
					t.Errorf("init with %s %q: %d %v, want 400", c.field, c.value, code, out)
				}
			}
			if code, _, _ := ts.call(t, "viewer", "GET", "/executions/ctl", nil); code != 404 {
				t.Errorf("a refused init created the execution: %d", code)
			}
			if code, out, _ := ts.call(t, "runner", "POST", "/events/init", init("ok")); code != 200 {
				t.Fatalf("init: %d %v", code, out)
			}
			hash := "v1:\x1b[8mx"
			refused := []struct {
				path string
				body map[string]any
			}{
				{"/events/update", map[string]any{"execution_id": "ok", "stack": "a", "seq": 1, "status": "succeeded", "class": "mutating", "plan_hash": hash}},
				{"/events/updates", map[string]any{"updates": []any{map[string]any{"execution_id": "ok", "stack": "a", "seq": 1, "status": "succeeded", "class": "mutating", "plan_hash": hash}}}},
				{"/events/finalize", map[string]any{"execution_id": "ok", "status": "succeeded",
					"stacks": []map[string]any{{"stack": "a", "status": "succeeded", "class": "mutating", "plan_hash": hash}}}},
				{"/gates/check", map[string]any{"execution_id": "ap", "environment": "prod", "pr": 3, "sha": "x\x1b]0;t\x07",
					"stacks": []map[string]any{{"stack": "a", "plan_hash": "v1:a", "class": "mutating"}}}},
				{"/gates/check", map[string]any{"execution_id": "ap", "environment": "prod", "pr": 3, "sha": "x",
					"stacks": []map[string]any{{"stack": "a", "plan_hash": hash, "class": "mutating"}}}},
			}
			for _, r := range refused {
				if code, out, _ := ts.call(t, "runner", "POST", r.path, r.body); code != 400 || out["code"] != "INVALID_ARGUMENT" {
					t.Errorf("%s with a control character: %d %v, want 400", r.path, code, out)
				}
			}
			if st := ts.stacksOf(t, "ok")["a"]; st["status"] != "pending" || st["plan_hash"] != nil {
				t.Errorf("a refused event changed the stack: %v", st)
			}
		})
	}
}

// 6: the zero time sent in started_at, finished_at or an event's at, or as the executions
// list's before without before_id, is outside the times the server stores: 400, not "absent".
func TestAZeroTimeIsNotAbsent(t *testing.T) {
	const zero = "0001-01-01T00:00:00Z"
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ts := newTestServer(t, b.Open(t), nil)
			init := map[string]any{"execution_id": "z", "environment": "prod", "op": "plan", "pr": 3, "sha": "abc", "stacks": []string{"a"},
				"started_at": zero}
			if code, out, _ := ts.call(t, "runner", "POST", "/events/init", init); code != 400 || !strings.Contains(fmt.Sprint(out["message"]), "zero time") {
				t.Errorf("init with started_at %s: %d %v, want 400", zero, code, out)
			}
			if code, _, _ := ts.call(t, "viewer", "GET", "/executions/z", nil); code != 404 {
				t.Errorf("a refused init created the execution: %d", code)
			}
			delete(init, "started_at")
			if code, out, _ := ts.call(t, "runner", "POST", "/events/init", init); code != 200 {
				t.Fatalf("init: %d %v", code, out)
			}
			for path, body := range map[string]map[string]any{
				"/events/update":   {"execution_id": "z", "stack": "a", "seq": 1, "status": "running", "at": zero},
				"/events/phase":    {"execution_id": "z", "stack": "a", "seq": 1, "phase": "init", "at": zero},
				"/events/finalize": {"execution_id": "z", "status": "failed", "finished_at": zero},
			} {
				if code, out, _ := ts.call(t, "runner", "POST", path, body); code != 400 {
					t.Errorf("%s with a zero time: %d %v, want 400", path, code, out)
				}
			}
			if code, out, _ := ts.call(t, "viewer", "GET", "/executions/z", nil); code != 200 || out["status"] != "running" {
				t.Errorf("a refused finalize ended the execution: %d %v", code, out)
			}
			if code, out, _ := ts.call(t, "viewer", "GET", "/executions?before="+zero, nil); code != 400 {
				t.Errorf("the list before the zero time alone: %d %v, want 400", code, out)
			}
			if code, out, _ := ts.call(t, "viewer", "GET", "/executions?before="+zero+"&before_id=z", nil); code != 200 {
				t.Errorf("the list after an execution listed without started_at: %d %v, want 200", code, out)
			}
		})
	}
}

// The throttle locks out right tokens no more: after a burst of wrong tokens from one address
// (a NAT, a load balancer), the right token from that address is served while wrong ones get
// 429.
func TestAThrottledAddressStillServesRightTokens(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ts := newTestServer(t, b.Open(t), withClock(newTestClock()))
			const nat = "192.0.2.77"
			for i := range throttle.DefaultBurst {
				ts.from(nat, "GET", BasePath+"/claims", fmt.Sprint("misconfigured-", i), nil)
			}
			if w := ts.from(nat, "GET", BasePath+"/claims", "misconfigured", nil); w.Code != 429 {
				t.Fatalf("a wrong token from the throttled address: %d, want 429", w.Code)
			}
			init := map[string]any{"execution_id": "nat-1", "environment": "prod", "op": "plan", "pr": 3, "sha": "abc", "stacks": []string{"a"}}
			body, _ := json.Marshal(init)
			req := httptest.NewRequest("POST", BasePath+"/events/init", bytes.NewReader(body))
			req.RemoteAddr, req.Header["Content-Type"] = nat+":1", []string{"application/json"}
			req.Header.Set("Authorization", "Bearer "+tokenOf["runner"])
			w := httptest.NewRecorder()
			ts.srv.ServeHTTP(w, req)
			if w.Code != 200 {
				t.Fatalf("the right token from the throttled address: %d %s", w.Code, w.Body)
			}
			if code, _, _ := ts.call(t, "viewer", "GET", "/executions/nat-1", nil); code != 200 {
				t.Fatalf("the right token's Init was not stored: %d", code)
			}
		})
	}
}

// githubServer is a test server that also takes GitHub Actions ID tokens of iss's for
// repositories acme/infra and acme/other (role runner), and tweak's changes.
func githubServer(t *testing.T, s store.Store, extraTokens string, tweak func(*Config)) (*testServer, *testkit.OIDCIssuer) {
	t.Helper()
	const audience = "https://tfstackplan.example.com"
	iss := testkit.NewOIDCIssuer(t)
	ts := newTestServer(t, s, func(c *Config) {
		a := &auth.Authenticator{Audience: audience}
		if err := a.ParseTokens("tokens.hcl", []byte(testTokens+"github \"acme/infra\" {\n  roles = [\"runner\"]\n}\ngithub \"acme/other\" {\n  roles = [\"runner\"]\n}\n"+extraTokens)); err != nil {
			t.Fatal(err)
		}
		v, err := auth.NewGitHubValidator(context.Background(), auth.GitHubValidatorOptions{Issuer: iss.URL})
		if err != nil {
			t.Fatal(err)
		}
		a.GitHub = v
		c.Auth = a
		if tweak != nil {
			tweak(c)
		}
	})
	return ts, iss
}

// jobToken is an ID token of a job of run run of repo, from iss.
func jobToken(t *testing.T, iss *testkit.OIDCIssuer, repo, run string, edit func(map[string]any)) string {
	t.Helper()
	claims := iss.GitHubClaims("https://tfstackplan.example.com", repo)
	claims["run_id"], claims["exp"] = run, time.Now().Add(time.Hour).Unix()
	if edit != nil {
		edit(claims)
	}
	return iss.Mint(t, claims)
}

// getAs is GET path with token: its status.
func (ts *testServer) getAs(t *testing.T, token, path string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", ts.URL+BasePath+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// Quotas per workflow run: the slow bodies of two runs of one repository share its
// MaxRequestsPerPrincipal, so a third run of it is answered 429 while another repository's run
// is served.
func TestARepositorysRunsShareTheRequestsInProgress(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			const limit = 4
			ts, iss := githubServer(t, b.Open(t), "", func(c *Config) { c.MaxRequestsPerPrincipal, c.BodyTimeout = limit, time.Minute })
			for i := range limit {
				token := jobToken(t, iss, "acme/infra", fmt.Sprint(500+i%2), nil)
				ts.rawConn(t, "POST "+BasePath+"/events/phase HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+token+
					"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
			}
			third := jobToken(t, iss, "acme/infra", "502", nil)
			deadline := time.Now().Add(30 * time.Second) // generous: a loaded CI machine verifies four tokens slowly
			for ts.getAs(t, third, "/claims") != 429 {
				if time.Now().After(deadline) {
					t.Fatal("two runs' slow bodies never filled their repository's share: a third run is still served")
				}
				time.Sleep(20 * time.Millisecond)
			}
			if code := ts.getAs(t, jobToken(t, iss, "acme/other", "600", nil), "/claims"); code != 200 {
				t.Fatalf("another repository's run: %d", code)
			}
		})
	}
}

// Repository identity: a github block that gives repository_id (and repository_owner_id)
// takes only ID tokens with those ids: those of a repository deleted and created again under
// the same name are refused with 401.
func TestAGitHubBlockPinsItsRepositorysIDs(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ts, iss := githubServer(t, b.Open(t), "github \"acme/pinned\" {\n  roles = [\"runner\"]\n  repository_id = \"999\"\n  repository_owner_id = \"654321\"\n}\n", nil)
			for _, c := range []struct {
				what      string
				id, owner string
				want      int
			}{
				{"the pinned repository", "999", "654321", 200},
				{"a repository created again under the name", "1000", "654321", 401},
				{"the name under another owner", "999", "1", 401},
				{"a token without the ids", "", "", 401},
			} {
				token := jobToken(t, iss, "acme/pinned", "700", func(claims map[string]any) {
					claims["repository_id"], claims["repository_owner_id"] = c.id, c.owner
					if c.id == "" {
						delete(claims, "repository_id")
						delete(claims, "repository_owner_id")
					}
				})
				if code := ts.getAs(t, token, "/claims?repo=acme/pinned"); code != c.want {
					t.Errorf("%s: %d, want %d", c.what, code, c.want)
				}
			}
			// A block without ids takes any id, as before.
			if code := ts.getAs(t, jobToken(t, iss, "acme/infra", "701", func(claims map[string]any) { claims["repository_id"] = "1" }), "/claims"); code != 200 {
				t.Errorf("a repository whose block gives no ids: %d", code)
			}
		})
	}
}

// 7: "latest" is the plan the server received last: a plan dated four minutes ahead by its
// runner's clock heads the executions list, but /plans/latest names the plan received after
// it, the one an approval must name.
func TestTheLatestPlanIsTheOneReceivedLast(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ts := newTestServer(t, b.Open(t), nil)
			plan := func(id string, startedAt any) {
				t.Helper()
				init := map[string]any{"execution_id": id, "environment": "prod", "op": "plan", "pr": 8, "sha": id, "stacks": []string{"a"}}
				if startedAt != nil {
					init["started_at"] = startedAt
				}
				if code, out, _ := ts.call(t, "runner", "POST", "/events/init", init); code != 200 {
					t.Fatalf("init %s: %d %v", id, code, out)
				}
				fin := map[string]any{"execution_id": id, "status": "succeeded",
					"stacks": []map[string]any{{"stack": "a", "status": "succeeded", "class": "destructive", "plan_hash": "v1:" + id}}}
				if code, out, _ := ts.call(t, "runner", "POST", "/events/finalize", fin); code != 200 {
					t.Fatalf("finalize %s: %d %v", id, code, out)
				}
			}
			plan("ahead", time.Now().Add(4*time.Minute).UTC().Format(time.RFC3339Nano))
			plan("last", nil)
			_, out, _ := ts.call(t, "viewer", "GET", "/executions?repo=acme/infra&environment=prod&pr=8", nil)
			if list, _ := out["list"].([]any); len(list) != 2 || list[0].(map[string]any)["execution_id"] != "ahead" {
				t.Fatalf("the executions list, by started_at: %v", out)
			}
			code, out, _ := ts.call(t, "viewer", "GET", "/plans/latest?repo=acme/infra&environment=prod&pr=8", nil)
			if code != 200 || out["execution_id"] != "last" || len(out["stacks"].([]any)) != 1 {
				t.Fatalf("the latest plan: %d %v, want the plan received last with its stacks", code, out)
			}
			satisfy := map[string]any{"environment": "prod", "pr": 8, "class": "destructive", "target": "**", "reason": "reviewed", "execution_id": out["execution_id"]}
			if code, out, _ := ts.call(t, "admin", "POST", "/admin/gates/satisfy", satisfy); code != 200 {
				t.Fatalf("approving the latest plan: %d %v", code, out)
			}
			if code, _, _ := ts.call(t, "viewer", "GET", "/plans/latest?repo=acme/infra&environment=prod&pr=9", nil); code != 404 {
				t.Fatalf("a PR without a plan: %d, want 404", code)
			}
			if code, _, _ := ts.call(t, "viewer", "GET", "/plans/latest?repo=acme/infra&environment=prod", nil); code != 400 {
				t.Fatalf("without pr: %d, want 400", code)
			}
		})
	}
}

// Shard coverage: a "1/1" shard that names only some of the plan's changed stacks passes the
// gate for them, and the apply execution (and its page) says which changed stacks no shard
// applied.
func TestTheExecutionSaysWhichChangedStacksNoShardApplied(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ts := newTestServer(t, b.Open(t), nil)
			steps := []struct {
				path string
				body map[string]any
			}{
				{"/events/init", map[string]any{"execution_id": "pl", "environment": "prod", "op": "plan", "pr": 4, "sha": "s", "stacks": []string{"a", "b", "c"}}},
				{"/events/finalize", map[string]any{"execution_id": "pl", "status": "succeeded", "stacks": []map[string]any{
					{"stack": "a", "status": "succeeded", "class": "mutating", "plan_hash": "v1:a"},
					{"stack": "b", "status": "succeeded", "class": "additive", "plan_hash": "v1:b"},
					{"stack": "c", "status": "succeeded", "class": "no-changes"}}}},
				{"/gates/check", map[string]any{"execution_id": "ap", "environment": "prod", "pr": 4, "sha": "m", "shard": "1/1",
					"stacks": []map[string]any{{"stack": "a", "plan_hash": "v1:a", "class": "mutating"}}}},
				{"/events/init", map[string]any{"execution_id": "ap", "environment": "prod", "op": "apply", "pr": 4, "sha": "m", "stacks": []string{"a"}}},
				{"/events/update", map[string]any{"execution_id": "ap", "stack": "a", "seq": 1, "status": "succeeded", "class": "mutating", "plan_hash": "v1:a"}},
			}
			for _, s := range steps {
				if code, out, _ := ts.call(t, "runner", "POST", s.path, s.body); code != 200 {
					t.Fatalf("%s: %d %v", s.path, code, out)
				}
			}
			code, out, _ := ts.call(t, "viewer", "GET", "/executions/ap", nil)
			if code != 200 || fmt.Sprint(out["unapplied"]) != "[b]" {
				t.Fatalf("the apply's unapplied stacks: %d %v, want [b]", code, out["unapplied"])
			}
			if _, out, _ := ts.call(t, "viewer", "GET", "/executions/pl", nil); out["unapplied"] != nil {
				t.Fatalf("a plan lists unapplied stacks: %v", out["unapplied"])
			}
			status, body := ts.page(t, "/ui/executions/ap", tokenOf["viewer"])
			if status != 200 || !strings.Contains(body, "no shard applied: <code>b</code>") {
				t.Fatalf("the apply's page does not say which changed stack no shard applied: %d", status)
			}
		})
	}
}
