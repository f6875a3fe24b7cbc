package sqlstore

import (
	"context"
	"database/sql"
)

// SetTrace has fn see every statement s's transactions run, as sent, with its arguments; set
// it before any transaction.
func SetTrace(s *DB, fn func(query string, args []any)) { s.trace = fn }

// ReadDB is s's read handle.
func ReadDB(s *DB) *sql.DB { return s.rdb }

// MigrateTo applies the migrations up to version upTo to db as Open would with d: the database
// of a server from before the later ones.
func MigrateTo(ctx context.Context, d Dialect, db *sql.DB, upTo int) error {
	s := &DB{d: d, wdb: db, rdb: db, qcache: map[string]string{}}
	return s.migrate(ctx, upTo)
}
