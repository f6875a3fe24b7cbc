package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// seedExecutions stores n executions of environment "prod", one second apart with one edge
// each: every other one of PR 7, the others of PRs 1 to 50 in turn.
func seedExecutions(b *testing.B, s store.Store, n int) {
	b.Helper()
	const perWrite = 5000
	for from := 0; from < n; from += perWrite {
		if err := s.Write(ctx, func(tx store.Tx) error {
			for i := from; i < min(from+perWrite, n); i++ {
				e := exec1(fmt.Sprintf("x%06d", i), t0.Add(time.Duration(i)*time.Second))
				e.PR = 7
				if i%2 == 1 {
					e.PR = 1 + i%50
				}
				if _, err := tx.CreateExecution(e); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExecutionsList lists the newest 50 executions of an environment, and of a PR in
// it, among n executions of that environment (all of them match the environment, half the
// PR): what the executions API and the filtered web list (on every execution
// change) ask for.
func BenchmarkExecutionsList(b *testing.B) {
	for _, be := range Backends() {
		for _, n := range []int{20000, 40000, 80000} {
			for _, f := range []struct {
				name string
				f    store.ExecutionFilter
			}{
				{"env", store.ExecutionFilter{Environment: "prod", Limit: 50}},
				{"env+pr", store.ExecutionFilter{Environment: "prod", PR: 7, Limit: 50}},
			} {
				b.Run(fmt.Sprintf("%s/%s/%d", be.Name, f.name, n), func(b *testing.B) {
					s := be.Open(b)
					seedExecutions(b, s, n)
					Analyze(b, s)
					for b.Loop() {
						if err := s.Read(ctx, func(tx store.Tx) error {
							got, err := tx.Executions(f.f)
							if err == nil && len(got) != 50 {
								err = fmt.Errorf("listed %d executions, want 50", len(got))
							}
							return err
						}); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// Every read of an execution (Execution, LatestPlan, the list) leaves its edges out and
// reads the rest of it alike, EdgesApproximate included; ExecutionEdges reads the edges.
func TestExecutionReadsLeaveEdgesOut(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		e := exec1("graph", t0)
		e.Edges = []api.Edge{{From: "a", To: "b"}, {From: "b", To: "c"}}
		e.EdgesApproximate, e.Class, e.Error, e.FinishedAt = true, "additive", "boom", t0.Add(time.Minute)
		e.Counts = api.Counts{Create: 2}
		write(t, s, func(tx store.Tx) error { _, err := tx.CreateExecution(e); return err })
		_ = s.Read(ctx, func(tx store.Tx) error {
			full, err := tx.Execution("graph")
			if err != nil {
				t.Fatal(err)
			}
			want := *e
			want.Edges = nil
			if !reflect.DeepEqual(*full, want) {
				t.Errorf("Execution read %+v\nwant           %+v", *full, want)
			}
			latest, err := tx.LatestPlan(store.PRKey{Environment: "prod", PR: 7})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*latest, want) {
				t.Errorf("LatestPlan read %+v\nwant            %+v", *latest, want)
			}
			listed, err := tx.Executions(store.ExecutionFilter{Environment: "prod"})
			if err != nil || len(listed) != 1 {
				t.Fatalf("listed %d, %v", len(listed), err)
			}
			if !reflect.DeepEqual(listed[0], want) {
				t.Errorf("listed %+v\nwant   %+v", listed[0], want)
			}
			edges, err := tx.ExecutionEdges("graph")
			if err != nil || !reflect.DeepEqual(edges, e.Edges) {
				t.Errorf("ExecutionEdges read %v, %v; want %v", edges, err, e.Edges)
			}
			if _, err := tx.ExecutionEdges("nope"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("ExecutionEdges of an unknown execution: %v, want ErrNotFound", err)
			}
			return nil
		})
	})
}

// BenchmarkExecutionsListEdges lists 50 executions of edges edges each (a large run graph).
func BenchmarkExecutionsListEdges(b *testing.B) {
	for _, be := range Backends() {
		for _, edges := range []int{10000, 20000} {
			b.Run(fmt.Sprintf("%s/%d", be.Name, edges), func(b *testing.B) {
				s := be.Open(b)
				graph := make([]api.Edge, edges)
				for i := range graph {
					graph[i] = api.Edge{From: fmt.Sprintf("stacks/team-%03d/app-%05d", i%100, i), To: fmt.Sprintf("stacks/team-%03d/app-%05d", i%100, i+1)}
				}
				for i := range 50 {
					e := exec1(fmt.Sprintf("g%02d", i), t0.Add(time.Duration(i)*time.Second))
					e.Edges = graph
					if err := s.Write(ctx, func(tx store.Tx) error { _, err := tx.CreateExecution(e); return err }); err != nil {
						b.Fatal(err)
					}
				}
				Analyze(b, s)
				b.ReportAllocs()
				for b.Loop() {
					if err := s.Read(ctx, func(tx store.Tx) error {
						got, err := tx.Executions(store.ExecutionFilter{Limit: 50})
						if err == nil && len(got) != 50 {
							err = fmt.Errorf("listed %d executions, want 50", len(got))
						}
						return err
					}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// PlanHashes returns every stack's hash of the executions asked for, however many (more than
// one query's worth), named twice or unknown.
func TestPlanHashes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		const n = 600
		var ids []string
		write(t, s, func(tx store.Tx) error {
			for i := range n {
				id := fmt.Sprintf("p%03d", i)
				ids = append(ids, id)
				if _, err := tx.CreateExecution(exec1(id, t0)); err != nil {
					return err
				}
				for j := range 1 + i%3 {
					st := &store.Stack{}
					st.StackState.Stack, st.Status, st.PlanHash = fmt.Sprintf("s%d", j), "succeeded", fmt.Sprintf("h%d-%d", i, j)
					if err := tx.SaveStack(id, st); err != nil {
						return err
					}
				}
			}
			return nil
		})
		asked := append(append([]string{"unknown"}, ids...), ids[:10]...)
		var got map[string]map[string]string
		if err := s.Read(ctx, func(tx store.Tx) (err error) { got, err = tx.PlanHashes(asked); return }); err != nil {
			t.Fatal(err)
		}
		if len(got) != n {
			t.Fatalf("hashes of %d executions, want %d", len(got), n)
		}
		for i, id := range ids {
			if len(got[id]) != 1+i%3 {
				t.Fatalf("%s: %v, want %d stacks", id, got[id], 1+i%3)
			}
			for j := range 1 + i%3 {
				if h := got[id][fmt.Sprintf("s%d", j)]; h != fmt.Sprintf("h%d-%d", i, j) {
					t.Fatalf("%s s%d: hash %q", id, j, h)
				}
			}
		}
		if err := s.Read(ctx, func(tx store.Tx) (err error) { got, err = tx.PlanHashes(nil); return }); err != nil || len(got) != 0 {
			t.Fatalf("no executions: %v, %v", got, err)
		}
	})
}

// ClaimsOn returns exactly the claims Claims lists for the environment that are on one of the
// stacks or held by the PR, sorted by stack: random claims over two environments, some
// expired, asked for with random stack lists (some longer than one query's worth, with
// repeats and unclaimed names) and PRs (0 included).
func TestClaimsOnIsClaimsFiltered(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		rng := rand.New(rand.NewPCG(4, 2))
		stack := func(i int) string { return fmt.Sprintf("stacks/s%04d", i) }
		write(t, s, func(tx store.Tx) error {
			for _, env := range []string{"prod", "dev"} {
				for i := range 700 {
					if rng.IntN(3) == 0 {
						continue
					}
					c := api.Claim{Environment: env, Stack: stack(i), PR: 1 + rng.IntN(6), ExecutionID: fmt.Sprint("x", i), SHA: "abc", ClaimedAt: t0}
					switch rng.IntN(3) {
					case 0:
						c.ExpiresAt = t0.Add(-time.Minute)
					case 1:
						c.ExpiresAt = t0.Add(time.Hour)
					}
					if err := tx.PutClaim(c); err != nil {
						return err
					}
				}
			}
			return nil
		})
		for round := range 40 {
			pr := rng.IntN(7)
			var stacks []string
			for range rng.IntN([]int{5, 50, 900}[round%3]) {
				stacks = append(stacks, stack(rng.IntN(750)))
			}
			asked := map[string]bool{}
			for _, st := range stacks {
				asked[st] = true
			}
			_ = s.Read(ctx, func(tx store.Tx) error {
				all, err := tx.Claims("", "prod", t0)
				if err != nil {
					t.Fatal(err)
				}
				var want []api.Claim
				for _, c := range all {
					if asked[c.Stack] || pr != 0 && c.PR == pr {
						want = append(want, c)
					}
				}
				got, err := tx.ClaimsOn(store.PRKey{Environment: "prod", PR: pr}, stacks, t0)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != len(want) || len(want) > 0 && !reflect.DeepEqual(got, want) {
					t.Fatalf("round %d (PR %d, %d stacks): got %d claims, want %d\ngot  %v\nwant %v", round, pr, len(stacks), len(got), len(want), got, want)
				}
				return nil
			})
		}
	})
}

// BenchmarkReleaseExecutionClaims has an execution claim 10 stacks and release them all, in
// an environment where other executions hold n claims.
func BenchmarkReleaseExecutionClaims(b *testing.B) {
	for _, be := range Backends() {
		for _, n := range []int{10000, 40000} {
			b.Run(fmt.Sprintf("%s/%d", be.Name, n), func(b *testing.B) {
				s := be.Open(b)
				if err := s.Write(ctx, func(tx store.Tx) error {
					for i := range n {
						if err := tx.PutClaim(api.Claim{Environment: "prod", Stack: fmt.Sprintf("other/%05d", i), PR: 100 + i%50,
							ExecutionID: fmt.Sprintf("x%d", 100+i%50), ClaimedAt: t0}); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
				Analyze(b, s)
				for b.Loop() {
					if err := s.Write(ctx, func(tx store.Tx) error {
						for i := range 10 {
							if err := tx.PutClaim(api.Claim{Environment: "prod", Stack: fmt.Sprintf("mine/%02d", i), PR: 1, ExecutionID: "x1", ClaimedAt: t0}); err != nil {
								return err
							}
						}
						released, err := tx.ReleaseExecutionClaims("prod", "x1", "")
						if err == nil && released != 10 {
							err = fmt.Errorf("released %d claims, want 10", released)
						}
						return err
					}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
