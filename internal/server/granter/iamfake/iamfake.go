// Package iamfake is a loopback stand-in for the two IAM REST methods a granter uses,
// projects.serviceAccounts.getIamPolicy and setIamPolicy, and for the OAuth token endpoint a
// service-account key signs in at. Tests run the granter's IAM client, signing in through the
// real Google auth library, against it: CredentialsFile writes a key file whose token_uri is this
// server.
//
// Requests follow the IAM v1 REST reference: a bearer token, getIamPolicy with an empty body and
// the policy version as the query parameter options.requestedPolicyVersion, setIamPolicy with a
// JSON {"policy": ...} body. Policies follow IAM's rules where they matter to a read-modify-write:
// a fresh etag per change, a stale etag answered with 409 ABORTED, version 3 required for
// conditions, bindings with the same role and condition merged. Faults can be scripted: failing
// or garbled answers, a token the IAM methods refuse, and a concurrent writer between a read and
// a write.
package iamfake

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Expr is an IAM condition.
type Expr struct {
	Title       string `json:"title,omitempty"`
	Description string `json:"description,omitempty"`
	Expression  string `json:"expression,omitempty"`
}

// Binding binds members to a role, under a condition when Condition is set.
type Binding struct {
	Role      string   `json:"role,omitempty"`
	Members   []string `json:"members,omitempty"`
	Condition *Expr    `json:"condition,omitempty"`
}

// Policy is a service account's IAM policy.
type Policy struct {
	Version  int       `json:"version,omitempty"`
	Etag     string    `json:"etag,omitempty"`
	Bindings []Binding `json:"bindings,omitempty"`
}

// Token is the access token the token endpoint issues and the IAM methods require.
const Token = "iamfake-access-token"

// Limits IAM puts on a condition.
const (
	maxTitle       = 100
	maxDescription = 256
)

// Server is a running fake.
type Server struct {
	// URL is the IAM endpoint (and the token endpoint's host), e.g. "http://127.0.0.1:PORT/".
	URL string

	srv *httptest.Server

	mu         sync.Mutex
	policies   map[string]*Policy // by service account email
	serial     int                // etag source
	faults     []fault
	concurrent map[string][]func(*Policy)
	calls      map[string]int
	header     http.Header // of the last IAM request
	issue      string      // the token the token endpoint issues
	key        *rsa.PrivateKey
	keyEmail   string
}

// fault is a scripted answer.
type fault struct {
	method      string
	code        int
	contentType string
	body        string
}

// Start starts a fake on 127.0.0.1 that stops when t's test ends.
func Start(t testing.TB) *Server {
	s := &Server{policies: map[string]*Policy{}, concurrent: map[string][]func(*Policy){}, calls: map[string]int{}, issue: Token}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /token", s.token)
	mux.HandleFunc("POST /v1/projects/{project}/serviceAccounts/{call}", s.iam)
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	s.URL = s.srv.URL + "/"
	return s
}

// AddAccount creates a service account with an empty policy.
func (s *Server) AddAccount(email string) {
	s.SetPolicy(email, Policy{})
}

// SetPolicy replaces an account's policy (creating the account), as an outside writer would:
// the etag changes.
func (s *Server) SetPolicy(email string, p Policy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p = clone(p)
	s.store(email, &p)
}

// Policy returns a copy of an account's policy (the zero Policy for an unknown account).
func (s *Server) Policy(email string) Policy {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.policies[email]; p != nil {
		return clone(*p)
	}
	return Policy{}
}

// Fail makes the next n calls of method ("getIamPolicy", "setIamPolicy", or "" for either)
// answer with HTTP code and Google's error JSON, message "scripted fault", after authentication.
func (s *Server) Fail(method string, n, code int) {
	data, err := json.Marshal(errorBody(code, "scripted fault"))
	if err != nil {
		panic(err)
	}
	s.Answer(method, n, code, "application/json; charset=UTF-8", string(data))
}

// Answer makes the next n calls of method ("getIamPolicy", "setIamPolicy", or "" for either)
// answer with HTTP code, contentType and body as given, after authentication; the policy is
// left as it is.
func (s *Server) Answer(method string, n, code int, contentType, body string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.faults = append(s.faults, fault{method, code, contentType, body})
	}
}

// IssueToken makes the token endpoint issue tok from now on. The IAM methods still accept only
// Token, so any other tok stands for a token IAM does not honour.
func (s *Server) IssueToken(tok string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.issue = tok
}

// Header returns a header of the last getIamPolicy or setIamPolicy request ("" before one).
func (s *Server) Header(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.header.Get(name)
}

// ConcurrentWrite makes another writer change account's policy with mutate just before the next
// setIamPolicy on it is looked at, so that a set based on an earlier read carries a stale etag.
func (s *Server) ConcurrentWrite(account string, mutate func(*Policy)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.concurrent[account] = append(s.concurrent[account], mutate)
}

// Calls counts the requests of method ("getIamPolicy", "setIamPolicy" or "token") so far,
// failed ones included.
func (s *Server) Calls(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[method]
}

// CredentialsFile writes a service-account key file whose token_uri is this fake into a
// temporary directory of t, and returns its path. The key is made on first use.
func (s *Server) CredentialsFile(t testing.TB) string {
	t.Helper()
	s.mu.Lock()
	if s.key == nil {
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			s.mu.Unlock()
			t.Fatal(err)
		}
		s.key, s.keyEmail = key, "tfstackplan-server@iamfake.iam.gserviceaccount.com"
	}
	key, email := s.key, s.keyEmail
	s.mu.Unlock()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(map[string]string{
		"type":           "service_account",
		"project_id":     "iamfake",
		"private_key_id": "iamfake-key",
		"private_key":    string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email":   email,
		"client_id":      "1",
		"token_uri":      s.URL + "token",
	})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "credentials.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// token is the OAuth 2.0 JWT-bearer grant: it checks the assertion's RS256 signature against
// the key of CredentialsFile and its audience, and issues Token.
func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.calls["token"]++
	key, email, issue := s.key, s.keyEmail, s.issue
	s.mu.Unlock()
	oauthErr := func(msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "invalid_grant", "error_description": msg})
	}
	if r.PostFormValue("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
		oauthErr("grant_type is not jwt-bearer")
		return
	}
	parts := strings.Split(r.PostFormValue("assertion"), ".")
	if key == nil || len(parts) != 3 {
		oauthErr("no key, or the assertion is not a JWT")
		return
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		oauthErr("bad signature encoding")
		return
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if err := rsa.VerifyPKCS1v15(&key.PublicKey, crypto.SHA256, sum[:], sig); err != nil {
		oauthErr("bad signature")
		return
	}
	var claims struct {
		Iss   string `json:"iss"`
		Aud   string `json:"aud"`
		Scope string `json:"scope"`
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err == nil {
		err = json.Unmarshal(payload, &claims)
	}
	if err != nil || claims.Iss != email || claims.Aud != s.URL+"token" || claims.Scope == "" {
		oauthErr(fmt.Sprintf("bad claims %+v", claims))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": issue, "token_type": "Bearer", "expires_in": 3600})
}

// iam serves POST /v1/projects/{project}/serviceAccounts/{email}:{getIamPolicy,setIamPolicy}.
func (s *Server) iam(w http.ResponseWriter, r *http.Request) {
	email, method, ok := cutLast(r.PathValue("call"), ":")
	if !ok || (method != "getIamPolicy" && method != "setIamPolicy") {
		apiError(w, http.StatusNotFound, "no method "+r.PathValue("call"))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[method]++
	s.header = r.Header.Clone()
	if r.Header.Get("Authorization") != "Bearer "+Token {
		apiError(w, http.StatusUnauthorized, "Request had invalid authentication credentials.")
		return
	}
	if r.URL.Query().Get("alt") != "json" {
		apiError(w, http.StatusBadRequest, "the granter always asks for alt=json")
		return
	}
	if i := slices.IndexFunc(s.faults, func(f fault) bool { return f.method == "" || f.method == method }); i >= 0 {
		f := s.faults[i]
		s.faults = slices.Delete(s.faults, i, i+1)
		w.Header().Set("Content-Type", f.contentType)
		w.WriteHeader(f.code)
		_, _ = io.WriteString(w, f.body)
		return
	}
	p := s.policies[email]
	if p == nil {
		apiError(w, http.StatusNotFound, "Unknown service account")
		return
	}
	if method == "getIamPolicy" {
		if body, err := io.ReadAll(r.Body); err != nil || len(body) != 0 {
			apiError(w, http.StatusBadRequest, "the getIamPolicy request body must be empty (options.requestedPolicyVersion is a query parameter)")
			return
		}
		if conditional(p) && r.URL.Query().Get("options.requestedPolicyVersion") != "3" {
			apiError(w, http.StatusBadRequest, "the policy has conditions: request policy version 3")
			return
		}
		writeJSON(w, p)
		return
	}
	s.set(w, r, email)
}

func (s *Server) set(w http.ResponseWriter, r *http.Request, email string) {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		apiError(w, http.StatusBadRequest, "the body must be application/json")
		return
	}
	var req struct {
		Policy     *Policy `json:"policy"`
		UpdateMask string  `json:"updateMask"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Policy == nil {
		apiError(w, http.StatusBadRequest, fmt.Sprintf("bad body: no policy (%v)", err))
		return
	}
	for _, mutate := range s.concurrent[email] {
		p := clone(*s.policies[email])
		mutate(&p)
		s.store(email, &p)
	}
	delete(s.concurrent, email)
	in := req.Policy
	switch {
	case in.Etag == "":
		// IAM would take a blind write, but it loses conditions: a granter must never send one.
		apiError(w, http.StatusBadRequest, "iamfake: setIamPolicy without an etag")
		return
	case in.Etag != s.policies[email].Etag:
		apiError(w, http.StatusConflict, "There were concurrent policy changes. Please retry the whole read-modify-write with exponential backoff.")
		return
	case conditional(in) && in.Version != 3:
		apiError(w, http.StatusBadRequest, "a policy with conditions must have version 3")
		return
	}
	var merged []Binding
	for _, b := range in.Bindings {
		if msg := invalid(b); msg != "" {
			apiError(w, http.StatusBadRequest, msg)
			return
		}
		i := slices.IndexFunc(merged, func(m Binding) bool { return m.Role == b.Role && sameExpr(m.Condition, b.Condition) })
		if i < 0 {
			merged = append(merged, Binding{Role: b.Role, Condition: b.Condition})
			i = len(merged) - 1
		}
		for _, m := range b.Members {
			if !slices.Contains(merged[i].Members, m) {
				merged[i].Members = append(merged[i].Members, m)
			}
		}
	}
	p := &Policy{Bindings: merged}
	s.store(email, p)
	writeJSON(w, p)
}

// invalid says what IAM would reject in a binding, or "".
func invalid(b Binding) string {
	switch {
	case b.Role == "":
		return "a binding has no role"
	case len(b.Members) == 0:
		return "binding " + b.Role + " has no members"
	}
	for _, m := range b.Members {
		if !strings.Contains(m, ":") {
			return "member " + m + " has no type prefix"
		}
	}
	if c := b.Condition; c != nil {
		switch {
		case c.Title == "" || c.Expression == "":
			return "a condition needs a title and an expression"
		case len(c.Title) > maxTitle:
			return fmt.Sprintf("condition title longer than %d", maxTitle)
		case len(c.Description) > maxDescription:
			return fmt.Sprintf("condition description longer than %d", maxDescription)
		}
	}
	return ""
}

// store puts p as email's policy with a new etag; s.mu is held.
func (s *Server) store(email string, p *Policy) {
	s.serial++
	p.Etag = base64.StdEncoding.EncodeToString(fmt.Appendf(nil, "iamfake-%d", s.serial))
	p.Version = 1
	if conditional(p) {
		p.Version = 3
	}
	s.policies[email] = p
}

func conditional(p *Policy) bool {
	return slices.ContainsFunc(p.Bindings, func(b Binding) bool { return b.Condition != nil })
}

func sameExpr(a, b *Expr) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

func clone(p Policy) Policy {
	out := p
	out.Bindings = make([]Binding, len(p.Bindings))
	for i, b := range p.Bindings {
		b.Members = slices.Clone(b.Members)
		if b.Condition != nil {
			c := *b.Condition
			b.Condition = &c
		}
		out.Bindings[i] = b
	}
	return out
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// statuses are the google.rpc codes IAM answers with each HTTP status.
var statuses = map[int]string{
	400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
	409: "ABORTED", 412: "FAILED_PRECONDITION", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 502: "UNAVAILABLE",
	503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}

// errorBody is Google's error JSON for an HTTP code and a message.
func errorBody(code int, msg string) any {
	status := statuses[code]
	if status == "" {
		status = "UNKNOWN"
	}
	return map[string]any{"error": map[string]any{"code": code, "message": msg, "status": status}}
}

func apiError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(errorBody(code, msg))
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_ = json.NewEncoder(w).Encode(v)
}
