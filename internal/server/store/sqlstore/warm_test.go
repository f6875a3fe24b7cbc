package sqlstore_test

import (
	"bytes"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/postgres"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlstore"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// postgres.Open with MinConns leaves that many connections in the pool (at most the pool's size),
// each having run the statements of the runner's events and logs (prepared there) and set to
// compress with lz4, and writes nothing; the events then run through them.
func TestPostgresOpenWarmsThePool(t *testing.T) {
	u, channel := storetest.PostgresURL(t)
	s, err := postgres.Open(ctx, u, postgres.Options{Channel: channel, MaxConns: 3, MinConns: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	db := sqlstore.ReadDB(s)
	var lz4 bool // the server has lz4
	_ = db.QueryRowContext(ctx, "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'").Scan(&lz4)
	if st := db.Stats(); st.OpenConnections != 3 || st.Idle != 3 {
		t.Fatalf("after Open: %d connections open, %d idle; want the pool's 3, idle", st.OpenConnections, st.Idle)
	}
	// The statements of the owner check, an update, a phase, a log batch and the liveness note.
	hot := []string{"SELECT principal, repo FROM executions WHERE id = $1%", "WITH e AS (%INSERT INTO stacks (execution_id, stack, status, class%",
		"WITH e AS (%INSERT INTO phases%", "WITH e AS (%INSERT INTO log_chunks%", "INSERT INTO execution_seen%"}
	conns := make([]*sql.Conn, 3)
	for i := range conns {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
		for _, q := range hot {
			var n int
			if err := c.QueryRowContext(ctx, "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE $1", q).Scan(&n); err != nil || n == 0 {
				t.Fatalf("%q: no statement prepared on a connection (%v)", q, err)
			}
		}
	}
	if st := db.Stats(); st.OpenConnections != 3 {
		t.Fatalf("%d connections open, want 3: the ones checked were the warmed ones", st.OpenConnections)
	}
	// Values stored out of line (log chunks) are compressed with lz4 where the server has it.
	var setting string
	if err := conns[0].QueryRowContext(ctx, "SHOW default_toast_compression").Scan(&setting); lz4 && (err != nil || setting != "lz4") {
		t.Fatalf("default_toast_compression %q (%v), want lz4", setting, err)
	}
	// The warm-up wrote nothing.
	for _, table := range []string{"executions", "stacks", "phases", "log_chunks", "execution_seen"} {
		var n int
		if err := conns[0].QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%s has %d rows after Open (%v), want none", table, n, err)
		}
	}
	for _, c := range conns {
		_ = c.Close()
	}
	// An update through the prepared statement.
	if err := s.Write(ctx, func(tx store.Tx) error {
		e := &store.Execution{}
		e.ExecutionID, e.Environment, e.Op, e.Status, e.StartedAt = "e1", "prod", "plan", "running", t0
		if _, err := tx.CreateExecution(e); err != nil {
			return err
		}
		st := &store.Stack{}
		st.StackState.Stack, st.Status = "a", "pending"
		return tx.SaveStack("e1", st)
	}); err != nil {
		t.Fatal(err)
	}
	up := &store.Stack{Seq: 2}
	up.StackState.Stack, up.Status = "a", api.StackStatusRunning
	if err := s.WriteOne(ctx, func(tx store.Tx) error { _, _, err := tx.ApplyUpdate("e1", up); return err }); err != nil {
		t.Fatal(err)
	}
	text := bytes.Repeat([]byte("terraform output line ...\n"), 1000)
	if err := s.WriteOne(ctx, func(tx store.Tx) error {
		_, _, _, err := tx.AddLogBatch("e1", []store.LogChunk{{ExecutionID: "e1", Stack: "a", Generation: 1, Data: text}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var method sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT pg_column_compression(data) FROM log_chunks").Scan(&method); err != nil || (lz4 && method.String != "lz4") {
		t.Fatalf("a log chunk of %d bytes is stored compressed with %q (%v)", len(text), method.String, err)
	}
	var got *store.Stack
	if err := s.Read(ctx, func(tx store.Tx) (err error) { got, err = tx.Stack("e1", "a"); return }); err != nil || got.Status != api.StackStatusRunning || got.Seq != 2 {
		t.Fatalf("stack after the update: %+v %v", got, err)
	}
}

// The URL's pool_max_conns sizes the pool (and is not sent to the server); a value that is not
// a count of connections is refused, naming it.
func TestPostgresPoolSizeFromURL(t *testing.T) {
	u, channel := storetest.PostgresURL(t)
	s, err := postgres.Open(ctx, u+"&"+postgres.PoolParam+"=2", postgres.Options{Channel: channel, MaxConns: 9, MinConns: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if st := sqlstore.ReadDB(s).Stats(); st.MaxOpenConnections != 2 || st.OpenConnections != 2 {
		t.Fatalf("pool of %d, %d open; want 2 and 2", st.MaxOpenConnections, st.OpenConnections)
	}
	for _, bad := range []string{"0", "-1", "many", ""} {
		_, err := postgres.Open(ctx, u+"&"+postgres.PoolParam+"="+bad, postgres.Options{Channel: channel})
		if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), postgres.PoolParam+"=") {
			t.Fatalf("%s=%q: %v", postgres.PoolParam, bad, err)
		}
	}
}
