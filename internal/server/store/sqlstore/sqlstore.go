// Package sqlstore implements store.Store over database/sql for every SQL backend: one set of
// migrations, one set of queries, and a Dialect for the few differences (placeholders, column
// types, locks, notifications, error codes). The sqlite and postgres packages only open the
// database and describe their dialect.
package sqlstore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Dialect describes what differs between SQL backends.
type Dialect struct {
	// Name is the backend's name, returned by Kind.
	Name string
	// Dollar numbers placeholders ($1, $2…) instead of ?.
	Dollar bool
	// IDType and BlobType replace {{ID}} and {{BLOB}} in the migrations.
	IDType, BlobType string
	// ForUpdate is appended to the reads of execution and stack rows inside write transactions
	// (" FOR UPDATE"), so a read-modify-write of a row cannot lose a concurrent write; empty when
	// the backend serializes writers anyway.
	ForUpdate string
	// ForShare is appended to the execution read of a runner event inside write transactions
	// (" FOR SHARE"): events of one execution run concurrently while excluding (and excluded by)
	// the ForUpdate reads of finalize and cancel; empty when the backend serializes writers.
	ForShare string
	// WritableCTE says WITH clauses may hold INSERTs: a runner event is then one statement,
	// which WriteOne runs without an explicit transaction.
	WritableCTE bool
	// LockSQL takes a transaction-scoped lock on the int64 key given as the only argument; empty
	// when the backend serializes writers anyway.
	LockSQL string
	// NotifySQL sends (channel, payload) to other replicas; empty when there are none. The
	// store sends it after commit, outside the writes' transactions, coalescing the
	// notifications of many writes (see NotifyEvery).
	NotifySQL string
	// Channel is the notification channel name.
	Channel string
	// Prepare caches prepared statements (for drivers that do not cache them themselves).
	Prepare bool
	// GroupCommit batches concurrent writes into one transaction (savepoint per write) on a
	// single writer goroutine; for backends with one writer (SQLite).
	GroupCommit bool
	// MapError turns a driver error into a domain sentinel, or returns nil when it does not
	// recognize it.
	MapError func(error) error
	// Retryable reports a transaction conflict worth retrying.
	Retryable func(error) bool
	// Listen, when set, implements Store.Listen for a multi-replica backend.
	Listen func(ctx context.Context, fn func(execID string)) error
}

// DB is a store.Store over a database/sql handle.
type DB struct {
	d       Dialect
	wdb     *sql.DB
	rdb     *sql.DB
	jobs    chan *job
	stop    chan struct{}
	done    chan struct{}
	closed  sync.Once
	closing chan struct{}

	mu        sync.Mutex
	listeners map[int]func(string)
	nextL     int

	qmu    sync.RWMutex
	qcache map[string]string

	// trace, when set (by tests, before any transaction), sees every statement a transaction
	// runs, as sent, with its arguments.
	trace func(query string, args []any)

	smu    sync.Mutex
	stmts  map[string]*sql.Stmt
	wanted map[string]bool

	nmu      sync.Mutex
	npending map[string]bool
	nwake    chan struct{}
	ndone    chan struct{}

	commits atomic.Uint64 // write transactions committed (Commits)
}

// prepared returns the cached prepared statement of query on the writer connection, or nil
// after noting it for the writer to prepare between batches (the single writer connection is
// busy inside the current transaction).
func (s *DB) prepared(query string) *sql.Stmt {
	s.smu.Lock()
	defer s.smu.Unlock()
	st, ok := s.stmts[query]
	if !ok {
		s.wanted[query] = true
	}
	return st
}

// prepareWanted prepares noted statements; the writer calls it with no transaction open.
func (s *DB) prepareWanted() {
	s.smu.Lock()
	defer s.smu.Unlock()
	for q := range s.wanted {
		if st, err := s.wdb.Prepare(q); err == nil {
			s.stmts[q] = st
		}
		delete(s.wanted, q)
	}
}

// Linger is how long the writer waits to grow a batch after its first write and what was
// already queued. Zero by default: writes queue while a batch commits, so under load batches
// grow by themselves, while any wait delays every write of clients that wait for their answer
// before sending more (BenchmarkIngest: up to half the events/s at 300µs).
var Linger time.Duration

// MaxBatch bounds how many writes one group commit holds.
const MaxBatch = 512

// NotifyEvery is the least time between two sends of a multi-replica backend's notifications:
// what is written in between is announced once, together, just after.
var NotifyEvery = 10 * time.Millisecond

type job struct {
	ctx context.Context
	fn  func(store.Tx) error
	err chan error
}

// Open migrates the database and returns the store. wdb receives writes; rdb (which may be wdb)
// receives reads. With GroupCommit, wdb must allow exactly one connection.
func Open(ctx context.Context, d Dialect, wdb, rdb *sql.DB) (*DB, error) {
	s := &DB{d: d, wdb: wdb, rdb: rdb, closing: make(chan struct{}), listeners: map[int]func(string){}, qcache: map[string]string{}, stmts: map[string]*sql.Stmt{}, wanted: map[string]bool{}}
	if err := s.migrate(ctx, 0); err != nil {
		return nil, err
	}
	if d.GroupCommit {
		s.jobs = make(chan *job, 4096)
		s.stop = make(chan struct{})
		s.done = make(chan struct{})
		go s.writer()
	}
	if d.NotifySQL != "" {
		s.npending = map[string]bool{}
		s.nwake = make(chan struct{}, 1)
		s.ndone = make(chan struct{})
		go s.notifier()
	}
	return s, nil
}

// Closed is closed when Close starts.
func (s *DB) Closed() <-chan struct{} { return s.closing }

// Commits returns how many write transactions the store has committed since it was opened: a
// change in it says that something was written meanwhile.
func (s *DB) Commits() uint64 { return s.commits.Load() }

// Kind names the backend.
func (s *DB) Kind() string { return s.d.Name }

// Close stops the writer and closes the database handles.
func (s *DB) Close() error {
	var err error
	s.closed.Do(func() {
		close(s.closing)
		if s.stop != nil {
			close(s.stop)
			<-s.done
		}
		if s.ndone != nil {
			<-s.ndone // it sends what is pending, then ends
		}
		s.smu.Lock()
		for _, st := range s.stmts {
			_ = st.Close()
		}
		s.smu.Unlock()
		err = s.wdb.Close()
		if s.rdb != s.wdb {
			if e := s.rdb.Close(); err == nil {
				err = e
			}
		}
	})
	return err
}

// Ping checks the database answers.
func (s *DB) Ping(ctx context.Context) error {
	if err := s.rdb.PingContext(ctx); err != nil {
		return s.mapErr(err)
	}
	return nil
}

// Listen calls fn for every notified execution until ctx ends.
func (s *DB) Listen(ctx context.Context, fn func(execID string)) error {
	if s.d.Listen != nil {
		return s.d.Listen(ctx, fn)
	}
	s.mu.Lock()
	id := s.nextL
	s.nextL++
	s.listeners[id] = fn
	s.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	delete(s.listeners, id)
	s.mu.Unlock()
	return nil
}

// dispatch announces the executions committed writes changed: to this process's listeners, or
// through the notifier to every replica.
func (s *DB) dispatch(ids []string) {
	if len(ids) == 0 {
		return
	}
	if s.d.NotifySQL != "" {
		s.nmu.Lock()
		for _, id := range ids {
			s.npending[id] = true
		}
		s.nmu.Unlock()
		select {
		case s.nwake <- struct{}{}:
		default:
		}
		return
	}
	s.mu.Lock()
	fns := make([]func(string), 0, len(s.listeners))
	for _, f := range s.listeners {
		fns = append(fns, f)
	}
	s.mu.Unlock()
	for _, id := range ids {
		for _, f := range fns {
			f(id)
		}
	}
}

func (s *DB) mapErr(err error) error {
	if err == nil {
		return nil
	}
	for _, sentinel := range []error{store.ErrNotFound, store.ErrInvalid, store.ErrConflict,
		store.ErrPrecondition, store.ErrDenied, store.ErrUnavailable, store.ErrMismatch, store.ErrQuota, errNeedsTransaction} {
		if errors.Is(err, sentinel) {
			return err
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: %v", store.ErrNotFound, err)
	}
	if s.d.MapError != nil {
		if m := s.d.MapError(err); m != nil {
			return m
		}
	}
	// The driver's error stays wrapped too, so Retryable recognizes conflicts inside statements.
	return fmt.Errorf("%w: %s: %w", store.ErrUnavailable, s.d.Name, err)
}

// notifier sends the pending notifications, at most once per NotifyEvery, until Close. A
// NOTIFY in each write's own transaction would serialize their commits on the database's
// notification queue lock and cost a round trip each; sent here, a burst of writes to one
// execution is one notification.
func (s *DB) notifier() {
	defer close(s.ndone)
	for {
		select {
		case <-s.nwake:
		case <-s.closing:
			s.sendNotifications()
			return
		}
		s.sendNotifications()
		select {
		case <-time.After(NotifyEvery):
		case <-s.closing:
		}
	}
}

func (s *DB) sendNotifications() {
	s.nmu.Lock()
	ids := make([]string, 0, len(s.npending))
	for id := range s.npending {
		ids = append(ids, id)
	}
	clear(s.npending)
	s.nmu.Unlock()
	if len(ids) == 0 {
		return
	}
	sort.Strings(ids)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Best effort: a lost notification leaves live pages stale until their next change or
	// reload, never the data wrong.
	tx, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		return
	}
	defer func() { _ = tx.Rollback() }()
	for _, id := range ids {
		if _, err := tx.ExecContext(ctx, s.q(s.d.NotifySQL), s.d.Channel, id); err != nil {
			return
		}
	}
	_ = tx.Commit()
}

// q rewrites ? placeholders for the dialect (cached).
func (s *DB) q(query string) string {
	if !s.d.Dollar {
		return query
	}
	s.qmu.RLock()
	r, ok := s.qcache[query]
	s.qmu.RUnlock()
	if ok {
		return r
	}
	var b strings.Builder
	n := 0
	for _, c := range query {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	r = b.String()
	s.qmu.Lock()
	s.qcache[query] = r
	s.qmu.Unlock()
	return r
}

// migration is one file of migrations/, applied once under its version.
type migration struct {
	version int
	name    string
}

// migrations lists the files of migrations/ in fsys by version, the number their name starts
// with (001_init.sql is version 1). The version, not the file's rank, is what a database
// records: migrations written on different branches keep their numbers once merged, gaps
// included, so a database that applied 004 before 003 existed still applies 003 later.
func migrations(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	out := make([]migration, 0, len(names))
	seen := map[int]string{}
	for _, name := range names {
		base := path.Base(name)
		digits := len(base) - len(strings.TrimLeft(base, "0123456789"))
		v, err := strconv.Atoi(base[:digits])
		if digits == 0 || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: the name must start with a positive version number", name)
		}
		if other, ok := seen[v]; ok {
			return nil, fmt.Errorf("migrations %s and %s have the same version %d", other, name, v)
		}
		seen[v] = name
		out = append(out, migration{version: v, name: name})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// migrate applies the migrations the database lacks, those up to version upTo when it is not 0
// (tests make the database of an older server with it).
func (s *DB) migrate(ctx context.Context, upTo int) error {
	ms, err := migrations(migrationFS)
	if err != nil {
		return err
	}
	for i, m := range ms {
		if upTo > 0 && m.version > upTo {
			ms = ms[:i]
			break
		}
	}
	tx, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		return s.mapErr(err)
	}
	defer func() { _ = tx.Rollback() }()
	if s.d.LockSQL != "" {
		if _, err := tx.ExecContext(ctx, s.q(s.d.LockSQL), int64(0x7466737461636b)); err != nil {
			return s.mapErr(err)
		}
	}
	if _, err := tx.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY)"); err != nil {
		return s.mapErr(err)
	}
	for _, m := range ms {
		version, name := m.version, m.name
		var n int
		if err := tx.QueryRowContext(ctx, s.q("SELECT COUNT(*) FROM schema_migrations WHERE version = ?"), version).Scan(&n); err != nil {
			return s.mapErr(err)
		}
		if n > 0 {
			continue
		}
		body, err := migrationFS.ReadFile(name)
		if err != nil {
			return err
		}
		text := strings.NewReplacer("{{ID}}", s.d.IDType, "{{BLOB}}", s.d.BlobType).Replace(string(body))
		for _, stmt := range strings.Split(text, ";\n") {
			if strings.TrimSpace(stripComments(stmt)) == "" {
				continue
			}
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("migration %s: %w", name, s.mapErr(err))
			}
		}
		if _, err := tx.ExecContext(ctx, s.q("INSERT INTO schema_migrations (version) VALUES (?)"), version); err != nil {
			return s.mapErr(err)
		}
	}
	return s.mapErr(tx.Commit())
}

func stripComments(stmt string) string {
	var b strings.Builder
	for _, line := range strings.Split(stmt, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// Warm opens n connections of the write handle (fewer when its pool is smaller) and readies
// each for the runner's events: on each, in a transaction it rolls back, it runs the statements
// of the events and logs (warmEvents), so that the connection has them prepared and the
// database has read the catalog entries their planning needs. A fresh connection costs the
// database a process, its catalog reads and the preparation and first planning of each
// statement it runs; without Warm, the first burst of events after a start pays all of that at
// once, one connection a concurrent request, and every request waits for it (a runner's paced
// log then stays that late). The connections stay in the pool, readied.
func (s *DB) Warm(ctx context.Context, n int) error {
	if limit := s.wdb.Stats().MaxOpenConnections; limit > 0 {
		n = min(n, limit)
	}
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close() // back to the pool
		}
	}()
	for range n {
		c, err := s.wdb.Conn(ctx)
		if err != nil {
			return s.mapErr(err)
		}
		conns = append(conns, c)
		tx, err := c.BeginTx(ctx, nil)
		if err != nil {
			return s.mapErr(err)
		}
		err = warmEvents(&sqlTx{s: s, ctx: ctx, tx: tx, db: s.wdb, write: true})
		_ = tx.Rollback()
		if err != nil {
			return err
		}
	}
	return nil
}

// warmEvents runs, in t, the statements of a runner's events and logs: the owner check, a
// phase, an update, a log batch and the liveness note, for the execution "", which none has
// (the API refuses the name): they find no execution and write nothing, but the liveness
// note, which t's rollback takes back.
func warmEvents(t *sqlTx) error {
	const none = ""
	now := time.Unix(0, 1)
	st := &store.Stack{}
	st.StackState.Stack, st.Status = none, "running"
	steps := []func() error{
		func() error { _, _, err := t.ExecutionPrincipal(none); return err },
		func() error { _, _, err := t.ApplyUpdate(none, st); return err },
		func() error {
			_, _, err := t.AddPhaseEvent(store.Phase{ExecutionID: none, Stack: none, Phase: "plan", Seq: 1, At: now}, "plan", now)
			return err
		},
		func() error {
			_, _, _, err := t.AddLogBatch(none, []store.LogChunk{{ExecutionID: none, Stack: none, Generation: 1, Data: []byte{'\n'}}})
			return err
		},
		func() error { return t.SeeExecution(none, now) },
	}
	for _, step := range steps {
		if err := step(); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	return nil
}

// Read runs fn in a transaction on the read handle.
func (s *DB) Read(ctx context.Context, fn func(store.Tx) error) error {
	tx, err := s.rdb.BeginTx(ctx, nil)
	if err != nil {
		return s.mapErr(err)
	}
	defer func() { _ = tx.Rollback() }()
	return s.mapErr(fn(&sqlTx{s: s, ctx: ctx, tx: tx, db: s.rdb}))
}

// Write runs fn in a read-write transaction (grouped with concurrent writes under GroupCommit).
func (s *DB) Write(ctx context.Context, fn func(store.Tx) error) error {
	if s.jobs == nil {
		return s.writeDirect(ctx, fn)
	}
	j := &job{ctx: ctx, fn: fn, err: make(chan error, 1)}
	closed := fmt.Errorf("%w: store closed", store.ErrUnavailable)
	select {
	case <-s.stop:
		return closed
	default:
	}
	select {
	case s.jobs <- j:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.stop:
		return closed
	}
	select {
	case err := <-j.err:
		return err
	case <-ctx.Done():
		// The write may still commit; the caller retries idempotently.
		return ctx.Err()
	case <-s.done:
		select {
		case err := <-j.err:
			return err
		default:
			return closed
		}
	}
}

// WriteOne is Write for a fn that calls one Tx method made of one statement (ApplyUpdate,
// AddPhaseEvent, AddLogBatch), besides Notify. With WritableCTE (and no group commit) the statement runs as a
// transaction of its own, saving the round trips of BEGIN and COMMIT; a second statement
// fails the write (after the first one committed: it is a programming error). Otherwise it is
// Write.
func (s *DB) WriteOne(ctx context.Context, fn func(store.Tx) error) error {
	if !s.d.WritableCTE || s.jobs != nil {
		return s.Write(ctx, fn)
	}
	err := s.retry(ctx, func() ([]string, error) {
		t := &sqlTx{s: s, ctx: ctx, db: s.wdb, write: true}
		if err := callSafely(fn, t); err != nil {
			return nil, err
		}
		return t.notify, nil
	})
	if errors.Is(err, errNeedsTransaction) {
		return s.Write(ctx, fn)
	}
	return err
}

func (s *DB) writeDirect(ctx context.Context, fn func(store.Tx) error) error {
	return s.retry(ctx, func() ([]string, error) { return s.writeOnce(ctx, fn) })
}

// retry runs a write, again after a transaction conflict the dialect deems retryable, and
// announces the executions it changed.
func (s *DB) retry(ctx context.Context, write func() ([]string, error)) error {
	var err error
	for attempt := 0; attempt < 8; attempt++ {
		var ids []string
		ids, err = write()
		if err == nil {
			s.dispatch(ids)
			return nil
		}
		if s.d.Retryable == nil || !s.d.Retryable(err) || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Duration(attempt+1) * 5 * time.Millisecond)
	}
	return s.mapErr(err)
}

func (s *DB) writeOnce(ctx context.Context, fn func(store.Tx) error) ([]string, error) {
	tx, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }()
	t := &sqlTx{s: s, ctx: ctx, tx: tx, db: s.wdb, write: true}
	if err := callSafely(fn, t); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	s.commits.Add(1)
	return t.notify, nil
}

func callSafely(fn func(store.Tx) error, t store.Tx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("store: write panicked: %v", r)
		}
	}()
	return fn(t)
}

// writer is the single writer goroutine of a GroupCommit store.
func (s *DB) writer() {
	defer close(s.done)
	for {
		var first *job
		select {
		case first = <-s.jobs:
		case <-s.stop:
			s.failPending()
			return
		}
		batch := s.collect([]*job{first})
		s.runBatch(batch)
		if s.d.Prepare {
			s.prepareWanted()
		}
	}
}

// collect adds to batch, up to MaxBatch, the writes already queued and those arriving within
// Linger: one commit for many is what makes SQLite fast.
func (s *DB) collect(batch []*job) []*job {
queued:
	for len(batch) < MaxBatch {
		select {
		case j := <-s.jobs:
			batch = append(batch, j)
		default:
			break queued
		}
	}
	if Linger <= 0 {
		return batch
	}
	linger := time.NewTimer(Linger)
	defer linger.Stop()
	for len(batch) < MaxBatch {
		select {
		case j := <-s.jobs:
			batch = append(batch, j)
		case <-linger.C:
			return batch
		}
	}
	return batch
}

func (s *DB) failPending() {
	for {
		select {
		case j := <-s.jobs:
			j.err <- fmt.Errorf("%w: store closed", store.ErrUnavailable)
		default:
			return
		}
	}
}

func (s *DB) runBatch(batch []*job) {
	live := batch[:0]
	for _, j := range batch {
		if err := j.ctx.Err(); err != nil {
			j.err <- err
			continue
		}
		live = append(live, j)
	}
	if len(live) == 0 {
		return
	}
	// Optimistic pass: every write in one transaction without savepoints. When one fails, the
	// whole transaction is rolled back and the batch runs again with a savepoint per write, so
	// a failed write never takes the others down with it.
	results, notify, err := s.tryBatch(live, false)
	if err == errRetryIsolated {
		results, notify, err = s.tryBatch(live, true)
	}
	if err != nil {
		for _, j := range live {
			j.err <- s.mapErr(err)
		}
		return
	}
	for i, j := range live {
		j.err <- s.mapErr(results[i])
	}
	s.dispatch(dedup(notify))
}

var errRetryIsolated = errors.New("a write in the batch failed; retry with savepoints")

// tryBatch runs jobs in one transaction and commits it. Without isolation it gives up with
// errRetryIsolated at the first failing job.
func (s *DB) tryBatch(jobs []*job, isolate bool) ([]error, []string, error) {
	ctx := context.Background()
	tx, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		return nil, nil, err
	}
	results := make([]error, len(jobs))
	var notify []string
	for i, j := range jobs {
		t := &sqlTx{s: s, ctx: ctx, tx: tx, db: s.wdb, write: true}
		if isolate {
			if _, err := t.exec("SAVEPOINT w"); err != nil {
				results[i] = err
				continue
			}
		}
		err := callSafely(j.fn, t)
		switch {
		case err != nil && !isolate:
			_ = tx.Rollback()
			return nil, nil, errRetryIsolated
		case err != nil:
			results[i] = err
			_, _ = t.exec("ROLLBACK TO w")
		default:
			notify = append(notify, t.notify...)
		}
		if isolate {
			if _, err := t.exec("RELEASE w"); err != nil && results[i] == nil {
				results[i] = err
			}
		}
	}
	if err := tx.Commit(); err != nil {
		_ = tx.Rollback()
		return nil, nil, err
	}
	s.commits.Add(1)
	return results, notify, nil
}

func dedup(ids []string) []string {
	if len(ids) < 2 {
		return ids
	}
	seen := make(map[string]bool, len(ids))
	out := ids[:0]
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// PruneLogs deletes log chunks of executions started before cutoff.
func (s *DB) PruneLogs(ctx context.Context, cutoff time.Time) (int64, error) {
	var n int64
	err := s.Write(ctx, func(t store.Tx) error {
		var err error
		n, err = t.(*sqlTx).exec("DELETE FROM log_chunks WHERE execution_id IN (SELECT id FROM executions WHERE started_at < ?)", ns(cutoff))
		return err
	})
	return n, err
}
