// Package postgres opens the PostgreSQL store (github.com/jackc/pgx/v5) for several server
// replicas sharing one database: claim, gate and grant decisions serialize on transaction-scoped
// advisory locks, and every change is announced with NOTIFY so each replica's live pages update.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlstore"
)

// DefaultChannel is the NOTIFY channel replicas share.
const DefaultChannel = "tfstackplan_events"

// Options tune Open.
type Options struct {
	// Channel overrides DefaultChannel (tests isolate themselves with it).
	Channel string
	// MaxConns bounds the connection pool (default DefaultMaxConns; the URL's PoolParam wins).
	MaxConns int
	// MinConns is how many connections Open readies before it returns (sqlstore.DB.Warm: each
	// has run the runner events' statements once), at most MaxConns; none by default. serve
	// readies the whole pool, so the first burst of runners after a start does not pay for
	// new connections while it waits.
	MinConns int
}

// DefaultMaxConns is the connection pool's size unless Options.MaxConns says otherwise.
const DefaultMaxConns = 20

// PoolParam is the URL query parameter that sizes the connection pool (pgxpool's name for it);
// it overrides Options.MaxConns and is not sent to the server.
const PoolParam = "pool_max_conns"

// Open connects to the postgres:// URL and migrates the schema (search_path selects it).
func Open(ctx context.Context, rawURL string, opts Options) (*sqlstore.DB, error) {
	if !strings.HasPrefix(rawURL, "postgres://") && !strings.HasPrefix(rawURL, "postgresql://") {
		return nil, fmt.Errorf("%w: postgres URL must start with postgres://", store.ErrInvalid)
	}
	rawURL, maxConns, err := poolSize(rawURL, opts.MaxConns)
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: postgres URL: %v", store.ErrInvalid, err)
	}
	db := stdlib.OpenDB(*cfg, stdlib.OptionAfterConnect(compressLogsWithLZ4))
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("%w: connect to postgres: %v", store.ErrUnavailable, err)
	}
	channel := opts.Channel
	if channel == "" {
		channel = DefaultChannel
	}
	d := sqlstore.Dialect{
		Name:        "postgres",
		Dollar:      true,
		IDType:      "BIGSERIAL PRIMARY KEY",
		BlobType:    "BYTEA",
		ForUpdate:   " FOR UPDATE",
		ForShare:    " FOR SHARE",
		WritableCTE: true,
		LockSQL:     "SELECT pg_advisory_xact_lock(?)",
		NotifySQL:   "SELECT pg_notify(?, ?)",
		Channel:     channel,
		MapError:    mapError,
		Retryable:   retryable,
		Listen: func(ctx context.Context, fn func(string)) error {
			return listen(ctx, cfg, channel, fn)
		},
	}
	s, err := sqlstore.Open(ctx, d, db, db)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	if opts.MinConns > 0 {
		if err := s.Warm(pctx, opts.MinConns); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	return s, nil
}

// poolSize returns the URL without PoolParam and the pool's size: PoolParam's value, else
// maxConns, else DefaultMaxConns.
func poolSize(rawURL string, maxConns int) (string, int, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", 0, fmt.Errorf("%w: postgres URL: %v", store.ErrInvalid, err)
	}
	q := u.Query()
	if v, ok := q[PoolParam]; ok {
		n, err := strconv.Atoi(v[len(v)-1])
		if err != nil || n < 1 {
			return "", 0, fmt.Errorf("%w: postgres URL: %s=%q: want a whole number of connections, 1 or more", store.ErrInvalid, PoolParam, v[len(v)-1])
		}
		maxConns = n
		q.Del(PoolParam)
		u.RawQuery = q.Encode()
		rawURL = u.String()
	}
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	return rawURL, maxConns, nil
}

// lz4SQL has the session compress the values it stores out of line (log chunks, above all)
// with lz4, where the server has it (PostgreSQL 14 and later, built with lz4) and nobody chose
// otherwise (the database's, role's or URL's setting stays). pglz, the default, costs a log
// batch of 32 KiB several times more of the server's time.
const lz4SQL = "SELECT set_config('default_toast_compression', 'lz4', false) FROM pg_settings " +
	"WHERE name = 'default_toast_compression' AND source = 'default' AND 'lz4' = ANY(enumvals)"

// compressLogsWithLZ4 runs lz4SQL on a new connection.
func compressLogsWithLZ4(ctx context.Context, c *pgx.Conn) error {
	_, err := c.Exec(ctx, lz4SQL)
	return err
}

// listen holds one LISTEN connection, reconnecting with backoff, until ctx ends.
func listen(ctx context.Context, cfg *pgx.ConnConfig, channel string, fn func(string)) error {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := listenOnce(ctx, cfg, channel, fn)
		if ctx.Err() != nil {
			break
		}
		_ = err // reconnect: a replica must keep hearing the others
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		if backoff < 5*time.Second {
			backoff *= 2
		}
	}
	return nil
}

func listenOnce(ctx context.Context, cfg *pgx.ConnConfig, channel string, fn func(string)) error {
	conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		fn(n.Payload)
	}
}

// Error codes of values PostgreSQL refuses to store although SQLite takes them: text with a
// NUL byte or invalid UTF-8, and a \u0000 escape in JSON.
const (
	codeInvalidByteSequence      = "22021"
	codeUnsupportedUnicodeEscape = "22P05"
)

func mapError(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "23505":
			return fmt.Errorf("%w: %s", store.ErrConflict, pe.Message)
		case pe.Code == codeInvalidByteSequence, pe.Code == codeUnsupportedUnicodeEscape:
			return fmt.Errorf("%w: text PostgreSQL cannot store: %s", store.ErrInvalid, pe.Message)
		case strings.HasPrefix(pe.Code, "22"), strings.HasPrefix(pe.Code, "23"):
			return fmt.Errorf("%w: %s", store.ErrInvalid, pe.Message)
		}
	}
	return nil
}

func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}
