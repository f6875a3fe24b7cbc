package sqlstore_test

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

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
	for _, c := range []struct {
		name    string
		dialect sqlstore.Dialect
		// db names a fresh database, and open opens it as the store.
		db func(t *testing.T) (driver, dsn string, open func() (*sqlstore.DB, error))
	}{
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
	} {
		t.Run(c.name, func(t *testing.T) {
			driver, dsn, open := c.db(t)
			db, err := sql.Open(driver, dsn)
			if err != nil {
				t.Fatal(err)
			}
			if err := sqlstore.MigrateTo(ctx, c.dialect, db, 5); err != nil {
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
			defer s.Close()
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
