package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

func session(hash, principal string, created time.Time, ttl time.Duration) store.Session {
	return store.Session{IDHash: hash, Principal: principal, PrincipalJSON: `{"Name":"` + principal + `"}`,
		CreatedAt: created, ExpiresAt: created.Add(ttl)}
}

func readSession(t *testing.T, s store.Store, hash string) (*store.Session, error) {
	t.Helper()
	var got *store.Session
	err := s.Read(ctx, func(tx store.Tx) (err error) { got, err = tx.Session(hash); return })
	return got, err
}

// TestSessions: a session is stored once under its hash and read back whole; a revoke marks it
// once; sign-ins are counted per principal from a time on.
func TestSessions(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		a := session("aa", "alice", t0, time.Hour)
		write(t, s, func(tx store.Tx) error { return tx.CreateSession(a) })
		err := s.Write(ctx, func(tx store.Tx) error { return tx.CreateSession(session("aa", "bob", t0, time.Hour)) })
		if !errors.Is(err, store.ErrConflict) {
			t.Fatalf("second session under one hash: %v, want ErrConflict", err)
		}
		got, err := readSession(t, s, "aa")
		if err != nil || *got != a {
			t.Fatalf("read %+v, %v; want %+v", got, err, a)
		}
		if _, err := readSession(t, s, "bb"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("unknown hash: %v, want ErrNotFound", err)
		}

		var first, second, unknown bool
		write(t, s, func(tx store.Tx) (err error) { first, err = tx.RevokeSession("aa", t0.Add(time.Minute)); return })
		write(t, s, func(tx store.Tx) (err error) { second, err = tx.RevokeSession("aa", t0.Add(2*time.Minute)); return })
		write(t, s, func(tx store.Tx) (err error) { unknown, err = tx.RevokeSession("bb", t0); return })
		if !first || second || unknown {
			t.Fatalf("revoked %v, again %v, unknown %v; want true, false, false", first, second, unknown)
		}
		if got, _ := readSession(t, s, "aa"); !got.RevokedAt.Equal(t0.Add(time.Minute)) {
			t.Fatalf("revoked at %v, want the first revoke's time", got.RevokedAt)
		}

		write(t, s, func(tx store.Tx) error {
			for i, p := range []string{"alice", "alice", "bob"} {
				if err := tx.CreateSession(session(fmt.Sprint("s", i), p, t0.Add(time.Duration(i+1)*time.Second), time.Hour)); err != nil {
					return err
				}
			}
			return nil
		})
		for _, c := range []struct {
			principal string
			since     time.Time
			want      int
		}{{"alice", t0, 3}, {"alice", t0.Add(time.Second), 2}, {"alice", t0.Add(2 * time.Second), 1}, {"bob", t0, 1}, {"carol", t0, 0}} {
			var n int
			if err := s.Read(ctx, func(tx store.Tx) (err error) { n, err = tx.SessionsSince(c.principal, c.since); return }); err != nil || n != c.want {
				t.Errorf("SessionsSince(%s, %v) = %d, %v; want %d", c.principal, c.since, n, err, c.want)
			}
		}
	})
}

// TestPruneSessions deletes expired sessions only, the earliest first, at most limit at a time.
func TestPruneSessions(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		write(t, s, func(tx store.Tx) error {
			for i := range 5 {
				if err := tx.CreateSession(session(fmt.Sprint("h", i), "alice", t0, time.Duration(i+1)*time.Hour)); err != nil {
					return err
				}
			}
			return nil
		})
		prune := func(at time.Time, limit int) int64 {
			var n int64
			write(t, s, func(tx store.Tx) (err error) { n, err = tx.PruneSessions(at, limit); return })
			return n
		}
		// Expired at t0+3h: h0, h1 and h2 (h2 ends exactly then).
		if n := prune(t0.Add(3*time.Hour), 2); n != 2 {
			t.Fatalf("pruned %d, want the limit 2", n)
		}
		for i, want := range []bool{false, false, true, true, true} {
			_, err := readSession(t, s, fmt.Sprint("h", i))
			if (err == nil) != want {
				t.Errorf("h%d: %v after the first prune, want kept=%v", i, err, want)
			}
		}
		if n := prune(t0.Add(3*time.Hour), 10); n != 1 {
			t.Fatalf("pruned %d, want the one left expired", n)
		}
		if _, err := readSession(t, s, "h3"); err != nil {
			t.Fatalf("h3 is not expired: %v", err)
		}
	})
}
