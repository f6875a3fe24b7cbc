package sqlstore_test

import (
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/postgres"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlite"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlstore"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// A database whose gates were recorded before gates had a time (migration 006) gives each the
// time its plan arrived, and a gate of no known plan the zero time; both drivers.
func TestOldGatesGetTheirPlansArrival(t *testing.T) {
	arrived := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	seed := []string{
		fmt.Sprintf("INSERT INTO executions (id, environment, op, status, pr, started_at, received_at) VALUES ('p1', 'prod', 'plan', 'succeeded', 1, 1, %d)",
			arrived.UnixNano()),
		"INSERT INTO gates (environment, pr, execution_id, class, target) VALUES ('prod', 1, 'p1', 'destructive', '**')",
		"INSERT INTO gates (environment, pr, execution_id, class, target) VALUES ('prod', 2, 'gone', 'destructive', '**')",
	}
	for _, c := range oldDatabases() {
		t.Run(c.name, func(t *testing.T) {
			s := seeded(t, c, 5, seed)
			var gates []store.RowKey
			if err := s.Read(ctx, func(tx store.Tx) error {
				gs, err := tx.Gates(store.ListFilter{})
				for _, g := range gs {
					gates = append(gates, store.RowKey{At: g.RequiredAt, PR: g.PR})
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if len(gates) != 2 || gates[0].PR != 1 || !gates[0].At.Equal(arrived) || gates[1].PR != 2 || !gates[1].At.IsZero() {
				t.Fatalf("gates %+v, want PR 1's at %v, then PR 2's at the zero time", gates, arrived)
			}
		})
	}
}

// oldDatabase is a database of a server from before some migration, on one driver.
type oldDatabase struct {
	name    string
	dialect sqlstore.Dialect
	// db names a fresh database, and open opens it as the store.
	db func(t *testing.T) (driver, dsn string, open func() (*sqlstore.DB, error))
}

// oldDatabases are a fresh database of each driver.
func oldDatabases() []oldDatabase {
	return []oldDatabase{
		{name: "sqlite", dialect: sqlstore.Dialect{Name: "sqlite", IDType: "INTEGER PRIMARY KEY AUTOINCREMENT", BlobType: "BLOB"},
			db: func(t *testing.T) (string, string, func() (*sqlstore.DB, error)) {
				path := filepath.Join(t.TempDir(), "old.db")
				return "sqlite", "file:" + path, func() (*sqlstore.DB, error) { return sqlite.Open(ctx, path) }
			}},
		{name: "postgres", dialect: sqlstore.Dialect{Name: "postgres", Dollar: true, IDType: "BIGSERIAL PRIMARY KEY", BlobType: "BYTEA"},
			db: func(t *testing.T) (string, string, func() (*sqlstore.DB, error)) {
				u, channel := storetest.PostgresURL(t)
				return "pgx", u, func() (*sqlstore.DB, error) { return postgres.Open(ctx, u, postgres.Options{Channel: channel}) }
			}},
	}
}

// seeded opens, as the store, a database of c's driver migrated up to version upTo with the
// rows seed inserts.
func seeded(t *testing.T, c oldDatabase, upTo int, seed []string) *sqlstore.DB {
	t.Helper()
	driver, dsn, open := c.db(t)
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := sqlstore.MigrateTo(ctx, c.dialect, db, upTo); err != nil {
		t.Fatal(err)
	}
	for _, q := range seed {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	_ = db.Close()
	s, err := open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// The rows of a server from before repositories (migration 007) take the repository of the
// execution they came from, lowercased: claims, gates, grants and leases by their execution,
// checks by their PR's latest execution; a row whose execution named none keeps ”. Each is then
// found under its repository's key, and the PR of another repository is another PR.
func TestRowsMoveIntoTheirRepository(t *testing.T) {
	seed := []string{
		"INSERT INTO executions (id, repo, environment, op, status, pr, started_at, received_at, principal) VALUES ('p1', 'Acme/Infra', 'prod', 'plan', 'succeeded', 1, 1, 10, 'ci')",
		"INSERT INTO executions (id, repo, environment, op, status, pr, started_at, received_at, principal) VALUES ('p2', '', 'prod', 'plan', 'succeeded', 2, 1, 20, 'ci')",
		"INSERT INTO executions (id, repo, environment, op, status, pr, started_at, received_at, principal) VALUES ('a1', 'Acme/Infra', 'prod', 'apply', 'succeeded', 1, 1, 30, 'ci')",
		"INSERT INTO claims (environment, stack, pr, execution_id) VALUES ('prod', 'stacks/a', 1, 'p1')",
		"INSERT INTO claims (environment, stack, pr, execution_id) VALUES ('prod', 'stacks/b', 2, 'p2')",
		"INSERT INTO gates (environment, pr, execution_id, class, target, required_at) VALUES ('prod', 1, 'p1', 'destructive', '**', 5)",
		"INSERT INTO grants (environment, pr, class, target, execution_id) VALUES ('prod', 1, 'destructive', '**', 'p1')",
		"INSERT INTO leases (execution_id, environment, pr, plan_id) VALUES ('a1', 'prod', 1, 'p1')",
		"INSERT INTO checks (environment, pr, name, conclusion, updated_at) VALUES ('prod', 1, 'tfstackplan/plan', 'success', 7)",
		"INSERT INTO checks (environment, pr, name, conclusion, updated_at) VALUES ('prod', 9, 'tfstackplan/plan', 'success', 7)",
		"INSERT INTO audit (at, principal, action) VALUES (1, 'ci', 'gate.check')",
	}
	const repo = "acme/infra"
	for _, c := range oldDatabases() {
		t.Run(c.name, func(t *testing.T) {
			s := seeded(t, c, 6, seed)
			key := store.PRKey{Repo: repo, Environment: "prod", PR: 1}
			if err := s.Read(ctx, func(tx store.Tx) error {
				plan, err := tx.LatestPlan(key)
				if err != nil || plan.ExecutionID != "p1" || plan.Repo != repo {
					return fmt.Errorf("latest plan %+v, %v; want p1 of %s", plan, err, repo)
				}
				if _, err := tx.LatestPlan(store.PRKey{Repo: "other/infra", Environment: "prod", PR: 1}); !errors.Is(err, store.ErrNotFound) {
					return fmt.Errorf("latest plan of PR 1 of another repository: %v, want not found", err)
				}
				claims, err := tx.Claims("", "", time.Unix(0, 0))
				if err != nil || len(claims) != 2 || claims[0].Repo != "" || claims[0].Stack != "stacks/b" || claims[1].Repo != repo {
					return fmt.Errorf("claims %+v, %v; want stacks/b of '' and stacks/a of %s", claims, err, repo)
				}
				gates, err := tx.Gates(store.ListFilter{Repo: repo})
				if err != nil || len(gates) != 1 || gates[0].Repo != repo || gates[0].PR != 1 {
					return fmt.Errorf("gates %+v, %v", gates, err)
				}
				grants, err := tx.Grants(store.GrantFilter{Repo: repo, Environment: "prod", PR: 1})
				if err != nil || len(grants) != 1 {
					return fmt.Errorf("grants %+v, %v", grants, err)
				}
				l, err := tx.Lease("a1")
				if err != nil || l.Repo != repo {
					return fmt.Errorf("lease %+v, %v", l, err)
				}
				if ch, err := tx.Check(key, "tfstackplan/plan"); err != nil || ch.Repo != repo {
					return fmt.Errorf("check %+v, %v", ch, err)
				}
				if ch, err := tx.Check(store.PRKey{Environment: "prod", PR: 9}, "tfstackplan/plan"); err != nil || ch.Repo != "" {
					return fmt.Errorf("check of a PR without executions %+v, %v; want it kept under ''", ch, err)
				}
				entries, err := tx.Audit("", 10, 0)
				if err != nil || len(entries) != 1 || entries[0].Repo != "" {
					return fmt.Errorf("audit %+v, %v", entries, err)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			// The same PR number of another repository claims the same stack beside it.
			if err := s.Write(ctx, func(tx store.Tx) error {
				return tx.PutClaim(api.Claim{Repo: "other/infra", Environment: "prod", Stack: "stacks/a", PR: 1, ExecutionID: "o1"})
			}); err != nil {
				t.Fatal(err)
			}
			if err := s.Read(ctx, func(tx store.Tx) error {
				on, err := tx.ClaimsOn(key, []string{"stacks/a"}, time.Unix(0, 0))
				if err != nil || len(on) != 1 || on[0].ExecutionID != "p1" {
					return fmt.Errorf("claims of %s on stacks/a %+v, %v; want p1's alone", repo, on, err)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
