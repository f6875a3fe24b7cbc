package server

import (
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
	"github.com/tfstackplan/tfstackplan/internal/server/web"
)

// signInForm opens a page without credentials and returns the sign-in form's anti-forgery
// token and the cookie that goes with it.
func (ts *testServer) signInForm(t testing.TB) (string, *http.Cookie) {
	t.Helper()
	resp, err := ts.Client().Get(ts.URL + "/ui/claims")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindSubmatch(body)
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == web.CSRFCookieName {
			cookie = c
		}
	}
	if resp.StatusCode != 401 || m == nil || cookie == nil || cookie.Value != string(m[1]) || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode {
		t.Fatalf("sign-in form: %d cookie %+v field %q", resp.StatusCode, cookie, m)
	}
	return string(m[1]), cookie
}

// signIn posts the sign-in form with form values, the cookie (when not nil) and extra headers,
// and returns the answer without following it.
func (ts *testServer) signIn(t testing.TB, form url.Values, cookie *http.Cookie, header map[string]string) *http.Response {
	t.Helper()
	return ts.postForm(t, "/ui/login", form, cookie, header)
}

// postForm posts a form to path with the cookie (when not nil) and extra headers, and returns
// the answer without following it.
func (ts *testServer) postForm(t testing.TB, path string, form url.Values, cookie *http.Cookie, header map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", ts.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if cookie != nil {
		req.AddCookie(cookie)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// sessionCookie returns the session cookie an answer sets, or nil.
func sessionCookie(resp *http.Response) *http.Cookie {
	for _, c := range resp.Cookies() {
		if c.Name == web.SessionCookieName {
			return c
		}
	}
	return nil
}

// session signs in with token through the sign-in form, once per token and server, and
// returns the session cookie.
func (ts *testServer) session(t testing.TB, token string) *http.Cookie {
	t.Helper()
	if c, ok := ts.sessions[token]; ok {
		return c
	}
	c := ts.signInAs(t, token)
	if ts.sessions == nil {
		ts.sessions = map[string]*http.Cookie{}
	}
	ts.sessions[token] = c
	return c
}

// signInAs signs in with token through the sign-in form and returns a new session cookie.
func (ts *testServer) signInAs(t testing.TB, token string) *http.Cookie {
	t.Helper()
	csrf, cookie := ts.signInForm(t)
	resp := ts.signIn(t, url.Values{"token": {token}, "next": {"/"}, "csrf": {csrf}}, cookie, nil)
	c := sessionCookie(resp)
	if resp.StatusCode != http.StatusSeeOther || c == nil {
		t.Fatalf("sign-in: %d %v", resp.StatusCode, resp.Header)
	}
	return c
}

// TestLoginRedirectsOnlyWithinTheSite: next is followed only when it is a path of this site;
// anything a browser could read as another host goes to /.
func TestLoginRedirectsOnlyWithinTheSite(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), func(c *Config) { c.SignInsPerMinute = 100 })
	csrf, cookie := ts.signInForm(t)
	for next, want := range map[string]string{
		"/ui/claims":                  "/ui/claims",
		"/ui/executions/x?pr=1":       "/ui/executions/x?pr=1",
		"//evil.example/x":            "/",
		"https://evil.example":        "/",
		`/\evil.example`:              "/",
		`/\/evil.example`:             "/",
		"/%5Cevil.example":            "/",
		"/%5C%5Cevil.example":         "/",
		"/\t/evil.example":            "/",
		"/%09/evil.example":           "/",
		"/%2F%2Fevil.example":         "/",
		"/\r\nSet-Cookie: x=y":        "/",
		"javascript:alert(1)":         "/",
		"evil.example":                "/",
		"":                            "/",
		"/%zz":                        "/",
		"/ui/claims#frag":             "/ui/claims#frag",
		"/ui/../\\\\evil.example/../": "/",
	} {
		resp := ts.signIn(t, url.Values{"token": {tokenOf["viewer"]}, "next": {next}, "csrf": {csrf}}, cookie, nil)
		if resp.StatusCode != http.StatusSeeOther || sessionCookie(resp) == nil {
			t.Fatalf("next=%q: %d %v", next, resp.StatusCode, resp.Header)
		}
		if got := resp.Header.Get("Location"); got != want {
			t.Errorf("next=%q: Location %q, want %q", next, got, want)
		}
	}
}

// TestLoginRefusesForgeries: the sign-in form needs its anti-forgery cookie and field, a
// same-origin browser, the form's media type and a token that may read the pages.
func TestLoginRefusesForgeries(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	csrf, cookie := ts.signInForm(t)
	form := func(token, csrf string) url.Values {
		return url.Values{"token": {token}, "next": {"/ui/claims"}, "csrf": {csrf}}
	}
	other := *cookie
	other.Value = strings.Repeat("A", 26)
	cases := []struct {
		name   string
		form   url.Values
		cookie *http.Cookie
		header map[string]string
		status int
	}{
		{"no anti-forgery cookie", form(tokenOf["viewer"], csrf), nil, nil, 403},
		{"no anti-forgery field", url.Values{"token": {tokenOf["viewer"]}}, cookie, nil, 403},
		{"field of another cookie", form(tokenOf["viewer"], csrf), &other, nil, 403},
		{"cross-site fetch", form(tokenOf["viewer"], csrf), cookie, map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"same-site but other origin", form(tokenOf["viewer"], csrf), cookie, map[string]string{"Sec-Fetch-Site": "same-site"}, 403},
		{"foreign Origin", form(tokenOf["viewer"], csrf), cookie, map[string]string{"Origin": "https://evil.example"}, 403},
		{"multipart body", form(tokenOf["viewer"], csrf), cookie, map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, 415},
		{"unknown token", form("not-a-token-of-this-server", csrf), cookie, nil, 401},
		{"same-origin browser", form(tokenOf["viewer"], csrf), cookie, map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": ts.URL}, 303},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := ts.signIn(t, tc.form, tc.cookie, tc.header)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if got := sessionCookie(resp); (tc.status == 303) != (got != nil) {
				t.Fatalf("session cookie %v after %d", got, resp.StatusCode)
			}
		})
	}
}
