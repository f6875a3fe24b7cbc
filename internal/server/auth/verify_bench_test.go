package auth

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

// BenchmarkVerify is the cost of Authenticator.Verify per kind of token, keys cached: a static
// token, a GitHub token sent again (remembered), and GitHub tokens each new to the server
// (from a pool larger than it remembers, so each one's signature is checked).
func BenchmarkVerify(b *testing.B) {
	iss := testkit.NewOIDCIssuer(b)
	a := &Authenticator{Audience: testAudience}
	if err := a.ParseTokens("t.hcl", []byte("token \"ci\" {\n secret = \"a-long-enough-secret\"\n roles = [\"runner\"]\n}\ngithub \"acme/infra\" {\n roles = [\"runner\"]\n}\n")); err != nil {
		b.Fatal(err)
	}
	v, err := NewGitHubValidator(context.Background(), GitHubValidatorOptions{Issuer: iss.URL})
	if err != nil {
		b.Fatal(err)
	}
	a.GitHub = v
	pool := make([]string, 2*maxVerifiedTokens)
	for i := range pool {
		c := iss.GitHubClaims(testAudience, "acme/infra")
		c["exp"], c["jti"] = time.Now().Add(time.Hour).Unix(), fmt.Sprint(i)
		pool[i] = iss.Mint(b, c)
	}
	for _, tc := range []struct {
		name string
		toks []string
	}{{"static", []string{"a-long-enough-secret"}}, {"github-remembered", pool[:1]}, {"github-new", pool}} {
		b.Run(tc.name, func(b *testing.B) {
			if _, err := a.Verify(context.Background(), tc.toks[0]); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := a.Verify(context.Background(), tc.toks[i%len(tc.toks)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
