package server

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
	"github.com/tfstackplan/tfstackplan/internal/server/throttle"
	"github.com/tfstackplan/tfstackplan/internal/server/web"
)

// from serves a request from the client address addr straight through the handler (the test
// server's clients all come from 127.0.0.1).
func (ts *testServer) from(addr, method, path, token string, form url.Values, cookies ...*http.Cookie) *httptest.ResponseRecorder {
	var req *http.Request
	if form != nil {
		req = httptest.NewRequest(method, path, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		req = httptest.NewRequest(method, path, nil)
	}
	req.RemoteAddr = addr + ":40000"
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	w := httptest.NewRecorder()
	ts.srv.ServeHTTP(w, req)
	return w
}

// signInFrom posts the sign-in form with token from addr.
func (ts *testServer) signInFrom(addr, token string) *httptest.ResponseRecorder {
	csrf := strings.Repeat("A", 26)
	return ts.from(addr, "POST", "/ui/login", "", url.Values{"token": {token}, "csrf": {csrf}, "next": {"/"}},
		&http.Cookie{Name: web.CSRFCookieName, Value: csrf})
}

// TestFailedAuthenticationsThrottleTheAddress: after a burst of wrong tokens an address gets
// 429 with Retry-After for the window for every further failure, on the API, the pages and the
// sign-in form, while right credentials from it (a token, a session, a sign-in) are served:
// behind a load balancer or a NAT, one misconfigured job must not shut every job out. Other
// addresses, and the health checks, are not affected; failures are answered 401 again once the
// window has passed.
func TestFailedAuthenticationsThrottleTheAddress(t *testing.T) {
	clk := newTestClock()
	ts := newTestServer(t, storetest.OpenSQLite(t), withClock(clk))
	const bad, good = "192.0.2.1", "192.0.2.2"
	for i := range throttle.DefaultBurst - 1 {
		if w := ts.from(bad, "GET", BasePath+"/claims", fmt.Sprint("wrong-token-", i), nil); w.Code != 401 {
			t.Fatalf("wrong token %d: %d", i+1, w.Code)
		}
	}
	w := ts.from(bad, "GET", BasePath+"/claims", "wrong-token-last", nil)
	if w.Code != 429 || w.Header().Get("Retry-After") != "300" || !strings.Contains(w.Body.String(), "this address") {
		t.Fatalf("the burst's last wrong token: %d %v %s", w.Code, w.Header(), w.Body)
	}
	throttled := func(when string) {
		t.Helper()
		if w := ts.from(bad, "GET", BasePath+"/claims", "wrong-token-again", nil); w.Code != 429 || w.Header().Get("Retry-After") == "" {
			t.Fatalf("%s: API with a wrong token: %d %v", when, w.Code, w.Header())
		}
		w := ts.from(bad, "GET", "/ui/claims", "wrong-token-again", nil)
		if w.Code != 429 || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "Too many failed sign-ins from this address") {
			t.Fatalf("%s: page: %d %v %.300s", when, w.Code, w.Header(), w.Body)
		}
		w = ts.signInFrom(bad, "wrong-token-again")
		if w.Code != 429 || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "Too many failed sign-ins") || sessionCookie(w.Result()) != nil {
			t.Fatalf("%s: sign-in: %d %v %.300s", when, w.Code, w.Header(), w.Body)
		}
	}
	served := func(when string) {
		t.Helper()
		if w := ts.from(bad, "GET", BasePath+"/claims", tokenOf["admin"], nil); w.Code != 200 {
			t.Fatalf("%s: API with a right token: %d %s", when, w.Code, w.Body)
		}
		if w := ts.from(bad, "GET", "/ui/claims", tokenOf["viewer"], nil); w.Code != 200 {
			t.Fatalf("%s: page with a right token: %d", when, w.Code)
		}
		if w := ts.from(bad, "GET", "/ui/claims", "", nil, ts.session(t, tokenOf["viewer"])); w.Code != 200 {
			t.Fatalf("%s: page with a live session: %d", when, w.Code)
		}
		if w := ts.signInFrom(bad, tokenOf["viewer"]); w.Code != http.StatusSeeOther {
			t.Fatalf("%s: sign-in with a right token: %d %.300s", when, w.Code, w.Body)
		}
	}
	throttled("at once")
	served("at once")
	for _, path := range []string{"/healthz", "/readyz", BasePath + "/health"} {
		if w := ts.from(bad, "GET", path, "", nil); w.Code != 200 {
			t.Fatalf("%s from the throttled address: %d", path, w.Code)
		}
	}
	if w := ts.from(good, "GET", BasePath+"/claims", "wrong-token", nil); w.Code != 401 {
		t.Fatalf("another address's wrong token: %d", w.Code)
	}
	clk.add(throttle.DefaultWindow - time.Second)
	throttled("a second before the window ends")
	clk.add(throttle.DefaultWindow)
	if w := ts.from(bad, "GET", BasePath+"/claims", "wrong-token", nil); w.Code != 401 {
		t.Fatalf("a wrong token after the window: %d %s", w.Code, w.Body)
	}
}

// TestWhatCountsAsAFailure: requests without credentials, and a session that ended, do not
// count; wrong tokens on pages, unknown session ids and wrong sign-in tokens do.
func TestWhatCountsAsAFailure(t *testing.T) {
	clk := newTestClock()
	ts := newTestServer(t, storetest.OpenSQLite(t), withClock(clk, func(c *Config) { c.FailureBurst = 3 }))
	for i := range 20 {
		if w := ts.from("192.0.2.1", "GET", "/ui/claims", "", nil); w.Code != 401 {
			t.Fatalf("page without credentials %d: %d", i, w.Code)
		}
		if w := ts.from("192.0.2.1", "GET", BasePath+"/claims", "", nil); w.Code != 401 {
			t.Fatalf("API without credentials %d: %d", i, w.Code)
		}
	}
	unknown := &http.Cookie{Name: web.SessionCookieName, Value: strings.Repeat("x", 43)}
	for addr, fail := range map[string]func() *httptest.ResponseRecorder{
		"192.0.2.2": func() *httptest.ResponseRecorder {
			return ts.from("192.0.2.2", "GET", "/ui/claims", "wrong-token", nil)
		},
		"192.0.2.3": func() *httptest.ResponseRecorder { return ts.from("192.0.2.3", "GET", "/ui/claims", "", nil, unknown) },
		"192.0.2.4": func() *httptest.ResponseRecorder { return ts.signInFrom("192.0.2.4", "wrong-token") },
		"192.0.2.5": func() *httptest.ResponseRecorder {
			return ts.from("192.0.2.5", "POST", "/ui/logout", "", url.Values{"csrf": {"x"}}, unknown)
		},
	} {
		for range 2 {
			if w := fail(); w.Code == 429 {
				t.Fatalf("%s: throttled before the burst", addr)
			}
		}
		if w := fail(); w.Code != 429 {
			t.Fatalf("%s: the burst's last failure: %d, want 429", addr, w.Code)
		}
	}
}

// TestFailuresThrottleThePrincipal: a token that verifies but whose principal has no roles
// here (a Google identity the tokens file does not list) counts against the principal, from
// every address, on the API and the sign-in form alike; once throttled, the principal is
// answered 429 for its failures from a fresh address, while a credential of it that verifies
// is served.
func TestFailuresThrottleThePrincipal(t *testing.T) {
	keys, v := googleValidator(t)
	const aud, mallory = "https://tfstackplan.example.com", "mallory@else.example"
	clk := newTestClock()
	ts := newTestServer(t, storetest.OpenSQLite(t), withClock(clk, func(c *Config) {
		c.Auth.Audience, c.Auth.Validator = aud, v
		// A static token under the unlisted identity's name: the principal's right credential.
		if err := c.Auth.ParseTokens("tokens.hcl", []byte(testTokens+`
token "mallory" {
  secret    = "mallory-secret-0123456789"
  principal = "`+mallory+`"
  roles     = ["viewer"]
}`)); err != nil {
			t.Fatal(err)
		}
	}))
	now := time.Now().Unix()
	idToken := func(email string) string {
		return keys.sign(t, map[string]any{"iss": "https://accounts.google.com", "aud": aud, "iat": now, "exp": now + 600,
			"sub": "1", "email": email, "email_verified": true})
	}
	unlisted := idToken(mallory)
	for i := range throttle.DefaultBurst - 1 {
		addr := fmt.Sprintf("198.51.100.%d", i+1)
		var w *httptest.ResponseRecorder
		if i%2 == 0 {
			w = ts.from(addr, "GET", BasePath+"/claims", unlisted, nil)
		} else {
			w = ts.signInFrom(addr, unlisted)
		}
		if w.Code != 403 {
			t.Fatalf("unlisted identity %d from %s: %d %s", i+1, addr, w.Code, w.Body)
		}
	}
	if w := ts.from("198.51.100.100", "GET", BasePath+"/claims", unlisted, nil); w.Code != 429 || !strings.Contains(w.Body.String(), "this principal") {
		t.Fatalf("the burst's last failure of the principal: %d %s", w.Code, w.Body)
	}
	const fresh = "203.0.113.1"
	if w := ts.signInFrom(fresh, unlisted); w.Code != 429 || !strings.Contains(w.Body.String(), "this principal") {
		t.Fatalf("the throttled principal's failing sign-in from a fresh address: %d %.300s", w.Code, w.Body)
	}
	if w := ts.from(fresh, "GET", BasePath+"/claims", "mallory-secret-0123456789", nil); w.Code != 200 {
		t.Fatalf("the throttled principal's right token from a fresh address: %d %s", w.Code, w.Body)
	}
	if w := ts.signInFrom(fresh, "mallory-secret-0123456789"); w.Code != http.StatusSeeOther {
		t.Fatalf("the throttled principal signs in with its right token: %d %.300s", w.Code, w.Body)
	}
	if w := ts.from(fresh, "GET", BasePath+"/claims", idToken("deployer@proj.iam.gserviceaccount.com"), nil); w.Code != 200 {
		t.Fatalf("another principal from that address: %d %s", w.Code, w.Body)
	}
	clk.add(throttle.DefaultWindow)
	if w := ts.from("203.0.113.2", "GET", BasePath+"/claims", unlisted, nil); w.Code != 403 {
		t.Fatalf("the principal's failure after the window: %d %s", w.Code, w.Body)
	}
}

// TestSignInsPerPrincipal: a principal starts at most SignInsPerMinute sessions a minute, from
// any address; then the sign-in form answers 429 until the minute has passed.
func TestSignInsPerPrincipal(t *testing.T) {
	clk := newTestClock()
	ts := newTestServer(t, storetest.OpenSQLite(t), withClock(clk, func(c *Config) { c.SignInsPerMinute = 3 }))
	for i := range 3 {
		if w := ts.signInFrom(fmt.Sprintf("192.0.2.%d", i+1), tokenOf["viewer"]); w.Code != http.StatusSeeOther {
			t.Fatalf("sign-in %d: %d", i+1, w.Code)
		}
	}
	w := ts.signInFrom("192.0.2.9", tokenOf["viewer"])
	if w.Code != 429 || w.Header().Get("Retry-After") != "60" || !strings.Contains(w.Body.String(), "Too many sign-ins as viewer") {
		t.Fatalf("fourth sign-in in a minute: %d %v %.300s", w.Code, w.Header(), w.Body)
	}
	if w := ts.signInFrom("192.0.2.9", tokenOf["admin"]); w.Code != http.StatusSeeOther {
		t.Fatalf("another principal: %d", w.Code)
	}
	clk.add(time.Minute + time.Second)
	if w := ts.signInFrom("192.0.2.9", tokenOf["viewer"]); w.Code != http.StatusSeeOther {
		t.Fatalf("a minute later: %d", w.Code)
	}
}

// TestThrottleTracksBoundedAddresses: failures from more addresses than the throttle tracks
// keep it at its bound, and a throttled address stays throttled through the flood.
func TestThrottleTracksBoundedAddresses(t *testing.T) {
	clk := newTestClock()
	ts := newTestServer(t, storetest.OpenSQLite(t), withClock(clk))
	for range throttle.DefaultBurst {
		ts.from("192.0.2.1", "GET", BasePath+"/claims", "wrong-token", nil)
	}
	for i := range throttle.DefaultMaxKeys + 2000 {
		addr := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		if w := ts.from(addr, "GET", BasePath+"/claims", "wrong-token", nil); w.Code != 401 {
			t.Fatalf("%s: %d", addr, w.Code)
		}
	}
	if n := ts.srv.throttle.Addrs.Len(); n > throttle.DefaultMaxKeys {
		t.Fatalf("%d addresses tracked, want at most %d", n, throttle.DefaultMaxKeys)
	}
	if w := ts.from("192.0.2.1", "GET", BasePath+"/claims", "wrong-token", nil); w.Code != 429 {
		t.Fatalf("the throttled address after the flood: %d", w.Code)
	}
}

// The per-principal rate limiters are bounded: every GitHub Actions run is a principal of its
// own. A flood of new principals drops the idle limiters, never one that is spent.
func TestRateLimitersAreBounded(t *testing.T) {
	srv, err := New(Config{Service: service.New(storetest.Backends()[0].Open(t), nil), Auth: &auth.Authenticator{}, RateLimit: 1e-6, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	spent := srv.limiter("github:acme/infra:run:1")
	if !spent.Allow() {
		t.Fatal("a new limiter refused its first request")
	}
	for i := range maxLimiters + 5000 {
		srv.limiter(fmt.Sprintf("github:acme/infra:run:%d", 1000+i))
		if n := len(srv.limiters); n > maxLimiters {
			t.Fatalf("%d limiters kept, more than %d", n, maxLimiters)
		}
	}
	if l := srv.limiter("github:acme/infra:run:1"); l != spent || l.Allow() {
		t.Fatal("the flood dropped a spent limiter: its principal got a fresh burst")
	}
}
