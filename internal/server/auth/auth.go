// Package auth authenticates control-plane requests: static bearer tokens from a tokens file
// (for local use), Google ID tokens and GitHub Actions ID tokens verified by audience. Each
// token maps to a principal with roles, which decide which endpoints it may call, and
// optionally repositories, which limit what it may touch.
package auth

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/tfstackplan/tfstackplan/events"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

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
	// GitHub is set for a GitHub Actions job: its verified claims.
	GitHub *GitHubClaims
	// Expires is when the credentials end: an ID token's exp; zero for a static token.
	Expires time.Time `json:",omitzero"`
}

// QuotaKey is the name the server's quotas count p under: for a GitHub Actions job, its
// repository (every run of it together: each run is a principal of its own, and a repository
// would otherwise have each quota once per run it starts); for anyone else, its name.
func (p Principal) QuotaKey() string {
	if p.GitHub != nil && len(p.Repositories) == 1 {
		return GitHubPrincipalPrefix + p.Repositories[0]
	}
	return p.Name
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

// AllowsRepo reports whether p may act on repository repo (owner/name, in any case): always
// when p has no repository limit, else only for a valid name among p's repositories.
func (p Principal) AllowsRepo(repo string) bool {
	if p.Repositories == nil {
		return true
	}
	canon, err := events.CanonicalRepo(repo)
	return err == nil && slices.Contains(p.Repositories, canon)
}

// maxDescribeValue bounds each value of Describe, which so stays under about 1.5 KiB.
const maxDescribeValue = 128

// Describe renders the verified claims of a GitHub Actions principal on one line for the audit
// log, e.g. "repository=acme/infra ref=refs/pull/7/merge event=pull_request
// workflow=acme/infra/.github/workflows/plan.yml@refs/pull/7/merge environment= run=123/1
// sha=abc actor=alice" (job_workflow= follows workflow= when the job's workflow differs). Each
// value is cut to 128 bytes, with white space, control and format characters (U+202E and the
// other bidirectional overrides among them) and invalid UTF-8 replaced by "?".
// It is "" for any other principal.
func (p Principal) Describe() string {
	g := p.GitHub
	if g == nil {
		return ""
	}
	var b strings.Builder
	field := func(key, value string) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(key)
		b.WriteByte('=')
		b.WriteString(describeValue(value))
	}
	field("repository", g.Repository)
	field("ref", g.Ref)
	field("event", g.EventName)
	field("workflow", g.WorkflowRef)
	if g.JobWorkflowRef != g.WorkflowRef {
		field("job_workflow", g.JobWorkflowRef)
	}
	field("environment", g.Environment)
	run := g.RunID
	if g.RunAttempt != "" {
		run += "/" + g.RunAttempt
	}
	field("run", run)
	field("sha", g.SHA)
	field("actor", g.Actor)
	return b.String()
}

// describeValue is v fitted for Describe: one space-free token of at most maxDescribeValue
// bytes plus "…". strings.Map hands each invalid byte over as utf8.RuneError.
func describeValue(v string) string {
	v = strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == utf8.RuneError {
			return '?'
		}
		return r
	}, v)
	if len(v) > maxDescribeValue {
		return textfit.Prefix(v, maxDescribeValue) + "…"
	}
	return v
}

// GitHubPrincipalPrefix starts the name of every GitHub Actions job's principal,
// "github:owner/name:run:ID"; no other principal's name starts so.
const GitHubPrincipalPrefix = "github:"

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

// GitHubTokenValidator verifies a GitHub Actions ID token for an audience; *GitHubValidator is
// one.
type GitHubTokenValidator interface {
	// Issuer is the iss of the tokens it accepts: Verify hands it only tokens claiming it.
	Issuer() string
	Validate(ctx context.Context, token, audience string) (*GitHubClaims, error)
}

// Authenticator verifies bearer tokens.
type Authenticator struct {
	// Insecure accepts every request as Anonymous (--insecure-no-auth).
	Insecure bool
	// Audience is the audience Google and GitHub ID tokens must carry; empty disables both.
	Audience string
	// Validator verifies Google ID tokens (required when Audience is set).
	Validator IDTokenValidator
	// GitHub, when set (and Audience too), verifies GitHub Actions ID tokens.
	GitHub GitHubTokenValidator
	// Log, when set, records why an ID token was refused: the client is told only that it was.
	Log *slog.Logger

	// file is the tokens file last parsed, replaced whole by ParseTokens, so that sessions and
	// streams checking their principal meanwhile read one file or the other.
	file atomic.Pointer[tokenSet]
}

// tokenSet is what a tokens file says.
type tokenSet struct {
	tokens     map[[32]byte]Principal
	identities map[string]Principal // by lowercased email, without Name
	repos      map[string][]Role    // the roles of GitHub Actions jobs, by canonical repository
	repoIDs    map[string]githubIDs // the GitHub IDs a github block pins, by canonical repository
}

// githubIDs are the stable IDs a github block requires of its repository's ID tokens (""
// : not pinned).
type githubIDs struct{ repository, owner string }

// check says why claims do not come from the repository and owner ids pins ("" when they do).
func (ids githubIDs) check(c *GitHubClaims) string {
	switch {
	case ids.repository != "" && c.RepositoryID != ids.repository:
		return fmt.Sprintf("its repository_id %q is not the %q the tokens file gives %s (a repository deleted and created again under its name?)",
			clip(c.RepositoryID), ids.repository, c.Repository)
	case ids.owner != "" && c.RepositoryOwnerID != ids.owner:
		return fmt.Sprintf("its repository_owner_id %q is not the %q the tokens file gives %s", clip(c.RepositoryOwnerID), ids.owner, c.Repository)
	}
	return ""
}

// set is the tokens file in force (an empty one before any was parsed).
func (a *Authenticator) set() *tokenSet {
	if ts := a.file.Load(); ts != nil {
		return ts
	}
	return &tokenSet{}
}

type tokensFile struct {
	Tokens     []tokenHCL    `hcl:"token,block"`
	Identities []identityHCL `hcl:"identity,block"`
	GitHub     []githubHCL   `hcl:"github,block"`
}

type tokenHCL struct {
	Name         string    `hcl:"name,label"`
	Secret       string    `hcl:"secret"`
	Principal    string    `hcl:"principal,optional"`
	Roles        []string  `hcl:"roles"`
	Repositories *[]string `hcl:"repositories,optional"`
}

type identityHCL struct {
	Email        string    `hcl:"email,label"`
	Roles        []string  `hcl:"roles"`
	Repositories *[]string `hcl:"repositories,optional"`
}

type githubHCL struct {
	Repository        string   `hcl:"repository,label"`
	Roles             []string `hcl:"roles"`
	RepositoryID      string   `hcl:"repository_id,optional"`
	RepositoryOwnerID string   `hcl:"repository_owner_id,optional"`
}

// LoadTokens reads a tokens file into a:
//
//	token "ci" {
//	  secret    = "long-random-string"
//	  principal = "ci-runner"          # defaults to the label
//	  roles     = ["runner"]
//	}
//	identity "deployer@project.iam.gserviceaccount.com" {   # a Google ID token's email
//	  roles        = ["runner"]
//	  repositories = ["acme/infra"]  # optional, on a token too; absent: every repository
//	}
//	github "acme/infra" {            # GitHub Actions ID tokens of this repository's workflows
//	  roles               = ["runner"]
//	  repository_id       = "123456" # recommended: only ID tokens of this very repository
//	  repository_owner_id = "654321" # (not of one deleted and created again under its name)
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
	a2 := &tokenSet{tokens: map[[32]byte]Principal{}, identities: map[string]Principal{}, repos: map[string][]Role{}, repoIDs: map[string]githubIDs{}}
	for _, t := range tf.Tokens {
		if len(t.Secret) < 16 {
			return fmt.Errorf("tokens file %s: token %q: secret must be at least 16 characters", filename, t.Name)
		}
		roles, err := parseRoles(filename, "token "+t.Name, t.Roles)
		if err != nil {
			return err
		}
		repos, err := parseRepos(filename, "token "+t.Name, t.Repositories)
		if err != nil {
			return err
		}
		name := t.Principal
		if name == "" {
			name = t.Name
		}
		if strings.HasPrefix(name, GitHubPrincipalPrefix) {
			// The server reads that prefix as a GitHub Actions job's, whose runs of one
			// repository share the claims of a pull request.
			return fmt.Errorf("tokens file %s: token %q: principal %q starts with %q, which names GitHub Actions jobs", filename, t.Name, name, GitHubPrincipalPrefix)
		}
		h := sha256.Sum256([]byte(t.Secret))
		if _, dup := a2.tokens[h]; dup {
			return fmt.Errorf("tokens file %s: token %q reuses another token's secret", filename, t.Name)
		}
		a2.tokens[h] = Principal{Name: name, Roles: roles, Repositories: repos}
	}
	for _, id := range tf.Identities {
		roles, err := parseRoles(filename, "identity "+id.Email, id.Roles)
		if err != nil {
			return err
		}
		repos, err := parseRepos(filename, "identity "+id.Email, id.Repositories)
		if err != nil {
			return err
		}
		a2.identities[strings.ToLower(id.Email)] = Principal{Roles: roles, Repositories: repos}
	}
	for _, g := range tf.GitHub {
		repo, err := events.CanonicalRepo(g.Repository)
		if err != nil {
			return fmt.Errorf("tokens file %s: github: %w", filename, err)
		}
		if _, dup := a2.repos[repo]; dup {
			return fmt.Errorf("tokens file %s: github %q is defined twice", filename, repo)
		}
		if a2.repos[repo], err = parseRoles(filename, "github "+repo, g.Roles); err != nil {
			return err
		}
		for _, id := range []struct{ name, value string }{{"repository_id", g.RepositoryID}, {"repository_owner_id", g.RepositoryOwnerID}} {
			if id.value != "" && !allDigits(id.value) {
				return fmt.Errorf("tokens file %s: github %s: %s %q is not a number (GitHub's ID of the repository, or of its owner)", filename, repo, id.name, id.value)
			}
		}
		a2.repoIDs[repo] = githubIDs{repository: g.RepositoryID, owner: g.RepositoryOwnerID}
		// Every workflow of the repository, a pull request's own (editable) one included, runs
		// as such a principal: admin would let any of them approve its own plan.
		if slices.Contains(a2.repos[repo], RoleAdmin) {
			return fmt.Errorf("tokens file %s: github %s: a GitHub Actions job may not be admin (any workflow of the repository, a pull request's included, could approve its own plan): give runner or viewer", filename, repo)
		}
	}
	a.file.Store(a2)
	return nil
}

// GitHubRepositories returns the repositories of the tokens file's github blocks, sorted.
func (a *Authenticator) GitHubRepositories() []string {
	return slices.Sorted(maps.Keys(a.set().repos))
}

// parseRepos returns the canonical names of a repositories attribute: nil when it is absent
// (or null), an error when it is empty or holds a name that is not owner/name.
func parseRepos(filename, what string, in *[]string) ([]string, error) {
	if in == nil || *in == nil {
		return nil, nil
	}
	if len(*in) == 0 {
		return nil, fmt.Errorf("tokens file %s: %s: repositories is empty (leave it out to allow every repository)", filename, what)
	}
	out := make([]string, 0, len(*in))
	for _, r := range *in {
		canon, err := events.CanonicalRepo(r)
		if err != nil {
			return nil, fmt.Errorf("tokens file %s: %s: %w", filename, what, err)
		}
		if !slices.Contains(out, canon) {
			out = append(out, canon)
		}
	}
	return out, nil
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

// Verify returns the principal of a token: a static token's, else, for a JWT, a GitHub
// Actions job's when its iss is the GitHub validator's issuer, else a Google identity's.
func (a *Authenticator) Verify(ctx context.Context, token string) (Principal, error) {
	h := sha256.Sum256([]byte(token))
	for k, p := range a.set().tokens {
		if subtle.ConstantTimeCompare(k[:], h[:]) == 1 {
			return p, nil
		}
	}
	if a.Audience == "" || strings.Count(token, ".") != 2 {
		return Principal{}, fmt.Errorf("%w: unknown token", ErrUnauthenticated)
	}
	if a.GitHub != nil && unverifiedIssuer(token) == a.GitHub.Issuer() {
		return a.verifyGitHub(ctx, token)
	}
	if a.Validator == nil {
		return Principal{}, fmt.Errorf("%w: unknown token", ErrUnauthenticated)
	}
	claims, err := a.Validator.Validate(ctx, token, a.Audience)
	if err != nil {
		return Principal{}, a.refused(err)
	}
	if claims.Issuer != "accounts.google.com" && claims.Issuer != "https://accounts.google.com" {
		return Principal{}, fmt.Errorf("%w: ID token issuer %q is not Google", ErrUnauthenticated, claims.Issuer)
	}
	email, verified := claims.Email, claims.EmailVerified
	if email == "" || !verified {
		return Principal{}, fmt.Errorf("%w: ID token has no verified email", ErrUnauthenticated)
	}
	id, ok := a.set().identities[strings.ToLower(email)]
	if !ok {
		return Principal{Name: email}, fmt.Errorf("%w: %s is not listed in the tokens file", ErrNoRoles, email)
	}
	return Principal{Name: email, Roles: slices.Clone(id.Roles), Repositories: slices.Clone(id.Repositories), Expires: claims.Expires}, nil
}

// TokenMAC binds a session to the static token that opened it: a MAC of the token's hash keyed
// by key (the session's id, which the store does not keep), so that what is stored with the
// session tells nothing of the token without the id. It is "" for a token that is not a static
// token of the tokens file.
func (a *Authenticator) TokenMAC(token, key string) string {
	h := sha256.Sum256([]byte(token))
	if _, ok := a.set().tokens[h]; !ok {
		return ""
	}
	return tokenMAC(h, key)
}

func tokenMAC(h [32]byte, key string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write(h[:])
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// ErrRevoked: the credentials that opened a session no longer give its principal: the token
// left the tokens file (or its secret changed), the identity or repository is no longer
// listed, the principal's name changed, or the ID token expired.
var ErrRevoked = fmt.Errorf("%w: the credentials that signed in are no longer accepted", ErrUnauthenticated)

// Current returns principal p of a session as the tokens file now has it, with its roles and
// repositories as they are now: the static token that tokenMAC (TokenMAC of it keyed by key)
// names, the Google identity of p's email, or the github block of p's repository. A principal
// whose credentials the file no longer holds, or whose ID token expired at now, is ErrRevoked.
// Under Insecure, everyone is Anonymous.
func (a *Authenticator) Current(p Principal, key, mac string, now time.Time) (Principal, error) {
	if a.Insecure {
		return Anonymous, nil
	}
	f := a.set()
	if !p.Expires.IsZero() && !now.Before(p.Expires) {
		return Principal{}, ErrRevoked
	}
	switch {
	case p.GitHub != nil:
		repo, err := events.CanonicalRepo(p.GitHub.Repository)
		roles := f.repos[repo]
		if err != nil || len(roles) == 0 || f.repoIDs[repo].check(p.GitHub) != "" {
			return Principal{}, ErrRevoked
		}
		p.Roles, p.Repositories = slices.Clone(roles), []string{repo}
		return p, nil
	case mac != "":
		for h, cur := range f.tokens {
			if hmac.Equal([]byte(tokenMAC(h, key)), []byte(mac)) {
				if cur.Name != p.Name {
					return Principal{}, ErrRevoked
				}
				p.Roles, p.Repositories = slices.Clone(cur.Roles), slices.Clone(cur.Repositories)
				return p, nil
			}
		}
		return Principal{}, ErrRevoked
	}
	id, ok := f.identities[strings.ToLower(p.Name)]
	if !ok || p.Expires.IsZero() {
		// A session of a static token opened before sessions named their token ends too.
		return Principal{}, ErrRevoked
	}
	p.Roles, p.Repositories = slices.Clone(id.Roles), slices.Clone(id.Repositories)
	return p, nil
}

// verifyGitHub returns the principal of a GitHub Actions ID token: named after the repository
// and the workflow run, so that every job and attempt of a run acts as one principal (a run's
// jobs may write the executions the run announced) and another run of the same repository
// does not.
func (a *Authenticator) verifyGitHub(ctx context.Context, token string) (Principal, error) {
	claims, err := a.GitHub.Validate(ctx, token, a.Audience)
	if err != nil {
		return Principal{}, a.refused(err)
	}
	repo, err := events.CanonicalRepo(claims.Repository)
	if err != nil {
		return Principal{}, a.refused(err)
	}
	name := GitHubPrincipalPrefix + repo + ":run:" + claims.RunID
	set := a.set()
	roles := set.repos[repo]
	if len(roles) == 0 {
		return Principal{Name: name}, fmt.Errorf("%w: repository %s is not listed in the tokens file", ErrNoRoles, repo)
	}
	if why := set.repoIDs[repo].check(claims); why != "" {
		return Principal{}, a.refused(errors.New(why))
	}
	return Principal{Name: name, Roles: slices.Clone(roles), Repositories: []string{repo}, GitHub: claims, Expires: claims.Expires}, nil
}

// refused logs why an ID token was refused and returns the error the client gets: the reason
// may quote the key server's answer or the audience, which are nobody's business but the
// operator's.
func (a *Authenticator) refused(reason error) error {
	if a.Log != nil {
		a.Log.Info("ID token refused", "reason", textfit.Excerpt([]byte(reason.Error()), 512))
	}
	return fmt.Errorf("%w: the ID token is not valid", ErrUnauthenticated)
}

// unverifiedIssuer is the iss claim of a JWT's payload, read without checking anything: only to
// choose the validator that then checks the whole token ("" when unreadable).
func unverifiedIssuer(token string) string {
	_, rest, _ := strings.Cut(token, ".")
	payload, _, _ := strings.Cut(rest, ".")
	b, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return ""
	}
	var c struct {
		Iss string `json:"iss"`
	}
	if json.Unmarshal(b, &c) != nil {
		return ""
	}
	return c.Iss
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
