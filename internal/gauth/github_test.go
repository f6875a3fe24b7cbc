package gauth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/buildinfo"
	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

// The token is requested with the request token, the endpoint's own query kept and the
// audience escaped after it; the answer's value is the bearer, obtained once and then reused.
func TestGitHubActionsToken(t *testing.T) {
	const aud = "https://cp.example.com/a b&c=d"
	e := testkit.NewActionsOIDC(t)
	tf, err := GitHubActionsTokenFunc(aud, e.Getenv(nil))
	if err != nil || tf == nil {
		t.Fatalf("GitHubActionsTokenFunc: %v", err)
	}
	tokens := e.Tokens()
	if len(tokens) != 1 {
		t.Fatalf("%d tokens obtained up front, want 1", len(tokens))
	}
	mintTwice(t, tf, tokens[0])
	reqs := e.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1 (the token is cached)", len(reqs))
	}
	r := reqs[0]
	if r.Authorization != "Bearer "+e.RequestToken || r.UserAgent != buildinfo.UserAgent() {
		t.Errorf("Authorization %q, User-Agent %q", r.Authorization, r.UserAgent)
	}
	if r.Query.Get("api-version") != "2.0" || r.Query.Get("audience") != aud || len(r.Query) != 2 {
		t.Errorf("query %v, want the endpoint's api-version and the audience", r.Query)
	}
	if c, _ := jwtClaims(tokens[0]); c["aud"] != aud {
		t.Errorf("token claims %v", c)
	}
}

// A request URL without a query gets one; an answer of the value alone is a token too.
func TestGitHubActionsTokenURLWithoutQuery(t *testing.T) {
	tok := idTokenFor(t, "aud-x")
	for _, end := range []string{"", "?"} {
		e := testkit.NewActionsOIDC(t)
		var query atomic.Value
		e.SetAnswer(func(w http.ResponseWriter, r *http.Request) {
			query.Store(r.URL.RawQuery)
			fmt.Fprintf(w, `{"value":%q}`, tok)
		})
		base, _, _ := strings.Cut(e.URL, "?")
		e.URL = base + end
		tf, err := GitHubActionsTokenFunc("aud-x", e.Getenv(nil))
		if err != nil {
			t.Fatalf("%s: GitHubActionsTokenFunc: %v", e.URL, err)
		}
		mintTwice(t, tf, tok)
		if q := query.Load(); q != "audience=aud-x" {
			t.Errorf("%s: query %q, want audience=aud-x", e.URL, q)
		}
	}
}

// A token inside the last minute before its exp is replaced by the call that finds it so, and
// a failed replacement fails that call instead of handing out the old token.
func TestGitHubActionsTokenRefresh(t *testing.T) {
	e := testkit.NewActionsOIDC(t)
	e.SetTTL(30 * time.Second) // less than refreshEarly: inside the window at once
	tf, err := GitHubActionsTokenFunc("aud-x", e.Getenv(nil))
	if err != nil {
		t.Fatalf("GitHubActionsTokenFunc: %v", err)
	}
	got, err := tf(context.Background())
	if tokens := e.Tokens(); err != nil || len(tokens) != 2 || got != tokens[1] {
		t.Fatalf("token %q, %v after %d tokens; want a second one, obtained by this call", got, err, len(tokens))
	}
	e.SetAnswer(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "down", http.StatusInternalServerError) })
	if got, err := tf(context.Background()); err == nil || got != "" {
		t.Fatalf("token %q, %v; want the failed refresh's error, not the old token", got, err)
	}
	e.SetAnswer(nil)
	e.SetTTL(time.Hour)
	got, err = tf(context.Background())
	if tokens := e.Tokens(); err != nil || len(tokens) != 3 || got != tokens[2] {
		t.Fatalf("token %q, %v after %d tokens; want the third", got, err, len(tokens))
	}
	mintTwice(t, tf, got)
	if n := len(e.Tokens()); n != 3 {
		t.Errorf("%d tokens, want 3: a token an hour from its exp is reused", n)
	}
	// Two minutes from its exp, a token is still a minute from the refresh.
	e.SetTTL(2 * time.Minute)
	tf, err = GitHubActionsTokenFunc("aud-x", e.Getenv(nil))
	if err != nil {
		t.Fatalf("GitHubActionsTokenFunc: %v", err)
	}
	mintTwice(t, tf, e.Tokens()[3])
	if n := len(e.Tokens()); n != 4 {
		t.Errorf("%d tokens, want 4: a token two minutes from its exp is reused", n)
	}
}

// Outside a job with `permissions: id-token: write` the variables are missing: the error names
// them and the permission, and nothing is requested.
func TestGitHubActionsTokenMissingVariables(t *testing.T) {
	e := testkit.NewActionsOIDC(t)
	for name, tc := range map[string]struct {
		env  map[string]string
		want string
	}{
		"neither":  {nil, EnvActionsTokenURL + " and " + EnvActionsRequestToken + " are not set"},
		"no URL":   {map[string]string{EnvActionsRequestToken: e.RequestToken}, EnvActionsTokenURL + " is not set"},
		"no token": {map[string]string{EnvActionsTokenURL: e.URL}, EnvActionsRequestToken + " is not set"},
	} {
		t.Run(name, func(t *testing.T) {
			tf, err := GitHubActionsTokenFunc("aud-x", func(k string) string { return tc.env[k] })
			if tf != nil || !errors.Is(err, ErrNoGitHubToken) || !strings.Contains(err.Error(), tc.want) ||
				!strings.Contains(err.Error(), "permissions: id-token: write") || !strings.Contains(err.Error(), `audience "aud-x"`) {
				t.Fatalf("GitHubActionsTokenFunc = %v, %v; want ErrNoGitHubToken saying %q and naming the permission", tf != nil, err, tc.want)
			}
			if strings.Contains(err.Error(), e.RequestToken) {
				t.Fatalf("error repeats the request token: %v", err)
			}
		})
	}
	if tf, err := GitHubActionsTokenFunc("", e.Getenv(nil)); tf != nil || !errors.Is(err, ErrNoGitHubToken) || !strings.Contains(err.Error(), "no audience") {
		t.Errorf("no audience: %v, %v", tf != nil, err)
	}
	if n := len(e.Requests()); n != 0 {
		t.Errorf("%d requests, want none", n)
	}
}

// A request URL that would send the request token in the clear, or is no URL, is refused
// before anything is sent.
func TestGitHubActionsTokenURLChecks(t *testing.T) {
	e := testkit.NewActionsOIDC(t)
	noNetwork := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		t.Errorf("request sent to %s", r.URL.Host)
		return nil, errors.New("no network in tests")
	})}
	for raw, want := range map[string]string{
		"http://token.actions.example/idtoken?api-version=2.0": "the scheme must be https",
		"ftp://127.0.0.1/idtoken":                              "the scheme must be https",
		"/_apis/idtoken":                                       "not an absolute URL",
		"https://u:p@token.actions.example/idtoken":            "must not carry credentials",
		"https://token.actions.example/idtoken#x":              "must not have a fragment",
	} {
		tf, err := actionsMinter{client: noNetwork}.tokenFunc("aud-x", func(k string) string {
			return map[string]string{EnvActionsTokenURL: raw, EnvActionsRequestToken: e.RequestToken}[k]
		})
		if tf != nil || !errors.Is(err, ErrNoGitHubToken) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), ":p@") {
			t.Errorf("%s: %v, %v; want %q", raw, tf != nil, err, want)
		}
	}
}

// The endpoint's failures name it and its status, quote a bounded excerpt of an error body
// with the request token masked, and never quote a successful answer's body; no error repeats
// either token.
func TestGitHubActionsTokenEndpointErrors(t *testing.T) {
	jwt := idTokenFor(t, "aud-x")
	for name, tc := range map[string]struct {
		answer func(w http.ResponseWriter, r *http.Request)
		want   string
	}{
		"401": {func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, `{"message":"Bad credentials: `+r.Header.Get("Authorization")+`"}`+strings.Repeat("x", 5000), http.StatusUnauthorized)
		}, `answered 401 Unauthorized: {"message":"Bad credentials: Bearer [redacted]"}`},
		"500": {func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "upstream failure", http.StatusInternalServerError)
		}, "answered 500 Internal Server Error: upstream failure"},
		"oversize": {func(w http.ResponseWriter, r *http.Request) {
			// Endless: only a reader that stops at the cap gets to an answer in time.
			fmt.Fprintf(w, `{"value":%q,"pad":"`, jwt)
			pad := []byte(strings.Repeat("x", 4096))
			for {
				if _, err := w.Write(pad); err != nil {
					return
				}
			}
		}, fmt.Sprintf("answered 200 OK with more than %d bytes", maxActionsAnswer)},
		"malformed JSON": {func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, `{"value":%q`, jwt)
		}, "answered 200 OK without a token"},
		"no value": {func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, `{"count":1,"token":%q}`, jwt)
		}, "answered 200 OK without a token"},
		"not a JWT": {func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, `{"value":"opaque-secret-value"}`)
		}, "it is not a JWT"},
	} {
		t.Run(name, func(t *testing.T) {
			e := testkit.NewActionsOIDC(t)
			e.SetAnswer(tc.answer)
			tf, err := GitHubActionsTokenFunc("aud-x", e.Getenv(nil))
			endpoint, _, _ := strings.Cut(e.URL, "?")
			if tf != nil || !errors.Is(err, ErrNoGitHubToken) || !strings.Contains(err.Error(), "GitHub Actions token endpoint "+endpoint+" ") ||
				!strings.Contains(err.Error(), tc.want) || len(err.Error()) > 1000 {
				t.Fatalf("error %v (%d bytes); want ErrNoGitHubToken naming the endpoint and %q", err, len(fmt.Sprint(err)), tc.want)
			}
			for _, secret := range []string{e.RequestToken, jwt, "opaque-secret-value"} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("error repeats a token: %v", err)
				}
			}
		})
	}
}

// A transport failure names the endpoint once, without the query (the URL is long).
func TestGitHubActionsTokenUnreachable(t *testing.T) {
	e := testkit.NewActionsOIDC(t)
	e.URL = "http://" + testkit.ClosedLoopbackAddr(t) + "/_apis/idtoken?api-version=2.0"
	_, err := GitHubActionsTokenFunc("aud-x", e.Getenv(nil))
	if !errors.Is(err, ErrNoGitHubToken) || !strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "audience=") {
		t.Fatalf("error %v", err)
	}
}

// A redirect is not followed: the request token never reaches where it points.
func TestGitHubActionsTokenFollowsNoRedirect(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		t.Errorf("redirect target got %s %s with Authorization %q", r.Method, r.URL, r.Header.Get("Authorization"))
	}))
	defer other.Close()
	e := testkit.NewActionsOIDC(t)
	e.SetAnswer(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/stolen", http.StatusFound)
	})
	_, err := GitHubActionsTokenFunc("aud-x", e.Getenv(nil))
	if !errors.Is(err, ErrNoGitHubToken) || !strings.Contains(err.Error(), "answered 302 Found (redirects are not followed)") {
		t.Fatalf("error %v", err)
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("redirect target called %d times", n)
	}
}

// An endpoint that never answers fails within the discovery bound, saying so.
func TestGitHubActionsTokenDiscoveryIsBounded(t *testing.T) {
	addr, err := testkit.BlackHole(t.Cleanup)
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.NewActionsOIDC(t)
	e.URL = "http://" + addr + "/_apis/idtoken?api-version=2.0"
	started := time.Now()
	tf, err := actionsMinter{discovery: 300 * time.Millisecond}.tokenFunc("aud-x", e.Getenv(nil))
	if tf != nil || !errors.Is(err, ErrNoGitHubToken) || !strings.Contains(err.Error(), "gave no token within 300ms") {
		t.Fatalf("GitHubActionsTokenFunc = %v, %v; want the bound's error", tf != nil, err)
	}
	if d := time.Since(started); d > 5*time.Second {
		t.Errorf("took %s", d)
	}
	if (actionsMinter{}).httpClient().Timeout != actionsRequestTimeout {
		t.Error("the default client has no per-request timeout")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
