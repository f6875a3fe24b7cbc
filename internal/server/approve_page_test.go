package server

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// The plan the approval tests review: PR 7 in prod, a destructive stack (gated by the test
// policy's rule on **) and an additive one (not gated).
const (
	approvePR     = 7
	gatedStack    = "stacks/prod/db"
	ungatedStack  = "stacks/prod/app"
	firstPlanHash = "v1:9f2c4e1a07b3d8c6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2"
)

// seedReviewPlan has the runner post a finalized plan id of PR 7 in prod whose gated stack has
// content hash hash.
func (ts *testServer) seedReviewPlan(t *testing.T, id, hash string) {
	t.Helper()
	for _, step := range []struct {
		path string
		body map[string]any
	}{
		{"/events/init", map[string]any{"execution_id": id, "environment": "prod", "op": "plan", "pr": approvePR, "sha": "5ca1ab1e" + id,
			"stacks": []string{gatedStack, ungatedStack}, "edges": []map[string]string{{"from": gatedStack, "to": ungatedStack}}}},
		{"/events/phase", map[string]any{"execution_id": id, "stack": gatedStack, "phase": "plan", "seq": 1, "at": "2026-01-02T03:04:00Z"}},
		{"/events/phase", map[string]any{"execution_id": id, "stack": gatedStack, "phase": "plan", "status": "succeeded", "seq": 2, "at": "2026-01-02T03:04:41Z"}},
		{"/events/update", map[string]any{"execution_id": id, "stack": gatedStack, "seq": 3, "status": "succeeded", "class": "destructive", "plan_hash": hash,
			"counts": map[string]int{"delete": 1}, "destructive": []string{"aws_db_instance.main"}}},
		{"/events/update", map[string]any{"execution_id": id, "stack": ungatedStack, "seq": 1, "status": "succeeded", "class": "additive", "plan_hash": "v1:app",
			"counts": map[string]int{"create": 2}}},
		{"/events/finalize", map[string]any{"execution_id": id, "status": "succeeded"}},
	} {
		if status, out, _ := ts.call(t, "runner", "POST", step.path, step.body); status != 200 {
			t.Fatalf("%s: %d %v", step.path, status, out)
		}
	}
}

// submit posts a form of a page as a browser of this site would, with cookie, and returns the
// answer's status, Location and body.
func (ts *testServer) submit(t *testing.T, path string, form url.Values, cookie *http.Cookie) (int, string, string) {
	t.Helper()
	return ts.submitFrom(t, "same-origin", ts.URL, path, form, cookie)
}

// submitFrom posts a form as a browser would from a page of site (Sec-Fetch-Site) and origin.
func (ts *testServer) submitFrom(t *testing.T, site, origin, path string, form url.Values, cookie *http.Cookie) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", ts.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", site)
	req.Header.Set("Origin", origin)
	if cookie != nil {
		req.AddCookie(cookie)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(b)
}

var (
	formOf  = regexp.MustCompile(`(?s)<form class="(approve|revoke)" method="post" action="([^"]+)">(.*?)</form>`)
	fieldOf = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
)

// pageForm returns the action and the hidden fields of the first form of class kind in body
// (ok false when there is none).
func pageForm(body, kind string) (action string, fields url.Values, ok bool) {
	for _, m := range formOf.FindAllStringSubmatch(body, -1) {
		if m[1] != kind {
			continue
		}
		fields = url.Values{}
		for _, f := range fieldOf.FindAllStringSubmatch(m[3], -1) {
			fields.Add(html.UnescapeString(f[1]), html.UnescapeString(f[2]))
		}
		return html.UnescapeString(m[2]), fields, true
	}
	return "", nil, false
}

// gateCheck asks, as the apply's runner, whether apply may apply PR 7's plan whose gated stack
// has content hash hash; it returns the status.
func (ts *testServer) gateCheck(t *testing.T, apply, hash string) (int, map[string]any) {
	t.Helper()
	status, out, _ := ts.call(t, "runner", "POST", "/gates/check", map[string]any{"execution_id": apply, "environment": "prod", "pr": approvePR, "sha": "5ca1ab1e",
		"stacks": []map[string]any{{"stack": gatedStack, "plan_hash": hash, "class": "destructive"}, {"stack": ungatedStack, "plan_hash": "v1:app", "class": "additive"}}})
	return status, out
}

// TestApproveFromThePlanPage: the plan's page shows the gate with its stacks, changes and
// content hashes to everyone who may read it; only an admin's session gets the Approve form,
// which approves exactly the plan shown (the apply's gate check is then allowed), is audited,
// and is refused without its anti-forgery token, without a reason, with other hashes, or from a
// viewer. Revoking from the page ends the grant.
func TestApproveFromThePlanPage(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	ts.seedReviewPlan(t, "plan-1", firstPlanHash)
	page := "/ui/executions/plan-1"

	status, body := ts.page(t, page, tokenOf["viewer"])
	if status != 200 {
		t.Fatalf("viewer's page: %d %s", status, body)
	}
	for _, want := range []string{`id="approvals"`, "destructive</span> on <code>**</code>", "not approved", gatedStack, firstPlanHash, "aws_db_instance.main", "-1"} {
		if !strings.Contains(body, want) {
			t.Errorf("the viewer's page lacks %q", want)
		}
	}
	if _, _, ok := pageForm(body, "approve"); ok || strings.Contains(body, "/approve") {
		t.Error("a viewer's page has an Approve form")
	}
	// The ungated stack is no part of the gate.
	if i := strings.Index(body, `id="approvals"`); strings.Contains(body[i:i+strings.Index(body[i:], "</section>")], ungatedStack) {
		t.Error("the gate lists a stack it does not cover")
	}
	if status, _ := ts.gateCheck(t, "apply-1", firstPlanHash); status != 403 {
		t.Fatalf("gate check before the approval: %d, want 403", status)
	}

	admin := ts.session(t, tokenOf["admin"])
	_, body = ts.page(t, page, tokenOf["admin"])
	action, form, ok := pageForm(body, "approve")
	if !ok {
		t.Fatalf("the admin's page has no Approve form:\n%s", body)
	}
	// The form's content is the digest of the gate's stacks with the hashes the page shows.
	digest := sha256.Sum256([]byte(gatedStack + "\x00" + firstPlanHash + "\n"))
	if action != page+"/approve" || form.Get("execution_id") != "plan-1" || form.Get("class") != "destructive" || form.Get("target") != "**" ||
		form.Get("content") != "sha256:"+hex.EncodeToString(digest[:]) || form.Get("csrf") == "" {
		t.Fatalf("the Approve form: %s %v", action, form)
	}
	refused := func(what string, f url.Values, cookie *http.Cookie, wantStatus int, wantText string) {
		t.Helper()
		status, _, body := ts.submit(t, action, f, cookie)
		if status != wantStatus || !strings.Contains(html.UnescapeString(body), wantText) {
			t.Errorf("%s: %d, want %d with %q: %.400s", what, status, wantStatus, wantText, body)
		}
	}
	with := func(k, v string) url.Values {
		f := url.Values{}
		for key, vs := range form {
			f[key] = append([]string(nil), vs...)
		}
		f.Set("reason", "reviewed the deletion")
		if k != "" {
			f.Set(k, v)
		}
		return f
	}
	refused("no anti-forgery token", with("csrf", ""), admin, 403, "this form expired")
	refused("no session", with("", ""), nil, 401, `name="token"`)
	if status, _, body := ts.submitFrom(t, "cross-site", "https://evil.example", action, with("", ""), admin); status != 403 || !strings.Contains(body, "another site") {
		t.Errorf("a form from another site: %d %.200s", status, body)
	}
	refused("no reason", with("reason", " "), admin, 400, "reason is required")
	refused("other content", with("content", "sha256:00"), admin, 409, "differ from what the page showed")
	refused("no content", with("content", ""), admin, 409, "differ from what the page showed")
	refused("another execution", with("execution_id", "plan-0"), admin, 400, "not this page's")
	refused("another gate", with("class", "mutating"), admin, 412, "requires no gate")
	viewerForm := with("", "")
	viewerForm.Set("csrf", signOutToken(t, func() string { _, b := ts.page(t, page, tokenOf["viewer"]); return b }()))
	refused("a viewer", viewerForm, ts.session(t, tokenOf["viewer"]), 403, "admin action")
	if status, _ := ts.gateCheck(t, "apply-1", firstPlanHash); status != 403 {
		t.Fatalf("gate check after refused approvals: %d, want 403", status)
	}

	status, where, body := ts.submit(t, action, with("", ""), admin)
	if status != http.StatusSeeOther || where != page+"#approvals" {
		t.Fatalf("approve: %d %q %.300s", status, where, body)
	}
	_, body = ts.page(t, page, tokenOf["admin"])
	if !strings.Contains(body, `<span class="yes">satisfied</span>`) || !strings.Contains(body, "by alice") || !strings.Contains(body, "reviewed the deletion") {
		t.Fatalf("the page after approving:\n%s", body)
	}
	if _, _, ok := pageForm(body, "approve"); ok {
		t.Error("a satisfied gate still offers the Approve form")
	}
	if status, out := ts.gateCheck(t, "apply-1", firstPlanHash); status != 200 {
		t.Fatalf("gate check after approving from the page: %d %v", status, out)
	}
	if _, body := ts.page(t, "/ui/audit", tokenOf["admin"]); !strings.Contains(body, "gates.satisfy") || !strings.Contains(body, "plan plan-1") {
		t.Errorf("the approval is not audited:\n%s", body)
	}

	// Revoking ends the grant: the gate is no longer approved.
	action, form, ok = pageForm(body2(t, ts, page), "revoke")
	if !ok || action != page+"/revoke" {
		t.Fatalf("no Revoke form: %q %v", action, form)
	}
	form.Set("reason", "")
	if status, _, body := ts.submit(t, action, form, admin); status != 400 || !strings.Contains(body, "reason is required") {
		t.Errorf("revoke without a reason: %d %.300s", status, body)
	}
	form.Set("reason", "changed my mind")
	if status, where, _ := ts.submit(t, action, form, admin); status != http.StatusSeeOther || where != page+"#approvals" {
		t.Fatalf("revoke: %d %q", status, where)
	}
	if _, body := ts.page(t, page, tokenOf["viewer"]); !strings.Contains(body, "not approved") || strings.Contains(body, "Grant #") {
		t.Errorf("the page after revoking:\n%s", body)
	}
	if _, body := ts.page(t, "/ui/audit", tokenOf["admin"]); !strings.Contains(body, "grants.release") || !strings.Contains(body, "changed my mind") {
		t.Error("the revoke is not audited")
	}
}

// body2 reads page as the admin.
func body2(t *testing.T, ts *testServer, page string) string {
	t.Helper()
	_, body := ts.page(t, page, tokenOf["admin"])
	return body
}

// TestStaleApprovePageIsRefused: a page loaded before a newer plan arrived approves nothing: its
// form is refused with a message naming the newer plan, no grant is made, and the old plan's
// page says which plan to review instead and offers no form.
func TestStaleApprovePageIsRefused(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	ts.seedReviewPlan(t, "plan-1", firstPlanHash)
	admin := ts.session(t, tokenOf["admin"])
	action, form, ok := pageForm(body2(t, ts, "/ui/executions/plan-1"), "approve")
	if !ok {
		t.Fatal("no Approve form")
	}
	newer := "v1:" + strings.Repeat("2", 64)
	ts.seedReviewPlan(t, "plan-2", newer)
	form.Set("reason", "looks fine")
	status, _, body := ts.submit(t, action, form, admin)
	if status != 409 || !strings.Contains(body, "Not approved") || !strings.Contains(body, "newer plan") || !strings.Contains(body, "plan-2") ||
		!strings.Contains(body, `id="notice"`) {
		t.Fatalf("stale approve: %d\n%s", status, body)
	}
	if _, body := ts.page(t, "/ui/gates", tokenOf["admin"]); strings.Contains(body, "looks fine") {
		t.Fatal("a stale page made a grant")
	}
	if status, _ := ts.gateCheck(t, "apply-1", newer); status != 403 {
		t.Fatalf("gate check of the newer plan: %d, want 403", status)
	}
	old := body2(t, ts, "/ui/executions/plan-1")
	if _, _, ok := pageForm(old, "approve"); ok || !strings.Contains(old, `<a href="/ui/executions/plan-2">plan-2</a> is`) {
		t.Fatalf("the old plan's page:\n%s", old)
	}
}

// TestGatesPageShowsPlansAndApplies: the gates page links each gate to its plan, shows a gate
// whose plan was applied as satisfied (the apply's end released its grant), and each grant's
// approved plan and the apply that used it.
func TestGatesPageShowsPlansAndApplies(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	ts.seedReviewPlan(t, "plan-1", firstPlanHash)
	if status, out, _ := ts.call(t, "admin", "POST", "/admin/gates/satisfy", map[string]any{"pr": approvePR, "environment": "prod", "class": "destructive",
		"target": "**", "reason": "ok", "execution_id": "plan-1"}); status != 200 {
		t.Fatalf("satisfy: %d %v", status, out)
	}
	if status, out := ts.gateCheck(t, "apply-9", firstPlanHash); status != 200 {
		t.Fatalf("gate check: %d %v", status, out)
	}
	if status, out, _ := ts.call(t, "runner", "POST", "/gates/revoke", map[string]any{"execution_id": "apply-9", "outcome": "succeeded"}); status != 200 {
		t.Fatalf("revoke: %d %v", status, out)
	}
	_, body := ts.page(t, "/ui/gates", tokenOf["viewer"])
	for _, want := range []string{
		`<a href="/ui/executions/plan-1#approvals">plan-1</a>`,
		`<span class="yes">yes, applied</span> by <a href="/ui/executions/apply-9">apply-9</a> (succeeded)`,
		`<td><a href="/ui/executions/apply-9">apply-9</a> (succeeded)</td>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the gates page lacks %s", want)
		}
	}
	if strings.Contains(body, `<span class="no">no</span>`) {
		t.Errorf("the applied gate shows as not satisfied:\n%s", body)
	}
}

// TestExecutionPageGraphAndBadge: the stack graph is SVG drawn on the server with an arrow per
// dependency, each stack shows how long it ran, and the live badge shows only while the
// execution runs.
func TestExecutionPageGraphAndBadge(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	ts.seed(t) // web-1: running
	_, body := ts.page(t, "/ui/executions/web-1", tokenOf["viewer"])
	if !strings.Contains(body, `<svg class="graph"`) || strings.Count(body, `<path class="edge"`) != 1 || !strings.Contains(body, "<title>net → app</title>") {
		t.Errorf("the running execution's graph:\n%s", body)
	}
	if !strings.Contains(body, `<span id="live" class="live">live</span>`) {
		t.Error("a running execution has no live badge")
	}
	ts.seedReviewPlan(t, "plan-1", firstPlanHash) // finished
	_, body = ts.page(t, "/ui/executions/plan-1", tokenOf["viewer"])
	if !strings.Contains(body, `<span id="live" class="live" hidden>live</span>`) {
		t.Error("a finished execution shows the live badge")
	}
	if !strings.Contains(body, "<td>41 s</td>") {
		t.Errorf("the stack's duration (41 s between its phases) is not shown:\n%s", body)
	}
}

// TestApproveALargeGate: a gate of 250 stacks lists the first 100 and says how many more it
// covers, and its Approve form (a digest of every stack's hash, not the list) is small and
// approves them all.
func TestApproveALargeGate(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	const n = 250
	var stacks []string
	var updates []map[string]any
	for i := range n {
		name := fmt.Sprintf("stacks/prod/s%03d", i)
		stacks = append(stacks, name)
		updates = append(updates, map[string]any{"execution_id": "big-plan", "stack": name, "seq": 1, "status": "succeeded", "class": "destructive",
			"plan_hash": fmt.Sprintf("v1:%064d", i), "counts": map[string]int{"delete": 1}})
	}
	for _, step := range []struct {
		path string
		body any
	}{
		{"/events/init", map[string]any{"execution_id": "big-plan", "environment": "prod", "op": "plan", "pr": approvePR, "sha": "abc", "stacks": stacks}},
		{"/events/updates", map[string]any{"updates": updates}},
		{"/events/finalize", map[string]any{"execution_id": "big-plan", "status": "succeeded"}},
	} {
		if status, out, _ := ts.call(t, "runner", "POST", step.path, step.body); status != 200 {
			t.Fatalf("%s: %d %v", step.path, status, out)
		}
	}
	body := body2(t, ts, "/ui/executions/big-plan")
	if !strings.Contains(body, "and 150 more stacks") || strings.Count(body, `<code class="hash">`) != 100 {
		t.Fatalf("the large gate's box:\n%.3000s", body)
	}
	action, form, ok := pageForm(body, "approve")
	if !ok || len(form.Encode()) > 1024 {
		t.Fatalf("the Approve form: %v (%d bytes)", form, len(form.Encode()))
	}
	form.Set("reason", "all of them")
	if status, _, body := ts.submit(t, action, form, ts.session(t, tokenOf["admin"])); status != http.StatusSeeOther {
		t.Fatalf("approve: %d %.300s", status, body)
	}
	if !strings.Contains(body2(t, ts, "/ui/executions/big-plan"), `<span class="yes">satisfied</span>`) {
		t.Error("the large gate is not satisfied after approving it")
	}
}

// TestLargeExecutionPageIsPaged: an execution of more stacks than a page lists shows them a
// page at a time with links to the others, and its graph summarized.
func TestLargeExecutionPageIsPaged(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	seedBigExecution(t, ts, 450)
	_, body := ts.page(t, "/ui/executions/big", tokenOf["viewer"])
	if !strings.Contains(body, "Stacks 1–200 of 450") || !strings.Contains(body, `<a href="?stacks=200">next stacks →</a>`) ||
		strings.Contains(body, "previous stacks") || !strings.Contains(body, `<g class="node band">`) || strings.Count(body, `<pre class="log"`) != 200 {
		t.Errorf("the first page of stacks:\n%.3000s", body)
	}
	_, body = ts.page(t, "/ui/executions/big?stacks=400", tokenOf["viewer"])
	if !strings.Contains(body, "Stacks 401–450 of 450") || !strings.Contains(body, `<a href="?stacks=200">← previous stacks</a>`) ||
		strings.Contains(body, "next stacks") || strings.Count(body, `<pre class="log"`) != 50 {
		t.Errorf("the last page of stacks:\n%.3000s", body)
	}
	// Durations of the listed stacks: 41 s between their phase events.
	if !strings.Contains(body, "<td>41 s</td>") {
		t.Error("the listed stacks show no duration")
	}
}

// bigStacks is the size of the execution BenchmarkExecutionPage renders: the most stacks one
// execution may have (service.MaxStacks).
const bigStacks = 10_000

// seedBigExecution has the runner post an execution "big" of n stacks, each but the first
// depending on the stack of half its number (a tree 14 columns deep), every stack with two
// timed phase events and a final state: most succeeded, some failed, the rest still running.
func seedBigExecution(tb testing.TB, ts *testServer, n int) {
	tb.Helper()
	name := func(i int) string { return fmt.Sprintf("stacks/env-%d/service-%05d", i%7, i) }
	stacks := make([]string, n)
	var edges []map[string]string
	for i := range n {
		stacks[i] = name(i)
		if i > 0 {
			edges = append(edges, map[string]string{"from": name(i / 2), "to": name(i)})
		}
	}
	post := func(path string, body any) {
		if status, out := ts.post(tb, "runner", path, body); status != 200 {
			tb.Fatalf("%s: %d %v", path, status, out)
		}
	}
	post("/events/init", map[string]any{"execution_id": "big", "environment": "prod", "op": "plan", "pr": 1, "sha": "0123456789abcdef",
		"stacks": stacks, "edges": edges})
	start := time.Now().Add(-time.Hour).UTC()
	for from := 0; from < n; from += 500 {
		var phases, updates []map[string]any
		for i := from; i < min(from+500, n); i++ {
			at := start.Add(time.Duration(i) * time.Second)
			phases = append(phases,
				map[string]any{"execution_id": "big", "stack": name(i), "phase": "plan", "seq": 1, "at": at.Format(time.RFC3339Nano)},
				map[string]any{"execution_id": "big", "stack": name(i), "phase": "plan", "status": "ok", "seq": 2, "at": at.Add(41 * time.Second).Format(time.RFC3339Nano)})
			status, class := "succeeded", "mutating"
			switch {
			case i%97 == 0:
				status, class = "failed", ""
			case i%13 == 0:
				status, class = "running", ""
			}
			updates = append(updates, map[string]any{"execution_id": "big", "stack": name(i), "seq": 3, "status": status, "class": class,
				"plan_hash": fmt.Sprintf("v1:%064d", i), "counts": map[string]int{"update": 1 + i%5}})
		}
		post("/events/phases", map[string]any{"phases": phases})
		post("/events/updates", map[string]any{"updates": updates})
	}
}

// post sends a JSON request as role and returns the status and body (call, for benchmarks too).
func (ts *testServer) post(tb testing.TB, role, path string, body any) (int, string) {
	tb.Helper()
	data, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", ts.URL+BasePath+path, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tokenOf[role])
	resp, err := ts.Client().Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}
