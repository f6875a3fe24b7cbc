package auth

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

const testAudience = "https://tfstackplan.example.com"

// keyServer serves a JWKS on 127.0.0.1 and counts the requests it gets.
type keyServer struct {
	srv      *httptest.Server
	requests atomic.Int64

	mu   sync.Mutex
	keys map[string]*rsa.PrivateKey // by kid
}

func newKeyServer(t *testing.T) *keyServer {
	t.Helper()
	t.Setenv("GCE_METADATA_HOST", "127.0.0.1:1")
	t.Setenv("GCE_METADATA_IP", "127.0.0.1:1")
	ks := &keyServer{keys: map[string]*rsa.PrivateKey{"k1": newRSAKey(t)}}
	ks.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ks.requests.Add(1)
		ks.mu.Lock()
		defer ks.mu.Unlock()
		var jwks []map[string]string
		for kid, k := range ks.keys {
			jwks = append(jwks, testkit.JWK(kid, &k.PublicKey))
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"keys": jwks})
	}))
	t.Cleanup(ks.srv.Close)
	return ks
}

func newRSAKey(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func (ks *keyServer) key(kid string) *rsa.PrivateKey {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return ks.keys[kid]
}

func (ks *keyServer) validator(t *testing.T) *GoogleValidator {
	t.Helper()
	v, err := NewGoogleValidator(context.Background(), GoogleValidatorOptions{KeysURL: ks.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func googleClaims() map[string]any {
	now := time.Now().Unix()
	return map[string]any{"iss": "https://accounts.google.com", "aud": testAudience, "iat": now, "exp": now + 600,
		"sub": "1234", "email": "deployer@proj.iam.gserviceaccount.com", "email_verified": true}
}

func TestGoogleValidatorAccepts(t *testing.T) {
	ks := newKeyServer(t)
	v := ks.validator(t)
	for _, iss := range []string{"https://accounts.google.com", "accounts.google.com"} {
		c := googleClaims()
		c["iss"] = iss
		got, err := v.Validate(context.Background(), testkit.SignRS256(t, ks.key("k1"), "k1", c), testAudience)
		if err != nil {
			t.Fatalf("iss %q: %v", iss, err)
		}
		if got.Issuer != iss || got.Email != "deployer@proj.iam.gserviceaccount.com" || !got.EmailVerified ||
			got.Subject != "1234" || got.Audience != testAudience || got.Expires.Unix() != c["exp"] || got.IssuedAt.Unix() != c["iat"] {
			t.Fatalf("iss %q: claims %+v", iss, got)
		}
	}
	if n := ks.requests.Load(); n != 1 {
		t.Fatalf("key server got %d requests, want 1 (keys are cached)", n)
	}
}

func TestGoogleValidatorEmailClaimsAsTyped(t *testing.T) {
	ks := newKeyServer(t)
	v := ks.validator(t)
	for _, tc := range []struct {
		email, verified any
		wantEmail       string
		wantVerified    bool
	}{
		{"a@b.c", "true", "a@b.c", false}, // only the JSON boolean true counts
		{"a@b.c", false, "a@b.c", false},
		{42, true, "", true},
		{nil, nil, "", false},
	} {
		c := googleClaims()
		c["email"], c["email_verified"] = tc.email, tc.verified
		if tc.email == nil {
			delete(c, "email")
			delete(c, "email_verified")
		}
		got, err := v.Validate(context.Background(), testkit.SignRS256(t, ks.key("k1"), "k1", c), testAudience)
		if err != nil {
			t.Fatalf("email %v verified %v: %v", tc.email, tc.verified, err)
		}
		if got.Email != tc.wantEmail || got.EmailVerified != tc.wantVerified {
			t.Errorf("email %v verified %v: got %q %v, want %q %v", tc.email, tc.verified, got.Email, got.EmailVerified, tc.wantEmail, tc.wantVerified)
		}
	}
}

func TestGoogleValidatorRejects(t *testing.T) {
	ks := newKeyServer(t)
	v := ks.validator(t)
	k1 := ks.key("k1")
	now := time.Now().Unix()
	claimsWith := func(mutate func(map[string]any)) map[string]any {
		c := googleClaims()
		mutate(c)
		return c
	}
	rs := func(mutate func(map[string]any)) string { return testkit.SignRS256(t, k1, "k1", claimsWith(mutate)) }
	valid := rs(func(map[string]any) {})
	pubDER, err := x509.MarshalPKIXPublicKey(&k1.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	noneHead := testkit.B64JSON(t, map[string]string{"alg": "none", "typ": "JWT"}) + "." + testkit.B64JSON(t, googleClaims())

	sig := strings.Split(valid, ".")[2]
	// want is a fragment of the error, so each token is rejected for the reason it was built for.
	// Signature failures make go-oidc refetch the keys, which the limiter refuses within the
	// interval: those errors name the fetch, under "verify signature".
	cases := map[string]rejection{
		"wrong audience":          {rs(func(c map[string]any) { c["aud"] = "https://other" }), "expected audience"},
		"audience prefix":         {rs(func(c map[string]any) { c["aud"] = testAudience + "/x" }), "expected audience"},
		"audience list":           {rs(func(c map[string]any) { c["aud"] = []string{testAudience, "https://other"} }), "want exactly"},
		"audience list of one":    {rs(func(c map[string]any) { c["aud"] = []string{testAudience} }), "want exactly"},
		"no audience":             {rs(func(c map[string]any) { delete(c, "aud") }), "expected audience"},
		"issuer not Google":       {rs(func(c map[string]any) { c["iss"] = "https://evil.example" }), "different provider"},
		"issuer over http":        {rs(func(c map[string]any) { c["iss"] = "http://accounts.google.com" }), "different provider"},
		"issuer trailing slash":   {rs(func(c map[string]any) { c["iss"] = "https://accounts.google.com/" }), "different provider"},
		"issuer lookalike":        {rs(func(c map[string]any) { c["iss"] = "accounts.google.com.evil.example" }), "different provider"},
		"no issuer":               {rs(func(c map[string]any) { delete(c, "iss") }), "different provider"},
		"expired":                 {rs(func(c map[string]any) { c["exp"] = now - 10 }), "expired"},
		"no exp":                  {rs(func(c map[string]any) { delete(c, "exp") }), "expired"},
		"exp not a number":        {rs(func(c map[string]any) { c["exp"] = "tomorrow" }), "unmarshal claims"},
		"nbf in the future":       {rs(func(c map[string]any) { c["nbf"] = now + 3600 }), "nbf"},
		"iat in the future":       {rs(func(c map[string]any) { c["iat"], c["exp"] = now+3600, now+7200 }), "iat"},
		"no iat":                  {rs(func(c map[string]any) { delete(c, "iat") }), "no iat"},
		"alg none":                {noneHead + ".", `algorithm "none"`},
		"alg none with signature": {noneHead + "." + sig, `algorithm "none"`},
		"HS256 with the modulus":  {testkit.SignHS256(t, k1.N.Bytes(), "k1", googleClaims()), `algorithm "HS256"`},
		"HS256 with the PEM key":  {testkit.SignHS256(t, pubPEM, "k1", googleClaims()), `algorithm "HS256"`},
		"unknown kid":             {testkit.SignRS256(t, newRSAKey(t), "k9", googleClaims()), "verify signature"},
		"known kid, other key":    {testkit.SignRS256(t, newRSAKey(t), "k1", googleClaims()), "verify signature"},
		"forged signature":        {valid[:strings.LastIndex(valid, ".")+1] + base64.RawURLEncoding.EncodeToString(make([]byte, 256)), "verify signature"},
		"payload swapped":         {strings.Split(valid, ".")[0] + "." + testkit.B64JSON(t, claimsWith(func(c map[string]any) { c["email"] = "admin@proj.example" })) + "." + sig, "verify signature"},
		"empty signature":         {valid[:strings.LastIndex(valid, ".")+1], "verify signature"},
		"empty":                   {"", "three parts"},
		"two parts":               {"a.b", "three parts"},
		"four parts":              {valid + ".x", "three parts"},
		"bad base64":              {"!!!.@@@.###", "base64"},
		"header not JSON":         {base64.RawURLEncoding.EncodeToString([]byte("{nope")) + "." + strings.Split(valid, ".")[1] + "." + sig, "malformed jwt"},
	}
	checkRejections(t, cases, func(tok string) (any, error) { return v.Validate(context.Background(), tok, testAudience) })
	if _, err := v.Validate(context.Background(), valid, ""); err == nil {
		t.Fatal("a token validated for the empty audience")
	}
	if _, err := v.Validate(context.Background(), valid, testAudience); err != nil {
		t.Fatalf("the valid token after the rejections: %v", err)
	}
}

// rejection is a token that validate must refuse with an error mentioning want.
type rejection struct{ tok, want string }

// checkRejections runs a subtest per case: validate refuses the token for the reason it was
// built for, without quoting it.
func checkRejections(t *testing.T, cases map[string]rejection, validate func(tok string) (any, error)) {
	t.Helper()
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := validate(tc.tok)
			if err == nil {
				t.Fatalf("accepted: %+v", got)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %q, want it to mention %q", err, tc.want)
			}
			if len(tc.tok) > 8 && strings.Contains(err.Error(), tc.tok) {
				t.Fatalf("the error quotes the token: %v", err)
			}
		})
	}
}

func TestGoogleValidatorMakesNoRequestUntilUsed(t *testing.T) {
	ks := newKeyServer(t)
	v := ks.validator(t)
	if n := ks.requests.Load(); n != 0 {
		t.Fatalf("constructing the validator made %d requests", n)
	}
	// A token rejected before the signature check (alg) fetches nothing either.
	if _, err := v.Validate(context.Background(), testkit.SignHS256(t, []byte("secret"), "k1", googleClaims()), testAudience); err == nil {
		t.Fatal("HS256 token accepted")
	}
	if n := ks.requests.Load(); n != 0 {
		t.Fatalf("an HS256 token made %d key requests", n)
	}
}

func TestGoogleValidatorRefetchIsRateLimited(t *testing.T) {
	ks := newKeyServer(t)
	v := ks.validator(t)
	if _, err := v.Validate(context.Background(), testkit.SignRS256(t, ks.key("k1"), "k1", googleClaims()), testAudience); err != nil {
		t.Fatal(err)
	}
	other := newRSAKey(t)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok := testkit.SignRS256(t, other, fmt.Sprintf("random-%d", i), googleClaims())
			if _, err := v.Validate(context.Background(), tok, testAudience); err == nil {
				t.Errorf("token with unknown kid random-%d accepted", i)
			}
		}()
	}
	wg.Wait()
	if n := ks.requests.Load(); n != 1 {
		t.Fatalf("50 tokens with unknown kids made %d key requests in total, want 1", n)
	}
	// The cached keys still verify while refetches are refused.
	if _, err := v.Validate(context.Background(), testkit.SignRS256(t, ks.key("k1"), "k1", googleClaims()), testAudience); err != nil {
		t.Fatalf("known kid while rate limited: %v", err)
	}

	// Key rotation: once the interval has passed, a token with a new kid refetches and verifies.
	ks.mu.Lock()
	ks.keys["k2"] = newRSAKey(t)
	ks.mu.Unlock()
	v.limiter.mu.Lock()
	v.limiter.last = time.Now().Add(-v.limiter.interval)
	v.limiter.mu.Unlock()
	if _, err := v.Validate(context.Background(), testkit.SignRS256(t, ks.key("k2"), "k2", googleClaims()), testAudience); err != nil {
		t.Fatalf("rotated key: %v", err)
	}
	if n := ks.requests.Load(); n != 2 {
		t.Fatalf("key requests after rotation: %d, want 2", n)
	}
}

func TestGoogleValidatorKeyFetchBoundedByRequestContext(t *testing.T) {
	t.Setenv("GCE_METADATA_HOST", "127.0.0.1:1")
	t.Setenv("GCE_METADATA_IP", "127.0.0.1:1")
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close, which waits for the handler
	v, err := NewGoogleValidator(context.Background(), GoogleValidatorOptions{KeysURL: srv.URL, Client: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	key := newRSAKey(t)
	start := time.Now()
	_, err = v.Validate(ctx, testkit.SignRS256(t, key, "k1", googleClaims()), testAudience)
	if err == nil || !strings.Contains(err.Error(), context.DeadlineExceeded.Error()) {
		t.Fatalf("err %v, want the request context's deadline", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Validate took %s with a 200ms context", d)
	}
}

func TestGoogleValidatorKeyServerErrors(t *testing.T) {
	t.Setenv("GCE_METADATA_HOST", "127.0.0.1:1")
	t.Setenv("GCE_METADATA_IP", "127.0.0.1:1")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	t.Cleanup(srv.Close)
	v, err := NewGoogleValidator(context.Background(), GoogleValidatorOptions{KeysURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.Validate(context.Background(), testkit.SignRS256(t, newRSAKey(t), "k1", googleClaims()), testAudience)
	if err == nil || !strings.Contains(err.Error(), "500") {
		t.Fatalf("err %v, want the key server's 500", err)
	}
}

func TestNewGoogleValidatorOptions(t *testing.T) {
	for _, bad := range []string{"certs", "ftp://example.com/certs", "https://", "http://[::1"} {
		if _, err := NewGoogleValidator(context.Background(), GoogleValidatorOptions{KeysURL: bad}); err == nil || !strings.Contains(err.Error(), "keys URL") {
			t.Errorf("KeysURL %q: err %v, want a keys URL error", bad, err)
		}
	}
	noTimeout := &http.Client{}
	v, err := NewGoogleValidator(context.Background(), GoogleValidatorOptions{Client: noTimeout})
	if err != nil {
		t.Fatal(err)
	}
	if noTimeout.Timeout != 0 || noTimeout.Transport != nil {
		t.Fatalf("the caller's client was modified: %+v", noTimeout)
	}
	if v.limiter.next != http.DefaultTransport || v.limiter.interval != defaultRefetchInterval {
		t.Fatalf("limiter %+v, want DefaultTransport every %s", v.limiter, defaultRefetchInterval)
	}
}

// fakeValidator returns fixed claims, to test what Authenticator does with them.
type fakeValidator struct{ claims GoogleClaims }

func (f fakeValidator) Validate(context.Context, string, string) (*GoogleClaims, error) {
	c := f.claims
	return &c, nil
}

func TestAuthenticatorGoogleClaims(t *testing.T) {
	a := &Authenticator{Audience: testAudience}
	if err := a.ParseTokens("t.hcl", []byte("identity \"Deployer@proj.example\" {\n roles = [\"runner\"]\n}\n")); err != nil {
		t.Fatal(err)
	}
	good := GoogleClaims{Email: "deployer@proj.example", EmailVerified: true, Issuer: "accounts.google.com"}
	for _, tc := range []struct {
		name    string
		mutate  func(*GoogleClaims)
		wantErr error
	}{
		{"listed", func(*GoogleClaims) {}, nil},
		{"https issuer", func(c *GoogleClaims) { c.Issuer = "https://accounts.google.com" }, nil},
		{"other issuer", func(c *GoogleClaims) { c.Issuer = "https://evil.example" }, ErrUnauthenticated},
		{"unverified", func(c *GoogleClaims) { c.EmailVerified = false }, ErrUnauthenticated},
		{"no email", func(c *GoogleClaims) { c.Email = "" }, ErrUnauthenticated},
		{"unlisted", func(c *GoogleClaims) { c.Email = "x@proj.example" }, ErrNoRoles},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.mutate(&c)
			a.Validator = fakeValidator{c}
			p, err := a.Verify(context.Background(), "h.p.s")
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if err == nil && (p.Name != c.Email || !p.Has(RoleRunner) || p.Has(RoleAdmin)) {
				t.Fatalf("principal %+v", p)
			}
		})
	}
	a.Validator = fakeValidator{good}
	if _, err := a.Verify(context.Background(), "not-a-jwt"); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("a token without two dots reached the validator: %v", err)
	}
}

type refusingValidator struct{ err error }

func (f refusingValidator) Validate(context.Context, string, string) (*GoogleClaims, error) {
	return nil, f.err
}

// A refused ID token's reason goes to the log, never to the client: it may quote the key
// server's answer or the audience.
func TestAuthenticatorKeepsTheRefusalReasonFromTheClient(t *testing.T) {
	var log bytes.Buffer
	reason := `fetching keys: key server answered "internal body" for audience ` + testAudience
	a := &Authenticator{Audience: testAudience, Validator: refusingValidator{errors.New(reason)},
		Log: slog.New(slog.NewTextHandler(&log, nil))}
	_, err := a.Verify(context.Background(), "h.p.s")
	if !errors.Is(err, ErrUnauthenticated) || strings.Contains(err.Error(), "internal body") || strings.Contains(err.Error(), testAudience) {
		t.Fatalf("err %v: want ErrUnauthenticated without the reason", err)
	}
	if !strings.Contains(log.String(), "internal body") {
		t.Fatalf("the log lacks the reason: %s", log.String())
	}
}

// A key set older than its maximum age is fetched anew: a key Google withdrew stops verifying
// even though no token ever named an unknown kid.
func TestGoogleValidatorKeysExpire(t *testing.T) {
	ks := newKeyServer(t)
	v := ks.validator(t)
	now := time.Now()
	v.now = func() time.Time { return now }
	tok := testkit.SignRS256(t, ks.key("k1"), "k1", googleClaims())
	if _, err := v.Validate(context.Background(), tok, testAudience); err != nil {
		t.Fatal(err)
	}
	ks.mu.Lock()
	ks.keys = map[string]*rsa.PrivateKey{"k2": newRSAKey(t)} // k1 withdrawn
	ks.mu.Unlock()
	now = now.Add(v.maxAge - time.Second)
	if _, err := v.Validate(context.Background(), tok, testAudience); err != nil {
		t.Fatalf("within the key set's age: %v", err)
	}
	// A made-up kid spends the refetch on the old set just before it ages out ...
	v.limiter.mu.Lock()
	v.limiter.last = time.Now().Add(-v.limiter.interval) // the limiter runs on the real clock
	v.limiter.mu.Unlock()
	if _, err := v.Validate(context.Background(), testkit.SignRS256(t, newRSAKey(t), "made-up", googleClaims()), testAudience); err == nil {
		t.Fatal("a token with a made-up kid verified")
	}
	// ... and the new set still fetches at once: a current key verifies, the withdrawn one not.
	now = now.Add(2 * time.Second)
	if _, err := v.Validate(context.Background(), testkit.SignRS256(t, ks.key("k2"), "k2", googleClaims()), testAudience); err != nil {
		t.Fatalf("current key after the key set's maximum age: %v", err)
	}
	if _, err := v.Validate(context.Background(), tok, testAudience); err == nil {
		t.Fatal("a withdrawn key still verifies after the key set's maximum age")
	}
	if n := ks.requests.Load(); n != 3 {
		t.Fatalf("key requests: %d, want 3", n)
	}
}

// A key server that redirects is followed: the limit counts fetches, not their redirects.
func TestGoogleValidatorFollowsARedirect(t *testing.T) {
	ks := newKeyServer(t)
	redirect := httptest.NewServer(http.RedirectHandler(ks.srv.URL, http.StatusFound))
	t.Cleanup(redirect.Close)
	v, err := NewGoogleValidator(context.Background(), GoogleValidatorOptions{KeysURL: redirect.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Validate(context.Background(), testkit.SignRS256(t, ks.key("k1"), "k1", googleClaims()), testAudience); err != nil {
		t.Fatal(err)
	}
}
