package server

import (
	"context"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// GET /executions/{id}/gates over HTTP: the runner that planned, and a viewer, read the plan's
// gates; a caller limited to another repository gets the 404 of an unknown execution, and no
// token gets nothing.
func TestExecutionGatesOverHTTP(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	init := map[string]any{"execution_id": "p1", "environment": "prod", "op": "plan", "pr": 3, "sha": "s", "stacks": []string{"stacks/a", "stacks/b"}}
	if code, body, _ := ts.call(t, "runner", "POST", "/events/init", init); code != 200 {
		t.Fatalf("init: %d %v", code, body)
	}
	fin := map[string]any{"execution_id": "p1", "status": "succeeded", "stacks": []map[string]any{
		{"stack": "stacks/a", "status": "succeeded", "class": "destructive", "plan_hash": "v1:a"},
		{"stack": "stacks/b", "status": "succeeded", "class": "mutating", "plan_hash": "v1:b"}}}
	if code, body, _ := ts.call(t, "runner", "POST", "/events/finalize", fin); code != 200 {
		t.Fatalf("finalize: %d %v", code, body)
	}
	for _, role := range []string{"runner", "viewer"} {
		code, body, _ := ts.call(t, role, "GET", "/executions/p1/gates", nil)
		if code != 200 || body["policy"] != true || body["pr"] != float64(3) {
			t.Fatalf("%s: %d %v", role, code, body)
		}
		gates, _ := body["gates"].([]any)
		if len(gates) != 1 {
			t.Fatalf("%s: gates %v, want prod's destructive gate", role, body["gates"])
		}
		g := gates[0].(map[string]any)
		if g["class"] != "destructive" || g["target"] != "**" || g["satisfied"] != nil {
			t.Fatalf("%s: gate %v", role, g)
		}
	}
	ctx := context.Background()
	other := service.Caller{Name: "elsewhere", Repositories: []string{"acme/other"}}
	if _, err := ts.svc.Init(ctx, other, &api.Init{ExecutionID: "theirs", Environment: "prod", Op: "plan", PR: 3, SHA: "s", Stacks: []string{"stacks/a"}}); err != nil {
		t.Fatal(err)
	}
	codeKnown, known, _ := ts.call(t, "runner", "GET", "/executions/theirs/gates", nil)
	codeUnknown, unknown, _ := ts.call(t, "runner", "GET", "/executions/nope/gates", nil)
	if codeKnown != 404 || codeUnknown != 404 || known["code"] != unknown["code"] {
		t.Fatalf("another repository's execution: %d %v; an unknown one: %d %v", codeKnown, known, codeUnknown, unknown)
	}
	if code, _, _ := ts.call(t, "", "GET", "/executions/p1/gates", nil); code != 401 {
		t.Fatalf("without a token: %d, want 401", code)
	}
}
