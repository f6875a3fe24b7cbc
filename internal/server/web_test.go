package server

import (
	"bufio"
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tfstackplan/tfstackplan/internal/server/store/postgres"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// read GETs path with token as the bearer token (none when empty).
func (ts *testServer) read(t *testing.T, path string, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", ts.URL+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return ts.do(t, req)
}

// do sends req and returns the status and body of the answer.
func (ts *testServer) do(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// page reads a page, signed in with token through the sign-in form (once per token and
// server) unless token is empty.
func (ts *testServer) page(t *testing.T, path string, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", ts.URL+path, nil)
	if token != "" {
		req.AddCookie(ts.session(t, token))
	}
	return ts.do(t, req)
}

// seed posts an execution with two dependent stacks, a destructive plan, logs and a gap.
func (ts *testServer) seed(t *testing.T) {
	t.Helper()
	for _, step := range []struct {
		path string
		body map[string]any
	}{
		{"/events/init", map[string]any{"execution_id": "web-1", "environment": "prod", "op": "plan", "pr": 12, "sha": "0123456789abcdef",
			"stacks": []string{"net", "app"}, "edges": []map[string]string{{"from": "net", "to": "app"}},
			"reasons": []map[string]string{{"stack": "app", "kind": "watched-file", "detail": "app/main.tf"}}}},
		{"/events/update", map[string]any{"execution_id": "web-1", "stack": "net", "seq": 1, "status": "succeeded", "class": "destructive",
			"counts": map[string]int{"delete": 2}, "destructive": []string{"aws_vpc.main"}, "plan_hash": "feedface"}},
		{"/events/log", map[string]any{"execution_id": "web-1", "stack": "net", "generation": 1, "offset": 0, "data": b64("net says <b>hi</b>\n")}},
		{"/events/log", map[string]any{"execution_id": "web-1", "stack": "net", "generation": 1, "offset": 19, "gap_length": 100}},
	} {
		if status, out, _ := ts.call(t, "runner", "POST", step.path, step.body); status != 200 {
			t.Fatalf("%s: %d %v", step.path, status, out)
		}
	}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestWebPages(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	ts.seed(t)
	status, body := ts.page(t, "/", "")
	if status != 401 || !strings.Contains(body, `name="token"`) {
		t.Fatalf("anonymous page: %d %s", status, body)
	}
	viewer := tokenOf["viewer"]
	for path, wants := range map[string][]string{
		"/":                     {"web-1", "#12", ">running<"},
		"/ui/executions/web-1":  {"net", "app", "aws_vpc.main", "lost bytes 19–119", "watched-file: app/main.tf", `class="graph"`},
		"/ui/claims":            {"No claims."},
		"/ui/gates":             {"No gates required.", "No grants."},
		"/ui/audit":             {"Nothing audited yet."},
		"/?environment=prod":    {"web-1"},
		"/?environment=staging": {"No executions yet."},
	} {
		status, body := ts.page(t, path, viewer)
		if status != 200 {
			t.Fatalf("%s: %d %s", path, status, body)
		}
		for _, w := range wants {
			if !strings.Contains(body, w) {
				t.Errorf("%s lacks %q", path, w)
			}
		}
		if !strings.Contains(body, `name="viewport"`) {
			t.Errorf("%s has no viewport meta (phones)", path)
		}
	}
	// A session authenticates page reads only: never a state change, nor the API.
	req, _ := http.NewRequest("POST", ts.URL+BasePath+"/claims/release", strings.NewReader(`{"environment":"prod","pr":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.AddCookie(ts.session(t, tokenOf["admin"]))
	if resp, err := ts.Client().Do(req); err != nil || resp.StatusCode != 401 {
		t.Fatalf("POST with only a session cookie: %v %v", resp, err)
	}
	req, _ = http.NewRequest("GET", ts.URL+BasePath+"/claims", nil)
	req.AddCookie(ts.session(t, tokenOf["admin"]))
	if resp, err := ts.Client().Do(req); err != nil || resp.StatusCode != 401 {
		t.Fatalf("API read with only a session cookie: %v %v", resp, err)
	}
	if status, _ := ts.page(t, "/ui/executions/nope", viewer); status != 404 {
		t.Fatalf("unknown execution page: %d", status)
	}

}

// TestRateLimitedPagesAnswer429: a rate-limited page or stream is answered 429 with
// Retry-After, as the API is, not with the sign-in form.
func TestRateLimitedPagesAnswer429(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), func(c *Config) { c.RateLimit, c.Burst = 0.001, 2 })
	for i := range 2 {
		if status, body := ts.page(t, "/ui/claims", tokenOf["viewer"]); status != 200 {
			t.Fatalf("page %d: %d %s", i, status, body)
		}
	}
	for _, accept := range []string{"text/html", "text/event-stream"} {
		req, _ := http.NewRequest("GET", ts.URL+"/ui/stream/executions", nil)
		req.AddCookie(ts.session(t, tokenOf["viewer"]))
		req.Header.Set("Accept", accept)
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || strings.Contains(string(body), `name="token"`) {
			t.Fatalf("rate-limited %s: %d %v %s", accept, resp.StatusCode, resp.Header, body)
		}
	}
}

func TestWebStreamSendsStateAndLogs(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	ts.seed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/ui/stream/executions/web-1", nil)
	req.Header.Set("Authorization", "Bearer "+tokenOf["viewer"])
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("content type %q", resp.Header.Get("Content-Type"))
	}
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	waitFor := func(what string) {
		t.Helper()
		for lines.Scan() {
			if strings.Contains(lines.Text(), what) {
				return
			}
		}
		t.Fatalf("stream ended before %q: %v", what, lines.Err())
	}
	waitFor("event: state")
	waitFor(`net says \u003cb\u003ehi\u003c/b\u003e`)
	waitFor(`"gap":100`)
	if status, out, _ := ts.call(t, "runner", "POST", "/events/log", map[string]any{"execution_id": "web-1", "stack": "app", "generation": 1, "offset": 0, "data": b64("app is live\n")}); status != 200 {
		t.Fatalf("log: %d %v", status, out)
	}
	waitFor("app is live")
	if status, out, _ := ts.call(t, "runner", "POST", "/events/log", map[string]any{"execution_id": "web-1", "stack": "app", "generation": 2, "offset": 0, "data": b64("rewritten\n")}); status != 200 {
		t.Fatalf("log: %d %v", status, out)
	}
	waitFor(`"text":"rewritten\n","reset":true`)
}

// TestBrowserLiveUpdates drives real headless Chromium: the execution page updates from
// events and log chunks posted after it loaded, without a reload.
func TestBrowserLiveUpdates(t *testing.T) {
	chromium := os.Getenv("TFSTACKPLAN_TEST_CHROMIUM")
	if chromium == "" {
		t.Skip("TFSTACKPLAN_TEST_CHROMIUM is unset: set it to a chromium binary (scripts/test.sh installs Debian's chromium and sets it) to run the browser test")
	}
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	ts.seed(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true), chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true), chromedp.NoFirstRun, chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(390, 844), // a phone
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelCtx := chromedp.NewContext(alloc)
	defer cancelCtx()
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()

	// Sign in through the login form, then open the execution page.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(ts.URL+"/ui/executions/web-1"),
		chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), tokenOf["viewer"]),
		chromedp.Submit(chromedp.CSS(`input[name="token"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#live.on`)),
	); err != nil {
		t.Fatalf("open page: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__notReloaded = true`)); err != nil {
		t.Fatal(err)
	}
	waitTrue := func(what, js string) {
		t.Helper()
		ok, err := chromedp.Run(ctx, chromedp.Poll[bool](js, chromedp.WithPollingTimeout(30*time.Second)))
		if err != nil || !ok {
			text, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("main")))
			t.Fatalf("%s: %v (page: %.600s)", what, err, text)
		}
	}
	waitTrue("seeded log shown", `document.querySelector('pre[data-stack="net"]').textContent.includes("net says <b>hi</b>")`)

	for _, step := range []struct {
		path string
		body map[string]any
	}{
		{"/events/phase", map[string]any{"execution_id": "web-1", "stack": "app", "phase": "plan", "seq": 5}},
		{"/events/log", map[string]any{"execution_id": "web-1", "stack": "app", "generation": 1, "offset": 0, "data": b64("Plan: 3 to add\n")}},
		{"/events/log", map[string]any{"execution_id": "web-1", "stack": "app", "generation": 1, "offset": 15, "data": b64("done\n")}},
		{"/events/update", map[string]any{"execution_id": "web-1", "stack": "app", "seq": 2, "status": "succeeded", "class": "additive", "counts": map[string]int{"create": 3}}},
		{"/events/finalize", map[string]any{"execution_id": "web-1", "status": "succeeded"}},
	} {
		if status, out, _ := ts.call(t, "runner", "POST", step.path, step.body); status != 200 {
			t.Fatalf("%s: %d %v", step.path, status, out)
		}
	}
	waitTrue("live log lines", `document.querySelector('pre[data-stack="app"]').textContent === "Plan: 3 to add\ndone\n"`)
	waitTrue("live status table", `document.querySelector('#state').textContent.includes("additive") && document.querySelector('#state').textContent.includes("+3")`)
	waitTrue("live execution status", `document.querySelector('#exec-status').textContent.trim().startsWith("succeeded")`)
	waitTrue("no reload happened", `window.__notReloaded === true`)

	// Signing out ends the session: the browser is back at the sign-in form, and the page it
	// had open asks for a token again.
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`form.signout button`)),
		chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
		chromedp.Navigate(ts.URL+"/ui/executions/web-1"),
		chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
	); err != nil {
		t.Fatalf("sign out: %v", err)
	}
}

// TestReplicasShareLivePages runs two servers on one PostgreSQL schema: a page stream open on
// one replica receives a log chunk posted to the other.
func TestReplicasShareLivePages(t *testing.T) {
	u, channel := storetest.PostgresURL(t)
	open := func() *testServer {
		s, err := postgres.Open(context.Background(), u, postgres.Options{Channel: channel})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return newTestServer(t, s, nil)
	}
	a, b := open(), open()
	a.seed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", b.URL+"/ui/stream/executions/web-1", nil)
	req.Header.Set("Authorization", "Bearer "+tokenOf["viewer"])
	resp, err := b.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	for lines.Scan() && !strings.Contains(lines.Text(), "net says") {
	}
	if status, out, _ := a.call(t, "runner", "POST", "/events/log", map[string]any{"execution_id": "web-1", "stack": "app", "generation": 1, "offset": 0, "data": b64("posted to replica a\n")}); status != 200 {
		t.Fatalf("log to a: %d %v", status, out)
	}
	for lines.Scan() {
		if strings.Contains(lines.Text(), "posted to replica a") {
			return
		}
	}
	t.Fatalf("replica b's stream never showed replica a's chunk: %v", lines.Err())
}
