package cli

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serveWith runs serve with opts (its IO, listen address, store and tokens filled in) until
// the test ends, and returns its base URL.
func serveWith(t *testing.T, opts ServeOptions) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	opts.IO = &IO{Out: io.Discard, ErrOut: io.Discard}
	opts.Listen, opts.DB, opts.Tokens = "127.0.0.1:0", "sqlite:"+filepath.Join(t.TempDir(), "s.db"), writeServeTokens(t)
	opts.ShutdownTimeout, opts.Ready = time.Minute, func(a string) { addr <- a }
	go func() { done <- runServe(ctx, &opts) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case a := <-addr:
		return "http://" + a
	case err := <-done:
		t.Fatalf("serve ended early: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not start")
	}
	return ""
}

// wrongTokens sends n requests with a wrong token and returns the last answer.
func wrongTokens(t *testing.T, base string, n int) *http.Response {
	t.Helper()
	var resp *http.Response
	for range n {
		req, _ := http.NewRequest("GET", base+"/api/v1/claims", nil)
		req.Header.Set("Authorization", "Bearer not-a-token-of-this-server")
		var err error
		if resp, err = http.DefaultClient.Do(req); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	return resp
}

// TestServeSessionAndThrottleFlags: --session-ttl sets the sign-in's lifetime, and
// --auth-failure-burst and --auth-failure-window the throttle (0 turns it off).
func TestServeSessionAndThrottleFlags(t *testing.T) {
	base := serveWith(t, ServeOptions{SessionTTL: 90 * time.Minute, AuthFailureBurst: 2, AuthFailureWindow: 7 * time.Minute})
	const csrf = "AAAAAAAAAAAAAAAAAAAAAAAAAA"
	req, _ := http.NewRequest("POST", base+"/ui/login", strings.NewReader(url.Values{"token": {"serve-test-runner-secret"}, "csrf": {csrf}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(&http.Cookie{Name: "tfstackplan_csrf", Value: csrf})
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var maxAge int
	for _, c := range resp.Cookies() {
		if c.Name == "tfstackplan_session" {
			maxAge = c.MaxAge
		}
	}
	if resp.StatusCode != http.StatusSeeOther || maxAge != 90*60 {
		t.Fatalf("sign-in: %d, session cookie Max-Age %d, want 5400", resp.StatusCode, maxAge)
	}
	if resp := wrongTokens(t, base, 2); resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "420" {
		t.Fatalf("second wrong token: %d Retry-After %q, want 429 after 420 s", resp.StatusCode, resp.Header.Get("Retry-After"))
	}

	off := serveWith(t, ServeOptions{AuthFailureBurst: 0})
	if resp := wrongTokens(t, off, 30); resp.StatusCode != 401 {
		t.Fatalf("wrong tokens with the throttle off: %d", resp.StatusCode)
	}
}
