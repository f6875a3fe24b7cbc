package server

import (
	"strings"
	"testing"

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
