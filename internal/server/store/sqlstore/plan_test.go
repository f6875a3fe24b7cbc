package sqlstore_test

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/postgres"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlite"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlstore"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
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
	return s, record(s)
}

// record records the statements of s's transactions from now on; the function it returns
// returns those recorded since its last call.
func record(s *sqlstore.DB) func() []statement {
	var mu sync.Mutex
	var seen []statement
	sqlstore.SetTrace(s, func(q string, args []any) {
		mu.Lock()
		seen = append(seen, statement{q, append([]any(nil), args...)})
		mu.Unlock()
	})
	return func() []statement {
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
	// tableOrder allows a SCAN of the table: its rowid is the order asked for, so the scan stops
	// after the rows it returns.
	tableOrder bool
	// index, for a list page, is the index PostgreSQL must read it from (or one of several,
	// separated by "|"), and cond, for a page after a cursor, what the index's condition must
	// hold (the cursor's range).
	index, cond string
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
				if strings.HasPrefix(step, "SCAN ") && !strings.Contains(step, " USING ") && !c.tableOrder || !c.sortOK && strings.Contains(step, "TEMP B-TREE") {
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

// listRepo is the repository the lists are filtered by in the plan tests.
const listRepo = "acme/infra"

// filters are the filters of a list: by repository, environment and PR, each given or not,
// except a PR without its repository (the service refuses it).
func filters() []store.PRKey {
	var out []store.PRKey
	for _, repo := range []string{"", listRepo} {
		for _, env := range []string{"", "prod"} {
			for _, pr := range []int{0, 7} {
				if pr == 0 || repo != "" {
					out = append(out, store.PRKey{Repo: repo, Environment: env, PR: pr})
				}
			}
		}
	}
	return out
}

// pgIndexes are the indexes PostgreSQL may read a page of table filtered by k from: the one
// made for the filter or, for a PR of a repository in an environment, the PR's (the PR's rows of
// other environments are few).
func pgIndexes(table, order string, k store.PRKey) string {
	out := table + filterSuffix(k.Repo, k.Environment, k.PR) + "_" + order
	if k.Repo != "" && k.Environment != "" && k.PR != 0 {
		out += "|" + table + filterSuffix(k.Repo, "", k.PR) + "_" + order
	}
	return out
}

// executionPageCases are the pages of the executions list, unfiltered or by repository,
// environment, PR, or some of them: the first, one before a time alone (the old paging) and one
// after an execution (its started_at and id), each with the index that must hold its rows in the
// order the page lists them and the range of it the page reads (as SQLite says them).
func executionPageCases() []planCase {
	var cases []planCase
	for _, k := range filters() {
		repo, env, pr := k.Repo, k.Environment, k.PR
		{
			index := "executions" + filterSuffix(repo, env, pr) + "_started"
			pgIndex := pgIndexes("executions", "started", k)
			for _, p := range []struct {
				name     string
				before   time.Time
				beforeID string
				free     []string // the columns of the range after the cursor, none on the first page
				cond     string   // PostgreSQL's index condition of that range
			}{
				// The cursor amid the rows TestListPagesUseIndexesOnPostgres seeds.
				{"first", time.Time{}, "", nil, ""},
				{"before a time", t0.Add(20 * time.Second), "", []string{"started_at"}, "(started_at < "},
				{"after an execution", t0.Add(20 * time.Second), "prod-20-1", []string{"started_at", "id"}, "(ROW(started_at, id) < ROW("},
			} {
				f := store.ExecutionFilter{Repo: repo, Environment: env, PR: pr, Before: p.before, BeforeID: p.beforeID, Limit: 50}
				cases = append(cases, planCase{name: fmt.Sprintf("executions repo %q env %q pr %d %s", repo, env, pr, p.name), index: pgIndex, cond: p.cond,
					want: pageStep(index, filterEqs(repo, env, pr), p.free, p.free != nil),
					read: func(tx store.Tx) error { _, err := tx.Executions(f); return err }})
			}
		}
	}
	return cases
}

// The executions list, filtered or not, reads the newest rows from an index in the order it
// returns them, a later page from where it starts: no sort of every matching row, however many
// match, and no walk through the pages before it.
func TestExecutionsListUsesIndexes(t *testing.T) {
	s, drain := traced(t)
	checkPlans(t, s, drain, executionPageCases())
}

// Grants filtered by environment, PR, class or target (what gate decisions read) search their
// index for what was given, in id order, instead of scanning the table; so do the plan hashes a
// gates listing reads and a later page of the audit log. The lists' pages: TestListPagesUseIndexes.
func TestGateListingsUseIndexes(t *testing.T) {
	s, drain := traced(t)
	grants := func(f store.GrantFilter) func(tx store.Tx) error {
		return func(tx store.Tx) error { _, err := tx.Grants(f); return err }
	}
	var cases []planCase
	for _, active := range []time.Time{{}, t0} {
		for f, want := range map[store.GrantFilter]string{
			{Repo: listRepo, Environment: "prod", PR: 7, Class: "destructive", Target: "**"}: "grants_repo_key (repo=? AND environment=? AND pr=? AND class=? AND target=?)",
			{Repo: listRepo, Environment: "prod", PR: 7}:                                     "grants_repo_env_pr_id (repo=? AND environment=? AND pr=?)",
			{Repo: listRepo, Environment: "prod"}:                                            "grants_repo_env_id (repo=? AND environment=?)",
			{Environment: "prod"}:                                                            "grants_env_id (environment=?)",
		} {
			f.ActiveAt = active
			cases = append(cases, planCase{name: fmt.Sprintf("grants %+v", f), read: grants(f), want: want})
		}
	}
	cases = append(cases,
		planCase{name: "plan hashes", read: func(tx store.Tx) error { _, err := tx.PlanHashes([]string{"p1", "p2", "p3"}); return err },
			want: "sqlite_autoindex_stacks_1 (execution_id=?)"},
		planCase{name: "a later page of the audit log", read: func(tx store.Tx) error { _, err := tx.Audit("", 50, 1000); return err },
			want: "INTEGER PRIMARY KEY (rowid<?)"},
		planCase{name: "a repository's audit log", read: func(tx store.Tx) error { _, err := tx.Audit(listRepo, 50, 0); return err },
			want: "audit_repo_id (repo=?)"},
		planCase{name: "a later page of a repository's audit log", read: func(tx store.Tx) error { _, err := tx.Audit(listRepo, 50, 1000); return err },
			want: "audit_repo_id (repo=? AND id<?)"},
	)
	checkPlans(t, s, drain, cases)
}

// pageStep is the step of SQLite's plan of a list page read from index: the filter's equalities
// eqs and, on a later page, the range after the cursor on the columns free the filter leaves
// free.
func pageStep(index string, eqs, free []string, later bool) string {
	switch {
	case later && len(free) == 1:
		eqs = append(eqs, free[0]+"<?")
	case later:
		eqs = append(eqs, "("+strings.Join(free, ",")+")<(?"+strings.Repeat(",?", len(free)-1)+")")
	}
	if len(eqs) == 0 {
		return "INDEX " + index
	}
	return index + " (" + strings.Join(eqs, " AND ") + ")"
}

// filterSuffix is the part of the name of a list's index that says the filter it serves: by
// repository, environment, PR, some of them, or none.
func filterSuffix(repo, env string, pr int) string {
	s := ""
	if repo != "" {
		s += "_repo"
	}
	if env != "" {
		s += "_env"
	}
	if pr != 0 {
		s += "_pr"
	}
	return s
}

// filterEqs are the equalities of SQLite's plan of a list filtered by repo, env and pr (zero:
// any).
func filterEqs(repo, env string, pr int) []string {
	var eqs []string
	if repo != "" {
		eqs = append(eqs, "repo=?")
	}
	if env != "" {
		eqs = append(eqs, "environment=?")
	}
	if pr != 0 {
		eqs = append(eqs, "pr=?")
	}
	return eqs
}

// listPageCases are the pages of the gates, grants and checks lists, unfiltered or by
// environment, PR, or both, the first and a later one, each with the index that must hold its
// rows in the order the page lists them and the range of it the page reads (as SQLite says them).
func listPageCases() []planCase {
	var cases []planCase
	for _, k := range filters() {
		repo, env, pr := k.Repo, k.Environment, k.PR
		{
			suffix, eqs := filterSuffix(repo, env, pr), filterEqs(repo, env, pr)
			free := func(cols ...string) []string {
				var out []string
				for _, c := range cols {
					if c == "repo" && repo != "" || c == "environment" && env != "" || c == "pr" && pr != 0 {
						continue
					}
					out = append(out, c)
				}
				return out
			}
			for _, later := range []bool{false, true} {
				gates, checks := store.ListFilter{Repo: repo, Environment: env, PR: pr, Limit: 50}, store.ListFilter{Repo: repo, Environment: env, PR: pr, Limit: 50}
				grants := store.GrantFilter{Repo: repo, Environment: env, PR: pr, Limit: 50}
				if later {
					key := store.RowKey{At: t0, Repo: cmp.Or(repo, "acme/other"), Environment: cmp.Or(env, "dev"), PR: cmp.Or(pr, 3)}
					gate, check := key, key
					gate.Names, check.Names = []string{"destructive", "**"}, []string{"plan"}
					gates.After, checks.After, grants.Before = &gate, &check, 1000
				}
				name := fmt.Sprintf("repo %q env %q pr %d later %v", repo, env, pr, later)
				// cond is PostgreSQL's index condition of a later page's range: a row value, or an id.
				cond := func(c string) string { return map[bool]string{true: c}[later] }
				grantIndex, grantWant := pgIndexes("grants", "id", k), pageStep("grants"+suffix+"_id", eqs, []string{"id"}, later)
				if suffix == "" {
					grantIndex = "grants_pkey" // PostgreSQL's name; SQLite's primary key is the rowid
					grantWant = map[bool]string{false: "SCAN grants", true: "INTEGER PRIMARY KEY (rowid<?)"}[later]
				}
				cases = append(cases,
					planCase{name: "gates " + name, index: pgIndexes("gates", "required", k), cond: cond("ROW("),
						want: pageStep("gates"+suffix+"_required", eqs, free("required_at", "repo", "environment", "pr", "class", "target"), later),
						read: func(tx store.Tx) error { _, err := tx.Gates(gates); return err }},
					planCase{name: "checks " + name, index: pgIndexes("checks", "updated", k), cond: cond("ROW("),
						want: pageStep("checks"+suffix+"_updated", eqs, free("updated_at", "repo", "environment", "pr", "name"), later),
						read: func(tx store.Tx) error { _, err := tx.Checks(checks); return err }},
					// The unfiltered first page reads the table itself, in its rowid's order.
					planCase{name: "grants " + name, index: grantIndex, cond: cond("(id < "), want: grantWant, tableOrder: suffix == "" && !later,
						read: func(tx store.Tx) error { _, err := tx.Grants(grants); return err }},
				)
			}
		}
	}
	return cases
}

// Every page of the gates, grants and checks lists, the first or a later one, reads its rows
// from an index in the order it lists them, starting where the page starts: no sort of the
// matching rows, no walk through the pages before it.
func TestListPagesUseIndexes(t *testing.T) {
	s, drain := traced(t)
	checkPlans(t, s, drain, listPageCases())
}

// The claims a decision reads are found through the PR's index and the primary key, not by
// scanning the environment's claims.
func TestClaimsOnUsesIndexes(t *testing.T) {
	s, drain := traced(t)
	on := func(pr int, stacks ...string) func(tx store.Tx) error {
		return func(tx store.Tx) error {
			_, err := tx.ClaimsOn(store.PRKey{Repo: listRepo, Environment: "prod", PR: pr}, stacks, t0)
			return err
		}
	}
	checkPlans(t, s, drain, []planCase{
		{name: "a PR's claims", read: on(7), want: "claims_repo_env_pr (repo=? AND environment=? AND pr=?)"},
		{name: "claims on stacks", read: on(0, "a", "b", "c"), want: "sqlite_autoindex_claims_1 (repo=? AND environment=? AND stack=?)"},
		{name: "both", read: on(7, "a", "b", "c"), want: "claims_repo_env_pr (repo=? AND environment=? AND pr=?)"},
	})
}

// Releasing an execution's claims finds them through an index, whether it names a stack or not.
func TestReleaseExecutionClaimsUsesIndexes(t *testing.T) {
	s, drain := traced(t)
	release := func(stack string) func(tx store.Tx) error {
		return func(tx store.Tx) error { _, err := tx.ReleaseExecutionClaims("prod", "x1", stack); return err }
	}
	checkPlans(t, s, drain, []planCase{
		{name: "one stack", read: release("a"), want: "claims_env_exec (environment=? AND execution_id=?)", write: true},
		{name: "every stack", read: release(""), want: "claims_env_exec (environment=? AND execution_id=?)", write: true},
	})
}

// The latest plan of a PR reads the index that orders a repository's PR's executions by arrival;
// the indexes before it, executions_env_pr, which no query read (migration 005), and
// executions_env_pr_received, which knew no repository (migration 007), are gone.
func TestLatestPlanUsesItsIndex(t *testing.T) {
	s, drain := traced(t)
	checkPlans(t, s, drain, []planCase{{
		name: "LatestPlan",
		read: func(tx store.Tx) error {
			_, err := tx.LatestPlan(store.PRKey{Environment: "prod", PR: 7})
			if errors.Is(err, store.ErrNotFound) {
				return nil
			}
			return err
		},
		want: "executions_repo_env_pr_received",
		// Only executions received in the same nanosecond are sorted, by id.
		sortOK: true,
	}})
	for _, name := range []string{"executions_env_pr", "executions_env_pr_received"} {
		var n int
		if err := sqlstore.ReadDB(s).QueryRow("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = ?", name).Scan(&n); err != nil || n != 0 {
			t.Fatalf("index %s: %d (%v), want dropped", name, n, err)
		}
	}
}

// On PostgreSQL too, every page of the executions, gates, grants and checks lists reads its rows
// from its index in the order it lists them, a later page from where it starts: with sequential
// scans and sorts priced out (on tables this small either would be cheapest), a plan that still
// scans or sorts has no index that serves the page.
func TestListPagesUseIndexesOnPostgres(t *testing.T) {
	u, channel := storetest.PostgresURL(t)
	s, err := postgres.Open(ctx, u, postgres.Options{Channel: channel})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	drain := record(s)
	// Rows of eight repositories, six environments and forty PRs, with statistics: what tells
	// the planner that a repository, an environment and a PR together select fewer rows than
	// any of them.
	if err := s.Write(ctx, func(tx store.Tx) error {
		for r, repo := range []string{"acme/infra", "acme/other", "beta/infra", "beta/other", "gamma/infra", "gamma/other", "delta/infra", "delta/other"} {
			for _, env := range []string{"dev", "prod", "qa", "stage", "eu", "us"} {
				for pr := 1; pr <= 40; pr++ {
					at := t0.Add(time.Duration(pr) * time.Second)
					key := store.PRKey{Repo: repo, Environment: env, PR: pr}
					if err := tx.ReplaceGates(key, []api.Gate{{Class: "destructive", Target: "**", RequiredAt: at}, {Class: "mutating", Target: "**", RequiredAt: at}}); err != nil {
						return err
					}
					for _, name := range []string{"plan", "apply"} {
						if err := tx.PutCheck(api.Check{Repo: repo, Environment: env, PR: pr, Check: name, Conclusion: "success", UpdatedAt: at}); err != nil {
							return err
						}
					}
					if _, err := tx.AddGrant(api.Grant{Repo: repo, Environment: env, PR: pr, Class: "destructive", Target: "**", GrantedAt: at}); err != nil {
						return err
					}
					for i := range 2 {
						e := &store.Execution{}
						e.ExecutionID, e.Repo, e.Environment, e.PR, e.Op, e.Status, e.StartedAt = fmt.Sprintf("%s-%d-%d-%d", env, pr, i, r), repo, env, pr, "plan", "running", at
						if _, err := tx.CreateExecution(e); err != nil {
							return err
						}
					}
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	conn, err := sqlstore.ReadDB(s).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// random_page_cost as on the SSDs a server runs on (PostgreSQL's own default prices a disk
	// that seeks): otherwise a table this small, written in id order, is cheaper to read by id
	// and filter than through the index that holds exactly the page.
	if _, err := conn.ExecContext(ctx, "ANALYZE; SET enable_seqscan = off; SET enable_sort = off; SET random_page_cost = 1.1"); err != nil {
		t.Fatal(err)
	}
	for _, c := range append(executionPageCases(), listPageCases()...) {
		drain()
		if err := s.Read(ctx, c.read); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		sts := drain()
		if len(sts) != 1 {
			t.Fatalf("%s: ran %d statements, want 1", c.name, len(sts))
		}
		rows, err := conn.QueryContext(ctx, "EXPLAIN "+sts[0].query, sts[0].args...)
		if err != nil {
			t.Fatalf("%s: explain %s: %v", c.name, sts[0].query, err)
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, strings.TrimSpace(line))
		}
		rows.Close()
		text := strings.Join(plan, "\n")
		var cond string // the index condition
		for _, line := range plan {
			if strings.HasPrefix(line, "Index Cond:") {
				cond = line
			}
		}
		switch {
		case strings.Contains(text, "Sort") || strings.Contains(text, "Seq Scan"):
			t.Errorf("%s sorts or scans: %s\n%s", c.name, sts[0].query, text)
		case !slices.ContainsFunc(strings.Split(c.index, "|"), func(ix string) bool { return strings.Contains(text, " using "+ix+" on ") }):
			t.Errorf("%s: does not read %s: %s\n%s", c.name, c.index, sts[0].query, text)
		case !strings.Contains(cond, c.cond):
			t.Errorf("%s: the index condition does not start at the cursor: %s\n%s", c.name, sts[0].query, text)
		}
	}
}
