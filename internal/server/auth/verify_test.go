package auth

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

const githubTokens = `
github "Acme/Infra" {
  roles = ["runner"]
}
github "acme/viewers-only" {
  roles = ["viewer"]
}
identity "deployer@proj.example" {
  roles = ["runner"]
}
`

// githubAuthenticator trusts the repositories of githubTokens on a loopback issuer, and a
// Google validator that accepts every token as deployer@proj.example.
func githubAuthenticator(t *testing.T) (*Authenticator, *testkit.OIDCIssuer, *bytes.Buffer) {
	t.Helper()
	iss := testkit.NewOIDCIssuer(t)
	var log bytes.Buffer
	a := &Authenticator{Audience: testAudience, GitHub: githubValidator(t, iss),
		Validator: fakeValidator{GoogleClaims{Email: "deployer@proj.example", EmailVerified: true, Issuer: googleIssuer}},
		Log:       slog.New(slog.NewTextHandler(&log, nil))}
	if err := a.ParseTokens("t.hcl", []byte(githubTokens)); err != nil {
		t.Fatal(err)
	}
	return a, iss, &log
}

func TestAuthenticatorGitHub(t *testing.T) {
	a, iss, _ := githubAuthenticator(t)
	for _, repo := range []string{"acme/infra", "ACME/INFRA", "Acme/Infra"} {
		c := iss.GitHubClaims(testAudience, repo)
		p, err := a.Verify(context.Background(), iss.Mint(t, c))
		if err != nil {
			t.Fatalf("%s: %v", repo, err)
		}
		if p.Name != "github:acme/infra:run:4242" || !p.Has(RoleRunner) || p.Has(RoleAdmin) ||
			len(p.Repositories) != 1 || p.Repositories[0] != "acme/infra" || p.GitHub == nil || p.GitHub.Repository != repo || p.GitHub.RunID != "4242" {
			t.Fatalf("%s: principal %+v (claims %+v)", repo, p, p.GitHub)
		}
		if !p.AllowsRepo("acme/infra") || !p.AllowsRepo("ACME/Infra") || p.AllowsRepo("acme/other") || p.AllowsRepo("acme/\u212Anfra") {
			t.Fatalf("%s: AllowsRepo wrong for %v", repo, p.Repositories)
		}
	}
	// Every job and attempt of a run is one principal; another run is another.
	name := func(mutate func(map[string]any)) string {
		p, err := a.Verify(context.Background(), mintWith(t, iss, mutate))
		if err != nil {
			t.Fatal(err)
		}
		return p.Name
	}
	if n := name(func(c map[string]any) {
		c["run_attempt"], c["job_workflow_ref"] = "2", "acme/infra/.github/workflows/apply.yml@refs/heads/main"
	}); n != "github:acme/infra:run:4242" {
		t.Fatalf("another attempt and job of the run: %s", n)
	}
	if n := name(func(c map[string]any) { c["run_id"] = "4243" }); n != "github:acme/infra:run:4243" {
		t.Fatalf("another run: %s", n)
	}
	p, err := a.Verify(context.Background(), iss.Mint(t, iss.GitHubClaims(testAudience, "acme/viewers-only")))
	if err != nil || !p.Has(RoleViewer) || p.Has(RoleRunner) {
		t.Fatalf("viewer repository: %+v %v", p, err)
	}
}

func TestAuthenticatorGitHubUnlistedRepository(t *testing.T) {
	a, iss, _ := githubAuthenticator(t)
	for _, repo := range []string{"acme/other", "evil/infra", "acme/infra-x"} {
		p, err := a.Verify(context.Background(), iss.Mint(t, iss.GitHubClaims(testAudience, repo)))
		if !errors.Is(err, ErrNoRoles) || len(p.Roles) != 0 || !strings.Contains(err.Error(), strings.ToLower(repo)) {
			t.Fatalf("%s: principal %+v, err %v; want ErrNoRoles naming it", repo, p, err)
		}
	}
}

// A token that claims the GitHub issuer is checked by the GitHub validator alone, and its
// refusal tells the client nothing more than a Google token's would.
func TestAuthenticatorGitHubRefusal(t *testing.T) {
	a, iss, log := githubAuthenticator(t)
	for name, tok := range map[string]string{
		"wrong audience":   mintWith(t, iss, func(c map[string]any) { c["aud"] = "https://other" }),
		"forged signature": testkit.SignRS256(t, newRSAKey(t), "k", iss.GitHubClaims(testAudience, "acme/infra")),
		"expired":          mintWith(t, iss, func(c map[string]any) { c["exp"] = time.Now().Unix() - 60 }),
	} {
		log.Reset()
		p, err := a.Verify(context.Background(), tok)
		if !errors.Is(err, ErrUnauthenticated) || err.Error() != "unauthenticated: the ID token is not valid" || p.Name != "" {
			t.Fatalf("%s: principal %+v, err %v; want only that the ID token is not valid", name, p, err)
		}
		if !strings.Contains(log.String(), "ID token refused") {
			t.Fatalf("%s: the log lacks the reason: %s", name, log)
		}
	}
}

// Only the exact issuer routes a token to the GitHub validator; anything else goes to Google's.
func TestAuthenticatorChoosesTheValidatorByIssuer(t *testing.T) {
	a, iss, _ := githubAuthenticator(t)
	for _, other := range []string{"https://accounts.google.com", iss.URL + "/", iss.URL + ".evil.example", strings.ToUpper(iss.URL), ""} {
		p, err := a.Verify(context.Background(), mintWith(t, iss, func(c map[string]any) { c["iss"] = other }))
		if err != nil || p.Name != "deployer@proj.example" || p.GitHub != nil {
			t.Fatalf("iss %q: principal %+v, err %v; want the Google validator's", other, p, err)
		}
	}
	// Without a GitHub validator, or without an audience, a GitHub token is not one.
	a.GitHub = nil
	if p, err := a.Verify(context.Background(), mintWith(t, iss, func(map[string]any) {})); err != nil || p.GitHub != nil {
		t.Fatalf("no GitHub validator: principal %+v, err %v; want the Google validator's", p, err)
	}
	a, _, _ = githubAuthenticator(t)
	a.Audience = ""
	if _, err := a.Verify(context.Background(), mintWith(t, iss, func(map[string]any) {})); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("no audience: err %v", err)
	}
}

func TestPrincipalDescribe(t *testing.T) {
	a, iss, _ := githubAuthenticator(t)
	p, err := a.Verify(context.Background(), mintWith(t, iss, func(c map[string]any) {
		c["ref"], c["event_name"], c["environment"] = "refs/pull/7/merge", "pull_request", ""
		c["workflow_ref"] = "acme/infra/.github/workflows/plan.yml@refs/pull/7/merge"
		c["job_workflow_ref"] = c["workflow_ref"]
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := "repository=acme/infra ref=refs/pull/7/merge event=pull_request workflow=acme/infra/.github/workflows/plan.yml@refs/pull/7/merge environment= run=4242/1 sha=0123456789abcdef0123456789abcdef01234567 actor=alice"
	if got := p.Describe(); got != want {
		t.Fatalf("Describe\n%s\nwant\n%s", got, want)
	}
	// A reusable workflow's job names it; hostile values stay on one bounded line.
	p.GitHub.JobWorkflowRef = "acme/shared/.github/workflows/tf.yml@v1"
	p.GitHub.Actor = "mallory\n2024-01-01 audit forged=yes\x00\x1b[31m\xff"
	p.GitHub.Environment = strings.Repeat("é", 1000)
	p.GitHub.SHA = "abc\u202eevil\u2066x\u2069"
	got := p.Describe()
	if !strings.Contains(got, " sha=abc?evil?x? ") {
		t.Fatalf("bidirectional overrides in the sha not replaced: %q", got)
	}
	if !strings.Contains(got, " job_workflow=acme/shared/.github/workflows/tf.yml@v1 ") {
		t.Fatalf("Describe lacks the job's workflow: %s", got)
	}
	if !strings.Contains(got, "actor=mallory?2024-01-01?audit?forged=yes??[31m?") {
		t.Fatalf("actor not sanitized: %q", got)
	}
	if strings.ContainsFunc(got, func(r rune) bool { return r < 0x20 || r == 0x7f || r == utf8.RuneError }) || !utf8.ValidString(got) {
		t.Fatalf("Describe holds control characters or invalid UTF-8: %q", got)
	}
	if env := strings.Fields(got)[5]; len(env) > len("environment=")+maxDescribeValue+len("…") {
		t.Fatalf("environment not bounded: %d bytes", len(env))
	}
	for _, other := range []Principal{{Name: "ci", Roles: []Role{RoleRunner}}, Anonymous} {
		if d := other.Describe(); d != "" {
			t.Fatalf("Describe of %s: %q", other.Name, d)
		}
	}
}
