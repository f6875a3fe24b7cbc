// Package storetest opens every store backend for tests, and holds the one store test suite run
// against each: SQLite in a temporary directory always, PostgreSQL in a fresh schema when
// TFSTACKPLAN_TEST_POSTGRES names a server.
package storetest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/postgres"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlite"
)

// PostgresEnv names the environment variable holding the test PostgreSQL URL.
const PostgresEnv = "TFSTACKPLAN_TEST_POSTGRES"

// SkipMessage says how to enable the PostgreSQL tests.
const SkipMessage = PostgresEnv + " is unset: set it to a postgres:// URL (scripts/test.sh starts a throwaway PostgreSQL and sets it) to run the PostgreSQL store tests"

// Backend opens a fresh, empty store.
type Backend struct {
	Name string
	Open func(t testing.TB) store.Store
}

// Backends returns SQLite and PostgreSQL; PostgreSQL's Open skips the test when it is not
// configured.
func Backends() []Backend {
	return []Backend{
		{Name: "sqlite", Open: func(t testing.TB) store.Store { return OpenSQLite(t) }},
		{Name: "postgres", Open: func(t testing.TB) store.Store { return OpenPostgres(t) }},
	}
}

// OpenSQLite opens a SQLite store in a temporary directory, closed when the test ends.
func OpenSQLite(t testing.TB) store.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "test.db"))
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// PostgresURL creates a fresh schema and returns a URL selecting it plus a channel name unique
// to it; the schema is dropped when the test ends. It skips the test when PostgreSQL is not
// configured.
func PostgresURL(t testing.TB) (string, string) {
	t.Helper()
	base := os.Getenv(PostgresEnv)
	if base == "" {
		t.Skip(SkipMessage)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "t_" + hex.EncodeToString(b)
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatalf("postgres: %v", err)
	}
	defer admin.Close()
	if _, err := admin.Exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		if db, err := sql.Open("pgx", base); err == nil {
			_, _ = db.Exec("DROP SCHEMA " + schema + " CASCADE")
			_ = db.Close()
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("%s: %v", PostgresEnv, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), schema
}

// OpenPostgres opens a PostgreSQL store in a fresh schema.
func OpenPostgres(t testing.TB) store.Store {
	t.Helper()
	u, channel := PostgresURL(t)
	opts := postgres.Options{Channel: channel}
	if _, ok := t.(*testing.B); ok {
		// A benchmark measures the store as serve opens it (its pool readied), with the pool
		// sized as docs/deploy.md advises for the database server, which runs on this machine.
		opts.MaxConns, opts.MinConns = 2*runtime.NumCPU(), postgres.DefaultMaxConns
	}
	s, err := postgres.Open(context.Background(), u, opts)
	if err != nil {
		t.Fatalf("open postgres: %v", err)
	}
	postgresURLs.Store(store.Store(s), u)
	t.Cleanup(func() {
		postgresURLs.Delete(store.Store(s))
		_ = s.Close()
	})
	return s
}

// postgresURLs maps each open PostgreSQL store to its URL, for Analyze.
var postgresURLs sync.Map

// Analyze has PostgreSQL gather the statistics of a store's tables now, as autovacuum would
// soon after a bulk load: a benchmark that seeds rows and queries at once would otherwise be
// planned on the statistics of empty tables. SQLite keeps none unless asked (the store never
// asks), so it does nothing there.
func Analyze(t testing.TB, s store.Store) {
	t.Helper()
	u, ok := postgresURLs.Load(s)
	if !ok {
		return
	}
	db, err := sql.Open("pgx", u.(string))
	if err != nil {
		t.Fatalf("postgres: %v", err)
	}
	defer db.Close()
	if _, err := db.Exec("ANALYZE"); err != nil {
		t.Fatalf("analyze: %v", err)
	}
}
