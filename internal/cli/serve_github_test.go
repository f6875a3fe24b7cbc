package cli

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

const serveGitHubTokens = `
github "Acme/Infra" {
  roles = ["runner"]
}
`

const serveGitHubAudience = "https://tfstackplan.example.com"

func TestServeGitHubFlags(t *testing.T) {
	github := writeTokensFile(t, serveGitHubTokens)
	static := writeServeTokens(t)
	for _, tc := range []struct {
		name string
		opts ServeOptions
		want string
	}{
		{"github blocks without --audience", ServeOptions{Tokens: github}, "--audience"},
		{"--github-issuer without --audience", ServeOptions{Tokens: static, GitHubIssuer: "https://ghes.example/_services/token"}, "--audience"},
		{"http issuer elsewhere", ServeOptions{Tokens: github, Audience: serveGitHubAudience, GitHubIssuer: "http://ghes.example"}, `"http://ghes.example"`},
		{"not a URL", ServeOptions{Tokens: github, Audience: serveGitHubAudience, GitHubIssuer: "ghes.example"}, `"ghes.example"`},
		{"bad repository", ServeOptions{Tokens: writeTokensFile(t, "github \"acme\" {\n roles = [\"runner\"]\n}\n"), Audience: serveGitHubAudience}, `repository "acme"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.IO = &IO{Out: io.Discard, ErrOut: io.Discard}
			tc.opts.Listen = "127.0.0.1:0"
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := runServe(ctx, &tc.opts)
			var ue *UsageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want a usage error mentioning %s", err, tc.want)
			}
		})
	}
	// The flag is in the command's help.
	var help strings.Builder
	cmd := newServeCmd(&IO{Out: &help, ErrOut: &help}, nil)
	cmd.SetOut(&help)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil || !strings.Contains(help.String(), "--github-issuer") {
		t.Fatalf("help (err %v) lacks --github-issuer:\n%s", err, help.String())
	}
}

// serveInProcess runs serve with opts (SQLite in a temporary directory unless opts.DB says
// otherwise) until the test ends and returns its base URL.
func serveInProcess(t *testing.T, opts *ServeOptions) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	opts.Listen = "127.0.0.1:0"
	if opts.DB == "" {
		opts.DB = "sqlite:" + filepath.Join(t.TempDir(), "s.db")
	}
	opts.RateLimit, opts.ShutdownTimeout = 1000, time.Minute
	opts.Ready = func(a string) { addr <- a }
	if opts.IO == nil {
		opts.IO = &IO{Out: io.Discard, ErrOut: io.Discard}
	}
	go func() { done <- runServe(ctx, opts) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case a := <-addr:
		return "http://" + a
	case err := <-done:
		t.Fatalf("serve ended early: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not start")
	}
	return ""
}

// getAs is the status and body of GET base+path with token.
func getAs(t *testing.T, base, path, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", base+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestServeGitHubTokens(t *testing.T) {
	t.Setenv("GCE_METADATA_HOST", "127.0.0.1:1")
	t.Setenv("GCE_METADATA_IP", "127.0.0.1:1")
	iss := testkit.NewOIDCIssuer(t)
	var log testkit.SyncBuffer
	base := serveInProcess(t, &ServeOptions{IO: &IO{Out: io.Discard, ErrOut: &log},
		Tokens: writeTokensFile(t, serveGitHubTokens), Audience: serveGitHubAudience, GitHubIssuer: iss.URL})
	if n := iss.Discoveries.Load(); n != 0 {
		t.Fatalf("serve made %d discovery requests before any token", n)
	}
	for _, tc := range []struct {
		name   string
		claims func(map[string]any)
		status int
		body   string
	}{
		{"listed repository", func(map[string]any) {}, 200, ""},
		{"listed repository, other case", func(c map[string]any) { c["repository"], c["repository_owner"] = "ACME/infra", "ACME" }, 200, ""},
		{"unlisted repository", func(c map[string]any) { c["repository"] = "acme/other" }, 403, "acme/other"},
		{"wrong audience", func(c map[string]any) { c["aud"] = "https://other.example" }, 401, "the ID token is not valid"},
		{"expired", func(c map[string]any) { c["exp"] = time.Now().Unix() - 60 }, 401, "the ID token is not valid"},
	} {
		c := iss.GitHubClaims(serveGitHubAudience, "acme/infra")
		tc.claims(c)
		status, body := getAs(t, base, "/api/v1/claims", iss.Mint(t, c))
		if status != tc.status || !strings.Contains(body, tc.body) {
			t.Errorf("%s: %d %s, want %d mentioning %q", tc.name, status, body, tc.status, tc.body)
		}
	}
	if !strings.Contains(log.String(), "ID token refused") || !strings.Contains(log.String(), "expected audience") {
		t.Errorf("the server log lacks the refusals' reasons:\n%s", log.String())
	}
}

// serve starts while the GitHub issuer is unreachable, and its tokens are refused until it
// answers.
func TestServeStartsWithTheGitHubIssuerDown(t *testing.T) {
	t.Setenv("GCE_METADATA_HOST", "127.0.0.1:1")
	t.Setenv("GCE_METADATA_IP", "127.0.0.1:1")
	issuer := "http://" + testkit.ClosedLoopbackAddr(t)
	base := serveInProcess(t, &ServeOptions{Tokens: writeTokensFile(t, serveGitHubTokens), Audience: serveGitHubAudience, GitHubIssuer: issuer})
	key := testkit.NewOIDCIssuer(t) // only its key and claims
	c := key.GitHubClaims(serveGitHubAudience, "acme/infra")
	c["iss"] = issuer
	if status, body := getAs(t, base, "/api/v1/claims", key.Mint(t, c)); status != 401 || !strings.Contains(body, "the ID token is not valid") {
		t.Fatalf("issuer down: %d %s, want 401", status, body)
	}
	// The default issuer is GitHub's, which serve does not contact before a token needs it.
	serveInProcess(t, &ServeOptions{Tokens: writeTokensFile(t, serveGitHubTokens), Audience: serveGitHubAudience})
}
