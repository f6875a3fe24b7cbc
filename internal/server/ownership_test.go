package server

import (
	"context"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// A runner ends only what its own execution took; the same requests as an admin go through.
func TestRunnersReleaseOnlyTheirOwnExecutionsClaims(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	ctx := context.Background()
	// PR 1's plan, announced over HTTP by the runner token (principal ci-runner); PR 2's plan
	// announced by another principal.
	plan := func(role, id string, pr int, stack string) {
		t.Helper()
		init := map[string]any{"execution_id": id, "environment": "prod", "op": "plan", "pr": pr, "sha": "s", "stacks": []string{stack}}
		if role == "" {
			if _, err := ts.svc.Init(ctx, "someone-else", &api.Init{ExecutionID: id, Environment: "prod", Op: "plan", PR: pr, SHA: "s", Stacks: []string{stack}}); err != nil {
				t.Fatal(err)
			}
		} else if code, body, _ := ts.call(t, role, "POST", "/events/init", init); code != 200 {
			t.Fatalf("init %s: %d %v", id, code, body)
		}
		fin := map[string]any{"execution_id": id, "status": "succeeded",
			"stacks": []map[string]any{{"stack": stack, "status": "succeeded", "class": "mutating", "plan_hash": "v1:" + stack}}}
		if code, body, _ := ts.call(t, "runner", "POST", "/events/finalize", fin); code != 200 {
			t.Fatalf("finalize %s: %d %v", id, code, body)
		}
	}
	plan("runner", "own", 1, "a")
	plan("", "theirs", 2, "b")
	for _, c := range []struct {
		role string
		body map[string]any
		want int
	}{
		{"runner", map[string]any{"environment": "prod", "pr": 2}, 403},
		{"runner", map[string]any{"environment": "prod", "pr": 2, "execution_id": "theirs"}, 403},
		{"runner", map[string]any{"environment": "prod", "pr": 1, "execution_id": "own"}, 200},
		{"admin", map[string]any{"environment": "prod", "pr": 2, "reason": "abandoned"}, 200},
	} {
		if code, body, _ := ts.call(t, c.role, "POST", "/claims/release", c.body); code != c.want {
			t.Errorf("%s releasing %v: %d %v, want %d", c.role, c.body, code, body, c.want)
		}
	}
	claims, err := ts.svc.Claims(ctx, "prod")
	if err != nil || len(claims) != 0 {
		t.Fatalf("claims left %+v %v", claims, err)
	}
	// A lease granted to the runner may be ended by an admin, not by a stranger's made-up id.
	check := map[string]any{"execution_id": "ap", "environment": "prod", "pr": 1, "sha": "merged",
		"stacks": []map[string]any{{"stack": "a", "plan_hash": "v1:a"}}}
	if code, body, _ := ts.call(t, "runner", "POST", "/gates/check", check); code != 200 {
		t.Fatalf("gate check: %d %v", code, body)
	}
	if code, body, _ := ts.call(t, "admin", "POST", "/gates/revoke", map[string]any{"execution_id": "ap", "outcome": "failed"}); code != 200 {
		t.Fatalf("admin revoke: %d %v", code, body)
	}
	if code, body, _ := ts.call(t, "runner", "POST", "/gates/check", check); code != 403 {
		t.Fatalf("check after the admin's revoke: %d %v", code, body)
	}
}
