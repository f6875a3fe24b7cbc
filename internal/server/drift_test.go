package server

import (
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// TestDriftEndpoint: GET /drift lists what a drift execution's Finalize recorded; a value of the
// wrong type or out of range is 400 naming the field.
func TestDriftEndpoint(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	status, out, _ := ts.call(t, "runner", "POST", "/events/init", map[string]any{
		"execution_id": "d1", "environment": "prod", "op": "drift", "repo": "acme/infra", "stacks": []string{"a", "b"}})
	if status != 200 {
		t.Fatalf("init: %d %v", status, out)
	}
	status, out, _ = ts.call(t, "runner", "POST", "/events/finalize", map[string]any{"execution_id": "d1", "status": "succeeded",
		"stacks": []map[string]any{{"stack": "a", "status": "succeeded", "class": "no-changes", "drifted": true}, {"stack": "b", "status": "succeeded", "class": "no-changes"}}})
	if status != 200 {
		t.Fatalf("finalize: %d %v", status, out)
	}
	status, out, _ = ts.call(t, "viewer", "GET", "/drift?repo=acme/infra&environment=prod", nil)
	list, _ := out["list"].([]any)
	if status != 200 || len(list) != 2 {
		t.Fatalf("GET /drift: %d %v, want the two stacks", status, out)
	}
	if a := list[0].(map[string]any); a["stack"] != "a" || a["drifted"] != true || a["execution_id"] != "d1" {
		t.Fatalf("stack a: %v", a)
	}
	if b := list[1].(map[string]any); b["drifted"] != false {
		t.Fatalf("stack b: %v, want drifted false (shown, not left out)", b)
	}
	for _, c := range []struct{ query, field string }{
		{"environment=prod&limit=abc", "limit"},
		{"environment=prod&stack=a&limit=0", "limit"},
		{"repo=acme/infra", "environment"},
		{"repo=not-a-repo&environment=prod", "repo"},
		{"repo=acme/infra&environment=prod&stack=/abs", "stack"},
	} {
		status, out, _ := ts.call(t, "viewer", "GET", "/drift?"+c.query, nil)
		if msg, _ := out["message"].(string); status != 400 || !strings.Contains(msg, c.field) {
			t.Errorf("GET /drift?%s: %d %v, want 400 naming %s", c.query, status, out, c.field)
		}
	}
}

// otherRepoToken reads only another repository than the tests' executions'.
const otherRepoToken = "other-repo-viewer-secret-0123456789"

// newDriftServer is a test server whose tokens also hold a viewer of another repository.
func newDriftServer(t *testing.T) *testServer {
	return newTestServer(t, storetest.OpenSQLite(t), func(c *Config) {
		a := &auth.Authenticator{}
		if err := a.ParseTokens("tokens.hcl", []byte(testTokens+`
token "other" {
  secret       = "`+otherRepoToken+`"
  repositories = ["evil/other"]
  roles        = ["viewer"]
}
`)); err != nil {
			t.Fatal(err)
		}
		c.Auth = a
	})
}

// driftRun posts drift execution id of acme/infra's prod, finalized with stacks.
func driftRun(t *testing.T, ts *testServer, id string, stacks ...map[string]any) {
	t.Helper()
	var names []string
	for _, s := range stacks {
		names = append(names, s["stack"].(string))
	}
	for _, step := range []struct {
		path string
		body map[string]any
	}{
		{"/events/init", map[string]any{"execution_id": id, "environment": "prod", "op": "drift", "repo": "acme/infra", "stacks": names}},
		{"/events/finalize", map[string]any{"execution_id": id, "status": "succeeded", "stacks": stacks}},
	} {
		if status, out, _ := ts.call(t, "runner", "POST", step.path, step.body); status != 200 {
			t.Fatalf("%s: %d %v", step.path, status, out)
		}
	}
}

// TestDriftPage: /ui/drift lists the environment's stacks with their last check, drifted first,
// each linking to its execution and its history; a stack's name is shown as text, never as
// markup; another repository's reader sees none of it; without an environment the page asks for
// one; a bad stack is 400.
func TestDriftPage(t *testing.T) {
	ts := newDriftServer(t)
	driftRun(t, ts, "drift-1",
		map[string]any{"stack": "stacks/a", "status": "succeeded", "class": "no-changes"},
		map[string]any{"stack": "stacks/<b>z</b>", "status": "succeeded", "class": "mutating", "counts": map[string]any{"update": 2}},
		map[string]any{"stack": "stacks/c", "status": "failed", "class": "unclassified"},
	)
	status, body := ts.page(t, "/ui/drift?repo=acme/infra&environment=prod", tokenOf["viewer"])
	if status != 200 {
		t.Fatalf("drift page: %d %s", status, body)
	}
	for _, want := range []string{"1 of 3 stacks drifted", `href="/ui/executions/drift-1"`, "~2", ">drifted<", ">not checked<",
		"stacks/&lt;b&gt;z&lt;/b&gt;", `href="/ui/drift?repo=acme%2finfra&amp;environment=prod&amp;stack=stacks%2f%3cb%3ez%3c%2fb%3e"`} {
		if !strings.Contains(body, want) {
			t.Errorf("drift page lacks %q", want)
		}
	}
	if strings.Contains(body, "<b>z</b>") {
		t.Error("a stack's name was rendered as markup")
	}
	if i, j := strings.Index(body, "z&lt;/b&gt;"), strings.Index(body, ">stacks/a<"); i < 0 || j < 0 || i > j {
		t.Errorf("the drifted stack is not listed first (%d, %d)", i, j)
	}

	if status, body := ts.page(t, "/ui/executions/drift-1", tokenOf["viewer"]); status != 200 || !strings.Contains(body, `href="/ui/drift?repo=acme%2finfra&amp;environment=prod"`) || strings.Contains(body, "Approve") {
		t.Errorf("a drift execution's page: %d, want it shown as a drift with nothing to approve", status)
	}

	driftRun(t, ts, "drift-2", map[string]any{"stack": "stacks/<b>z</b>", "status": "succeeded", "class": "no-changes"})
	status, body = ts.page(t, "/ui/drift?repo=acme/infra&environment=prod&stack="+"stacks/%3Cb%3Ez%3C/b%3E", tokenOf["viewer"])
	if status != 200 || !strings.Contains(body, "drift-1") || !strings.Contains(body, "drift-2") || strings.Index(body, "drift-2") > strings.Index(body, "drift-1") {
		t.Fatalf("a stack's history, newest first: %d %s", status, body)
	}

	if status, body := ts.page(t, "/ui/drift?environment=prod", otherRepoToken); status != 200 || strings.Contains(body, "stacks/a") || !strings.Contains(body, "0 of 0 stacks") {
		t.Errorf("another repository's reader: %d, listed acme/infra's drift: %s", status, body)
	}
	if status, _ := ts.page(t, "/ui/drift?repo=acme/infra&environment=prod", otherRepoToken); status != 403 {
		t.Errorf("another repository's reader naming acme/infra: %d, want 403", status)
	}
	if status, body := ts.page(t, "/ui/drift", tokenOf["viewer"]); status != 200 || !strings.Contains(body, `name="environment"`) || strings.Contains(body, "<table>") {
		t.Errorf("no environment: %d, want the form alone", status)
	}
	if status, body := ts.page(t, "/ui/drift?environment=prod&repo=acme/infra&stack=../x", tokenOf["viewer"]); status != 400 || !strings.Contains(body, "stack") {
		t.Errorf("a bad stack: %d %s, want 400 naming the stack", status, body)
	}
	if status, _ := ts.page(t, "/ui/drift?environment=prod", ""); status != 401 {
		t.Errorf("anonymous: %d, want 401", status)
	}
}
