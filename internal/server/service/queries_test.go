package service

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// countingStore counts what the service's transactions read through the Tx methods whose
// cost grows with the tables: grant queries, reads of plans' stacks (Stacks, PlanHashes),
// claim rows (Claims, ClaimsOn) and reads of run-graph edges (ExecutionEdges, or an
// execution Execution or LatestPlan returned with its edges).
type countingStore struct {
	store.Store
	mu           sync.Mutex
	grantQueries int
	planReads    int
	claimRows    int
	edgeReads    int
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

func (c *countingStore) count(n *int) { c.add(n, 1) }

func (c *countingStore) add(n *int, k int) {
	c.mu.Lock()
	*n += k
	c.mu.Unlock()
}

// take returns the count n so far and starts it again from zero.
func (c *countingStore) take(n *int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := *n
	*n = 0
	return k
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

func (t *countingTx) Claims(repo, env string, now time.Time) ([]api.Claim, error) {
	out, err := t.Tx.Claims(repo, env, now)
	t.c.add(&t.c.claimRows, len(out))
	return out, err
}

func (t *countingTx) ClaimsOn(k store.PRKey, stacks []string, now time.Time) ([]api.Claim, error) {
	out, err := t.Tx.ClaimsOn(k, stacks, now)
	t.c.add(&t.c.claimRows, len(out))
	return out, err
}

func (t *countingTx) ExecutionEdges(id string) ([]api.Edge, error) {
	t.c.count(&t.c.edgeReads)
	return t.Tx.ExecutionEdges(id)
}

func (t *countingTx) Execution(id string) (*store.Execution, error) {
	e, err := t.Tx.Execution(id)
	if e != nil && e.Edges != nil {
		t.c.count(&t.c.edgeReads)
	}
	return e, err
}

func (t *countingTx) LatestPlan(k store.PRKey) (*store.Execution, error) {
	e, err := t.Tx.LatestPlan(k)
	if e != nil && e.Edges != nil {
		t.c.count(&t.c.edgeReads)
	}
	return e, err
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
			err := f.satisfy(who("alice"), &api.GatesSatisfy{PR: 1, Environment: "prod", Class: "destructive", Target: target, Reason: "ok"})
			f.must(err)
		}
		c.reset()
		gates, err := f.Gates(ctx, reader, everyRow("prod", 0), "")
		f.must(err)
		var got []string
		for _, g := range gates {
			got = append(got, g.Class+" "+g.Target+" "+map[bool]string{true: "satisfied", false: "open"}[g.Satisfied])
		}
		// Newest first; required at the same instant, by PR, class and target, descending.
		want := []string{"destructive a/** open", "mutating b/** open", "destructive b/** satisfied", "destructive a/** satisfied"}
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
		err = f.satisfy(who("alice"), &api.GatesSatisfy{PR: 1, Environment: "prod", Class: "mutating", Target: "b/**", Reason: "ok"})
		f.must(err)
		_, err = f.check("ap2", 1, sp("a/x", "h-ax"), sp("b/y", "h-by"), sp("b/z", "h-bz"))
		f.must(err)
	})
}

// Finalizing a plan and checking its gate read the claims of the PR and of the plan's changed
// stacks, not every claim of the environment; what they decide is unchanged.
func TestDecisionsReadOnlyTheClaimsTheyNeed(t *testing.T) {
	forEachCountedStore(t, testPolicy, func(t *testing.T, f *fixture, c *countingStore) {
		f.must(f.Store.Write(ctx, func(tx store.Tx) error {
			for i := range 500 {
				if err := tx.PutClaim(api.Claim{Repo: testRepo, Environment: "prod", Stack: fmt.Sprintf("other/%03d", i), PR: 100 + i%7,
					ExecutionID: "elsewhere", ClaimedAt: f.now}); err != nil {
					return err
				}
			}
			return tx.PutClaim(api.Claim{Repo: testRepo, Environment: "prod", Stack: "taken", PR: 9, ExecutionID: "p9", ClaimedAt: f.now})
		}))
		c.take(&c.claimRows)
		f.planWith("p1", 1, "s1", map[string][2]string{"d": {"destructive", "h-d"}, "m": {"mutating", "h-m"}})
		if n := c.take(&c.claimRows); n != 0 {
			t.Errorf("finalizing PR 1's first plan read %d claims, want 0 (it has none, nor has anyone on d and m)", n)
		}
		f.must(f.approve(1, ""))
		_, err := f.check("ap1", 1, sp("d", "h-d"), sp("m", "h-m"))
		f.must(err)
		if n := c.take(&c.claimRows); n != 2 {
			t.Errorf("a gate check over d and m read %d claims, want their 2", n)
		}
		f.planWith("p2", 1, "s2", map[string][2]string{"d": {"destructive", "h-d2"}, "taken": {"mutating", "h-t"}})
		if n := c.take(&c.claimRows); n != 3 {
			t.Errorf("finalizing PR 1's second plan read %d claims, want 3 (its d and m, PR 9's taken)", n)
		}
		claims, err := f.Claims(ctx, reader, "", "prod")
		f.must(err)
		held := map[string]int{}
		for _, cl := range claims {
			held[cl.Stack] = cl.PR
		}
		if len(claims) != 502 || held["d"] != 1 || held["taken"] != 9 || held["m"] != 0 {
			t.Errorf("%d claims; d held by %d, taken by %d, m by %d; want 502, 1, 9, none", len(claims), held["d"], held["taken"], held["m"])
		}
		f.must(f.approve(1, ""))
		_, err = f.check("ap2", 1, sp("d", "h-d2"), sp("taken", "h-t"))
		wantErr(t, err, store.ErrDenied, `stack "taken" is claimed by PR #9`)
	})
}

// Only the execution's detail reads its run-graph edges: a retried Init, Finalize, a grant
// (on the latest plan or a named one), a gate check and a cancel do not, however many edges
// the plan has; the detail still has them all, and EdgesApproximate as the Init had it.
func TestOnlyTheDetailReadsEdges(t *testing.T) {
	forEachCountedStore(t, testPolicy, func(t *testing.T, f *fixture, c *countingStore) {
		stacks := make([]string, 50)
		var edges []api.Edge
		for i := range stacks {
			stacks[i] = fmt.Sprintf("s/%02d", i)
			for j := range i {
				edges = append(edges, api.Edge{From: stacks[j], To: stacks[i]})
			}
		}
		results := make([]api.StackResult, len(stacks))
		for i, st := range stacks {
			results[i] = api.StackResult{Stack: st, Status: "succeeded", Class: "no-changes"}
		}
		results[0].Class, results[0].PlanHash = "destructive", "h0"
		in := &api.Init{ExecutionID: "p1", Environment: "prod", Op: "plan", PR: 1, SHA: "s1", Stacks: stacks, Edges: edges, EdgesApproximate: true}
		_, err := f.Init(ctx, runner, in)
		f.must(err)
		_, err = f.Init(ctx, runner, in)
		f.must(err)
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "p1", Status: "succeeded", Stacks: results})
		f.must(err)
		f.must(f.approve(1, ""))
		f.must(f.approve(1, "p1"))
		_, err = f.check("ap1", 1, sp(stacks[0], "h0"))
		f.must(err)
		_, err = f.CancelExecution(ctx, who("alice"), &api.ExecutionsCancel{ExecutionID: "p1", Reason: "done"})
		f.must(err)
		list, err := f.Executions(ctx, reader, store.ExecutionFilter{Environment: "prod"})
		f.must(err)
		if len(list) != 1 || list[0].Edges != nil || !list[0].EdgesApproximate {
			t.Errorf("listed %+v, want p1 without edges, approximate", list)
		}
		if n := c.take(&c.edgeReads); n != 0 {
			t.Errorf("Init, Finalize, grants, a gate check, a cancel and the list read edges %d times, want 0", n)
		}
		x, err := f.Execution(ctx, reader, "p1")
		f.must(err)
		if !reflect.DeepEqual(x.Edges, edges) || !x.EdgesApproximate {
			t.Errorf("the detail has %d edges (approximate %v), want %d (true)", len(x.Edges), x.EdgesApproximate, len(edges))
		}
		if n := c.take(&c.edgeReads); n != 1 {
			t.Errorf("the detail read edges %d times, want 1", n)
		}
	})
}

// BenchmarkGatesListing lists the newest page (MaxPageLimit gates) of an environment's gates:
// gates PRs with one gate each (their plans' one destructive stack), and 1,000 active grants
// spread over the newest of them.
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
						if err := tx.ReplaceGates(store.PRKey{Repo: testRepo, Environment: "prod", PR: pr}, []api.Gate{{ExecutionID: id, Class: "destructive", Target: "**", Stacks: []string{"s"}}}); err != nil {
							return err
						}
					}
					for i := range grants {
						pr := gates - i%gates
						if _, err := tx.AddGrant(api.Grant{Repo: testRepo, Environment: "prod", PR: pr, Class: "destructive", Target: "**", Principal: "alice",
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
					out, err := svc.Gates(ctx, reader, everyRow("prod", 0), "")
					if err != nil {
						b.Fatal(err)
					}
					if len(out) != min(gates, MaxPageLimit) || !out[0].Satisfied {
						b.Fatalf("listed %d gates, first %+v", len(out), out[0])
					}
				}
			})
		}
	}
}

// BenchmarkDecisionClaims finalizes a plan of 10 changed stacks, and checks the gate of
// another, in an environment where other PRs hold n claims.
func BenchmarkDecisionClaims(b *testing.B) {
	for _, be := range storetest.Backends() {
		for _, n := range []int{10000, 20000, 40000} {
			open := func(b *testing.B) *Service {
				p, err := ParsePolicy("policy.hcl", []byte(testPolicy))
				if err != nil {
					b.Fatal(err)
				}
				st := be.Open(b)
				now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
				if err := st.Write(ctx, func(tx store.Tx) error {
					for i := range n {
						if err := tx.PutClaim(api.Claim{Repo: testRepo, Environment: "prod", Stack: fmt.Sprintf("other/%05d", i), PR: 100 + i%50,
							ExecutionID: "elsewhere", ClaimedAt: now}); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
				storetest.Analyze(b, st)
				svc := New(st, p)
				svc.Now = func() time.Time { now = now.Add(time.Millisecond); return now }
				return svc
			}
			stacks := make([]string, 10)
			results := make([]api.StackResult, 10)
			for i := range stacks {
				stacks[i] = fmt.Sprintf("mine/%02d", i)
				results[i] = api.StackResult{Stack: stacks[i], Status: "succeeded", Class: "destructive", PlanHash: "h-" + stacks[i]}
			}
			b.Run(fmt.Sprintf("%s/finalize/%d", be.Name, n), func(b *testing.B) {
				svc := open(b)
				i := 0
				for b.Loop() {
					b.StopTimer()
					id := fmt.Sprintf("p%d", i)
					i++
					if _, err := svc.Init(ctx, runner, &api.Init{ExecutionID: id, Environment: "prod", Op: "plan", PR: 1, SHA: "s", Stacks: stacks}); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					if _, err := svc.Finalize(ctx, runner, &api.Finalize{ExecutionID: id, Status: "succeeded", Stacks: results}); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(fmt.Sprintf("%s/gatecheck/%d", be.Name, n), func(b *testing.B) {
				svc := open(b)
				if _, err := svc.Init(ctx, runner, &api.Init{ExecutionID: "p", Environment: "prod", Op: "plan", PR: 1, SHA: "s", Stacks: stacks}); err != nil {
					b.Fatal(err)
				}
				if _, err := svc.Finalize(ctx, runner, &api.Finalize{ExecutionID: "p", Status: "succeeded", Stacks: results}); err != nil {
					b.Fatal(err)
				}
				if _, err := svc.SatisfyGate(ctx, who("alice"), &api.GatesSatisfy{PR: 1, Environment: "prod", Class: "destructive", Target: "**", Reason: "ok"}); err != nil {
					b.Fatal(err)
				}
				check := &api.GateCheck{Environment: "prod", PR: 1, SHA: "s"}
				for _, r := range results {
					check.Stacks = append(check.Stacks, api.StackPlan{Stack: r.Stack, PlanHash: r.PlanHash})
				}
				i := 0
				for b.Loop() {
					check.ExecutionID = fmt.Sprintf("ap%d", i)
					i++
					if _, err := svc.GateCheck(ctx, runner, check); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
