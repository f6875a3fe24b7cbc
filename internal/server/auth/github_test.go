package auth

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

func githubValidator(t *testing.T, iss *testkit.OIDCIssuer) *GitHubValidator {
	t.Helper()
	v, err := NewGitHubValidator(context.Background(), GitHubValidatorOptions{Issuer: iss.URL, Client: iss.Client()})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// mintWith is a GitHub-like token for repository acme/infra, after mutate changed its claims.
func mintWith(t *testing.T, iss *testkit.OIDCIssuer, mutate func(map[string]any)) string {
	t.Helper()
	c := iss.GitHubClaims(testAudience, "acme/infra")
	mutate(c)
	return iss.Mint(t, c)
}

func TestGitHubValidatorAccepts(t *testing.T) {
	iss := testkit.NewOIDCIssuer(t)
	v := githubValidator(t, iss)
	c := iss.GitHubClaims(testAudience, "Acme/Infra")
	c["environment"], c["event_name"], c["ref"] = "prod", "pull_request", "refs/pull/7/merge"
	got, err := v.Validate(context.Background(), iss.Mint(t, c), testAudience)
	if err != nil {
		t.Fatal(err)
	}
	want := GitHubClaims{
		Repository: "Acme/Infra", RepositoryOwner: "Acme", RepositoryID: "123456", RepositoryOwnerID: "654321",
		Ref: "refs/pull/7/merge", RefType: "branch", EventName: "pull_request",
		WorkflowRef: "Acme/Infra/.github/workflows/plan.yml@refs/heads/main", JobWorkflowRef: "Acme/Infra/.github/workflows/plan.yml@refs/heads/main",
		Environment: "prod", RunID: "4242", RunAttempt: "1", SHA: "0123456789abcdef0123456789abcdef01234567", Actor: "alice",
		Subject:  "repo:Acme/Infra:ref:refs/heads/main",
		IssuedAt: time.Unix(c["iat"].(int64), 0), Expires: time.Unix(c["exp"].(int64), 0),
	}
	if !got.IssuedAt.Equal(want.IssuedAt) || !got.Expires.Equal(want.Expires) {
		t.Fatalf("times %v %v, want %v %v", got.IssuedAt, got.Expires, want.IssuedAt, want.Expires)
	}
	got.IssuedAt, got.Expires, want.IssuedAt, want.Expires = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if *got != want {
		t.Fatalf("claims\n%+v\nwant\n%+v", *got, want)
	}
	// Optional claims may be missing.
	minimal := map[string]any{}
	for _, k := range []string{"iss", "aud", "iat", "exp", "sub", "repository", "repository_owner", "run_id", "ref"} {
		minimal[k] = c[k]
	}
	if _, err := v.Validate(context.Background(), iss.Mint(t, minimal), testAudience); err != nil {
		t.Fatalf("the required claims alone: %v", err)
	}
	if d, k := iss.Discoveries.Load(), iss.KeyFetches.Load(); d != 1 || k != 1 {
		t.Fatalf("%d discoveries and %d key fetches, want 1 and 1 (both cached)", d, k)
	}
}

func TestGitHubValidatorRejects(t *testing.T) {
	iss := testkit.NewOIDCIssuer(t)
	v := githubValidator(t, iss)
	kid, key := iss.Key()
	now := time.Now().Unix()
	mint := func(mutate func(map[string]any)) string { return mintWith(t, iss, mutate) }
	valid := mint(func(map[string]any) {})
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	claims := iss.GitHubClaims(testAudience, "acme/infra")
	noneHead := testkit.B64JSON(t, map[string]string{"alg": "none", "typ": "JWT"}) + "." + testkit.B64JSON(t, claims)
	sig := strings.Split(valid, ".")[2]
	without := func(claim string) func(map[string]any) { return func(c map[string]any) { delete(c, claim) } }
	set := func(claim string, value any) func(map[string]any) { return func(c map[string]any) { c[claim] = value } }
	cases := map[string]rejection{
		"expired":                 {mint(set("exp", now-10)), "expired"},
		"no exp":                  {mint(without("exp")), "expired"},
		"nbf in the future":       {mint(set("nbf", now+3600)), "nbf"},
		"iat in the future":       {mint(func(c map[string]any) { c["iat"], c["exp"] = now+3600, now+7200 }), "iat"},
		"no iat":                  {mint(without("iat")), "no iat"},
		"wrong audience":          {mint(set("aud", "https://other")), "expected audience"},
		"no audience":             {mint(without("aud")), "expected audience"},
		"audience list":           {mint(set("aud", []string{testAudience, "https://other"})), "want exactly"},
		"audience list of one":    {mint(set("aud", []string{testAudience})), "want exactly"},
		"wrong issuer":            {mint(set("iss", "https://token.actions.githubusercontent.com")), "different provider"},
		"issuer lookalike":        {mint(set("iss", iss.URL+".evil.example")), "different provider"},
		"issuer trailing slash":   {mint(set("iss", iss.URL+"/")), "different provider"},
		"no issuer":               {mint(without("iss")), "different provider"},
		"alg none":                {noneHead + ".", `algorithm "none"`},
		"alg none with signature": {noneHead + "." + sig, `algorithm "none"`},
		"HS256 with the modulus":  {testkit.SignHS256(t, key.N.Bytes(), kid, claims), `algorithm "HS256"`},
		"HS256 with the PEM key":  {testkit.SignHS256(t, pubPEM, kid, claims), `algorithm "HS256"`},
		"unknown kid":             {testkit.SignRS256(t, newRSAKey(t), "k9", claims), "verify signature"},
		"known kid, other key":    {testkit.SignRS256(t, newRSAKey(t), kid, claims), "verify signature"},
		"forged signature":        {valid[:strings.LastIndex(valid, ".")+1] + base64.RawURLEncoding.EncodeToString(make([]byte, 256)), "verify signature"},
		"payload swapped":         {strings.Split(valid, ".")[0] + "." + testkit.B64JSON(t, iss.GitHubClaims(testAudience, "acme/other")) + "." + sig, "verify signature"},
		"no repository":           {mint(without("repository")), "no repository"},
		"no repository_owner":     {mint(without("repository_owner")), "no repository_owner"},
		"no run_id":               {mint(without("run_id")), "no run_id"},
		"no ref":                  {mint(without("ref")), "no ref"},
		"no sub":                  {mint(without("sub")), "no sub"},
		"repository not a name":   {mint(set("repository", "acme/infra/x")), `repository "acme/infra/x"`},
		"owner not the repo's":    {mint(set("repository_owner", "evil")), "not the owner"},
		"run_id not a number":     {mint(set("run_id", "12:run:3")), "run_id"},
		"run_id a JSON number":    {mint(set("run_id", 4242)), "claims"},
		"empty":                   {"", "three parts"},
		"bad base64":              {"!!!.@@@.###", "base64"},
	}
	checkRejections(t, cases, func(tok string) (any, error) { return v.Validate(context.Background(), tok, testAudience) })
	if _, err := v.Validate(context.Background(), valid, ""); err == nil {
		t.Fatal("a token validated for the empty audience")
	}
	if _, err := v.Validate(context.Background(), valid, testAudience); err != nil {
		t.Fatalf("the valid token after the rejections: %v", err)
	}
}

func TestNewGitHubValidatorIssuer(t *testing.T) {
	for _, bad := range []string{
		"http://token.actions.githubusercontent.com", "http://10.0.0.1:8080", "http://127.0.0.1.evil.example",
		"http://localhost.evil.example", "ftp://127.0.0.1", "token.actions.githubusercontent.com", "https://",
		"https://user@token.actions.githubusercontent.com", "https://token.actions.githubusercontent.com?x=1",
		"https://token.actions.githubusercontent.com#x", "http://[::1",
	} {
		if _, err := NewGitHubValidator(context.Background(), GitHubValidatorOptions{Issuer: bad}); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("issuer %q: err %v, want an error naming it", bad, err)
		}
	}
	// Constructing makes no request, whatever the issuer.
	noNetwork := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		t.Errorf("request to %s at construction", r.URL)
		return nil, errors.New("no network")
	})}
	for _, good := range []string{"", GitHubIssuer, "http://127.0.0.1:1", "http://[::1]:1", "http://localhost:1", "http://LOCALHOST:1/path", "https://ghes.example/_services/token"} {
		v, err := NewGitHubValidator(context.Background(), GitHubValidatorOptions{Issuer: good, Client: noNetwork})
		if err != nil {
			t.Errorf("issuer %q: %v", good, err)
			continue
		}
		if want := map[bool]string{true: GitHubIssuer, false: good}[good == ""]; v.Issuer() != want {
			t.Errorf("issuer %q: Issuer() %q", good, v.Issuer())
		}
	}
}

// fakeClock makes k's clock read *now, which the test moves.
func fakeClock(k *rotatingKeys) *time.Time {
	now := time.Now()
	k.now = func() time.Time { return now }
	return &now
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestGitHubValidatorMakesNoRequestUntilUsed(t *testing.T) {
	iss := testkit.NewOIDCIssuer(t)
	v := githubValidator(t, iss)
	// A token refused before its signature is checked discovers nothing either.
	if _, err := v.Validate(context.Background(), testkit.SignHS256(t, []byte("secret"), "k", iss.GitHubClaims(testAudience, "acme/infra")), testAudience); err == nil {
		t.Fatal("HS256 token accepted")
	}
	if d, k := iss.Discoveries.Load(), iss.KeyFetches.Load(); d != 0 || k != 0 {
		t.Fatalf("%d discoveries and %d key fetches before a signature was checked", d, k)
	}
}

func TestGitHubValidatorDiscoveryIssuerMismatch(t *testing.T) {
	for _, discovered := range []func(url string) string{
		func(string) string { return GitHubIssuer },
		func(url string) string { return url + "/" },
		func(url string) string { return url + ".evil.example" },
	} {
		iss := testkit.NewOIDCIssuer(t)
		iss.SetDiscovery(discovered(iss.URL), "")
		v := githubValidator(t, iss)
		_, err := v.Validate(context.Background(), mintWith(t, iss, func(map[string]any) {}), testAudience)
		if err == nil || !strings.Contains(err.Error(), "did not match") {
			t.Fatalf("discovered issuer %q: err %v, want a mismatch", discovered(iss.URL), err)
		}
		if k := iss.KeyFetches.Load(); k != 0 {
			t.Fatalf("discovered issuer %q: %d key fetches after a mismatch", discovered(iss.URL), k)
		}
	}
}

func TestGitHubValidatorKeysURLMustBeHTTPS(t *testing.T) {
	plain := testkit.NewOIDCIssuer(t)
	for _, tc := range []struct {
		name string
		iss  *testkit.OIDCIssuer
		jwks string
		want string
	}{
		{"https issuer, http keys on loopback", testkit.NewOIDCIssuerTLS(t), plain.URL + "/.well-known/jwks", "want https"},
		{"https issuer, relative keys", testkit.NewOIDCIssuerTLS(t), "/.well-known/jwks", "want an absolute"},
		{"loopback http issuer, http keys elsewhere", testkit.NewOIDCIssuer(t), "http://keys.example/jwks", "loopback"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.iss.SetDiscovery("", tc.jwks)
			v := githubValidator(t, tc.iss)
			_, err := v.Validate(context.Background(), mintWith(t, tc.iss, func(map[string]any) {}), testAudience)
			if err == nil || !strings.Contains(err.Error(), "jwks_uri") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want a jwks_uri error mentioning %q", err, tc.want)
			}
			if n := plain.KeyFetches.Load(); n != 0 {
				t.Fatalf("the http key set was fetched %d times", n)
			}
		})
	}
	// An https issuer's https key set is used.
	tlsIss := testkit.NewOIDCIssuerTLS(t)
	if _, err := githubValidator(t, tlsIss).Validate(context.Background(), mintWith(t, tlsIss, func(map[string]any) {}), testAudience); err != nil {
		t.Fatalf("https issuer: %v", err)
	}
}

// While the issuer is down, tokens are refused and discovery is retried at most every
// discoveryRetry; once it is up, the next try succeeds.
func TestGitHubValidatorDiscoveryRetry(t *testing.T) {
	iss := testkit.NewOIDCIssuer(t)
	v := githubValidator(t, iss)
	now := fakeClock(&v.rotatingKeys)
	tok := mintWith(t, iss, func(map[string]any) {})
	iss.SetDown(true)
	if _, err := v.Validate(context.Background(), tok, testAudience); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("issuer down: err %v, want its 503", err)
	}
	iss.SetDown(false)
	*now = now.Add(v.discoveryRetry - time.Second)
	if _, err := v.Validate(context.Background(), tok, testAudience); err == nil || !strings.Contains(err.Error(), "not retrying") {
		t.Fatalf("within the retry interval: err %v, want the last failure", err)
	}
	if n := iss.Discoveries.Load(); n != 1 {
		t.Fatalf("%d discoveries within the retry interval, want 1", n)
	}
	*now = now.Add(time.Second)
	if _, err := v.Validate(context.Background(), tok, testAudience); err != nil {
		t.Fatalf("after the retry interval: %v", err)
	}
	if n := iss.Discoveries.Load(); n != 2 {
		t.Fatalf("%d discoveries, want 2", n)
	}
	// A successful discovery is kept: the issuer going down again changes nothing.
	iss.SetDown(true)
	if _, err := v.Validate(context.Background(), tok, testAudience); err != nil {
		t.Fatalf("cached discovery and keys: %v", err)
	}
}

// Tokens that arrive during a discovery wait for it rather than start their own.
func TestGitHubValidatorOneDiscoveryAtATime(t *testing.T) {
	iss := testkit.NewOIDCIssuer(t)
	v := githubValidator(t, iss)
	tok := mintWith(t, iss, func(map[string]any) {})
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if _, err := v.Validate(context.Background(), tok, testAudience); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if d, k := iss.Discoveries.Load(), iss.KeyFetches.Load(); d != 1 || k != 1 {
		t.Fatalf("%d discoveries and %d key fetches for 20 concurrent tokens, want 1 and 1", d, k)
	}
}

// A hung issuer holds a token no longer than the token's context, and a discovery no longer
// than discoveryTimeout.
func TestGitHubValidatorHungIssuer(t *testing.T) {
	addr, err := testkit.BlackHole(t.Cleanup)
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewGitHubValidator(context.Background(), GitHubValidatorOptions{Issuer: "http://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	v.discoveryTimeout = 300 * time.Millisecond
	tok := testkit.SignRS256(t, newRSAKey(t), "k", map[string]any{"iss": "http://" + addr, "aud": testAudience, "exp": time.Now().Unix() + 60, "iat": time.Now().Unix()})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := v.Validate(ctx, tok, testAudience); err == nil || !strings.Contains(err.Error(), "waiting for the OIDC discovery") {
		t.Fatalf("err %v, want the token's own deadline", err)
	}
	if d := time.Since(start); d > 250*time.Millisecond {
		t.Fatalf("a token with a 50ms deadline waited %s", d)
	}
	if _, err := v.Validate(context.Background(), tok, testAudience); err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("err %v, want the discovery's timeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("a discovery bounded to 300ms took %s", d)
	}
}

func TestGitHubValidatorKeyRotation(t *testing.T) {
	iss := testkit.NewOIDCIssuer(t)
	v := githubValidator(t, iss)
	now := fakeClock(&v.rotatingKeys)
	old := mintWith(t, iss, func(map[string]any) {})
	if _, err := v.Validate(context.Background(), old, testAudience); err != nil {
		t.Fatal(err)
	}
	oldKid, _ := iss.Key()
	iss.Rotate(t)
	rotated := mintWith(t, iss, func(map[string]any) {})
	// Within the refetch interval the new kid is not fetched; the old key goes on verifying.
	if _, err := v.Validate(context.Background(), rotated, testAudience); err == nil || !strings.Contains(err.Error(), "not refetching") {
		t.Fatalf("new kid within the refetch interval: err %v", err)
	}
	v.limiter.mu.Lock()
	v.limiter.last = time.Now().Add(-v.limiter.interval) // the limiter runs on the real clock
	v.limiter.mu.Unlock()
	// go-oidc hands a fetch's result to the tokens waiting for it a moment before it forgets the
	// fetch, and a token in between gets that (refused) result again.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := v.Validate(context.Background(), rotated, testAudience)
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "not refetching") || time.Now().After(deadline) {
			t.Fatalf("new kid after the refetch interval: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := v.Validate(context.Background(), old, testAudience); err != nil {
		t.Fatalf("old key, still published and cached: %v", err)
	}
	// The issuer withdraws the old key: once the key set ages out, it stops verifying.
	iss.Withdraw(oldKid)
	*now = now.Add(v.maxAge)
	if _, err := v.Validate(context.Background(), old, testAudience); err == nil {
		t.Fatal("a withdrawn key verifies after the key set's maximum age")
	}
	if _, err := v.Validate(context.Background(), rotated, testAudience); err != nil {
		t.Fatalf("current key after the key set's maximum age: %v", err)
	}
	if d, k := iss.Discoveries.Load(), iss.KeyFetches.Load(); d != 1 || k != 3 {
		t.Fatalf("%d discoveries and %d key fetches, want 1 and 3", d, k)
	}
}

// Fetches stay on the host asked and read at most maxFetchBody bytes.
func TestGitHubValidatorFetchLimits(t *testing.T) {
	iss := testkit.NewOIDCIssuer(t)
	elsewhere := httptest.NewServer(http.RedirectHandler(iss.URL+"/.well-known/jwks", http.StatusFound))
	t.Cleanup(elsewhere.Close)
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		chunk := strings.Repeat(" ", 64<<10)
		_, _ = w.Write([]byte(`{"keys":[`))
		for range maxFetchBody/len(chunk) + 1 {
			_, _ = w.Write([]byte(chunk))
			w.(http.Flusher).Flush() // chunked: no Content-Length to refuse it by
		}
		_, _ = w.Write([]byte(`]}`))
	}))
	t.Cleanup(big.Close)
	declared := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(maxFetchBody+1))
		_, _ = w.Write([]byte(`{"keys":[`))
	}))
	t.Cleanup(declared.Close)
	for _, tc := range []struct{ name, jwks, want string }{
		{"redirect to another host", elsewhere.URL + "/jwks", "another host"},
		{"answer over the limit", big.URL + "/jwks", "exceeds"},
		{"length over the limit", declared.URL + "/jwks", fmt.Sprintf("%d bytes exceeds", maxFetchBody+1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			iss.SetDiscovery("", tc.jwks)
			v := githubValidator(t, iss)
			_, err := v.Validate(context.Background(), mintWith(t, iss, func(map[string]any) {}), testAudience)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	// A redirect within the host is followed.
	key := newRSAKey(t)
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/.well-known/openid-configuration":
			_, _ = fmt.Fprintf(w, `{"issuer":%q,"jwks_uri":%q}`, srv.URL, srv.URL+"/moved")
		case "/moved":
			http.Redirect(w, r, "/jwks", http.StatusFound)
		case "/jwks":
			_ = json.NewEncoder(w).Encode(map[string]any{"keys": []any{testkit.JWK("k", &key.PublicKey)}})
		}
	}))
	t.Cleanup(srv.Close)
	v, err := NewGitHubValidator(context.Background(), GitHubValidatorOptions{Issuer: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	c := iss.GitHubClaims(testAudience, "acme/infra")
	c["iss"] = srv.URL
	if _, err := v.Validate(context.Background(), testkit.SignRS256(t, key, "k", c), testAudience); err != nil {
		t.Fatalf("redirect within the host: %v", err)
	}
}
