package testkit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"
)

// ActionsOIDC is a stand-in, on 127.0.0.1, for the endpoint a GitHub Actions job requests its
// OIDC tokens from: a GET authorized by RequestToken is answered {"count":N,"value":JWT}, the
// JWT an unsigned token for the request's audience with an exp TTL ahead; any other request
// gets 401. SetAnswer replaces that answer.
type ActionsOIDC struct {
	// URL is the request URL (ACTIONS_ID_TOKEN_REQUEST_URL), with a query as GitHub's has.
	URL string
	// RequestToken authorizes the requests (ACTIONS_ID_TOKEN_REQUEST_TOKEN).
	RequestToken string

	t      testing.TB
	mu     sync.Mutex
	ttl    time.Duration
	answer http.HandlerFunc
	seen   []ActionsRequest
	tokens []string // the tokens handed out
}

// ActionsRequest is what an ActionsOIDC saw of one request.
type ActionsRequest struct {
	Authorization string
	UserAgent     string
	Query         url.Values
}

// NewActionsOIDC starts an ActionsOIDC whose tokens live an hour; it stops when t ends.
func NewActionsOIDC(t testing.TB) *ActionsOIDC {
	t.Helper()
	a := &ActionsOIDC{RequestToken: "actions-request-token-0123456789", t: t, ttl: time.Hour}
	srv := httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(srv.Close)
	a.URL = srv.URL + "/_apis/idtoken?api-version=2.0"
	return a
}

// Getenv returns a getenv of a job with `permissions: id-token: write` on a's endpoint: the two
// variables GitHub sets, then more (nil: none).
func (a *ActionsOIDC) Getenv(more map[string]string) func(string) string {
	return func(k string) string {
		switch k {
		case "ACTIONS_ID_TOKEN_REQUEST_URL":
			return a.URL
		case "ACTIONS_ID_TOKEN_REQUEST_TOKEN":
			return a.RequestToken
		}
		return more[k]
	}
}

// SetTTL makes the tokens handed out from now on live d.
func (a *ActionsOIDC) SetTTL(d time.Duration) {
	a.mu.Lock()
	a.ttl = d
	a.mu.Unlock()
}

// SetAnswer makes h answer the requests from now on (nil: the default answer).
func (a *ActionsOIDC) SetAnswer(h http.HandlerFunc) {
	a.mu.Lock()
	a.answer = h
	a.mu.Unlock()
}

// Requests returns what a saw of every request so far.
func (a *ActionsOIDC) Requests() []ActionsRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]ActionsRequest(nil), a.seen...)
}

// Tokens returns the tokens handed out so far.
func (a *ActionsOIDC) Tokens() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.tokens...)
}

func (a *ActionsOIDC) serve(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.seen = append(a.seen, ActionsRequest{Authorization: r.Header.Get("Authorization"), UserAgent: r.Header.Get("User-Agent"), Query: r.URL.Query()})
	answer, ttl := a.answer, a.ttl
	a.mu.Unlock()
	if answer != nil {
		answer(w, r)
		return
	}
	if r.Method != http.MethodGet || r.Header.Get("Authorization") != "Bearer "+a.RequestToken {
		http.Error(w, `{"message":"Unauthorized"}`, http.StatusUnauthorized)
		return
	}
	aud := r.URL.Query().Get("audience")
	tok := UnsignedJWT(a.t, map[string]any{
		"iss": "https://token.actions.githubusercontent.com", "aud": aud, "sub": "repo:acme/infra:ref:refs/heads/main",
		"repository": "acme/infra", "exp": time.Now().Add(ttl).Unix(), "jti": fmt.Sprint(time.Now().UnixNano()),
	})
	a.mu.Lock()
	a.tokens = append(a.tokens, tok)
	n := len(a.tokens)
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"count":%d,"value":%q}`, n, tok)
}
