package auth

import (
	"context"
	"slices"
	"strings"
	"testing"
)

func TestParseTokensRepositories(t *testing.T) {
	a := &Authenticator{Audience: testAudience}
	err := a.ParseTokens("t.hcl", []byte(`
token "ci" {
  secret       = "a-long-enough-secret"
  roles        = ["runner"]
  repositories = ["Acme/Infra", "acme/other", "ACME/infra"]
}
token "any" {
  secret = "another-long-secret"
  roles  = ["viewer"]
}
token "null" {
  secret       = "a-third-long-secret"
  roles        = ["viewer"]
  repositories = null
}
identity "Deployer@proj.example" {
  roles        = ["runner"]
  repositories = ["acme/infra"]
}
github "acme/infra" {
  roles = ["runner"]
}
github "Acme/Other" {
  roles = ["viewer"]
}
`))
	if err != nil {
		t.Fatal(err)
	}
	for secret, want := range map[string][]string{
		"a-long-enough-secret": {"acme/infra", "acme/other"},
		"another-long-secret":  nil,
		"a-third-long-secret":  nil,
	} {
		p, err := a.Verify(context.Background(), secret)
		if err != nil || !slices.Equal(p.Repositories, want) || (want == nil) != (p.Repositories == nil) {
			t.Fatalf("token %s: principal %+v, err %v; want repositories %q", secret, p, err, want)
		}
	}
	p, _ := a.Verify(context.Background(), "a-long-enough-secret")
	if !p.AllowsRepo("ACME/OTHER") || p.AllowsRepo("acme/third") || p.AllowsRepo("not a repo") {
		t.Fatalf("AllowsRepo wrong for %v", p.Repositories)
	}
	// Only ASCII case differs: Unicode folds the Kelvin sign to k and the long s to s.
	kits := Principal{Repositories: []string{"acme/kits"}}
	if !kits.AllowsRepo("ACME/Kits") || kits.AllowsRepo("acme/\u212Aits") || kits.AllowsRepo("acme/kit\u017F") {
		t.Fatal("AllowsRepo compares beyond ASCII case")
	}
	if any, _ := a.Verify(context.Background(), "another-long-secret"); !any.AllowsRepo("whoever/whatever") {
		t.Fatal("a principal without repositories is limited")
	}
	a.Validator = fakeValidator{GoogleClaims{Email: "deployer@proj.example", EmailVerified: true, Issuer: googleIssuer}}
	if p, err := a.Verify(context.Background(), "h.p.s"); err != nil || !slices.Equal(p.Repositories, []string{"acme/infra"}) {
		t.Fatalf("identity: principal %+v, err %v", p, err)
	}
	if got := a.GitHubRepositories(); !slices.Equal(got, []string{"acme/infra", "acme/other"}) {
		t.Fatalf("GitHubRepositories %q", got)
	}
}

func TestParseTokensRefusesBadRepositories(t *testing.T) {
	for name, tc := range map[string]struct{ src, want string }{
		"token, not owner/name": {`token "ci" {
  secret = "a-long-enough-secret"
  roles = ["runner"]
  repositories = ["acme/infra", "acme"]
}`, `token ci: repository "acme"`},
		"token, empty list": {`token "ci" {
  secret = "a-long-enough-secret"
  roles = ["runner"]
  repositories = []
}`, "token ci: repositories is empty"},
		"identity, a URL": {`identity "a@b.c" {
  roles = ["runner"]
  repositories = ["https://github.com/acme/infra"]
}`, `identity a@b.c: repository "https://github.com/acme/infra"`},
		"identity, not a string": {`identity "a@b.c" {
  roles = ["runner"]
  repositories = [["acme/infra"]]
}`, "string required"},
		"github, bad label": {`github "acme/in fra" {
  roles = ["runner"]
}`, `github: repository "acme/in fra"`},
		"github, twice": {`github "acme/infra" {
  roles = ["runner"]
}
github "ACME/Infra" {
  roles = ["viewer"]
}`, `github "acme/infra" is defined twice`},
		"github, no roles": {`github "acme/infra" {
  roles = []
}`, "github acme/infra: roles is empty"},
		"github, unknown role": {`github "acme/infra" {
  roles = ["owner"]
}`, `github acme/infra: unknown role "owner"`},
		"github, repositories": {`github "acme/infra" {
  roles = ["runner"]
  repositories = ["acme/infra"]
}`, "repositories"},
		"github, admin": {`github "acme/infra" {
  roles = ["runner", "admin"]
}`, "github acme/infra: a GitHub Actions job may not be admin"},
		"github, no label": {`github {
  roles = ["runner"]
}`, "github"},
	} {
		t.Run(name, func(t *testing.T) {
			err := (&Authenticator{}).ParseTokens("t.hcl", []byte(tc.src))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "t.hcl") {
				t.Fatalf("err %v, want one naming t.hcl and %q", err, tc.want)
			}
		})
	}
}
