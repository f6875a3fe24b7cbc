// Package auth authenticates control-plane requests: static bearer tokens from a tokens file
// (for local use) and Google ID tokens verified by audience. Each token maps to a principal with
// roles; roles decide which endpoints a principal may call.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"

	"github.com/tfstackplan/tfstackplan/internal/textfit"
)

// Role is a permission level. Each role includes the ones below it.
type Role string

// Roles, weakest first.
const (
	RoleViewer Role = "viewer" // read executions, logs, claims, gates, grants, checks, audit
	RoleRunner Role = "runner" // plus runner events, gate checks, claim release
	RoleAdmin  Role = "admin"  // plus the admin endpoints
)

var rank = map[Role]int{RoleViewer: 1, RoleRunner: 2, RoleAdmin: 3}

// Principal is an authenticated caller.
type Principal struct {
	Name  string
	Roles []Role
	// Repositories limits the principal to these repositories (canonical owner/name); nil: any.
	Repositories []string
}

// Has reports whether p holds role r or a stronger one.
func (p Principal) Has(r Role) bool {
	for _, have := range p.Roles {
		if rank[have] >= rank[r] {
			return true
		}
	}
	return false
}

// Anonymous is the principal of --insecure-no-auth: every role, named so audit entries say so.
var Anonymous = Principal{Name: "anonymous (insecure-no-auth)", Roles: []Role{RoleAdmin}}

// Errors of Authenticate.
var (
	// ErrUnauthenticated: no credentials, or credentials that do not verify.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrNoRoles: the credentials verify but name a principal with no roles here.
	ErrNoRoles = errors.New("principal has no roles")
)

// IDTokenValidator verifies a Google ID token for an audience; *GoogleValidator is one.
// Tests inject a validator whose key server is on 127.0.0.1.
type IDTokenValidator interface {
	Validate(ctx context.Context, token, audience string) (*GoogleClaims, error)
}

// Authenticator verifies bearer tokens.
type Authenticator struct {
	// Insecure accepts every request as Anonymous (--insecure-no-auth).
	Insecure bool
	// Audience is the audience Google ID tokens must carry; empty disables Google tokens.
	Audience string
	// Validator verifies Google ID tokens (required when Audience is set).
	Validator IDTokenValidator
	// Log, when set, records why an ID token was refused: the client is told only that it was.
	Log *slog.Logger

	tokens     map[[32]byte]Principal
	identities map[string][]Role
}

type tokensFile struct {
	Tokens     []tokenHCL    `hcl:"token,block"`
	Identities []identityHCL `hcl:"identity,block"`
}

type tokenHCL struct {
	Name      string   `hcl:"name,label"`
	Secret    string   `hcl:"secret"`
	Principal string   `hcl:"principal,optional"`
	Roles     []string `hcl:"roles"`
}

type identityHCL struct {
	Email string   `hcl:"email,label"`
	Roles []string `hcl:"roles"`
}

// LoadTokens reads a tokens file into a:
//
//	token "ci" {
//	  secret    = "long-random-string"
//	  principal = "ci-runner"          # defaults to the label
//	  roles     = ["runner"]
//	}
//	identity "deployer@project.iam.gserviceaccount.com" {   # a Google ID token's email
//	  roles = ["runner"]
//	}
func (a *Authenticator) LoadTokens(path string) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("tokens file: %w", err)
	}
	return a.ParseTokens(path, src)
}

// ParseTokens parses tokens-file HCL; filename is used in messages.
func (a *Authenticator) ParseTokens(filename string, src []byte) error {
	f, diags := hclparse.NewParser().ParseHCL(src, filename)
	if diags.HasErrors() {
		return fmt.Errorf("tokens file: %s", diags.Error())
	}
	var tf tokensFile
	if diags := gohcl.DecodeBody(f.Body, nil, &tf); diags.HasErrors() {
		return fmt.Errorf("tokens file: %s", hcl.Diagnostics(diags).Error())
	}
	a.tokens = map[[32]byte]Principal{}
	a.identities = map[string][]Role{}
	for _, t := range tf.Tokens {
		if len(t.Secret) < 16 {
			return fmt.Errorf("tokens file %s: token %q: secret must be at least 16 characters", filename, t.Name)
		}
		roles, err := parseRoles(filename, "token "+t.Name, t.Roles)
		if err != nil {
			return err
		}
		name := t.Principal
		if name == "" {
			name = t.Name
		}
		h := sha256.Sum256([]byte(t.Secret))
		if _, dup := a.tokens[h]; dup {
			return fmt.Errorf("tokens file %s: token %q reuses another token's secret", filename, t.Name)
		}
		a.tokens[h] = Principal{Name: name, Roles: roles}
	}
	for _, id := range tf.Identities {
		roles, err := parseRoles(filename, "identity "+id.Email, id.Roles)
		if err != nil {
			return err
		}
		a.identities[strings.ToLower(id.Email)] = roles
	}
	return nil
}

func parseRoles(filename, what string, in []string) ([]Role, error) {
	var out []Role
	for _, r := range in {
		if _, ok := rank[Role(r)]; !ok {
			return nil, fmt.Errorf("tokens file %s: %s: unknown role %q (want viewer, runner or admin)", filename, what, r)
		}
		out = append(out, Role(r))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("tokens file %s: %s: roles is empty", filename, what)
	}
	return out, nil
}

// Authenticate returns the principal of a request's bearer token.
func (a *Authenticator) Authenticate(r *http.Request) (Principal, error) {
	if a.Insecure {
		return Anonymous, nil
	}
	token, ok := bearer(r)
	if !ok {
		return Principal{}, fmt.Errorf("%w: a bearer token is required", ErrUnauthenticated)
	}
	return a.Verify(r.Context(), token)
}

// Verify returns the principal of a token.
func (a *Authenticator) Verify(ctx context.Context, token string) (Principal, error) {
	h := sha256.Sum256([]byte(token))
	for k, p := range a.tokens {
		if subtle.ConstantTimeCompare(k[:], h[:]) == 1 {
			return p, nil
		}
	}
	if a.Audience == "" || a.Validator == nil || strings.Count(token, ".") != 2 {
		return Principal{}, fmt.Errorf("%w: unknown token", ErrUnauthenticated)
	}
	claims, err := a.Validator.Validate(ctx, token, a.Audience)
	if err != nil {
		// The reason may quote the key server's answer or the audience, which are nobody's
		// business but the operator's.
		if a.Log != nil {
			a.Log.Info("ID token refused", "reason", textfit.Excerpt([]byte(err.Error()), 512))
		}
		return Principal{}, fmt.Errorf("%w: the ID token is not valid", ErrUnauthenticated)
	}
	if claims.Issuer != "accounts.google.com" && claims.Issuer != "https://accounts.google.com" {
		return Principal{}, fmt.Errorf("%w: ID token issuer %q is not Google", ErrUnauthenticated, claims.Issuer)
	}
	email, verified := claims.Email, claims.EmailVerified
	if email == "" || !verified {
		return Principal{}, fmt.Errorf("%w: ID token has no verified email", ErrUnauthenticated)
	}
	roles := a.identities[strings.ToLower(email)]
	if len(roles) == 0 {
		return Principal{Name: email}, fmt.Errorf("%w: %s is not listed in the tokens file", ErrNoRoles, email)
	}
	return Principal{Name: email, Roles: slices.Clone(roles)}, nil
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	return strings.TrimSpace(h[len(prefix):]), true
}

type ctxKey struct{}

// With returns ctx carrying p.
func With(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// From returns the principal in ctx.
func From(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(ctxKey{}).(Principal)
	return p, ok
}
