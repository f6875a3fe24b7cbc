package auth

import "testing"

// A GitHub Actions job's quotas are its repository's, whatever its run; anyone else's are its
// own.
func TestQuotaKey(t *testing.T) {
	run := func(id string) Principal {
		return Principal{Name: GitHubPrincipalPrefix + "acme/infra:run:" + id, Repositories: []string{"acme/infra"}, GitHub: &GitHubClaims{RunID: id}}
	}
	if a, b := run("1").QuotaKey(), run("2").QuotaKey(); a != b || a != "github:acme/infra" {
		t.Fatalf("two runs of one repository: %q and %q", a, b)
	}
	if k := (Principal{Name: "ci", Repositories: []string{"acme/infra"}}).QuotaKey(); k != "ci" {
		t.Fatalf("a static token's principal: %q", k)
	}
}
