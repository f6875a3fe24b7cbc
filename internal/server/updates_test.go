package server

import (
	"context"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// stacksOf returns an execution's stacks as the API shows them, without their update times.
func (ts *testServer) stacksOf(t *testing.T, id string) map[string]map[string]any {
	t.Helper()
	status, out, _ := ts.call(t, "viewer", "GET", "/executions/"+id, nil)
	if status != 200 {
		t.Fatalf("execution %s: %d %v", id, status, out)
	}
	stacks := map[string]map[string]any{}
	list, _ := out["stacks"].([]any)
	for _, s := range list {
		st := s.(map[string]any)
		delete(st, "updated_at")
		stacks[fmt.Sprint(st["stack"])] = st
	}
	return stacks
}

// Updates over HTTP: a batch is stored and counted; every attack on it (no or a weak
// credential, an empty, oversized or mixed batch, one bad update, an unknown field, an unknown
// execution) is refused with its 4xx and stores nothing, on every store.
func TestUpdatesOverHTTP(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ts := newTestServer(t, b.Open(t), nil)
			for _, id := range []string{"e1", "e2"} {
				init := map[string]any{"execution_id": id, "environment": "prod", "op": "plan", "pr": 5, "stacks": []string{"a", "b"}}
				if status, out, _ := ts.call(t, "runner", "POST", "/events/init", init); status != 200 {
					t.Fatalf("init %s: %d %v", id, status, out)
				}
			}
			up := func(exec, stack string, seq int, extra ...any) map[string]any {
				u := map[string]any{"execution_id": exec, "stack": stack, "seq": seq, "status": "succeeded", "class": "additive", "plan_hash": "v1:" + stack}
				for i := 0; i+1 < len(extra); i += 2 {
					u[extra[i].(string)] = extra[i+1]
				}
				return u
			}
			batch := map[string]any{"updates": []any{up("e1", "b", 2), up("e1", "a", 1, "class", "destructive", "destructive", []string{"x.y"})}}
			for range 2 { // the second is a retry
				if status, out, _ := ts.call(t, "runner", "POST", "/events/updates", batch); status != 200 || len(out) != 0 {
					t.Fatalf("updates: %d %v", status, out)
				}
			}
			stored := ts.stacksOf(t, "e1")
			if a, b := stored["a"], stored["b"]; a["class"] != "destructive" || a["status"] != "succeeded" || b["plan_hash"] != "v1:b" {
				t.Fatalf("stacks after the batch %v", stored)
			}
			many := make([]any, service.MaxUpdates+1)
			for i := range many {
				many[i] = up("e1", fmt.Sprintf("s%d", i), 9)
			}
			for _, c := range []struct {
				name, role string
				body       any
				status     int
				code       string
				mention    string
			}{
				{"anonymous", "", batch, 401, "UNAUTHENTICATED", ""},
				{"viewer", "viewer", batch, 403, "PERMISSION_DENIED", "runner"},
				{"empty batch", "runner", map[string]any{"updates": []any{}}, 400, "INVALID_ARGUMENT", "empty"},
				{"no updates member", "runner", map[string]any{}, 400, "INVALID_ARGUMENT", "empty"},
				{"oversized batch", "runner", map[string]any{"updates": many}, 400, "INVALID_ARGUMENT", fmt.Sprint("more than ", service.MaxUpdates)},
				{"two executions", "runner", map[string]any{"updates": []any{up("e1", "a", 9), up("e2", "a", 9)}}, 400, "INVALID_ARGUMENT", "one execution"},
				{"one bad status", "runner", map[string]any{"updates": []any{up("e1", "a", 9), up("e1", "b", 9, "status", "done")}}, 400, "INVALID_ARGUMENT", "status"},
				{"one NUL address", "runner", map[string]any{"updates": []any{up("e1", "a", 9), up("e1", "b", 9, "destructive", []string{"x\x00"})}}, 400, "INVALID_ARGUMENT", "destructive address"},
				{"one unknown field", "runner", map[string]any{"updates": []any{up("e1", "a", 9), up("e1", "b", 9, "owner", "me")}}, 400, "INVALID_ARGUMENT", "owner"},
				{"unknown execution", "runner", map[string]any{"updates": []any{up("nope", "a", 9), up("nope", "b", 9)}}, 404, "NOT_FOUND", "nope"},
			} {
				status, out, _ := ts.call(t, c.role, "POST", "/events/updates", c.body)
				if status != c.status || out["code"] != c.code || !strings.Contains(fmt.Sprint(out["message"]), c.mention) {
					t.Errorf("%s: %d %v, want %d %s mentioning %q", c.name, status, out, c.status, c.code, c.mention)
				}
				if after := ts.stacksOf(t, "e1"); !reflect.DeepEqual(after, stored) {
					t.Fatalf("%s: refused batch changed e1: %v, was %v", c.name, after, stored)
				}
			}
			if e2 := ts.stacksOf(t, "e2"); e2["a"]["status"] != "pending" || e2["b"]["status"] != "pending" {
				t.Fatalf("refused batches changed e2: %v", e2)
			}
			resp, err := ts.Client().Get(ts.URL + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			metrics, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, want := range []string{`tfstackplan_events_total{kind="update"} 4`, `tfstackplan_http_requests_total{code="200",operation="Updates"} 2`} {
				if !strings.Contains(string(metrics), want) {
					t.Errorf("metrics lack %s", want)
				}
			}
		})
	}
}

// A runner's batch is authorized exactly as its single updates are: the same answer for the
// same update, whoever announced the execution, and the same stack state after it.
func TestUpdatesAuthorizedAsUpdate(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	ctx := context.Background()
	for _, id := range []string{"single", "batch"} {
		// Announced by another principal than the runner token's (ci-runner).
		if _, err := ts.svc.Init(ctx, service.Caller{Name: "someone-else", Repositories: []string{testRepo}}, &api.Init{ExecutionID: id, Environment: "prod", Op: "plan", Stacks: []string{"a"}}); err != nil {
			t.Fatal(err)
		}
	}
	for i, role := range []string{"viewer", "runner", "admin"} {
		u := func(id string) map[string]any {
			return map[string]any{"execution_id": id, "stack": "a", "seq": i + 1, "status": "failed", "error": "by " + role}
		}
		one, oneOut, _ := ts.call(t, role, "POST", "/events/update", u("single"))
		many, manyOut, _ := ts.call(t, role, "POST", "/events/updates", map[string]any{"updates": []any{u("batch")}})
		if one != many || oneOut["code"] != manyOut["code"] {
			t.Errorf("%s: Update answered %d %v, Updates %d %v", role, one, oneOut, many, manyOut)
		}
		single, batched := ts.stacksOf(t, "single")["a"], ts.stacksOf(t, "batch")["a"]
		delete(single, "stack")
		delete(batched, "stack")
		if !reflect.DeepEqual(single, batched) {
			t.Errorf("%s: Update stored %v, Updates %v", role, single, batched)
		}
	}
}

// events_total counts the phase events a batch carries, not its requests.
func TestPhasesCountedByEvent(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	init := map[string]any{"execution_id": "e1", "environment": "prod", "op": "plan", "stacks": []string{"a", "b"}}
	if status, out, _ := ts.call(t, "runner", "POST", "/events/init", init); status != 200 {
		t.Fatalf("init: %d %v", status, out)
	}
	phase := func(stack string, seq int) map[string]any {
		return map[string]any{"execution_id": "e1", "stack": stack, "phase": "plan", "seq": seq}
	}
	if status, out, _ := ts.call(t, "runner", "POST", "/events/phases", map[string]any{"phases": []any{phase("a", 1), phase("b", 2), phase("a", 3)}}); status != 200 {
		t.Fatalf("phases: %d %v", status, out)
	}
	if status, out, _ := ts.call(t, "runner", "POST", "/events/phase", phase("b", 4)); status != 200 {
		t.Fatalf("phase: %d %v", status, out)
	}
	resp, err := ts.Client().Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `tfstackplan_events_total{kind="phase"} 4`; !strings.Contains(string(metrics), want) {
		t.Errorf("metrics lack %s", want)
	}
}
