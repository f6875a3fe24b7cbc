package server

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/service"

	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// bidiRunes are the characters that reorder text: shown raw, a runner's sha or actor could make
// a page read otherwise than what the server stored.
const bidiRunes = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"

// What runners report reaches the pages without its bidirectional formatting characters.
func TestPagesShowNoBidirectionalOverrides(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	if status, out, _ := ts.call(t, "runner", "POST", "/events/init", map[string]any{"execution_id": "bidi-1", "environment": "prod",
		"op": "plan", "pr": 12, "sha": "abc\u202edef", "actor": "\u2066mallory\u2069", "stacks": []string{"app"},
		"reasons": []map[string]string{{"stack": "app", "kind": "watched-file", "detail": "main.tf\u202e"}}}); status != 200 {
		t.Fatalf("init: %d %v", status, out)
	}
	if status, out, _ := ts.call(t, "runner", "POST", "/events/finalize", map[string]any{"execution_id": "bidi-1", "status": "failed",
		"error": "boom \u202e!"}); status != 200 {
		t.Fatalf("finalize: %d %v", status, out)
	}
	for _, path := range []string{"/", "/ui/executions/bidi-1"} {
		status, body := ts.page(t, path, tokenOf["viewer"])
		if status != 200 || !strings.Contains(body, "bidi-1") {
			t.Fatalf("%s: %d %s", path, status, body)
		}
		if i := strings.IndexAny(body, bidiRunes); i >= 0 {
			t.Fatalf("%s shows a bidirectional formatting character: …%s…", path, body[max(0, i-60):min(len(body), i+60)])
		}
		if !strings.Contains(body, "abc\ufffd") {
			t.Fatalf("%s does not show the sha with the character replaced", path)
		}
	}
}

// A session opened with a Google ID token ends when that token does, however long sessions
// last otherwise; a token already expired by the sessions' clock opens none.
func TestASessionEndsWithItsIDToken(t *testing.T) {
	keys, v := googleValidator(t)
	const aud = "https://tfstackplan.example.com"
	clk := newTestClock()
	ts := newTestServer(t, storetest.OpenSQLite(t), withClock(clk, func(c *Config) {
		c.SessionTTL = 12 * time.Hour
		c.Auth.Audience, c.Auth.Validator = aud, v
		if err := c.Auth.ParseTokens("tokens.hcl", []byte(testTokens+`
identity "viewer@proj.iam.gserviceaccount.com" {
  roles = ["viewer"]
}`)); err != nil {
			t.Fatal(err)
		}
	}))
	exp := time.Now().Add(10 * time.Minute).Unix()
	idToken := keys.sign(t, map[string]any{"iss": "https://accounts.google.com", "aud": aud, "iat": time.Now().Unix(), "exp": exp,
		"sub": "1", "email": "viewer@proj.iam.gserviceaccount.com", "email_verified": true})
	c := ts.signInAs(t, idToken)
	// The sessions' clock is the test's, not the wall's (a loaded machine takes a while to
	// start the server): the token's remaining life is measured on it.
	left := time.Unix(exp, 0).Sub(clk.now())
	if c.MaxAge <= 0 || c.MaxAge > int(left.Seconds()) {
		t.Fatalf("cookie Max-Age %d, want at most the ID token's remaining %s", c.MaxAge, left)
	}
	if resp, _ := ts.pageWith(t, "/ui/claims", c); resp.StatusCode != 200 {
		t.Fatalf("before the token's exp: %d", resp.StatusCode)
	}
	clk.add(left + time.Second)
	if resp, body := ts.pageWith(t, "/ui/claims", c); resp.StatusCode != 401 || !strings.Contains(body, "session ended") {
		t.Fatalf("after the ID token's exp: %d", resp.StatusCode)
	}
	csrf, cookie := ts.signInForm(t)
	resp := ts.signIn(t, url.Values{"token": {idToken}, "next": {"/"}, "csrf": {csrf}}, cookie, nil)
	if resp.StatusCode != 401 || sessionCookie(resp) != nil {
		t.Fatalf("a sign-in with a token expired by the sessions' clock: %d", resp.StatusCode)
	}
}

// A session follows its token in the tokens file: removed, or given another secret, the token's
// sessions end; its roles and repositories changed, the session has the new ones. A signed-out
// session's cookie, replayed, opens nothing.
func TestSessionsFollowTheTokensFile(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	reload := func(tokens string) {
		t.Helper()
		if err := ts.srv.cfg.Auth.ParseTokens("tokens.hcl", []byte(tokens)); err != nil {
			t.Fatal(err)
		}
	}
	viewer := ts.signInAs(t, tokenOf["viewer"])
	admin := ts.signInAs(t, tokenOf["admin"])
	reload(strings.Replace(testTokens, `token "viewer" {
  secret = "viewer-secret-0123456789"
  roles  = ["viewer"]
}`, "", 1))
	if resp, body := ts.pageWith(t, "/", viewer); resp.StatusCode != 401 || !strings.Contains(body, "session ended") {
		t.Fatalf("the session of a removed token: %d", resp.StatusCode)
	}
	reload(strings.Replace(testTokens, "viewer-secret-0123456789", "viewer-secret-rotated-0123", 1))
	if resp, body := ts.pageWith(t, "/", viewer); resp.StatusCode != 401 || !strings.Contains(body, "session ended") {
		t.Fatalf("the session of a token given another secret: %d", resp.StatusCode)
	}
	reload(strings.Replace(testTokens, `repositories = ["acme/infra"]
  roles     = ["admin"]`, `repositories = ["acme/other"]
  roles     = ["viewer"]`, 1))
	if resp, _ := ts.pageWith(t, "/ui/audit?repo=acme/infra", admin); resp.StatusCode != 403 {
		t.Fatalf("a session of a token now limited to acme/other read acme/infra: %d", resp.StatusCode)
	}
	reload(strings.Replace(testTokens, `principal = "alice"`, `principal = "mallory"`, 1))
	if resp, _ := ts.pageWith(t, "/", admin); resp.StatusCode != 401 {
		t.Fatalf("a session of a token whose principal was renamed: %d", resp.StatusCode)
	}
	reload(testTokens)
	resp, body := ts.pageWith(t, "/", admin)
	if resp.StatusCode != 200 {
		t.Fatalf("the token restored: %d", resp.StatusCode)
	}
	if resp := ts.logout(t, signOutToken(t, body), admin, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	if resp, _ := ts.pageWith(t, "/", admin); resp.StatusCode != 401 {
		t.Fatalf("a signed-out session's cookie replayed: %d", resp.StatusCode)
	}
}

// The audit page's Older link keeps the repository filter: the next page is of the same
// repository.
func TestAuditOlderLinkKeepsTheRepository(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	root := service.Caller{Name: "root", Admin: true}
	for i := range 150 { // 113 in acme/infra: a full page and 13 older
		repo := "acme/infra"
		if i%4 == 3 {
			repo = "acme/other"
		}
		if _, err := ts.svc.OverrideCheck(context.Background(), root, &api.ChecksOverride{Repo: repo, Environment: "prod", PR: i + 1,
			Check: "c", Conclusion: "success", Reason: "r"}); err != nil {
			t.Fatal(err)
		}
	}
	status, body := ts.page(t, "/ui/audit?repo=acme/infra", tokenOf["viewer"])
	m := regexp.MustCompile(`<a href="([^"]*)">Older…</a>`).FindStringSubmatch(body)
	if status != 200 || m == nil {
		t.Fatalf("audit page: %d, Older link %v", status, m)
	}
	href, err := url.Parse(strings.ReplaceAll(m[1], "&amp;", "&"))
	if err != nil || href.Query().Get("repo") != "acme/infra" || href.Query().Get("before") == "" {
		t.Fatalf("Older link %q lost the filter", m[1])
	}
	status, body = ts.page(t, "/ui/audit"+href.String(), tokenOf["viewer"])
	if status != 200 || !strings.Contains(body, "acme/infra prod PR #1 c") || strings.Contains(body, "acme/other") {
		t.Fatalf("older page: %d %s", status, body)
	}
}

// A principal limited to acme/infra reaches nothing of acme/other through any endpoint, API or
// page, whatever spelling of the repository it tries; odd spellings are refused.
func TestALimitedPrincipalReachesNoOtherRepository(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	root := service.Caller{Name: "root", Admin: true}
	ctx := context.Background()
	for _, repo := range []string{"acme/other", "acme/infra"} {
		id := "x-" + strings.ReplaceAll(repo, "/", "-")
		if _, err := ts.svc.Init(ctx, root, &api.Init{Repo: repo, ExecutionID: id, Environment: "prod", Op: "plan", PR: 5, Stacks: []string{"app"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := ts.svc.Finalize(ctx, root, &api.Finalize{ExecutionID: id, Status: "succeeded",
			Stacks: []api.StackResult{{Stack: "app", Status: "succeeded", Class: "destructive", PlanHash: "h"}}}); err != nil {
			t.Fatal(err)
		}
	}
	otherGates, err := ts.svc.Gates(ctx, root, service.Page{Repo: "acme/other", Limit: 10}, "")
	if err != nil || len(otherGates) != 1 {
		t.Fatalf("acme/other's gates %v %v", otherGates, err)
	}
	long := "acme/" + strings.Repeat("x", 300)
	for _, c := range []struct {
		method, path string
		body         any
		want         int
	}{
		{"GET", "/executions?repo=ACME/Infra", nil, 200},
		{"GET", "/executions?repo=acme/other", nil, 403},
		{"GET", "/executions?repo=ACME/Other", nil, 403},
		{"GET", "/executions?repo=acme/infra%00", nil, 400},
		{"GET", "/executions?repo=acme/infra/../other", nil, 400},
		{"GET", "/executions?repo=" + long, nil, 400},
		{"GET", "/executions?repo=%D0%B0cme/infra", nil, 400}, // a Cyrillic а
		{"GET", "/executions/x-acme-other", nil, 404},
		{"GET", "/executions/x-acme-other/log?stack=app", nil, 404},
		{"GET", "/audit?repo=acme/other", nil, 403},
		{"GET", "/claims?repo=acme/other", nil, 403},
		{"GET", "/gates?repo=acme/other", nil, 403},
		{"GET", "/gates?before=" + otherGates[0].Cursor, nil, 400},
		{"GET", "/grants?repo=acme/other", nil, 403},
		{"GET", "/checks?repo=acme/other", nil, 403},
		{"POST", "/events/init", map[string]any{"repo": "Acme/Other", "execution_id": "n1", "environment": "prod", "op": "plan", "pr": 5}, 403},
		{"POST", "/events/update", map[string]any{"execution_id": "x-acme-other", "stack": "app", "seq": 9, "status": "failed"}, 404},
		{"POST", "/events/finalize", map[string]any{"execution_id": "x-acme-other", "status": "failed"}, 404},
		{"POST", "/gates/check", map[string]any{"repo": "acme/other", "execution_id": "n2", "environment": "prod", "pr": 5, "sha": "s",
			"stacks": []map[string]string{{"stack": "app", "plan_hash": "h"}}}, 403},
		{"POST", "/claims/release", map[string]any{"repo": "acme/other", "environment": "prod", "pr": 5, "execution_id": "x-acme-other"}, 403},
		{"POST", "/claims/release", map[string]any{"environment": "prod", "pr": 5, "execution_id": "x-acme-other"}, 404},
	} {
		if status, out, _ := ts.call(t, "runner", c.method, c.path, c.body); status != c.want {
			t.Errorf("runner %s %s: %d %v, want %d", c.method, c.path, status, out, c.want)
		}
	}
	for _, c := range []struct {
		path string
		body any
	}{
		{"/admin/gates/satisfy", map[string]any{"repo": "acme/other", "environment": "prod", "pr": 5, "class": "destructive", "target": "**",
			"reason": "r", "execution_id": "x-acme-other"}},
		{"/admin/grants/release", map[string]any{"repo": "acme/other", "environment": "prod", "pr": 5, "class": "destructive", "target": "**", "reason": "r"}},
		{"/admin/checks/override", map[string]any{"repo": "acme/other", "environment": "prod", "pr": 5, "check": "c", "conclusion": "success", "reason": "r"}},
	} {
		if status, out, _ := ts.call(t, "admin", "POST", c.path, c.body); status != 403 {
			t.Errorf("admin of acme/infra POST %s: %d %v, want 403", c.path, status, out)
		}
	}
	if status, out, _ := ts.call(t, "admin", "POST", "/admin/executions/cancel", map[string]any{"execution_id": "x-acme-other", "reason": "r"}); status != 404 {
		t.Errorf("admin of acme/infra cancels acme/other's execution: %d %v", status, out)
	}
	for path, want := range map[string]int{
		"/?repo=acme/other":                              403,
		"/ui/executions/x-acme-other":                    404,
		"/ui/claims?repo=acme/other":                     403,
		"/ui/gates?repo=acme/other":                      403,
		"/ui/audit?repo=acme/other":                      403,
		"/ui/stream/executions?repo=acme/other":          403,
		"/ui/stream/executions/x-acme-other":             404,
		"/ui/gates?gates_before=" + otherGates[0].Cursor: 400,
	} {
		if status, body := ts.page(t, path, tokenOf["runner"]); status != want {
			t.Errorf("runner's page %s: %d, want %d: %.200s", path, status, want, body)
		}
	}
	if _, body := ts.page(t, "/", tokenOf["runner"]); strings.Contains(body, "x-acme-other") {
		t.Error("the runner's executions list shows acme/other's execution")
	}
	if _, body := ts.page(t, "/ui/gates", tokenOf["runner"]); strings.Contains(body, "acme/other") {
		t.Error("the runner's gates page shows acme/other's gate")
	}
}
