package web

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/throttle"
)

// SessionCookieName carries a signed-in browser's session id. The server keeps only the id's
// SHA-256 (store.Session), so neither the cookie nor the database holds a token.
const SessionCookieName = "tfstackplan_session"

// legacyCookieName carried the raw token before sessions: it is no longer read, and a browser
// that still sends it has it cleared.
const legacyCookieName = "tfstackplan_token"

// Defaults of UI's session settings.
const (
	DefaultSessionTTL       = 12 * time.Hour
	DefaultSignInsPerMinute = 10
)

// prunePerSignIn bounds the expired sessions one sign-in deletes: sign-ins then keep the table
// to the sessions not yet expired, with no background work.
const prunePerSignIn = 100

// sessionIDBytes is the randomness of a session id (256 bits).
const sessionIDBytes = 32

var (
	// ErrUnknownSession: a session cookie that names no session (a guess, or a session pruned
	// after it expired). It counts as a failed authentication.
	ErrUnknownSession = fmt.Errorf("%w: unknown session", auth.ErrUnauthenticated)
	// ErrSessionEnded: the session expired or was signed out.
	ErrSessionEnded = fmt.Errorf("%w: the session ended; sign in again", auth.ErrUnauthenticated)
	// errTooManySignIns: the principal made UI.SignInsPerMinute sessions in the last minute.
	errTooManySignIns = errors.New("too many sign-ins")
)

// Session is a signed-in browser's session.
type Session struct {
	// Principal is who signed in, with the roles and repositories the tokens file gives it now
	// (auth.Authenticator.Current).
	Principal auth.Principal
	// CSRF is the session's anti-forgery token: the session's forms post it in their csrf
	// field (SessionPost checks it).
	CSRF string
	// ExpiresAt is when the session ends.
	ExpiresAt time.Time

	id, idHash string
}

// storedPrincipal is what the store keeps of a session's principal (store.Session's
// PrincipalJSON): the principal as it signed in and, for a static token, the token's MAC keyed
// by the session id (auth.Authenticator.TokenMAC), which ends the session with the token.
type storedPrincipal struct {
	auth.Principal
	TokenMAC string `json:",omitempty"`
}

type sessionKey struct{}

// WithSession returns ctx carrying the session that authenticated a request.
func WithSession(ctx context.Context, s *Session) context.Context {
	return context.WithValue(ctx, sessionKey{}, s)
}

// SessionFrom returns the session in ctx, or nil when the request was not authenticated by one.
func SessionFrom(ctx context.Context) *Session {
	s, _ := ctx.Value(sessionKey{}).(*Session)
	return s
}

func (u *UI) now() time.Time {
	if u.Now != nil {
		return u.Now()
	}
	return time.Now()
}

// hashID is what the store keeps of a session id.
func hashID(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:])
}

// csrfOf is a session's anti-forgery token: a MAC of a constant keyed by the session id, so it
// needs no storage, and knowing it (or the stored hash) does not give the id.
func csrfOf(id string) string {
	m := hmac.New(sha256.New, []byte(id))
	m.Write([]byte("tfstackplan csrf"))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// validSessionID reports whether v looks like an id newSession made, so that no junk reaches
// the database.
func validSessionID(v string) bool {
	if len(v) != base64.RawURLEncoding.EncodedLen(sessionIDBytes) {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(v)
	return err == nil
}

// newSession stores a session for p, who signed in with token (pruning expired ones), and
// returns its id and lifetime: SessionTTL, or less when p's ID token expires sooner. It refuses
// with errTooManySignIns past SignInsPerMinute sessions of p in the last minute.
func (u *UI) newSession(ctx context.Context, p auth.Principal, token string) (string, time.Duration, error) {
	b := make([]byte, sessionIDBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails: it crashes the program instead
	id := base64.RawURLEncoding.EncodeToString(b)
	pj, err := json.Marshal(storedPrincipal{Principal: p, TokenMAC: u.Auth.TokenMAC(token, id)})
	if err != nil {
		return "", 0, err
	}
	now := u.now()
	ttl := u.SessionTTL
	if !p.Expires.IsZero() {
		// A session is no more than the credentials it was opened with.
		ttl = min(ttl, p.Expires.Sub(now))
	}
	if ttl <= 0 {
		return "", 0, ErrSessionEnded
	}
	s := store.Session{IDHash: hashID(id), Principal: p.Name, PrincipalJSON: string(pj), CreatedAt: now, ExpiresAt: now.Add(ttl)}
	err = u.Service.Store.Write(ctx, func(tx store.Tx) error {
		n, err := tx.SessionsSince(p.Name, now.Add(-time.Minute))
		if err != nil {
			return err
		}
		if n >= u.SignInsPerMinute {
			return errTooManySignIns
		}
		if _, err := tx.PruneSessions(now, prunePerSignIn); err != nil {
			return err
		}
		return tx.CreateSession(s)
	})
	return id, ttl, err
}

// session returns the live session of id, ErrUnknownSession or ErrSessionEnded. A session whose
// credentials the tokens file no longer accepts (auth.Authenticator.Current: a token removed
// or given another secret, an identity or repository no longer listed) has ended too.
func (u *UI) session(ctx context.Context, id string) (*Session, error) {
	if !validSessionID(id) {
		return nil, ErrUnknownSession
	}
	row, err := u.live(ctx, hashID(id))
	if err != nil {
		return nil, err
	}
	var sp storedPrincipal
	if err := json.Unmarshal([]byte(row.PrincipalJSON), &sp); err != nil {
		return nil, fmt.Errorf("session of %s: %w", row.Principal, err)
	}
	p, err := u.Auth.Current(sp.Principal, id, sp.TokenMAC, u.now())
	if err != nil {
		return nil, ErrSessionEnded
	}
	return &Session{Principal: p, CSRF: csrfOf(id), ExpiresAt: row.ExpiresAt, id: id, idHash: row.IDHash}, nil
}

// live returns the stored session of idHash unless it ended: ErrUnknownSession,
// ErrSessionEnded, or the store's error.
func (u *UI) live(ctx context.Context, idHash string) (*store.Session, error) {
	var row *store.Session
	err := u.Service.Store.Read(ctx, func(tx store.Tx) (err error) { row, err = tx.Session(idHash); return })
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, ErrUnknownSession
	case err != nil:
		return nil, err
	case !row.RevokedAt.IsZero() || !u.now().Before(row.ExpiresAt):
		return nil, ErrSessionEnded
	}
	return row, nil
}

// sessionEnded reports whether s expired, was signed out or lost its credentials since it
// authenticated a request, or whether the tokens file now gives its principal other roles or
// repositories (what a stream opened by it was allowed to show was decided under the old
// ones). A store that fails says nothing: the session is taken to live on.
func (u *UI) sessionEnded(ctx context.Context, s *Session) bool {
	cur, err := u.session(ctx, s.id)
	if err != nil {
		return errors.Is(err, auth.ErrUnauthenticated)
	}
	return !slices.Equal(cur.Principal.Roles, s.Principal.Roles) || !slices.Equal(cur.Principal.Repositories, s.Principal.Repositories)
}

// PageSession returns the session of a page request's cookie, or nil without one. A cookie of
// no live session is cleared (ErrUnknownSession, ErrSessionEnded); so is the old cookie that
// held a token, which is not read.
func (u *UI) PageSession(w http.ResponseWriter, r *http.Request) (*Session, error) {
	if _, err := r.Cookie(legacyCookieName); err == nil {
		clearCookie(w, r, legacyCookieName)
	}
	c, err := r.Cookie(SessionCookieName)
	if err != nil || c.Value == "" {
		return nil, nil
	}
	s, err := u.session(r.Context(), c.Value)
	if errors.Is(err, auth.ErrUnauthenticated) {
		clearCookie(w, r, SessionCookieName)
	}
	return s, err
}

// setSessionCookie hands the browser a session id, for as long as the session lasts.
func setSessionCookie(w http.ResponseWriter, r *http.Request, id string, ttl time.Duration) {
	http.SetCookie(w, &http.Cookie{Name: SessionCookieName, Value: id, Path: "/", MaxAge: int(ttl.Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure(r)})
}

// clearCookie has the browser drop a cookie of Path /.
func clearCookie(w http.ResponseWriter, r *http.Request, name string) {
	http.SetCookie(w, &http.Cookie{Name: name, Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure(r)})
}

// maxFormBody bounds a form a signed-in session posts.
const maxFormBody = 64 << 10

// SessionPost checks that r is a form posted by a signed-in session: from a page of this site
// (the cross-origin check), as application/x-www-form-urlencoded, with the cookie of a live
// session and that session's anti-forgery token (Session.CSRF) in the csrf field (an unknown
// session id counts against the client's address, as a wrong token does). It reads the form into r.PostForm and returns the session. Otherwise it
// answers w itself and returns nil: an ended or unknown session gets the sign-in form.
func (u *UI) SessionPost(w http.ResponseWriter, r *http.Request) *Session {
	if err := crossOrigin.Check(r); err != nil {
		EndConnection(w, r)
		http.Error(w, "this form came from another site", http.StatusForbidden)
		return nil
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/x-www-form-urlencoded" {
		EndConnection(w, r)
		http.Error(w, "a form is sent as application/x-www-form-urlencoded", http.StatusUnsupportedMediaType)
		return nil
	}
	c, err := r.Cookie(SessionCookieName)
	if err != nil {
		EndConnection(w, r)
		LoginPage(w, r, fmt.Errorf("%w: not signed in", auth.ErrUnauthenticated))
		return nil
	}
	s, err := u.session(r.Context(), c.Value)
	if err != nil {
		EndConnection(w, r)
		switch {
		case errors.Is(err, ErrUnknownSession):
			if terr := u.Throttle.Fail(r, ""); terr != nil {
				err = terr
			}
			fallthrough
		case errors.Is(err, auth.ErrUnauthenticated):
			clearCookie(w, r, SessionCookieName)
			LoginPage(w, r, err)
		default:
			u.fail(w, err)
		}
		return nil
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBody)
	if err := r.ParseForm(); err != nil {
		formError(w, err)
		return nil
	}
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(s.CSRF)) != 1 {
		http.Error(w, "this form expired: reload the page and send it again", http.StatusForbidden)
		return nil
	}
	return s
}

// formError answers a form that could not be read.
func formError(w http.ResponseWriter, err error) {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		http.Error(w, "the form is too large", http.StatusRequestEntityTooLarge)
	case errors.Is(err, os.ErrDeadlineExceeded):
		http.Error(w, "the form did not arrive in time", http.StatusRequestTimeout)
	default:
		http.Error(w, "the form could not be read", http.StatusBadRequest)
	}
}

// logout ends the session that posts it, on every replica, and clears its cookie.
func (u *UI) logout(w http.ResponseWriter, r *http.Request) {
	s := u.SessionPost(w, r)
	if s == nil {
		return
	}
	err := u.Service.Store.Write(r.Context(), func(tx store.Tx) error {
		_, err := tx.RevokeSession(s.idHash, u.now())
		return err
	})
	if err != nil {
		u.fail(w, err)
		return
	}
	clearCookie(w, r, SessionCookieName)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// throttledMessage is what the sign-in form says to a throttled client.
func throttledMessage(err error) string {
	var te *throttle.Error
	if !errors.As(err, &te) {
		return "Too many attempts: try again later."
	}
	return fmt.Sprintf("Too many failed sign-ins from %s: try again in %s.", te.What, te.Wait.Round(time.Second))
}
