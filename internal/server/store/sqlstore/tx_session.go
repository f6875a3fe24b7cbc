package sqlstore

import (
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

const sessionCols = "id_hash, principal, principal_json, created_at, expires_at, revoked_at"

func (t *sqlTx) CreateSession(s store.Session) error {
	_, err := t.exec("INSERT INTO sessions ("+sessionCols+") VALUES (?,?,?,?,?,?)",
		s.IDHash, s.Principal, s.PrincipalJSON, ns(s.CreatedAt), ns(s.ExpiresAt), ns(s.RevokedAt))
	return err
}

func (t *sqlTx) Session(idHash string) (*store.Session, error) {
	var s store.Session
	var created, expires, revoked int64
	err := t.row("SELECT "+sessionCols+" FROM sessions WHERE id_hash = ?", idHash).
		Scan(&s.IDHash, &s.Principal, &s.PrincipalJSON, &created, &expires, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: session", store.ErrNotFound)
	}
	if err != nil {
		return nil, t.s.mapErr(err)
	}
	s.CreatedAt, s.ExpiresAt, s.RevokedAt = tm(created), tm(expires), tm(revoked)
	return &s, nil
}

func (t *sqlTx) RevokeSession(idHash string, at time.Time) (bool, error) {
	n, err := t.exec("UPDATE sessions SET revoked_at = ? WHERE id_hash = ? AND revoked_at = 0", ns(at), idHash)
	return n > 0, err
}

func (t *sqlTx) SessionsSince(principal string, since time.Time) (int, error) {
	var n int
	err := t.row("SELECT COUNT(*) FROM sessions WHERE principal = ? AND created_at >= ?", principal, ns(since)).Scan(&n)
	return n, t.s.mapErr(err)
}

func (t *sqlTx) PruneSessions(at time.Time, limit int) (int64, error) {
	return t.exec("DELETE FROM sessions WHERE id_hash IN (SELECT id_hash FROM sessions WHERE expires_at <= ? ORDER BY expires_at LIMIT ?)", ns(at), limit)
}
