package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/postgres"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlite"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
	"github.com/tfstackplan/tfstackplan/internal/server/web"
)

// testClock is a settable clock for sessions and throttles.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: time.Now().UTC().Truncate(time.Second)} }

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// withClock sets the server's sessions and throttles on c.
func withClock(c *testClock, more ...func(*Config)) func(*Config) {
	return func(cfg *Config) {
		cfg.Now = c.now
		for _, f := range more {
			f(cfg)
		}
	}
}

// pageWith GETs a page with cookie (when not nil) and returns the answer, its body read.
func (ts *testServer) pageWith(t *testing.T, path string, cookie *http.Cookie) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", ts.URL+path, nil)
	if cookie != nil {
		req.AddCookie(cookie)
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

var signOutField = regexp.MustCompile(`action="/ui/logout"><input type="hidden" name="csrf" value="([^"]+)"`)

// signOutToken returns the anti-forgery token of the sign-out form a page shows.
func signOutToken(t *testing.T, body string) string {
	t.Helper()
	m := signOutField.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("the page shows no sign-out form:\n%.2000s", body)
	}
	return m[1]
}

// logout posts the sign-out form with csrf, the cookie (when not nil) and extra headers.
func (ts *testServer) logout(t *testing.T, csrf string, cookie *http.Cookie, header map[string]string) *http.Response {
	t.Helper()
	return ts.postForm(t, "/ui/logout", url.Values{"csrf": {csrf}}, cookie, header)
}

// cleared reports whether an answer has the browser drop the cookie name.
func cleared(resp *http.Response, name string) bool {
	for _, c := range resp.Cookies() {
		if c.Name == name && c.MaxAge < 0 && c.Path == "/" {
			return true
		}
	}
	return false
}

func hashOf(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:])
}

// TestSessionCookieHoldsNoToken: signing in hands the browser a random session id, never the
// token; the database keeps only the id's hash with the principal; the session reads pages,
// which show a sign-out form.
func TestSessionCookieHoldsNoToken(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	for _, token := range []string{tokenOf["viewer"], tokenOf["admin"]} {
		c := ts.signInAs(t, token)
		if strings.Contains(c.Value, token) || len(c.Value) < 22 || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode ||
			c.Path != "/" || c.Secure || c.MaxAge != int((12*time.Hour).Seconds()) {
			t.Fatalf("session cookie %+v", c)
		}
		var row *store.Session
		if err := ts.store.Read(context.Background(), func(tx store.Tx) (err error) { row, err = tx.Session(hashOf(c.Value)); return }); err != nil {
			t.Fatalf("no session stored under the id's hash: %v", err)
		}
		for _, v := range []string{row.IDHash, row.Principal, row.PrincipalJSON} {
			if strings.Contains(v, c.Value) || strings.Contains(v, token) {
				t.Fatalf("the stored session %+v holds the id or the token", row)
			}
		}
		if !strings.Contains(row.PrincipalJSON, `"Roles"`) {
			t.Fatalf("stored principal %s", row.PrincipalJSON)
		}
		resp, body := ts.pageWith(t, "/ui/claims", c)
		if resp.StatusCode != 200 || !strings.Contains(body, "No claims.") {
			t.Fatalf("page with the session: %d %.500s", resp.StatusCode, body)
		}
		signOutToken(t, body)
	}
	// Over HTTPS (here: as the proxy says) the cookie is Secure.
	csrf, cookie := ts.signInForm(t)
	resp := ts.signIn(t, url.Values{"token": {tokenOf["viewer"]}, "csrf": {csrf}}, cookie, map[string]string{"X-Forwarded-Proto": "https"})
	if c := sessionCookie(resp); c == nil || !c.Secure {
		t.Fatalf("session cookie over HTTPS: %+v", c)
	}
	// A page read with the bearer header shows no sign-out form: there is no session to end.
	if status, body := ts.read(t, "/ui/claims", tokenOf["viewer"]); status != 200 || signOutField.MatchString(body) {
		t.Fatalf("page by header: %d, sign-out form %v", status, signOutField.MatchString(body))
	}
}

// TestLogoutRevokesTheSession: the sign-out form ends the session in the store and clears the
// cookie; the cookie replayed afterwards gets the sign-in form, and is cleared again.
func TestLogoutRevokesTheSession(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	c := ts.signInAs(t, tokenOf["viewer"])
	other := ts.signInAs(t, tokenOf["viewer"])
	_, body := ts.pageWith(t, "/", c)
	resp := ts.logout(t, signOutToken(t, body), c, map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": ts.URL})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" || !cleared(resp, web.SessionCookieName) {
		t.Fatalf("sign-out: %d %v", resp.StatusCode, resp.Header)
	}
	resp, body = ts.pageWith(t, "/ui/claims", c)
	if resp.StatusCode != 401 || !strings.Contains(body, `name="token"`) || !strings.Contains(body, "session ended") || !cleared(resp, web.SessionCookieName) {
		t.Fatalf("replayed cookie after sign-out: %d %v %.300s", resp.StatusCode, resp.Header, body)
	}
	// Signing out again with the old cookie and its token is the sign-in form, not an error.
	if resp := ts.logout(t, "x", c, nil); resp.StatusCode != 401 {
		t.Fatalf("sign-out of an ended session: %d", resp.StatusCode)
	}
	// Another session of the same principal lives on.
	if resp, _ := ts.pageWith(t, "/ui/claims", other); resp.StatusCode != 200 {
		t.Fatalf("the principal's other session: %d", resp.StatusCode)
	}
}

// TestLogoutRefusesForgeries: the sign-out form must come from this site, as a form, with the
// cookie of a live session and that session's anti-forgery token; a refused one leaves the
// session alive.
func TestLogoutRefusesForgeries(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	c := ts.signInAs(t, tokenOf["viewer"])
	_, body := ts.pageWith(t, "/", c)
	csrf := signOutToken(t, body)
	_, otherBody := ts.pageWith(t, "/", ts.signInAs(t, tokenOf["admin"]))
	otherCSRF := signOutToken(t, otherBody)
	if otherCSRF == csrf {
		t.Fatal("two sessions share an anti-forgery token")
	}
	cases := []struct {
		name   string
		csrf   string
		cookie *http.Cookie
		header map[string]string
		status int
	}{
		{"cross-site", csrf, c, map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"same-site, other origin", csrf, c, map[string]string{"Sec-Fetch-Site": "same-site"}, 403},
		{"foreign Origin", csrf, c, map[string]string{"Origin": "https://evil.example"}, 403},
		{"no anti-forgery token", "", c, nil, 403},
		{"another session's token", otherCSRF, c, nil, 403},
		{"multipart", csrf, c, map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, 415},
		{"no session cookie", csrf, nil, nil, 401},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if resp := ts.logout(t, tc.csrf, tc.cookie, tc.header); resp.StatusCode != tc.status || cleared(resp, web.SessionCookieName) {
				t.Fatalf("status %d, want %d (cookie kept)", resp.StatusCode, tc.status)
			}
			if resp, _ := ts.pageWith(t, "/ui/claims", c); resp.StatusCode != 200 {
				t.Fatalf("the session ended after a refused sign-out: %d", resp.StatusCode)
			}
		})
	}
}

// TestSessionExpires: a session reads pages until its TTL has passed, then gets the sign-in
// form and its cookie cleared; an ended session is not a failed authentication.
func TestSessionExpires(t *testing.T) {
	clk := newTestClock()
	ts := newTestServer(t, storetest.OpenSQLite(t), withClock(clk, func(c *Config) { c.SessionTTL = time.Hour; c.FailureBurst = 1 }))
	c := ts.signInAs(t, tokenOf["viewer"])
	if c.MaxAge != 3600 {
		t.Fatalf("cookie Max-Age %d, want the TTL", c.MaxAge)
	}
	clk.add(time.Hour - time.Second)
	if resp, _ := ts.pageWith(t, "/ui/claims", c); resp.StatusCode != 200 {
		t.Fatalf("a second before the end: %d", resp.StatusCode)
	}
	clk.add(time.Second)
	resp, body := ts.pageWith(t, "/ui/claims", c)
	if resp.StatusCode != 401 || !strings.Contains(body, "session ended") || !cleared(resp, web.SessionCookieName) {
		t.Fatalf("at the end: %d %v", resp.StatusCode, resp.Header)
	}
	// With a burst of 1, a counted failure would have throttled this address.
	if status, _ := ts.read(t, "/ui/claims", tokenOf["viewer"]); status != 200 {
		t.Fatalf("an ended session counted as a failure: %d", status)
	}
	// A sign-in deletes the expired sessions.
	ts.signInAs(t, tokenOf["viewer"])
	err := ts.store.Read(context.Background(), func(tx store.Tx) error { _, err := tx.Session(hashOf(c.Value)); return err })
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the expired session after a sign-in: %v, want it pruned", err)
	}
}

// TestSessionsAuthenticateReadsOnly: a session cookie does not authenticate a state change,
// even on a route behind the pages' guard.
func TestSessionsAuthenticateReadsOnly(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	c := ts.signInAs(t, tokenOf["admin"])
	reached := false
	h := ts.srv.webGuard(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true }))
	for _, method := range []string{"GET", "HEAD", "POST", "PUT", "DELETE"} {
		reached = false
		req := httptest.NewRequest(method, "/ui/claims", nil)
		req.AddCookie(c)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if want := method == "GET" || method == "HEAD"; reached != want {
			t.Errorf("%s with a session: reached %v (%d), want %v", method, reached, w.Code, want)
		}
	}
}

// TestSessionLookupFailure: a store that fails answers a page read by session with its error,
// not the sign-in form; a cookie that is no session id never reaches the store.
func TestSessionLookupFailure(t *testing.T) {
	s := storetest.OpenSQLite(t)
	ts := newTestServer(t, s, nil)
	c := ts.signInAs(t, tokenOf["viewer"])
	broken := newTestServer(t, failingStore{Store: s, err: fmt.Errorf("%w: database down", store.ErrUnavailable)}, nil)
	if resp, body := broken.pageWith(t, "/ui/claims", c); resp.StatusCode != 503 || strings.Contains(body, `name="token"`) {
		t.Fatalf("session lookup on a failing store: %d %.300s", resp.StatusCode, body)
	}
	junk := &http.Cookie{Name: web.SessionCookieName, Value: "not-a-session-id"}
	if resp, body := broken.pageWith(t, "/ui/claims", junk); resp.StatusCode != 401 || !strings.Contains(body, `name="token"`) {
		t.Fatalf("a junk cookie on a failing store: %d %.300s", resp.StatusCode, body)
	}
}

// TestOldTokenCookieIsRefused: the cookie that held a raw token before sessions authenticates
// nothing, and a page answer clears it.
func TestOldTokenCookieIsRefused(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	old := &http.Cookie{Name: "tfstackplan_token", Value: tokenOf["admin"]}
	resp, body := ts.pageWith(t, "/ui/claims", old)
	if resp.StatusCode != 401 || !strings.Contains(body, `name="token"`) || !cleared(resp, "tfstackplan_token") {
		t.Fatalf("page with the old cookie: %d %v", resp.StatusCode, resp.Header)
	}
	req, _ := http.NewRequest("GET", ts.URL+BasePath+"/claims", nil)
	req.AddCookie(old)
	if status, _ := ts.do(t, req); status != 401 {
		t.Fatalf("API read with the old cookie: %d", status)
	}
	// Beside a session, it is cleared too.
	req, _ = http.NewRequest("GET", ts.URL+"/ui/claims", nil)
	req.AddCookie(old)
	req.AddCookie(ts.signInAs(t, tokenOf["viewer"]))
	if resp, err := ts.Client().Do(req); err != nil || resp.StatusCode != 200 || !cleared(resp, "tfstackplan_token") {
		t.Fatalf("page with a session and the old cookie: %v %v", resp, err)
	}
}

// TestSessionsAcrossReplicas: two servers on one database honour each other's sessions, and a
// sign-out on one ends the session on the other (PostgreSQL, and one SQLite file).
func TestSessionsAcrossReplicas(t *testing.T) {
	backends := map[string]func(t *testing.T) (store.Store, store.Store){
		"sqlite": func(t *testing.T) (store.Store, store.Store) {
			path := filepath.Join(t.TempDir(), "shared.db")
			open := func() store.Store {
				s, err := sqlite.Open(context.Background(), path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Close() })
				return s
			}
			return open(), open()
		},
		"postgres": func(t *testing.T) (store.Store, store.Store) {
			u, channel := storetest.PostgresURL(t)
			open := func() store.Store {
				s, err := postgres.Open(context.Background(), u, postgres.Options{Channel: channel})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Close() })
				return s
			}
			return open(), open()
		},
	}
	for name, open := range backends {
		t.Run(name, func(t *testing.T) {
			sa, sb := open(t)
			a, b := newTestServer(t, sa, nil), newTestServer(t, sb, nil)
			c := a.signInAs(t, tokenOf["viewer"])
			resp, body := b.pageWith(t, "/ui/claims", c)
			if resp.StatusCode != 200 {
				t.Fatalf("replica b refuses replica a's session: %d", resp.StatusCode)
			}
			if resp := b.logout(t, signOutToken(t, body), c, nil); resp.StatusCode != http.StatusSeeOther {
				t.Fatalf("sign-out on b: %d", resp.StatusCode)
			}
			if resp, _ := a.pageWith(t, "/ui/claims", c); resp.StatusCode != 401 || !cleared(resp, web.SessionCookieName) {
				t.Fatalf("replica a still honours the session b ended: %d", resp.StatusCode)
			}
		})
	}
}

// BenchmarkPageRead measures a page read authenticated by the bearer header and by a session:
// the difference is the session's lookup in the store.
func BenchmarkPageRead(b *testing.B) {
	for _, backend := range storetest.Backends() {
		b.Run(backend.Name, func(b *testing.B) {
			ts := newTestServer(b, backend.Open(b), func(c *Config) { c.RateLimit = 1e9 })
			for _, by := range []string{"header", "session"} {
				b.Run(by, func(b *testing.B) {
					req, _ := http.NewRequest("GET", ts.URL+"/ui/claims", nil)
					if by == "header" {
						req.Header.Set("Authorization", "Bearer "+tokenOf["viewer"])
					} else {
						req.AddCookie(ts.session(b, tokenOf["viewer"]))
					}
					for b.Loop() {
						resp, err := ts.Client().Do(req)
						if err != nil || resp.StatusCode != 200 {
							b.Fatalf("%v %v", resp, err)
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				})
			}
		})
	}
}
