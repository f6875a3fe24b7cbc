package service

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// countingStore counts what the service's transactions read through the Tx methods whose
// cost grows with the tables: grant queries, and reads of plans' stacks (Stacks, PlanHashes).
type countingStore struct {
	store.Store
	mu           sync.Mutex
	grantQueries int
	planReads    int
}

func (c *countingStore) Read(ctx context.Context, fn func(store.Tx) error) error {
	return c.Store.Read(ctx, func(tx store.Tx) error { return fn(&countingTx{Tx: tx, c: c}) })
}

func (c *countingStore) Write(ctx context.Context, fn func(store.Tx) error) error {
	return c.Store.Write(ctx, func(tx store.Tx) error { return fn(&countingTx{Tx: tx, c: c}) })
}

// reset returns the counts so far and starts again from zero.
func (c *countingStore) reset() (grantQueries, planReads int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	grantQueries, planReads = c.grantQueries, c.planReads
	c.grantQueries, c.planReads = 0, 0
	return
}

func (c *countingStore) count(n *int) {
	c.mu.Lock()
	*n++
	c.mu.Unlock()
}

type countingTx struct {
	store.Tx
	c *countingStore
}

func (t *countingTx) Grants(f store.GrantFilter) ([]api.Grant, error) {
	t.c.count(&t.c.grantQueries)
	return t.Tx.Grants(f)
}

func (t *countingTx) Stacks(execID string) ([]store.Stack, error) {
	t.c.count(&t.c.planReads)
	return t.Tx.Stacks(execID)
}

func (t *countingTx) PlanHashes(execIDs []string) (map[string]map[string]string, error) {
	t.c.count(&t.c.planReads)
	return t.Tx.PlanHashes(execIDs)
}

// A policy of two classes on two globs: a plan touching both needs up to four gates.
const twoGlobPolicy = `
environment "prod" {
  requester = "deployer@proj.iam.gserviceaccount.com"
  gate {
    classes = ["destructive", "mutating"]
    stacks  = ["a/**", "b/**"]
  }
}
`

// forEachCountedStore runs fn against a fresh service, on every store backend, whose store
// counts what it reads.
func forEachCountedStore(t *testing.T, policy string, fn func(t *testing.T, f *fixture, c *countingStore)) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			p, err := ParsePolicy("policy.hcl", []byte(policy))
			if err != nil {
				t.Fatal(err)
			}
			c := &countingStore{Store: b.Open(t)}
			f := &fixture{Service: New(c, p), t: t, now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
			f.Now = func() time.Time { return f.now }
			fn(t, f, c)
		})
	}
}

// Listing gates reads the active grants once and the plans' hashes once, whatever the number
// of gates and plans, and a gate check reads the grants once, whatever the number of gates its
// plan requires; each gate still sees only the grants of its own key.
func TestGatesReadGrantsOncePerListing(t *testing.T) {
	forEachCountedStore(t, twoGlobPolicy, func(t *testing.T, f *fixture, c *countingStore) {
		f.planWith("p1", 1, "s1", map[string][2]string{"a/x": {"destructive", "h-ax"}, "b/y": {"mutating", "h-by"}, "b/z": {"destructive", "h-bz"}})
		f.planWith("p2", 2, "s1", map[string][2]string{"a/w": {"destructive", "h-aw"}})
		for _, target := range []string{"a/**", "b/**"} {
			_, err := f.SatisfyGate(ctx, "alice", &api.GatesSatisfy{PR: 1, Environment: "prod", Class: "destructive", Target: target, Reason: "ok"})
			f.must(err)
		}
		c.reset()
		gates, err := f.Gates(ctx, "prod", 0)
		f.must(err)
		var got []string
		for _, g := range gates {
			got = append(got, g.Class+" "+g.Target+" "+map[bool]string{true: "satisfied", false: "open"}[g.Satisfied])
		}
		want := []string{"destructive a/** satisfied", "destructive b/** satisfied", "mutating b/** open", "destructive a/** open"}
		if len(got) != len(want) {
			t.Fatalf("gates %v, want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("gates %v, want %v", got, want)
			}
		}
		if n, plans := c.reset(); n != 1 || plans != 1 {
			t.Errorf("listing %d gates of 2 plans ran %d grant queries and %d reads of plans, want 1 and 1", len(gates), n, plans)
		}
		_, err = f.check("ap1", 1, sp("a/x", "h-ax"), sp("b/y", "h-by"), sp("b/z", "h-bz"))
		wantErr(t, err, store.ErrDenied, "mutating on b/** (stacks b/y)")
		if n, _ := c.reset(); n != 1 {
			t.Errorf("a gate check over 3 required gates ran %d grant queries, want 1", n)
		}
		_, err = f.SatisfyGate(ctx, "alice", &api.GatesSatisfy{PR: 1, Environment: "prod", Class: "mutating", Target: "b/**", Reason: "ok"})
		f.must(err)
		_, err = f.check("ap2", 1, sp("a/x", "h-ax"), sp("b/y", "h-by"), sp("b/z", "h-bz"))
		f.must(err)
	})
}

// BenchmarkGatesListing lists the gates of an environment: gates PRs with one gate each
// (their plans' one destructive stack), and 1,000 active grants spread over them.
func BenchmarkGatesListing(b *testing.B) {
	const grants = 1000
	for _, be := range storetest.Backends() {
		for _, gates := range []int{500, 1000, 2000} {
			b.Run(fmt.Sprintf("%s/%d", be.Name, gates), func(b *testing.B) {
				p, err := ParsePolicy("policy.hcl", []byte(testPolicy))
				if err != nil {
					b.Fatal(err)
				}
				st := be.Open(b)
				now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
				if err := st.Write(ctx, func(tx store.Tx) error {
					for pr := 1; pr <= gates; pr++ {
						id := fmt.Sprintf("p%d", pr)
						e := &store.Execution{}
						e.ExecutionID, e.Environment, e.Op, e.Status, e.PR, e.StartedAt = id, "prod", "plan", "succeeded", pr, now
						if _, err := tx.CreateExecution(e); err != nil {
							return err
						}
						s := &store.Stack{}
						s.StackState.Stack, s.Status, s.Class, s.PlanHash = "s", "succeeded", "destructive", "h"+id
						if err := tx.SaveStack(id, s); err != nil {
							return err
						}
						if err := tx.ReplaceGates("prod", pr, []api.Gate{{ExecutionID: id, Class: "destructive", Target: "**", Stacks: []string{"s"}}}); err != nil {
							return err
						}
					}
					for i := range grants {
						pr := 1 + i%gates
						if _, err := tx.AddGrant(api.Grant{Environment: "prod", PR: pr, Class: "destructive", Target: "**", Principal: "alice",
							GrantedAt: now, ExecutionID: fmt.Sprintf("p%d", pr), Stacks: []api.StackPlan{{Stack: "s", PlanHash: fmt.Sprintf("hp%d", pr)}}}); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
				storetest.Analyze(b, st)
				svc := New(st, p)
				svc.Now = func() time.Time { return now }
				for b.Loop() {
					out, err := svc.Gates(ctx, "prod", 0)
					if err != nil {
						b.Fatal(err)
					}
					if len(out) != gates || !out[0].Satisfied {
						b.Fatalf("listed %d gates, first %+v", len(out), out[0])
					}
				}
			})
		}
	}
}
