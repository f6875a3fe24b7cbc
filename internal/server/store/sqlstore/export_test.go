package sqlstore

import "database/sql"

// SetTrace has fn see every statement s's transactions run, as sent, with its arguments; set
// it before any transaction.
func SetTrace(s *DB, fn func(query string, args []any)) { s.trace = fn }

// ReadDB is s's read handle.
func ReadDB(s *DB) *sql.DB { return s.rdb }
