package server

import (
	"context"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
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
			if _, err := ts.svc.Init(ctx, service.Caller{Name: "someone-else", Repositories: []string{testRepo}}, &api.Init{ExecutionID: id, Environment: "prod", Op: "plan", PR: pr, SHA: "s", Stacks: []string{stack}}); err != nil {
				t.Fatal(err)
			}
		} else if code, body, _ := ts.call(t, role, "POST", "/events/init", init); code != 200 {
			t.Fatalf("init %s: %d %v", id, code, body)
		}
		fin := map[string]any{"execution_id": id, "status": "succeeded",
			"stacks": []map[string]any{{"stack": stack, "status": "succeeded", "class": "mutating", "plan_hash": "v1:" + stack}}}
		if role == "" {
			role = "admin" // only its own runner, or an admin, finalizes someone else's execution
		}
		if code, body, _ := ts.call(t, role, "POST", "/events/finalize", fin); code != 200 {
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
	claims, err := ts.svc.Claims(ctx, service.Caller{Name: "test"}, testRepo, "prod")
	if err != nil || len(claims) != 0 {
		t.Fatalf("claims left %+v %v", claims, err)
	}
	// A lease granted to the runner may be ended by an admin, not by a stranger's made-up id.
	check := map[string]any{"execution_id": "ap", "environment": "prod", "pr": 1, "sha": "merged",
		"stacks": []map[string]any{{"stack": "a", "plan_hash": "v1:a", "class": "mutating"}}}
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

// Every runner event names its execution, and only the principal that announced it (or an
// admin) may send it: another runner's token is refused with 403 on each event path, singly and
// batched, and changes nothing, not even with a seq that would otherwise win.
func TestRunnerEventsOnlyForTheirOwnExecution(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ts := newTestServer(t, b.Open(t), nil)
			for _, c := range []struct{ role, id string }{{"runner", "mine"}, {"runner2", "theirs"}} {
				init := map[string]any{"execution_id": c.id, "environment": "prod", "op": "plan", "pr": 7, "sha": "s", "stacks": []string{"a"}}
				if code, body, _ := ts.call(t, c.role, "POST", "/events/init", init); code != 200 {
					t.Fatalf("init %s: %d %v", c.id, code, body)
				}
			}
			update := func(id string) map[string]any {
				return map[string]any{"execution_id": id, "stack": "a", "seq": 1 << 40, "status": "succeeded",
					"class": "no-changes", "plan_hash": "v1:forged"}
			}
			phase := func(id string) map[string]any {
				return map[string]any{"execution_id": id, "stack": "a", "seq": 1 << 40, "phase": "forged"}
			}
			chunk := func(id string) map[string]any {
				return map[string]any{"execution_id": id, "stack": "a", "offset": 0, "data": "Zm9yZ2VkCg=="}
			}
			finalize := func(id string) map[string]any {
				return map[string]any{"execution_id": id, "status": "succeeded",
					"stacks": []map[string]any{{"stack": "a", "status": "succeeded", "class": "no-changes", "plan_hash": "v1:forged"}}}
			}
			events := []struct {
				path string
				body func(id string) map[string]any
			}{
				{"/events/phase", phase},
				{"/events/phases", func(id string) map[string]any { return map[string]any{"phases": []any{phase(id)}} }},
				{"/events/update", update},
				{"/events/updates", func(id string) map[string]any { return map[string]any{"updates": []any{update(id)}} }},
				{"/events/log", chunk},
				{"/events/logs", func(id string) map[string]any { return map[string]any{"chunks": []any{chunk(id)}} }},
				{"/events/finalize", finalize},
			}
			for _, ev := range events {
				if code, body, _ := ts.call(t, "runner", "POST", ev.path, ev.body("theirs")); code != 403 || body["code"] != "PERMISSION_DENIED" {
					t.Errorf("runner on another principal's execution, %s: %d %v, want 403 PERMISSION_DENIED", ev.path, code, body)
				}
				if code, body, _ := ts.call(t, "runner", "POST", ev.path, ev.body("nobody-announced-this")); code != 404 {
					t.Errorf("runner on an unknown execution, %s: %d %v, want 404", ev.path, code, body)
				}
			}
			// The same id announced again: its owner's retry is acknowledged, another's refused.
			again := map[string]any{"execution_id": "theirs", "environment": "prod", "op": "plan", "pr": 7, "sha": "s", "stacks": []string{"a"}}
			if code, body, _ := ts.call(t, "runner", "POST", "/events/init", again); code != 403 || body["code"] != "PERMISSION_DENIED" {
				t.Errorf("another principal's Init of an announced id: %d %v, want 403", code, body)
			}
			if code, body, _ := ts.call(t, "runner2", "POST", "/events/init", again); code != 200 {
				t.Errorf("the owner's Init again: %d %v, want 200", code, body)
			}
			st := ts.stacksOf(t, "theirs")["a"]
			if st["status"] != "pending" || st["plan_hash"] != nil || st["class"] != nil || st["phase"] != nil {
				t.Errorf("another runner's refused events changed the stack: %v", st)
			}
			if code, body, _ := ts.call(t, "viewer", "GET", "/executions/theirs/log?stack=a", nil); (code != 200 && code != 404) || body["data"] != nil {
				t.Errorf("another runner's refused chunk is readable: %d %v", code, body)
			}
			if code, body, _ := ts.call(t, "viewer", "GET", "/executions/theirs", nil); code != 200 || body["status"] != "running" {
				t.Errorf("another runner's refused finalize ended the execution: %d %v", code, body)
			}
			// Each execution's own runner, and an admin on anyone's, is heard on every path.
			for _, who := range []struct{ role, id string }{{"runner", "mine"}, {"runner2", "theirs"}, {"admin", "mine"}} {
				for _, ev := range events {
					if code, body, _ := ts.call(t, who.role, "POST", ev.path, ev.body(who.id)); code != 200 {
						t.Errorf("%s on %s, %s: %d %v, want 200", who.role, who.id, ev.path, code, body)
					}
				}
			}
			if st := ts.stacksOf(t, "theirs")["a"]; st["plan_hash"] != "v1:forged" || st["status"] != "succeeded" {
				t.Errorf("the owner's own events were not stored: %v", st)
			}
		})
	}
}
