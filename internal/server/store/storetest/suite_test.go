package storetest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/postgres"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlite"
)

func TestStores(t *testing.T) {
	for _, b := range Backends() {
		t.Run(b.Name, func(t *testing.T) {
			for _, tc := range suite {
				t.Run(tc.name, func(t *testing.T) { tc.fn(t, b.Open(t)) })
			}
		})
	}
}

var ctx = context.Background()

func write(t *testing.T, s store.Store, fn func(store.Tx) error) {
	t.Helper()
	if err := s.Write(ctx, fn); err != nil {
		t.Fatalf("write: %v", err)
	}
}

func exec1(id string, started time.Time) *store.Execution {
	e := &store.Execution{}
	e.ExecutionID, e.Environment, e.Op, e.Status, e.PR, e.SHA = id, "prod", "plan", "running", 7, "abc"
	e.StartedAt = started
	e.Edges = []api.Edge{{From: "a", To: "b"}}
	return e
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

var suite = []struct {
	name string
	fn   func(t *testing.T, s store.Store)
}{
	{"execution create is idempotent, first copy wins", func(t *testing.T, s store.Store) {
		var first, second bool
		write(t, s, func(tx store.Tx) (err error) { first, err = tx.CreateExecution(exec1("e1", t0)); return })
		e := exec1("e1", t0)
		e.Repo = "other"
		write(t, s, func(tx store.Tx) (err error) { second, err = tx.CreateExecution(e); return })
		if !first || second {
			t.Fatalf("created %v then %v, want true then false", first, second)
		}
		_ = s.Read(ctx, func(tx store.Tx) error {
			got, err := tx.Execution("e1")
			if err != nil {
				t.Fatal(err)
			}
			if got.Repo != "" || got.PR != 7 || !got.StartedAt.Equal(t0) {
				t.Errorf("stored %+v", got)
			}
			if edges, err := tx.ExecutionEdges("e1"); err != nil || len(edges) != 1 {
				t.Errorf("stored edges %v, %v; want 1", edges, err)
			}
			return nil
		})
	}},
	{"unknown execution is ErrNotFound", func(t *testing.T, s store.Store) {
		err := s.Read(ctx, func(tx store.Tx) error { _, err := tx.Execution("nope"); return err })
		if !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("err %v, want ErrNotFound", err)
		}
		err = s.Write(ctx, func(tx store.Tx) error { return tx.SaveExecution(exec1("nope", t0)) })
		if !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("save unknown: %v, want ErrNotFound", err)
		}
	}},
	{"event state follows cancel and finalize", func(t *testing.T, s store.Store) {
		err := s.Read(ctx, func(tx store.Tx) error { _, err := tx.EventState("nope"); return err })
		if !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("EventState of an unknown execution: %v, want ErrNotFound", err)
		}
		e := exec1("ev", t0)
		write(t, s, func(tx store.Tx) error { _, err := tx.CreateExecution(e); return err })
		state := func() store.EventState {
			var st store.EventState
			write(t, s, func(tx store.Tx) error { var err error; st, err = tx.EventState("ev"); return err })
			return st
		}
		if st := state(); st != (store.EventState{}) {
			t.Fatalf("fresh execution: %+v", st)
		}
		e.Cancelled, e.CancelReason, e.Finalized = true, "wrong branch", true
		write(t, s, func(tx store.Tx) error { return tx.SaveExecution(e) })
		if st := state(); st != (store.EventState{Cancelled: true, CancelReason: "wrong branch", Finalized: true}) {
			t.Fatalf("after cancel and finalize: %+v", st)
		}
	}},
	{"executions list newest first with filters and paging", func(t *testing.T, s store.Store) {
		for i := 0; i < 5; i++ {
			e := exec1(fmt.Sprintf("e%d", i), t0.Add(time.Duration(i)*time.Minute))
			if i == 4 {
				e.Environment = "dev"
			}
			write(t, s, func(tx store.Tx) error { _, err := tx.CreateExecution(e); return err })
		}
		_ = s.Read(ctx, func(tx store.Tx) error {
			got, _ := tx.Executions(store.ExecutionFilter{Environment: "prod", Limit: 2})
			if len(got) != 2 || got[0].ExecutionID != "e3" || got[1].ExecutionID != "e2" {
				t.Errorf("page 1: %v", ids(got))
			}
			got, _ = tx.Executions(store.ExecutionFilter{Environment: "prod", Before: got[1].StartedAt})
			if len(got) != 2 || got[0].ExecutionID != "e1" {
				t.Errorf("page 2: %v", ids(got))
			}
			if _, err := tx.LatestPlan(store.PRKey{Environment: "prod", PR: 8}); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("latest plan of a PR without plans: %v", err)
			}
			return nil
		})
		// The latest plan is the one the server received last, whatever the client's clock said.
		for i, id := range []string{"e3", "e0", "e2"} {
			write(t, s, func(tx store.Tx) error {
				return tx.StampExecution(id, "runner-"+id, t0.Add(time.Duration(i)*time.Hour))
			})
		}
		_ = s.Read(ctx, func(tx store.Tx) error {
			latest, err := tx.LatestPlan(store.PRKey{Environment: "prod", PR: 7})
			if err != nil || latest.ExecutionID != "e2" {
				t.Errorf("latest plan %v %v, want e2 (received last)", latest, err)
			}
			if p, _, err := tx.ExecutionPrincipal("e0"); err != nil || p != "runner-e0" {
				t.Errorf("principal %q %v", p, err)
			}
			return nil
		})
		err := s.Write(ctx, func(tx store.Tx) error { return tx.StampExecution("missing", "x", t0) })
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("stamping an unknown execution: %v", err)
		}
	}},
	{"log chunks dedup by key, read in offset order, gaps summarized", func(t *testing.T, s store.Store) {
		write(t, s, func(tx store.Tx) error { _, err := tx.CreateExecution(exec1("e1", t0)); return err })
		chunks := []store.LogChunk{
			{Offset: 6, Data: []byte("world\n")},
			{Offset: 0, Data: []byte("hello ")},
			{Offset: 0, Data: []byte("HELLO ")}, // a retry: the first copy wins
			{Offset: 12, GapLength: 10},
			{Offset: 22, Data: []byte("tail")},
		}
		var added []bool
		for _, c := range chunks {
			c.ExecutionID, c.Stack, c.Generation = "e1", "a", 1
			write(t, s, func(tx store.Tx) error { ok, err := tx.AddLogChunk(c); added = append(added, ok); return err })
		}
		if fmt.Sprint(added) != "[true true false true true]" {
			t.Errorf("added %v", added)
		}
		write(t, s, func(tx store.Tx) error {
			_, err := tx.AddLogChunk(store.LogChunk{ExecutionID: "e1", Stack: "a", Generation: 0, Offset: 0, Data: []byte("old")})
			return err
		})
		_ = s.Read(ctx, func(tx store.Tx) error {
			got, _ := tx.LogChunks("e1", "a", 1, 3, 1<<20, 100)
			if len(got) != 4 || got[0].Offset != 0 || string(got[0].Data) != "hello " || got[2].GapLength != 10 {
				t.Errorf("chunks %+v", got)
			}
			g, _ := tx.LatestGeneration("e1", "a")
			if g != 1 {
				t.Errorf("latest generation %d", g)
			}
			sum, _ := tx.LogSummaries("e1", 100)
			if len(sum) != 1 || sum[0].Bytes != 26 || sum[0].Generation != 1 || len(sum[0].Gaps) != 1 || sum[0].Gaps[0].To != 22 {
				t.Errorf("summaries %+v", sum)
			}
			return nil
		})
		n, err := s.PruneLogs(ctx, t0.Add(time.Second))
		if err != nil || n != 5 {
			t.Errorf("prune removed %d, %v; want 5", n, err)
		}
	}},
	{"stacks and phases", func(t *testing.T, s store.Store) {
		st := &store.Stack{Seq: 3}
		st.StackState.Stack, st.Status, st.Class, st.PlanHash = "a/b", "succeeded", "destructive", "h1"
		st.Reasons = []api.ChangeReason{{Stack: "a/b", Kind: "module"}}
		write(t, s, func(tx store.Tx) error { return tx.SaveStack("e1", st) })
		st.PlanHash = "h2"
		write(t, s, func(tx store.Tx) error { return tx.SaveStack("e1", st) })
		var added []bool
		for i := 0; i < 2; i++ {
			write(t, s, func(tx store.Tx) error {
				ok, err := tx.AddPhase(store.Phase{ExecutionID: "e1", Stack: "a/b", Phase: "init", Seq: 5})
				added = append(added, ok)
				return err
			})
		}
		if fmt.Sprint(added) != "[true false]" {
			t.Errorf("phase added %v", added)
		}
		_ = s.Read(ctx, func(tx store.Tx) error {
			got, err := tx.Stack("e1", "a/b")
			if err != nil || got.PlanHash != "h2" || got.Seq != 3 || len(got.Reasons) != 1 || got.Class != "destructive" {
				t.Errorf("stack %+v %v", got, err)
			}
			if _, err := tx.Stack("e1", "zzz"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("unknown stack: %v", err)
			}
			return nil
		})
		// A stack's span runs from its first phase event to its last, whatever their order.
		write(t, s, func(tx store.Tx) error {
			for i, at := range []time.Time{t0.Add(40 * time.Second), t0.Add(3 * time.Second)} {
				if _, err := tx.AddPhase(store.Phase{ExecutionID: "e1", Stack: "a/b", Phase: "plan", Seq: int64(6 + i), At: at}); err != nil {
					return err
				}
			}
			return nil
		})
		_ = s.Read(ctx, func(tx store.Tx) error {
			spans, err := tx.StackSpans("e1", nil)
			// The init phase above, stored with no time, is not part of it.
			if sp := spans["a/b"]; err != nil || len(spans) != 1 || !sp.Last.Equal(t0.Add(40*time.Second)) || !sp.First.Equal(t0.Add(3*time.Second)) {
				t.Errorf("spans %+v %v", spans, err)
			}
			if some, err := tx.StackSpans("e1", []string{"a/b", "zzz"}); err != nil || len(some) != 1 || some["a/b"] != spans["a/b"] {
				t.Errorf("spans of a/b and zzz: %+v %v", some, err)
			}
			if none, err := tx.StackSpans("e1", []string{"zzz"}); err != nil || len(none) != 0 {
				t.Errorf("spans of zzz: %+v %v", none, err)
			}
			return nil
		})
	}},
	{"claims expire and release", func(t *testing.T, s store.Store) {
		write(t, s, func(tx store.Tx) error {
			for _, c := range []api.Claim{
				{Environment: "prod", Stack: "a", PR: 1, ExpiresAt: t0.Add(time.Hour)},
				{Environment: "prod", Stack: "b", PR: 1, ExpiresAt: t0.Add(-time.Hour)},
				{Environment: "prod", Stack: "c", PR: 2},
				{Environment: "dev", Stack: "a", PR: 1},
			} {
				if err := tx.PutClaim(c); err != nil {
					return err
				}
			}
			return nil
		})
		_ = s.Read(ctx, func(tx store.Tx) error {
			got, _ := tx.Claims("", "prod", t0)
			if len(got) != 2 || got[0].Stack != "a" || got[1].Stack != "c" {
				t.Errorf("claims %+v", got)
			}
			return nil
		})
		write(t, s, func(tx store.Tx) error {
			n, err := tx.ReleaseClaims(store.PRKey{Environment: "prod", PR: 1}, "")
			if n != 2 {
				t.Errorf("released %d, want 2", n)
			}
			return err
		})
		_ = s.Read(ctx, func(tx store.Tx) error {
			all, _ := tx.Claims("", "", t0)
			if len(all) != 2 {
				t.Errorf("claims left %+v", all)
			}
			return nil
		})
	}},
	{"grants active until released or expired", func(t *testing.T, s store.Store) {
		write(t, s, func(tx store.Tx) error {
			_, err := tx.AddGrant(api.Grant{Environment: "prod", PR: 1, Class: "destructive", Target: "**", GrantedAt: t0})
			if err != nil {
				return err
			}
			_, err = tx.AddGrant(api.Grant{Environment: "prod", PR: 1, Class: "mutating", Target: "**", GrantedAt: t0, ExpiresAt: t0.Add(time.Minute)})
			return err
		})
		_ = s.Read(ctx, func(tx store.Tx) error {
			got, _ := tx.Grants(store.GrantFilter{Environment: "prod", PR: 1, ActiveAt: t0.Add(2 * time.Minute)})
			if len(got) != 1 || got[0].Class != "destructive" || got[0].ID == 0 {
				t.Errorf("active grants %+v", got)
			}
			return nil
		})
		write(t, s, func(tx store.Tx) error {
			n, err := tx.ReleaseGrants(store.PRKey{Environment: "prod", PR: 1}, "destructive", "**", "admin", t0.Add(3*time.Minute))
			if n != 1 {
				t.Errorf("released %d", n)
			}
			return err
		})
		_ = s.Read(ctx, func(tx store.Tx) error {
			got, _ := tx.Grants(store.GrantFilter{Environment: "prod"})
			if len(got) != 2 || got[1].ReleasedBy != "admin" || got[1].ReleasedAt.IsZero() {
				t.Errorf("grants %+v", got)
			}
			return nil
		})
	}},
	{"gates, leases, checks", func(t *testing.T, s store.Store) {
		write(t, s, func(tx store.Tx) error {
			if err := tx.ReplaceGates(store.PRKey{Environment: "prod", PR: 1}, []api.Gate{{Class: "destructive", Target: "**", Stacks: []string{"a"}, RequiredAt: t0}}); err != nil {
				return err
			}
			if err := tx.PutLease(store.Lease{ExecutionID: "ap", Environment: "prod", PR: 1, Requester: "sa@x"}); err != nil {
				return err
			}
			return tx.PutCheck(api.Check{Environment: "prod", PR: 1, Check: "tfstackplan/plan", Conclusion: "success"})
		})
		write(t, s, func(tx store.Tx) error {
			return tx.ReplaceGates(store.PRKey{Environment: "prod", PR: 1}, []api.Gate{{Class: "mutating", Target: "x/*", RequiredAt: t0.Add(time.Minute)}})
		})
		_ = s.Read(ctx, func(tx store.Tx) error {
			gates, _ := tx.Gates(store.ListFilter{Environment: "prod", PR: 1})
			if len(gates) != 1 || gates[0].Class != "mutating" || gates[0].Environment != "prod" || !gates[0].RequiredAt.Equal(t0.Add(time.Minute)) {
				t.Errorf("gates %+v", gates)
			}
			l, err := tx.Lease("ap")
			if err != nil || l.Requester != "sa@x" {
				t.Errorf("lease %+v %v", l, err)
			}
			c, err := tx.Check(store.PRKey{Environment: "prod", PR: 1}, "tfstackplan/plan")
			if err != nil || c.Conclusion != "success" {
				t.Errorf("check %+v %v", c, err)
			}
			return nil
		})
	}},
	{"grants keep the plan content they approve; leases their principal, grants and binding", func(t *testing.T, s store.Store) {
		approved := []api.StackPlan{{Stack: "a", PlanHash: "v1:aa"}, {Stack: "b", PlanHash: "v1:bb"}}
		var g1, g2 int64
		write(t, s, func(tx store.Tx) (err error) {
			if g1, err = tx.AddGrant(api.Grant{Environment: "prod", PR: 1, Class: "destructive", Target: "**", GrantedAt: t0,
				ExecutionID: "p1", Stacks: approved}); err != nil {
				return err
			}
			g2, err = tx.AddGrant(api.Grant{Environment: "prod", PR: 1, Class: "mutating", Target: "**", GrantedAt: t0, ExecutionID: "p1"})
			return err
		})
		l := store.Lease{ExecutionID: "ap", Environment: "prod", PR: 1, Requester: "sa@x", GrantedAt: t0, ExpiresAt: t0.Add(time.Hour),
			Principal: "ci", SHA: "abc", PlanID: "p1", GrantIDs: []int64{g1}, Member: "serviceAccount:ci@x", Bound: true}
		write(t, s, func(tx store.Tx) error {
			if err := tx.PutLease(l); err != nil {
				return err
			}
			return tx.PutLease(store.Lease{ExecutionID: "gone", Environment: "prod", PR: 2, GrantedAt: t0, ExpiresAt: t0.Add(time.Hour)})
		})
		_ = s.Read(ctx, func(tx store.Tx) error {
			got, err := tx.Grants(store.GrantFilter{Environment: "prod", Class: "destructive"})
			if err != nil || len(got) != 1 || got[0].ExecutionID != "p1" || len(got[0].Stacks) != 2 || got[0].Stacks[1] != approved[1] {
				t.Errorf("grant %+v %v", got, err)
			}
			back, err := tx.Lease("ap")
			if err != nil || back.Principal != "ci" || back.SHA != "abc" || back.PlanID != "p1" || len(back.GrantIDs) != 1 ||
				back.GrantIDs[0] != g1 || !back.Bound || back.Member != "serviceAccount:ci@x" {
				t.Errorf("lease %+v %v", back, err)
			}
			// The applies that used plan p1's approvals: only the lease that decided over it.
			if used, err := tx.LeasesOfPlans([]string{"p1", "p9", "p1"}); err != nil || len(used) != 1 || used[0].ExecutionID != "ap" || used[0].GrantIDs[0] != g1 {
				t.Errorf("leases of plan p1: %+v %v", used, err)
			}
			// Bound, neither revoked nor expired: nothing to unbind yet; unbound leases never.
			if due, err := tx.LeasesToUnbind(t0.Add(time.Minute), 10); err != nil || len(due) != 0 {
				t.Errorf("due before expiry: %+v %v", due, err)
			}
			if due, err := tx.LeasesToUnbind(t0.Add(2*time.Hour), 10); err != nil || len(due) != 1 || due[0].ExecutionID != "ap" {
				t.Errorf("due after expiry: %+v %v", due, err)
			}
			return nil
		})
		write(t, s, func(tx store.Tx) error {
			n, err := tx.ReleaseGrantIDs([]int64{g1, g1}, "ci", t0.Add(time.Minute))
			if n != 1 {
				t.Errorf("released %d grants, want 1", n)
			}
			return err
		})
		_ = s.Read(ctx, func(tx store.Tx) error {
			active, _ := tx.Grants(store.GrantFilter{Environment: "prod", ActiveAt: t0.Add(2 * time.Minute)})
			if len(active) != 1 || active[0].ID != g2 {
				t.Errorf("active after releasing g1: %+v", active)
			}
			return nil
		})
	}},
	{"claims release by execution", func(t *testing.T, s store.Store) {
		write(t, s, func(tx store.Tx) error {
			for _, c := range []api.Claim{{Environment: "prod", Stack: "a", PR: 1, ExecutionID: "p1"},
				{Environment: "prod", Stack: "b", PR: 1, ExecutionID: "p1"}, {Environment: "prod", Stack: "c", PR: 2, ExecutionID: "p2"}} {
				if err := tx.PutClaim(c); err != nil {
					return err
				}
			}
			return nil
		})
		write(t, s, func(tx store.Tx) error {
			if n, err := tx.ReleaseExecutionClaims("prod", "p1", "b"); err != nil || n != 1 {
				t.Errorf("one stack: %d %v", n, err)
			}
			if n, err := tx.ReleaseExecutionClaims("prod", "p1", ""); err != nil || n != 1 {
				t.Errorf("the rest: %d %v", n, err)
			}
			return nil
		})
		_ = s.Read(ctx, func(tx store.Tx) error {
			left, _ := tx.Claims("", "prod", t0)
			if len(left) != 1 || left[0].ExecutionID != "p2" {
				t.Errorf("claims left %+v", left)
			}
			return nil
		})
	}},
	{"audit newest first with paging", func(t *testing.T, s store.Store) {
		for i := 0; i < 3; i++ {
			write(t, s, func(tx store.Tx) error {
				_, err := tx.AddAudit(api.AuditEntry{At: t0, Principal: "p", Action: fmt.Sprint("a", i)})
				return err
			})
		}
		_ = s.Read(ctx, func(tx store.Tx) error {
			all, _ := tx.Audit("", 10, 0)
			if len(all) != 3 || all[0].Action != "a2" {
				t.Fatalf("audit %+v", all)
			}
			older, _ := tx.Audit("", 10, all[0].ID)
			if len(older) != 2 || older[0].Action != "a1" {
				t.Errorf("older %+v", older)
			}
			return nil
		})
	}},
	{"a failed write rolls back alone while concurrent writes commit", func(t *testing.T, s store.Store) {
		var wg sync.WaitGroup
		errs := make([]error, 40)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = s.Write(ctx, func(tx store.Tx) error {
					if _, err := tx.CreateExecution(exec1(fmt.Sprint("c", i), t0)); err != nil {
						return err
					}
					if i%4 == 0 {
						return fmt.Errorf("%w: refused", store.ErrDenied)
					}
					return nil
				})
			}()
		}
		wg.Wait()
		_ = s.Read(ctx, func(tx store.Tx) error {
			for i, err := range errs {
				_, gerr := tx.Execution(fmt.Sprint("c", i))
				if i%4 == 0 && (!errors.Is(err, store.ErrDenied) || !errors.Is(gerr, store.ErrNotFound)) {
					t.Errorf("write %d: err %v, read %v; want denied and rolled back", i, err, gerr)
				}
				if i%4 != 0 && (err != nil || gerr != nil) {
					t.Errorf("write %d: err %v, read %v", i, err, gerr)
				}
			}
			return nil
		})
	}},
	{"notifications reach listeners after commit", func(t *testing.T, s store.Store) {
		lctx, cancel := context.WithCancel(ctx)
		defer cancel()
		got := make(chan string, 16)
		go func() { _ = s.Listen(lctx, func(id string) { got <- id }) }()
		deadline := time.After(10 * time.Second)
		for {
			write(t, s, func(tx store.Tx) error { return tx.Notify("exec-n") })
			select {
			case id := <-got:
				if id != "exec-n" {
					t.Fatalf("notified %q", id)
				}
				return
			case <-time.After(100 * time.Millisecond):
			case <-deadline:
				t.Fatal("no notification within 10s")
			}
		}
	}},
}

func ids(es []store.Execution) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.ExecutionID)
	}
	return out
}

func TestSQLiteReopenKeepsDataAndMigratesOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "re.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	write(t, s, func(tx store.Tx) error { _, err := tx.CreateExecution(exec1("keep", t0)); return err })
	_ = s.Close()
	s, err = sqlite.Open(ctx, path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	if err := s.Read(ctx, func(tx store.Tx) error { _, err := tx.Execution("keep"); return err }); err != nil {
		t.Fatalf("after reopen: %v", err)
	}
}

// TestPostgresReplicasSeeEachOther opens two stores (two replicas) on one schema: a write
// through one is visible to, and notified on, the other.
func TestPostgresReplicasSeeEachOther(t *testing.T) {
	u, channel := PostgresURL(t)
	a, err := postgres.Open(ctx, u, postgres.Options{Channel: channel})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := postgres.Open(ctx, u, postgres.Options{Channel: channel})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan string, 64)
	go func() { _ = b.Listen(lctx, func(id string) { got <- id }) }()
	deadline := time.After(15 * time.Second)
	for i := 0; ; i++ {
		id := fmt.Sprint("r", i)
		write(t, a, func(tx store.Tx) error {
			if _, err := tx.CreateExecution(exec1(id, t0)); err != nil {
				return err
			}
			return tx.Notify(id)
		})
		select {
		case n := <-got:
			if err := b.Read(ctx, func(tx store.Tx) error { _, err := tx.Execution(n); return err }); err != nil {
				t.Fatalf("replica b was notified of %s but cannot read it: %v", n, err)
			}
			return
		case <-time.After(200 * time.Millisecond): // the LISTEN may not be up yet
		case <-deadline:
			t.Fatal("replica b heard nothing from replica a within 15s")
		}
	}
}
