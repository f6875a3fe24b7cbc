package storetest

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// pageFilters are the filters a list is paged with: none, an environment, a PR, both.
var pageFilters = []store.ListFilter{{}, {Environment: "prod"}, {PR: 2}, {Environment: "prod", PR: 2}}

// keyOrder is the lists' order, newest first: At, then Environment, PR and Names, all
// descending. The seeded names are lower-case ASCII letters, which every collation orders alike.
func keyOrder(a, b store.RowKey) int {
	return cmp.Or(b.At.Compare(a.At), cmp.Compare(b.Environment, a.Environment), cmp.Compare(b.PR, a.PR),
		slices.Compare(b.Names, a.Names))
}

// walkPages lists every page of f, limit rows at a time, each after the last row of the one
// before it, and returns the rows' keys in the order listed.
func walkPages(t *testing.T, f store.ListFilter, limit int, list func(store.ListFilter) ([]store.RowKey, error)) []store.RowKey {
	t.Helper()
	var out []store.RowKey
	f.Limit = limit
	for pages := 0; ; pages++ {
		if pages > 500 {
			t.Fatalf("%+v: more than 500 pages", f)
		}
		page, err := list(f)
		if err != nil {
			t.Fatalf("%+v: %v", f, err)
		}
		if len(page) > limit {
			t.Fatalf("%+v: a page of %d rows, limit %d", f, len(page), limit)
		}
		out = append(out, page...)
		if len(page) < limit {
			return out
		}
		last := page[len(page)-1]
		f.After = &last
	}
}

// checkWalk fails unless walked is exactly the rows of all that f selects, each once, in the
// lists' order.
func checkWalk(t *testing.T, what string, f store.ListFilter, all, walked []store.RowKey) {
	t.Helper()
	var want []store.RowKey
	for _, k := range all {
		if (f.Environment == "" || k.Environment == f.Environment) && (f.PR == 0 || k.PR == f.PR) {
			want = append(want, k)
		}
	}
	slices.SortFunc(want, keyOrder)
	if len(want) == 0 {
		t.Fatalf("%s %+v: the seed has no such rows", what, f)
	}
	if !reflect.DeepEqual(walked, want) {
		t.Fatalf("%s %+v: the pages listed %d rows, want %d\ngot  %v\nwant %v", what, f, len(walked), len(want), walked, want)
	}
}

// Gates and checks, many of them recorded at the same instant, are listed page after page,
// each page after the last row of the one before: every row comes exactly once, in the lists'
// order (newest first, the key breaking ties), whatever the filter and the page size.
func TestListPagesWalkRowsOfTheSameTime(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		var gates, checks []store.RowKey
		write(t, s, func(tx store.Tx) error {
			for _, env := range []string{"dev", "prod", "qa"} {
				for pr := 1; pr <= 4; pr++ {
					// Three instants for twelve PRs: most rows share their time with others.
					at := t0.Add(time.Duration((pr+len(env))%3) * time.Second)
					var gs []api.Gate
					for _, class := range []string{"destructive", "mutating"} {
						for _, target := range []string{"a", "b", "c"} {
							gs = append(gs, api.Gate{Class: class, Target: target, RequiredAt: at})
							gates = append(gates, store.RowKey{At: at, Environment: env, PR: pr, Names: []string{class, target}})
						}
					}
					if err := tx.ReplaceGates(store.PRKey{Environment: env, PR: pr}, gs); err != nil {
						return err
					}
					for _, name := range []string{"apply", "plan", "lint"} {
						if err := tx.PutCheck(api.Check{Environment: env, PR: pr, Check: name, Conclusion: "success", UpdatedAt: at}); err != nil {
							return err
						}
						checks = append(checks, store.RowKey{At: at, Environment: env, PR: pr, Names: []string{name}})
					}
				}
			}
			return nil
		})
		listGates := func(f store.ListFilter) (out []store.RowKey, err error) {
			err = s.Read(ctx, func(tx store.Tx) error {
				gs, err := tx.Gates(f)
				for _, g := range gs {
					out = append(out, store.RowKey{At: g.RequiredAt, Environment: g.Environment, PR: g.PR, Names: []string{g.Class, g.Target}})
				}
				return err
			})
			return out, err
		}
		listChecks := func(f store.ListFilter) (out []store.RowKey, err error) {
			err = s.Read(ctx, func(tx store.Tx) error {
				cs, err := tx.Checks(f)
				for _, c := range cs {
					out = append(out, store.RowKey{At: c.UpdatedAt, Environment: c.Environment, PR: c.PR, Names: []string{c.Check}})
				}
				return err
			})
			return out, err
		}
		for _, f := range pageFilters {
			for _, limit := range []int{1, 4, 7, 1000} {
				t.Run(fmt.Sprintf("env=%q pr=%d limit=%d", f.Environment, f.PR, limit), func(t *testing.T) {
					checkWalk(t, "gates", f, gates, walkPages(t, f, limit, listGates))
					checkWalk(t, "checks", f, checks, walkPages(t, f, limit, listChecks))
				})
			}
		}
	})
}

// Grants, granted at the same instant, are listed page after page by id: every grant comes
// exactly once, newest (highest id) first, whatever the filter and the page size; Limit 0
// lists them all.
func TestGrantPagesWalkEveryGrantOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		var ids []int64
		write(t, s, func(tx store.Tx) error {
			for i := range 40 {
				id, err := tx.AddGrant(api.Grant{Environment: []string{"dev", "prod"}[i%2], PR: 1 + i%3, Class: "destructive", Target: "**", GrantedAt: t0})
				ids = append(ids, id)
				if err != nil {
					return err
				}
			}
			return nil
		})
		for _, lf := range pageFilters {
			f := store.GrantFilter{Environment: lf.Environment, PR: lf.PR}
			var want []int64
			for i, id := range ids {
				if (f.Environment == "" || f.Environment == []string{"dev", "prod"}[i%2]) && (f.PR == 0 || f.PR == 1+i%3) {
					want = append(want, id)
				}
			}
			slices.Reverse(want)
			for _, limit := range []int{0, 1, 3, 1000} {
				var got []int64
				f := f
				f.Limit = limit
				for f.Before = 0; len(got) <= len(ids); {
					var page []api.Grant
					if err := s.Read(ctx, func(tx store.Tx) (err error) { page, err = tx.Grants(f); return }); err != nil {
						t.Fatal(err)
					}
					for _, g := range page {
						got = append(got, g.ID)
					}
					if limit == 0 || len(page) < limit {
						break
					}
					f.Before = page[len(page)-1].ID
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%+v: listed %v, want %v", f, got, want)
				}
			}
		}
	})
}

// A page asked after a row the list does not hold (of another environment or PR than the
// filter's, or with a key of another list's shape) is refused, not listed from some other place.
func TestListPageAfterAnotherListsRowIsInvalid(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		gate := &store.RowKey{At: t0, Environment: "dev", PR: 2, Names: []string{"destructive", "**"}}
		check := &store.RowKey{At: t0, Environment: "dev", PR: 2, Names: []string{"plan"}}
		for _, c := range []struct {
			name string
			read func(tx store.Tx) error
		}{
			{"gates of prod after a dev gate", func(tx store.Tx) error {
				_, err := tx.Gates(store.ListFilter{Environment: "prod", After: gate})
				return err
			}},
			{"gates of PR 3 after a PR 2 gate", func(tx store.Tx) error { _, err := tx.Gates(store.ListFilter{PR: 3, After: gate}); return err }},
			{"gates after a check", func(tx store.Tx) error { _, err := tx.Gates(store.ListFilter{After: check}); return err }},
			{"checks of prod after a dev check", func(tx store.Tx) error {
				_, err := tx.Checks(store.ListFilter{Environment: "prod", After: check})
				return err
			}},
			{"checks after a gate", func(tx store.Tx) error { _, err := tx.Checks(store.ListFilter{After: gate}); return err }},
		} {
			if err := s.Read(ctx, c.read); !errors.Is(err, store.ErrInvalid) {
				t.Errorf("%s: %v, want ErrInvalid", c.name, err)
			}
		}
		// The same rows page their own lists.
		if err := s.Read(ctx, func(tx store.Tx) error {
			if _, err := tx.Gates(store.ListFilter{Environment: "dev", PR: 2, After: gate}); err != nil {
				return err
			}
			_, err := tx.Checks(store.ListFilter{Environment: "dev", After: check})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	})
}

// execKey is an execution's place in the executions list: its started_at as stored (Unix
// nanoseconds, 0 for the zero time) and its id.
type execKey struct {
	at int64
	id string
}

func keyOfExecution(e store.Execution) execKey {
	k := execKey{id: e.ExecutionID}
	if !e.StartedAt.IsZero() {
		k.at = e.StartedAt.UnixNano()
	}
	return k
}

// Executions, most of them started at one instant (of every environment and PR) and the others
// a nanosecond, a microsecond or a second apart, at the zero Unix time (stored as the zero time)
// or before it, are listed page after page, each page after the started_at and id of the last
// execution of the one before as listed: every execution comes exactly once, newest first, by id
// among those of the same instant, whatever the filter and the page size.
func TestExecutionPagesWalkExecutionsOfTheSameTime(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		instants := []time.Time{t0.Add(time.Nanosecond), t0.Add(time.Microsecond), t0.Add(-time.Second), time.Unix(0, 0), time.Unix(-5, 7)}
		var all []store.Execution
		write(t, s, func(tx store.Tx) error {
			for i := range 120 {
				// Ids out of the order of their times: lower-case letters and digits of one
				// length, which every collation orders alike.
				e := exec1(fmt.Sprintf("x%03d", (i*37)%120), t0)
				e.Environment, e.PR = []string{"dev", "prod", "qa"}[i%3], i%5 // PR 0: none
				// A quarter of them at other instants, the rest all at t0.
				if i%4 == 3 {
					e.StartedAt = instants[i%len(instants)]
				}
				if _, err := tx.CreateExecution(e); err != nil {
					return err
				}
				all = append(all, *e)
			}
			return nil
		})
		order := func(a, b execKey) int { return cmp.Or(cmp.Compare(b.at, a.at), cmp.Compare(b.id, a.id)) }
		for _, lf := range pageFilters {
			var want []execKey
			for _, e := range all {
				if (lf.Environment == "" || e.Environment == lf.Environment) && (lf.PR == 0 || e.PR == lf.PR) {
					want = append(want, keyOfExecution(e))
				}
			}
			slices.SortFunc(want, order)
			for _, limit := range []int{1, 3, 1000} {
				f := store.ExecutionFilter{Environment: lf.Environment, PR: lf.PR, Limit: limit}
				var got []execKey
				for pages := 0; ; pages++ {
					if pages > len(all) {
						t.Fatalf("%+v: more pages than executions", f)
					}
					var page []store.Execution
					if err := s.Read(ctx, func(tx store.Tx) (err error) { page, err = tx.Executions(f); return }); err != nil {
						t.Fatalf("%+v: %v", f, err)
					}
					for _, e := range page {
						got = append(got, keyOfExecution(e))
					}
					if len(page) < limit {
						break
					}
					f.Before, f.BeforeID = page[len(page)-1].StartedAt, page[len(page)-1].ExecutionID
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("env %q pr %d limit %d: the pages listed %d executions, want %d\ngot  %v\nwant %v", lf.Environment, lf.PR, limit, len(got), len(want), got, want)
				}
			}
		}
		// Each is listed with the started_at it was stored with, to the nanosecond (the zero Unix
		// time as the zero time).
		var listed []store.Execution
		if err := s.Read(ctx, func(tx store.Tx) (err error) { listed, err = tx.Executions(store.ExecutionFilter{Limit: 1000}); return }); err != nil {
			t.Fatal(err)
		}
		at := map[string]time.Time{}
		for _, e := range listed {
			at[e.ExecutionID] = e.StartedAt
		}
		for _, e := range all {
			want := e.StartedAt
			if want.Equal(time.Unix(0, 0)) {
				want = time.Time{}
			}
			if !at[e.ExecutionID].Equal(want) {
				t.Errorf("%s: listed started at %v, stored %v", e.ExecutionID, at[e.ExecutionID], e.StartedAt)
			}
		}
		// Before alone (the old paging) still lists the executions started before it.
		var older []store.Execution
		if err := s.Read(ctx, func(tx store.Tx) (err error) {
			older, err = tx.Executions(store.ExecutionFilter{Before: t0.Add(time.Nanosecond), Limit: 1000})
			return
		}); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range all {
			if e.StartedAt.Before(t0.Add(time.Nanosecond)) {
				n++
			}
		}
		if len(older) != n || slices.ContainsFunc(older, func(e store.Execution) bool { return !e.StartedAt.Before(t0.Add(time.Nanosecond)) }) {
			t.Fatalf("before %v alone: %d executions, want the %d started before it", t0.Add(time.Nanosecond), len(older), n)
		}
	})
}
