package gauth

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/auth"

	"github.com/tfstackplan/tfstackplan/internal/buildinfo"
	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

func TestParseServerURL(t *testing.T) {
	for raw, want := range map[string]string{
		"https://cp.example.com":         "",
		"http://127.0.0.1:8080/base/":    "",
		"ftp://cp.example.com":           "scheme must be http or https",
		"https://":                       "has no host",
		"https://user:pw@cp.example.com": "must not carry credentials",
		"https://cp.example.com/?a=1":    "must not have a query or fragment",
		"https://cp.example.com/#x":      "must not have a query or fragment",
		"http://[::1":                    "malformed",
	} {
		_, err := ParseServerURL(raw)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("ParseServerURL(%q) = %v, want %q", raw, err, want)
		}
	}
}

// The token goes to the configured origin only; a token that cannot be minted sends nothing.
func TestTransportSendsTheTokenOnlyToItsOrigin(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Host+" "+r.Header.Get("Authorization"))
	}))
	defer srv.Close()
	origin, err := ParseServerURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	other := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1) // same server, another origin
	c := &http.Client{Transport: &Transport{Origin: origin, Token: Static("s3cret"), Next: http.DefaultTransport}}
	for _, u := range []string{srv.URL + "/a", other + "/b"} {
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if len(got) != 2 || !strings.HasSuffix(got[0], "Bearer s3cret") || strings.Contains(got[1], "s3cret") {
		t.Fatalf("requests seen %q", got)
	}
	failing := &http.Client{Transport: &Transport{Origin: origin, Next: http.DefaultTransport,
		Token: func(context.Context) (string, error) { return "", errors.New("no credentials") }}}
	_, err = failing.Get(srv.URL + "/c")
	var te *TokenError
	if !errors.As(err, &te) || len(got) != 2 {
		t.Fatalf("err %v, requests %q", err, got)
	}
}

// isolateADC hides every ambient credential: no GOOGLE_APPLICATION_CREDENTIALS, no gcloud
// well-known file, and a metadata server address where nothing listens.
func isolateADC(t *testing.T) {
	t.Helper()
	t.Setenv("HOME", t.TempDir())
	t.Setenv("CLOUDSDK_CONFIG", t.TempDir())
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", "")
	t.Setenv("GOOGLE_CLOUD_QUOTA_PROJECT", "")
	closed := testkit.ClosedLoopbackAddr(t)
	t.Setenv("GCE_METADATA_HOST", closed)
	t.Setenv("GCE_METADATA_IP", closed)
}

var testKeyPEM = sync.OnceValue(func() string {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
})

func serviceAccount(tokenURI, email string) map[string]any {
	return map[string]any{
		"type": "service_account", "project_id": "test", "private_key_id": "k1",
		"private_key": testKeyPEM(), "client_email": email, "client_id": "1", "token_uri": tokenURI,
	}
}

// useCredentials writes v as the GOOGLE_APPLICATION_CREDENTIALS file.
func useCredentials(t *testing.T, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "adc.json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", file)
}

func idTokenFor(t *testing.T, audience string) string {
	return testkit.UnsignedJWT(t, map[string]any{"aud": audience, "iss": "https://accounts.google.com", "exp": time.Now().Add(time.Hour).Unix()})
}

func jwtClaims(token string) (map[string]any, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, fmt.Errorf("%d JWT parts", len(parts))
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, err
	}
	var claims map[string]any
	return claims, json.Unmarshal(b, &claims)
}

// sourceTokenServer is a service account token endpoint handing out accessToken for assertions
// that ask for cloud-platform access (not for an ID token).
func sourceTokenServer(t *testing.T, accessToken string, minted *atomic.Int32) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		claims, err := jwtClaims(r.FormValue("assertion"))
		if err != nil || claims["scope"] != cloudPlatformScope || claims["target_audience"] != nil {
			t.Errorf("source token endpoint: assertion claims %v (%v)", claims, err)
			http.Error(w, "bad assertion", http.StatusBadRequest)
			return
		}
		minted.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"access_token":%q,"token_type":"Bearer","expires_in":3600}`, accessToken)
	}))
	t.Cleanup(srv.Close)
	return srv
}

type generateIDTokenRequest struct {
	Audience     string   `json:"audience"`
	IncludeEmail bool     `json:"includeEmail"`
	Delegates    []string `json:"delegates"`
}

// iamServer is an IAM Credentials API serving generateIdToken for account with answer; any
// other call (generateAccessToken: impersonating twice) fails the test.
func iamServer(t *testing.T, account string, answer func(w http.ResponseWriter, r *http.Request, req generateIDTokenRequest)) *httptest.Server {
	want := "/v1/projects/-/serviceAccounts/" + account + ":generateIdToken"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req generateIDTokenRequest
		if r.Method != http.MethodPost || r.URL.Path != want || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("IAM server got %s %s (Content-Type %q), want POST %s", r.Method, r.URL.Path, r.Header.Get("Content-Type"), want)
			http.Error(w, "unexpected call", http.StatusNotFound)
			return
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("generateIdToken body: %v", err)
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		answer(w, r, req)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestIDTokenFuncEmptyAudienceLooksAtNothing(t *testing.T) {
	isolateADC(t)
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "must-not-be-read.json"))
	tok, err := IDTokenFunc("")
	if tok != nil || err != nil {
		t.Fatalf("IDTokenFunc(\"\") = %v, %v", tok != nil, err)
	}
}

// A service account key signs an assertion carrying target_audience; the endpoint's id_token
// (not its access token) is the bearer, minted once and then reused.
func TestIDTokenFromServiceAccountKey(t *testing.T) {
	isolateADC(t)
	const aud, email = "tfstackplan-test", "runner@test.iam.gserviceaccount.com"
	idTok := idTokenFor(t, aud)
	var minted atomic.Int32
	var tokenURL string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		claims, err := jwtClaims(r.FormValue("assertion"))
		if r.FormValue("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" || err != nil ||
			claims["target_audience"] != aud || claims["iss"] != email || claims["aud"] != tokenURL {
			t.Errorf("token endpoint: grant %q, assertion claims %v (%v)", r.FormValue("grant_type"), claims, err)
			http.Error(w, "bad assertion", http.StatusBadRequest)
			return
		}
		minted.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"access_token":"an-access-token","id_token":%q,"token_type":"Bearer","expires_in":3600}`, idTok)
	}))
	defer srv.Close()
	tokenURL = srv.URL + "/token"
	useCredentials(t, serviceAccount(tokenURL, email))

	tf, err := IDTokenFunc(aud)
	if err != nil || tf == nil {
		t.Fatalf("IDTokenFunc: %v", err)
	}
	mintTwice(t, tf, idTok)
	if n := minted.Load(); n != 1 {
		t.Errorf("token endpoint called %d times, want 1 (the token is cached)", n)
	}
}

// An impersonated_service_account file: the source key's access token authenticates
// generateIdToken for the target, with the file's delegates, our User-Agent and the source
// credentials' quota project.
func TestIDTokenFromImpersonatedServiceAccount(t *testing.T) {
	isolateADC(t)
	const aud, target = "https://cp.example.com", "target@p.iam.gserviceaccount.com"
	idTok := idTokenFor(t, aud)
	var sourceMinted, iamMinted atomic.Int32
	source := sourceTokenServer(t, "source-access-token", &sourceMinted)
	iam := iamServer(t, target, func(w http.ResponseWriter, r *http.Request, req generateIDTokenRequest) {
		if r.Header.Get("Authorization") != "Bearer source-access-token" || req.Audience != aud || !req.IncludeEmail ||
			len(req.Delegates) != 2 || req.Delegates[0] != "projects/-/serviceAccounts/d1@p.iam.gserviceaccount.com" ||
			req.Delegates[1] != "projects/-/serviceAccounts/d2@p.iam.gserviceaccount.com" ||
			r.Header.Get("User-Agent") != buildinfo.UserAgent() || r.Header.Get("X-Goog-User-Project") != "billing-proj" {
			t.Errorf("generateIdToken: Authorization %q, User-Agent %q, X-Goog-User-Project %q, request %+v",
				r.Header.Get("Authorization"), r.Header.Get("User-Agent"), r.Header.Get("X-Goog-User-Project"), req)
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		iamMinted.Add(1)
		fmt.Fprintf(w, `{"token":%q}`, idTok)
	})
	sourceCreds := serviceAccount(source.URL+"/token", "source@p.iam.gserviceaccount.com")
	sourceCreds["quota_project_id"] = "billing-proj"
	useCredentials(t, map[string]any{
		"type":                              "impersonated_service_account",
		"service_account_impersonation_url": iam.URL + "/v1/projects/-/serviceAccounts/" + target + ":generateAccessToken",
		"delegates":                         []string{"d1@p.iam.gserviceaccount.com", "projects/-/serviceAccounts/d2@p.iam.gserviceaccount.com"},
		"source_credentials":                sourceCreds,
	})

	tf, err := minter{iamBase: iam.URL, client: &http.Client{Timeout: 5 * time.Second}}.tokenFunc(aud)
	if err != nil {
		t.Fatalf("tokenFunc: %v", err)
	}
	mintTwice(t, tf, idTok)
	if s, n := sourceMinted.Load(), iamMinted.Load(); s != 1 || n != 1 {
		t.Errorf("source token endpoint called %d times, generateIdToken %d times; want 1 and 1", s, n)
	}
}

// stsServer is a local Security Token Service exchanging subject (a JWT-typed subject token for
// poolAudience, cloud-platform scope) for the access token "federated-access-token", counting
// exchanges in calls.
func stsServer(t *testing.T, poolAudience, subject string, calls *atomic.Int32) *httptest.Server {
	t.Helper()
	sts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.FormValue("grant_type") != "urn:ietf:params:oauth:grant-type:token-exchange" ||
			r.FormValue("subject_token") != subject || r.FormValue("audience") != poolAudience ||
			r.FormValue("subject_token_type") != "urn:ietf:params:oauth:token-type:jwt" || r.FormValue("scope") != cloudPlatformScope {
			t.Errorf("STS request %v", r.PostForm)
			http.Error(w, "bad exchange", http.StatusBadRequest)
			return
		}
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"access_token":"federated-access-token","issued_token_type":"urn:ietf:params:oauth:token-type:access_token","token_type":"Bearer","expires_in":3600}`)
	}))
	t.Cleanup(sts.Close)
	return sts
}

// mintTwice calls tf twice and fails unless both calls return want.
func mintTwice(t *testing.T, tf TokenFunc, want string) {
	t.Helper()
	for i := range 2 {
		if got, err := tf(context.Background()); err != nil || got != want {
			t.Fatalf("call %d: token %q, %v; want the minted ID token", i, got, err)
		}
	}
}

// An external_account (workload identity federation) that impersonates a service account: the
// STS token for the file's subject token authenticates generateIdToken for that account, and
// the account is not impersonated first (no generateAccessToken). cloud.google.com/go/auth does
// not restrict token_url hosts, so the STS endpoint is local too.
func TestIDTokenFromExternalAccount(t *testing.T) {
	isolateADC(t)
	const aud, target = "tfstackplan-test", "wif@p.iam.gserviceaccount.com"
	const poolAudience = "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/ci/providers/gh"
	idTok := idTokenFor(t, aud)
	subjectFile := filepath.Join(t.TempDir(), "subject-token")
	if err := os.WriteFile(subjectFile, []byte("subject-token-from-ci\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stsCalls, iamMinted atomic.Int32
	sts := stsServer(t, poolAudience, "subject-token-from-ci", &stsCalls)
	iam := iamServer(t, target, func(w http.ResponseWriter, r *http.Request, req generateIDTokenRequest) {
		if r.Header.Get("Authorization") != "Bearer federated-access-token" || req.Audience != aud || !req.IncludeEmail || len(req.Delegates) != 0 {
			t.Errorf("generateIdToken: Authorization %q, request %+v", r.Header.Get("Authorization"), req)
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		iamMinted.Add(1)
		fmt.Fprintf(w, `{"token":%q}`, idTok)
	})
	useCredentials(t, map[string]any{
		"type":                              "external_account",
		"audience":                          poolAudience,
		"subject_token_type":                "urn:ietf:params:oauth:token-type:jwt",
		"token_url":                         sts.URL + "/v1/token",
		"credential_source":                 map[string]any{"file": subjectFile},
		"service_account_impersonation_url": iam.URL + "/v1/projects/-/serviceAccounts/" + target + ":generateAccessToken",
	})

	tf, err := minter{iamBase: iam.URL}.tokenFunc(aud)
	if err != nil {
		t.Fatalf("tokenFunc: %v", err)
	}
	mintTwice(t, tf, idTok)
	if s, n := stsCalls.Load(), iamMinted.Load(); s != 1 || n != 1 {
		t.Errorf("STS called %d times, generateIdToken %d times; want 1 and 1", s, n)
	}
}

// GitHub Actions as google-github-actions/auth sets it up: credential_source.url is the Actions
// ID-token endpoint, asked with the request token as a bearer and answering {"value": ...}; that
// subject token goes to STS, whose access token authenticates generateIdToken.
func TestIDTokenFromExternalAccountURLSource(t *testing.T) {
	isolateADC(t)
	const aud, target = "tfstackplan-test", "wif@p.iam.gserviceaccount.com"
	const poolAudience = "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/ci/providers/gh"
	const requestToken = "actions-request-token"
	idTok := idTokenFor(t, aud)
	subject := testkit.UnsignedJWT(t, map[string]any{"iss": "https://token.actions.githubusercontent.com", "sub": "repo:o/r:ref:refs/heads/main"})
	var oidcCalls, stsCalls, iamMinted atomic.Int32
	oidc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/_apis/token" || r.URL.Query().Get("api-version") != "2.0" ||
			r.URL.Query().Get("audience") != "https:"+poolAudience || r.Header.Get("Authorization") != "bearer "+requestToken {
			t.Errorf("credential_source.url got %s %s with Authorization %q", r.Method, r.URL, r.Header.Get("Authorization"))
			http.Error(w, "bad request", http.StatusUnauthorized)
			return
		}
		oidcCalls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"count":1,"value":%q}`, subject)
	}))
	defer oidc.Close()
	sts := stsServer(t, poolAudience, subject, &stsCalls)
	iam := iamServer(t, target, func(w http.ResponseWriter, r *http.Request, req generateIDTokenRequest) {
		if r.Header.Get("Authorization") != "Bearer federated-access-token" || req.Audience != aud ||
			r.Header.Get("X-Goog-User-Project") != "" || r.Header.Get("User-Agent") != buildinfo.UserAgent() {
			t.Errorf("generateIdToken: Authorization %q, X-Goog-User-Project %q, User-Agent %q, request %+v",
				r.Header.Get("Authorization"), r.Header.Get("X-Goog-User-Project"), r.Header.Get("User-Agent"), req)
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		iamMinted.Add(1)
		fmt.Fprintf(w, `{"token":%q}`, idTok)
	})
	useCredentials(t, map[string]any{
		"type":               "external_account",
		"audience":           poolAudience,
		"subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
		"token_url":          sts.URL + "/v1/token",
		"credential_source": map[string]any{
			"url":     oidc.URL + "/_apis/token?api-version=2.0&audience=" + url.QueryEscape("https:"+poolAudience),
			"headers": map[string]string{"Authorization": "bearer " + requestToken},
			"format":  map[string]string{"type": "json", "subject_token_field_name": "value"},
		},
		"service_account_impersonation_url": iam.URL + "/v1/projects/-/serviceAccounts/" + target + ":generateAccessToken",
	})

	tf, err := minter{iamBase: iam.URL}.tokenFunc(aud)
	if err != nil {
		t.Fatalf("tokenFunc: %v", err)
	}
	if got, err := tf(context.Background()); err != nil || got != idTok {
		t.Fatalf("token %q, %v", got, err)
	}
	if o, s, n := oidcCalls.Load(), stsCalls.Load(), iamMinted.Load(); o != 1 || s != 1 || n != 1 {
		t.Errorf("credential_source.url called %d times, STS %d, generateIdToken %d; want 1 each", o, s, n)
	}
}

// A token inside the early-expiry window is replaced before the call that finds it returns,
// and a failed replacement fails that call instead of handing out the old token. The endpoint's
// tokens live 30 seconds, less than refreshEarly, so each one is inside the window at once.
func TestIDTokenRefreshIsSynchronous(t *testing.T) {
	isolateADC(t)
	const aud = "aud-x"
	var minted atomic.Int32
	var failNext atomic.Bool
	tokens := make(chan string, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failNext.Swap(false) {
			http.Error(w, `{"error":"invalid_grant"}`, http.StatusBadRequest)
			return
		}
		n := minted.Add(1)
		tok := testkit.UnsignedJWT(t, map[string]any{"aud": aud, "n": n, "exp": time.Now().Add(30 * time.Second).Unix()})
		tokens <- tok
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id_token":%q,"token_type":"Bearer","expires_in":60}`, tok)
	}))
	defer srv.Close()
	useCredentials(t, serviceAccount(srv.URL+"/token", "runner@test.iam.gserviceaccount.com"))

	tf, err := IDTokenFunc(aud)
	if err != nil {
		t.Fatalf("IDTokenFunc: %v", err)
	}
	first := <-tokens
	got, err := tf(context.Background())
	if err != nil || got == first || minted.Load() != 2 {
		t.Fatalf("token %q (the first is %q), %v after %d mints; want a second token, minted by this call", got, first, err, minted.Load())
	}
	if second := <-tokens; got != second {
		t.Fatalf("token %q, want the newly minted %q", got, second)
	}
	failNext.Store(true)
	if got, err := tf(context.Background()); err == nil || got != "" {
		t.Fatalf("token %q, %v; want the failed refresh's error, not the old token", got, err)
	}
	got, err = tf(context.Background())
	if err != nil || minted.Load() != 3 || got != <-tokens {
		t.Fatalf("token %q, %v after %d mints; want the third token", got, err, minted.Load())
	}
}

// Token endpoints and generateIdToken are not followed to where a redirect points: the 3xx is
// an error naming the endpoint and status.
func TestTokenRequestsFollowNoRedirect(t *testing.T) {
	var elsewhereCalls atomic.Int32
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhereCalls.Add(1)
		t.Errorf("redirect target got %s %s", r.Method, r.URL)
	}))
	defer elsewhere.Close()
	redirect := func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+"/stolen", http.StatusTemporaryRedirect)
	}
	t.Run("generateIdToken", func(t *testing.T) {
		isolateADC(t)
		var sourceMinted atomic.Int32
		source := sourceTokenServer(t, "source-access-token", &sourceMinted)
		iam := iamServer(t, "target@p.iam.gserviceaccount.com", func(w http.ResponseWriter, r *http.Request, _ generateIDTokenRequest) {
			redirect(w, r)
		})
		useCredentials(t, map[string]any{
			"type":                              "impersonated_service_account",
			"service_account_impersonation_url": "https://iamcredentials.googleapis.com/v1/projects/-/serviceAccounts/target@p.iam.gserviceaccount.com:generateAccessToken",
			"source_credentials":                serviceAccount(source.URL+"/token", "source@p.iam.gserviceaccount.com"),
		})
		_, err := minter{iamBase: iam.URL}.tokenFunc("aud-x")
		endpoint := iam.URL + "/v1/projects/-/serviceAccounts/target@p.iam.gserviceaccount.com:generateIdToken"
		if err == nil || !strings.Contains(err.Error(), endpoint+" answered 307 Temporary Redirect") || strings.Contains(err.Error(), "source-access-token") {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("service account token endpoint", func(t *testing.T) {
		isolateADC(t)
		srv := httptest.NewServer(http.HandlerFunc(redirect))
		defer srv.Close()
		useCredentials(t, serviceAccount(srv.URL+"/token", "runner@test.iam.gserviceaccount.com"))
		_, err := IDTokenFunc("aud-x")
		if err == nil || !strings.Contains(err.Error(), srv.URL+"/token answered 307 Temporary Redirect") {
			t.Fatalf("error %v", err)
		}
	})
	if n := elsewhereCalls.Load(); n != 0 {
		t.Errorf("redirect target called %d times, want 0", n)
	}
}

// A service account key outside Google's default universe mints through IAM, authenticated by
// the key's self-signed JWT, as Google's library does.
func TestIDTokenFromServiceAccountKeyInAnotherUniverse(t *testing.T) {
	isolateADC(t)
	const aud, email = "tfstackplan-test", "runner@test.iam.example-universe.test"
	idTok := idTokenFor(t, aud)
	var iamMinted atomic.Int32
	iam := iamServer(t, email, func(w http.ResponseWriter, r *http.Request, req generateIDTokenRequest) {
		bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		claims, err := jwtClaims(bearer)
		if err != nil || claims["iss"] != email || claims["scope"] != cloudPlatformScope || req.Audience != aud {
			t.Errorf("generateIdToken: bearer claims %v (%v), request %+v", claims, err, req)
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		iamMinted.Add(1)
		fmt.Fprintf(w, `{"token":%q}`, idTok)
	})
	sa := serviceAccount(testkit.ClosedLoopbackAddr(t), email) // the token endpoint must not be used
	sa["universe_domain"] = "example-universe.test"
	useCredentials(t, sa)

	tf, err := minter{iamBase: iam.URL}.tokenFunc(aud)
	if err != nil {
		t.Fatalf("tokenFunc: %v", err)
	}
	if got, err := tf(context.Background()); err != nil || got != idTok || iamMinted.Load() != 1 {
		t.Fatalf("token %q, %v after %d generateIdToken calls", got, err, iamMinted.Load())
	}
}

// Without a credentials file the metadata server's identity endpoint mints the token.
func TestIDTokenFromMetadataServer(t *testing.T) {
	isolateADC(t)
	const aud = "https://cp.example.com/a b?x=1&y=2"
	idTok := idTokenFor(t, aud)
	var minted atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Metadata-Flavor") != "Google" {
			http.Error(w, "missing Metadata-Flavor", http.StatusForbidden)
			return
		}
		w.Header().Set("Metadata-Flavor", "Google")
		if r.URL.Path != "/computeMetadata/v1/instance/service-accounts/default/identity" ||
			r.URL.Query().Get("audience") != aud || r.URL.Query().Get("format") != "full" || r.Header.Get("User-Agent") != buildinfo.UserAgent() {
			t.Errorf("metadata request %s (User-Agent %q)", r.URL, r.Header.Get("User-Agent"))
			http.NotFound(w, r)
			return
		}
		minted.Add(1)
		fmt.Fprint(w, idTok)
	}))
	defer srv.Close()
	t.Setenv("GCE_METADATA_HOST", strings.TrimPrefix(srv.URL, "http://"))

	tf, err := IDTokenFunc(aud)
	if err != nil {
		t.Fatalf("IDTokenFunc: %v", err)
	}
	mintTwice(t, tf, idTok)
	if n := minted.Load(); n != 1 {
		t.Errorf("identity endpoint called %d times, want 1", n)
	}
}

// Credentials that cannot mint ID tokens fail at start with ErrNoCredentials, naming the
// audience and why.
func TestIDTokenFuncRejectsUnusableCredentials(t *testing.T) {
	external := map[string]any{
		"type": "external_account", "audience": "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/ci/providers/gh",
		"subject_token_type": "urn:ietf:params:oauth:token-type:jwt", "token_url": "http://" + testkit.ClosedLoopbackAddr(t) + "/v1/token",
		"credential_source": map[string]any{"file": "/nonexistent"},
	}
	for name, tc := range map[string]struct {
		creds any // nil: a credentials path with no file
		want  string
	}{
		"authorized_user":                        {map[string]any{"type": "authorized_user", "client_id": "c", "client_secret": "s", "refresh_token": "r"}, "authorized_user credentials cannot mint ID tokens"},
		"external_account without impersonation": {external, "external_account credentials without service_account_impersonation_url"},
		"unknown type":                           {map[string]any{"type": "mystery_account"}, "mystery_account"},
		"impersonation URL without an account":   {map[string]any{"type": "impersonated_service_account", "service_account_impersonation_url": "https://iamcredentials.googleapis.com/v1/nothing", "source_credentials": map[string]any{"type": "authorized_user", "client_id": "c", "client_secret": "s", "refresh_token": "r"}}, "names no service account"},
		"missing file":                           {nil, "no such file"},
	} {
		t.Run(name, func(t *testing.T) {
			isolateADC(t)
			if tc.creds != nil {
				useCredentials(t, tc.creds)
			} else {
				t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "nope.json"))
			}
			tf, err := IDTokenFunc("aud-x")
			if tf != nil || !errors.Is(err, ErrNoCredentials) || !strings.Contains(err.Error(), `"aud-x"`) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("IDTokenFunc = %v, %v; want ErrNoCredentials naming %q", tf != nil, err, tc.want)
			}
		})
	}
}

// A minted token whose expiry cannot be read is refused: it could be neither cached nor
// refreshed in time.
func TestIDTokenWithoutExpIsRejected(t *testing.T) {
	isolateADC(t)
	noExp := testkit.UnsignedJWT(t, map[string]any{"aud": "aud-x", "iss": "https://accounts.google.com"})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id_token":%q,"token_type":"Bearer","expires_in":3600}`, noExp)
	}))
	defer srv.Close()
	useCredentials(t, serviceAccount(srv.URL+"/token", "runner@test.iam.gserviceaccount.com"))
	tf, err := IDTokenFunc("aud-x")
	if tf != nil || !errors.Is(err, ErrNoCredentials) || !strings.Contains(err.Error(), "no exp claim") {
		t.Fatalf("IDTokenFunc = %v, %v; want an error about the missing exp", tf != nil, err)
	}
	if strings.Contains(err.Error(), noExp) {
		t.Fatalf("error repeats the token: %v", err)
	}
}

// Token endpoint failures name the endpoint and status, repeat a bounded excerpt of an error
// body, and never the body of a successful answer (which may carry a token).
func TestTokenEndpointErrors(t *testing.T) {
	long := `{"error":"invalid_grant","error_description":"` + strings.Repeat("x", 5000) + `"}`
	t.Run("service account key, 400", func(t *testing.T) {
		isolateADC(t)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, long, http.StatusBadRequest)
		}))
		defer srv.Close()
		useCredentials(t, serviceAccount(srv.URL+"/token", "runner@test.iam.gserviceaccount.com"))
		_, err := IDTokenFunc("aud-x")
		if err == nil || !strings.Contains(err.Error(), srv.URL+"/token answered 400") || !strings.Contains(err.Error(), "invalid_grant") || len(err.Error()) > 1000 {
			t.Fatalf("error %v (%d bytes)", err, len(fmt.Sprint(err)))
		}
	})
	for name, tc := range map[string]struct {
		status int
		body   string
		want   string
	}{
		"generateIdToken 403":               {http.StatusForbidden, long, "answered 403 Forbidden: {\"error\":\"invalid_grant\""},
		"generateIdToken 200 without token": {http.StatusOK, `{"accessToken":"leaky-secret-value"}`, "answered 200 OK without a token"},
	} {
		t.Run(name, func(t *testing.T) {
			isolateADC(t)
			var sourceMinted atomic.Int32
			source := sourceTokenServer(t, "source-access-token", &sourceMinted)
			iam := iamServer(t, "target@p.iam.gserviceaccount.com", func(w http.ResponseWriter, r *http.Request, req generateIDTokenRequest) {
				w.WriteHeader(tc.status)
				fmt.Fprint(w, tc.body)
			})
			useCredentials(t, map[string]any{
				"type":                              "impersonated_service_account",
				"service_account_impersonation_url": "https://iamcredentials.googleapis.com/v1/projects/-/serviceAccounts/target@p.iam.gserviceaccount.com:generateAccessToken",
				"source_credentials":                serviceAccount(source.URL+"/token", "source@p.iam.gserviceaccount.com"),
			})
			_, err := minter{iamBase: iam.URL}.tokenFunc("aud-x")
			endpoint := iam.URL + "/v1/projects/-/serviceAccounts/target@p.iam.gserviceaccount.com:generateIdToken"
			if err == nil || !strings.Contains(err.Error(), endpoint) || !strings.Contains(err.Error(), tc.want) ||
				strings.Contains(err.Error(), "leaky-secret-value") || strings.Contains(err.Error(), "source-access-token") || len(err.Error()) > 1000 {
				t.Fatalf("error %v (%d bytes)", err, len(fmt.Sprint(err)))
			}
		})
	}
}

type providerFunc func(context.Context) (*auth.Token, error)

func (f providerFunc) Token(ctx context.Context) (*auth.Token, error) { return f(ctx) }

// A caller's context ends its wait even when the provider does not return.
func TestProviderTokenFuncHonoursContext(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	tf := fromProvider(providerFunc(func(context.Context) (*auth.Token, error) {
		<-release
		return &auth.Token{Value: "late"}, nil
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if tok, err := tf(ctx); tok != "" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("token %q, %v; want the context's deadline", tok, err)
	}
	empty := fromProvider(providerFunc(func(context.Context) (*auth.Token, error) { return &auth.Token{}, nil }))
	if _, err := empty(context.Background()); err == nil {
		t.Fatal("an empty token must be an error")
	}
}
