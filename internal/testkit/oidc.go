package testkit

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// OIDCIssuer is an OpenID Connect issuer on 127.0.0.1 with its own RSA keys: it serves a
// discovery document at /.well-known/openid-configuration and its key set at
// /.well-known/jwks, as GitHub's token.actions.githubusercontent.com does, and mints tokens.
// Its methods are safe for concurrent use.
type OIDCIssuer struct {
	// URL is the issuer (http://127.0.0.1:PORT): its tokens' iss and its discovery's base.
	URL string
	// Discoveries and KeyFetches count the requests for the discovery document and the key set.
	Discoveries, KeyFetches atomic.Int64

	srv *httptest.Server

	mu         sync.Mutex
	keys       map[string]*rsa.PrivateKey // published, by kid
	kid        string                     // the one Mint signs with
	minted     int                        // kids made so far
	down       bool
	discovered string // the issuer the discovery document names ("": URL)
	jwksURL    string // the jwks_uri it names ("": its own)
}

// NewOIDCIssuer starts an issuer over http with one key; the test's cleanup stops it.
func NewOIDCIssuer(t testing.TB) *OIDCIssuer {
	t.Helper()
	return newOIDCIssuer(t, httptest.NewServer)
}

// NewOIDCIssuerTLS starts an issuer over https (https://127.0.0.1:PORT) with one key; Client
// trusts its certificate.
func NewOIDCIssuerTLS(t testing.TB) *OIDCIssuer {
	t.Helper()
	return newOIDCIssuer(t, httptest.NewTLSServer)
}

func newOIDCIssuer(t testing.TB, start func(http.Handler) *httptest.Server) *OIDCIssuer {
	o := &OIDCIssuer{keys: map[string]*rsa.PrivateKey{}}
	o.srv = start(http.HandlerFunc(o.serve))
	t.Cleanup(o.srv.Close)
	o.URL = o.srv.URL
	o.Rotate(t)
	return o
}

// Client is a client that trusts the issuer's certificate (any client will do over http).
func (o *OIDCIssuer) Client() *http.Client { return o.srv.Client() }

func (o *OIDCIssuer) serve(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch r.URL.Path {
	case "/.well-known/openid-configuration":
		o.Discoveries.Add(1)
	case "/.well-known/jwks":
		o.KeyFetches.Add(1)
	default:
		http.NotFound(w, r)
		return
	}
	if o.down {
		http.Error(w, "issuer down", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/.well-known/jwks" {
		jwks := []map[string]string{}
		for kid, k := range o.keys {
			jwks = append(jwks, JWK(kid, &k.PublicKey))
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"keys": jwks})
		return
	}
	iss, jwksURL := o.discovered, o.jwksURL
	if iss == "" {
		iss = o.URL
	}
	if jwksURL == "" {
		jwksURL = o.URL + "/.well-known/jwks"
	}
	_ = json.NewEncoder(w).Encode(map[string]any{
		"issuer": iss, "jwks_uri": jwksURL,
		"subject_types_supported":               []string{"public", "pairwise"},
		"response_types_supported":              []string{"id_token"},
		"id_token_signing_alg_values_supported": []string{"RS256"},
		"claims_supported":                      []string{"sub", "aud", "exp", "iat", "iss", "jti", "nbf", "ref", "repository", "repository_id", "repository_owner", "run_id", "run_attempt", "actor", "workflow", "workflow_ref", "job_workflow_ref", "event_name", "ref_type", "environment", "sha"},
		"scopes_supported":                      []string{"openid"},
	})
}

// Rotate publishes a new key and signs with it from now on; the older keys stay published
// until Withdraw. It returns the new key's kid.
func (o *OIDCIssuer) Rotate(t testing.TB) string {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.minted++
	o.kid = fmt.Sprintf("key-%d", o.minted)
	o.keys[o.kid] = k
	return o.kid
}

// Withdraw stops publishing the key kid (Mint goes on signing with the current key).
func (o *OIDCIssuer) Withdraw(kid string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.keys, kid)
}

// Key returns the current signing key and its kid.
func (o *OIDCIssuer) Key() (string, *rsa.PrivateKey) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.kid, o.keys[o.kid]
}

// SetDown makes every request fail with 503 (true) or be answered again (false).
func (o *OIDCIssuer) SetDown(down bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.down = down
}

// SetDiscovery makes the discovery document name issuer and jwksURL instead of the issuer's
// own ("" keeps its own).
func (o *OIDCIssuer) SetDiscovery(issuer, jwksURL string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.discovered, o.jwksURL = issuer, jwksURL
}

// Mint is a token carrying claims signed with the current key.
func (o *OIDCIssuer) Mint(t testing.TB, claims map[string]any) string {
	t.Helper()
	kid, key := o.Key()
	return SignRS256(t, key, kid, claims)
}

// GitHubClaims are the claims of a GitHub Actions ID token from this issuer for audience,
// issued to a push workflow of repository (owner/name) on refs/heads/main, run 4242 attempt
// 1, valid for five minutes from now; change them at will before Mint.
func (o *OIDCIssuer) GitHubClaims(audience, repository string) map[string]any {
	owner, _, _ := strings.Cut(repository, "/")
	now := time.Now().Unix()
	workflow := repository + "/.github/workflows/plan.yml@refs/heads/main"
	return map[string]any{
		"iss": o.URL, "aud": audience, "iat": now, "nbf": now - 5, "exp": now + 300,
		"jti": "1f6c4c3e-0000-4000-8000-000000000000",
		"sub": "repo:" + repository + ":ref:refs/heads/main",
		"ref": "refs/heads/main", "ref_type": "branch", "ref_protected": "true",
		"sha":        "0123456789abcdef0123456789abcdef01234567",
		"repository": repository, "repository_owner": owner,
		"repository_id": "123456", "repository_owner_id": "654321", "repository_visibility": "private",
		"run_id": "4242", "run_number": "17", "run_attempt": "1",
		"actor": "alice", "actor_id": "7", "event_name": "push",
		"workflow": "plan", "workflow_ref": workflow, "job_workflow_ref": workflow,
		"workflow_sha":       "0123456789abcdef0123456789abcdef01234567",
		"runner_environment": "github-hosted",
	}
}
