// Package sqlite opens the embedded SQLite store (modernc.org/sqlite, pure Go) in WAL mode: one
// writer connection fed by a group-commit goroutine, and a pool of readers.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlstore"
)

// Open opens (creating when missing) the SQLite database at path and migrates it.
func Open(ctx context.Context, path string) (*sqlstore.DB, error) {
	if path == "" || strings.ContainsRune(path, '?') {
		return nil, fmt.Errorf("%w: sqlite path %q must be a plain file path", store.ErrInvalid, path)
	}
	// synchronous=NORMAL in WAL mode survives a process crash (kill -9): a commit is in the WAL
	// in the OS page cache before it is acknowledged; only an OS crash can lose the last ones.
	pragmas := url.Values{"_pragma": {"journal_mode(WAL)", "synchronous(NORMAL)", "busy_timeout(10000)"}}
	dsn := "file:" + path + "?" + pragmas.Encode()
	// The writer never checkpoints inside a commit (that stalls every queued write); a
	// background goroutine checkpoints passively instead.
	wdb, err := sql.Open("sqlite", dsn+"&_txlock=immediate&_pragma=wal_autocheckpoint(0)")
	if err != nil {
		return nil, err
	}
	wdb.SetMaxOpenConns(1)
	wdb.SetMaxIdleConns(1)
	wdb.SetConnMaxLifetime(0)
	if err := wdb.PingContext(ctx); err != nil {
		_ = wdb.Close()
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	rdb, err := sql.Open("sqlite", dsn)
	if err != nil {
		_ = wdb.Close()
		return nil, err
	}
	rdb.SetMaxOpenConns(8)
	rdb.SetMaxIdleConns(8)
	s, err := sqlstore.Open(ctx, dialect, wdb, rdb)
	if err != nil {
		_ = wdb.Close()
		_ = rdb.Close()
		return nil, err
	}
	go checkpoint(s, rdb)
	return s, nil
}

// MaxWALFrames is the WAL size (in pages) past which a checkpoint restarts the WAL.
const MaxWALFrames = 64 << 10

// CheckpointEvery is how often the checkpointer looks at the store: it copies the WAL back into
// the database file once writes have paused for that long.
const CheckpointEvery = 500 * time.Millisecond

// CheckpointMaxDelay is the longest the checkpointer waits for writes to pause: while they go
// on, it checkpoints that often. A run streams small commits (logs, phases, updates) for as
// long as its scripts run; a checkpoint every CheckpointEvery then copied the pages those
// commits rewrite (the execution's row, its stacks', the log tables' last leaves) again and
// again, each time with two fsyncs: on the 200-stack benchmark (scripts/bench.sh) about a
// tenth of the server's CPU went to checkpoints.
const CheckpointMaxDelay = 5 * time.Second

func checkpoint(s *sqlstore.DB, rdb *sql.DB) {
	t := time.NewTicker(CheckpointEvery)
	defer t.Stop()
	p := walPacer{last: time.Now()}
	for {
		select {
		case <-s.Closed():
			return
		case now := <-t.C:
			commits := s.Commits()
			if !p.due(commits, now) {
				continue
			}
			// PASSIVE never blocks the writer; what it cannot copy now it copies next time.
			var busy, frames, copied int64
			if rdb.QueryRow("PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &copied) != nil {
				continue
			}
			p.checkpointed(commits, now, copied >= frames)
			// A WAL that readers keep from resetting would grow without bound: past the limit,
			// restart it (this briefly waits for the writer).
			if frames > MaxWALFrames {
				_, _ = rdb.Exec("PRAGMA wal_checkpoint(RESTART)")
			}
		}
	}
}

// walPacer decides when the checkpointer checkpoints, from the store's commit count at each
// look (see CheckpointEvery and CheckpointMaxDelay).
type walPacer struct {
	seen uint64    // the commit count at the previous look
	done uint64    // the commit count the last complete checkpoint covered
	last time.Time // when the last checkpoint ran
}

// due reports whether to checkpoint at now, the store having made commits commits: something
// was committed since the last complete checkpoint, and either nothing since the previous
// look (writes paused) or the last checkpoint is CheckpointMaxDelay old.
func (p *walPacer) due(commits uint64, now time.Time) bool {
	paused := commits == p.seen
	p.seen = commits
	if commits == p.done {
		return false
	}
	return paused || now.Sub(p.last) >= CheckpointMaxDelay
}

// checkpointed records a checkpoint at now that started at commit count commits; complete when
// it copied the whole WAL (readers may hold frames back: then the next look tries again).
func (p *walPacer) checkpointed(commits uint64, now time.Time, complete bool) {
	p.last = now
	if complete {
		p.done = commits
	}
}

var dialect = sqlstore.Dialect{
	Name:        "sqlite",
	IDType:      "INTEGER PRIMARY KEY AUTOINCREMENT",
	BlobType:    "BLOB",
	GroupCommit: true,
	Prepare:     true,
	MapError:    mapError,
}

func mapError(err error) error {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return nil
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_CONSTRAINT:
		return fmt.Errorf("%w: %v", store.ErrConflict, err)
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN:
		return fmt.Errorf("%w: sqlite: %v", store.ErrUnavailable, err)
	}
	return nil
}
