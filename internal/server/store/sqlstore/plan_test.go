package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlite"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlstore"
)

var ctx = context.Background()

// statement is one statement a store method ran.
type statement struct {
	query string
	args  []any
}

// traced opens a SQLite store whose statements are recorded.
func traced(t *testing.T) (*sqlstore.DB, func() []statement) {
	t.Helper()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	var mu sync.Mutex
	var seen []statement
	sqlstore.SetTrace(s, func(q string, args []any) {
		mu.Lock()
		seen = append(seen, statement{q, append([]any(nil), args...)})
		mu.Unlock()
	})
	return s, func() []statement {
		mu.Lock()
		defer mu.Unlock()
		out := seen
		seen = nil
		return out
	}
}

// queryPlan is SQLite's EXPLAIN QUERY PLAN of st, one step a line.
func queryPlan(t *testing.T, db *sql.DB, st statement) []string {
	t.Helper()
	rows, err := db.QueryContext(ctx, "EXPLAIN QUERY PLAN "+st.query, st.args...)
	if err != nil {
		t.Fatalf("explain %s: %v", st.query, err)
	}
	defer rows.Close()
	var steps []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		steps = append(steps, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return steps
}

// planCase is a read whose every statement must find its rows through an index, in the
// order asked for.
type planCase struct {
	name string
	read func(tx store.Tx) error
	// want is a step some statement's plan must have (the index it must use).
	want string
	// sortOK allows a temporary b-tree: the read returns every row it finds, so sorting them
	// costs no more than returning them.
	sortOK bool
	// write runs read in a write transaction.
	write bool
}

// checkPlans runs each case's read and fails when a statement's plan scans a table, sorts in
// a temporary b-tree, or lacks the wanted step.
func checkPlans(t *testing.T, s *sqlstore.DB, drain func() []statement, cases []planCase) {
	t.Helper()
	for _, c := range cases {
		drain()
		run := s.Read
		if c.write {
			run = s.Write
		}
		if err := run(ctx, c.read); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		sts := drain()
		if len(sts) == 0 {
			t.Fatalf("%s: ran no statement", c.name)
		}
		found := false
		for _, st := range sts {
			steps := queryPlan(t, sqlstore.ReadDB(s), st)
			for _, step := range steps {
				if strings.HasPrefix(step, "SCAN ") && !strings.Contains(step, " USING ") || !c.sortOK && strings.Contains(step, "TEMP B-TREE") {
					t.Errorf("%s: %s\n  plan: %s", c.name, st.query, strings.Join(steps, "; "))
				}
				found = found || strings.Contains(step, c.want)
			}
		}
		if !found {
			var plans []string
			for _, st := range sts {
				plans = append(plans, strings.Join(queryPlan(t, sqlstore.ReadDB(s), st), "; "))
			}
			t.Errorf("%s: no plan uses %q: %s", c.name, c.want, strings.Join(plans, " | "))
		}
	}
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// The executions list, filtered or not, reads the newest rows from an index in the order it
// returns them: no sort of every matching row, however many match.
func TestExecutionsListUsesIndexes(t *testing.T) {
	s, drain := traced(t)
	list := func(f store.ExecutionFilter) func(tx store.Tx) error {
		return func(tx store.Tx) error { _, err := tx.Executions(f); return err }
	}
	var cases []planCase
	for _, env := range []string{"", "prod"} {
		for _, pr := range []int{0, 7} {
			for _, before := range []time.Time{{}, t0} {
				f := store.ExecutionFilter{Environment: env, PR: pr, Before: before, Limit: 50}
				want := "executions_started"
				switch {
				case env != "" && pr != 0:
					want = "executions_env_pr_started"
				case env != "":
					want = "executions_env_started"
				case pr != 0:
					want = "executions_pr_started"
				}
				cases = append(cases, planCase{name: fmt.Sprintf("%+v", f), read: list(f), want: want})
			}
		}
	}
	checkPlans(t, s, drain, cases)
}

// Gates, grants and checks filtered by environment, PR, class or target search their index
// for what was given instead of scanning the table; so do the plan hashes a gates listing
// reads.
func TestGateListingsUseIndexes(t *testing.T) {
	s, drain := traced(t)
	grants := func(f store.GrantFilter) func(tx store.Tx) error {
		return func(tx store.Tx) error { _, err := tx.Grants(f); return err }
	}
	gates := func(env string, pr int) func(tx store.Tx) error {
		return func(tx store.Tx) error { _, err := tx.Gates(env, pr); return err }
	}
	checks := func(env string, pr int) func(tx store.Tx) error {
		return func(tx store.Tx) error { _, err := tx.Checks(env, pr); return err }
	}
	var cases []planCase
	for _, active := range []time.Time{{}, t0} {
		for _, f := range []store.GrantFilter{
			{Environment: "prod", PR: 7, Class: "destructive", Target: "**"},
			{Environment: "prod", PR: 7},
			{Environment: "prod"},
		} {
			f.ActiveAt = active
			cases = append(cases, planCase{name: fmt.Sprintf("grants %+v", f), read: grants(f), want: "grants_key", sortOK: true})
		}
	}
	cases = append(cases,
		planCase{name: "plan hashes", read: func(tx store.Tx) error { _, err := tx.PlanHashes([]string{"p1", "p2", "p3"}); return err },
			want: "sqlite_autoindex_stacks_1 (execution_id=?)"},
		planCase{name: "gates of a PR", read: gates("prod", 7), want: "sqlite_autoindex_gates_1 (environment=? AND pr=?)"},
		planCase{name: "gates of an environment", read: gates("prod", 0), want: "sqlite_autoindex_gates_1 (environment=?)"},
		planCase{name: "checks of a PR", read: checks("prod", 7), want: "sqlite_autoindex_checks_1 (environment=? AND pr=?)"},
		planCase{name: "checks of an environment", read: checks("prod", 0), want: "sqlite_autoindex_checks_1 (environment=?)"},
		planCase{name: "a later page of the audit log", read: func(tx store.Tx) error { _, err := tx.Audit(50, 1000); return err },
			want: "INTEGER PRIMARY KEY (rowid<?)"},
	)
	checkPlans(t, s, drain, cases)
}

// The claims a decision reads are found through the PR's index and the primary key, not by
// scanning the environment's claims.
func TestClaimsOnUsesIndexes(t *testing.T) {
	s, drain := traced(t)
	on := func(pr int, stacks ...string) func(tx store.Tx) error {
		return func(tx store.Tx) error { _, err := tx.ClaimsOn("prod", pr, stacks, t0); return err }
	}
	checkPlans(t, s, drain, []planCase{
		{name: "a PR's claims", read: on(7), want: "claims_env_pr (environment=? AND pr=?)"},
		{name: "claims on stacks", read: on(0, "a", "b", "c"), want: "sqlite_autoindex_claims_1 (environment=? AND stack=?)"},
		{name: "both", read: on(7, "a", "b", "c"), want: "claims_env_pr (environment=? AND pr=?)"},
	})
}

// Releasing an execution's claims finds them through an index, whether it names a stack or not.
func TestReleaseExecutionClaimsUsesIndexes(t *testing.T) {
	s, drain := traced(t)
	release := func(stack string) func(tx store.Tx) error {
		return func(tx store.Tx) error { _, err := tx.ReleaseExecutionClaims("prod", "x1", stack); return err }
	}
	checkPlans(t, s, drain, []planCase{
		{name: "one stack", read: release("a"), want: "sqlite_autoindex_claims_1 (environment=? AND stack=?)", write: true},
		{name: "every stack", read: release(""), want: "claims_env_exec (environment=? AND execution_id=?)", write: true},
	})
}

// The latest plan of a PR reads the index that orders a PR's executions by arrival; the index
// before it, executions_env_pr, which no query read, is gone (migration 005).
func TestLatestPlanUsesItsIndex(t *testing.T) {
	s, drain := traced(t)
	checkPlans(t, s, drain, []planCase{{
		name: "LatestPlan",
		read: func(tx store.Tx) error {
			_, err := tx.LatestPlan("prod", 7)
			if errors.Is(err, store.ErrNotFound) {
				return nil
			}
			return err
		},
		want: "executions_env_pr_received",
		// Only executions received in the same nanosecond are sorted, by id.
		sortOK: true,
	}})
	var n int
	if err := sqlstore.ReadDB(s).QueryRow("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'executions_env_pr'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("index executions_env_pr: %d (%v), want dropped", n, err)
	}
}
