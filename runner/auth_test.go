package runner

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/gauth"
	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

// noADC hides every Google credential, so that choosing Google ID tokens fails fast and
// locally.
func noADC(t *testing.T) {
	t.Helper()
	t.Setenv("HOME", t.TempDir())
	t.Setenv("CLOUDSDK_CONFIG", t.TempDir())
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "none.json"))
	t.Setenv("GCE_METADATA_HOST", testkit.ClosedLoopbackAddr(t))
}

func TestParseConfigAuth(t *testing.T) {
	cfg, err := ParseConfig("cfg.hcl", []byte("environment \"x\" {\n  audience = \"aud\"\n  auth = \"github-actions\"\n}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if x, _ := cfg.Environment("x"); x.Auth != AuthGitHubActions {
		t.Errorf("auth %q", x.Auth)
	}
	_, err = ParseConfig("cfg.hcl", []byte("environment \"x\" {\n  auth = \"GitHub\"\n}\n"))
	if !strings.Contains(fmt.Sprint(err), `cfg.hcl:1,1: invalid auth: "GitHub" is not a way to authenticate: want "google" or "github-actions"`) {
		t.Errorf("error %v", err)
	}
}

// The variables win over the block; a mode needs an audience; a token and an audience exclude
// each other; only the two modes exist.
func TestServerAuth(t *testing.T) {
	block := Environment{Audience: "block-aud", Auth: AuthGitHubActions}
	if a := AuthFor(block, mapEnv(nil)); a != (ServerAuth{Mode: AuthGitHubActions, Audience: "block-aud"}) {
		t.Errorf("from the block: %+v", a)
	}
	a := AuthFor(block, mapEnv(map[string]string{EnvAuth: " google ", EnvAudience: "env-aud", EnvToken: "tok"}))
	if a != (ServerAuth{Mode: AuthGoogle, Audience: "env-aud", Token: "tok"}) {
		t.Errorf("from the variables: %+v", a)
	}
	for _, tc := range []struct {
		a        ServerAuth
		want     string
		resolved string
	}{
		{ServerAuth{}, "", ""},
		{ServerAuth{Token: "t"}, "", ""},
		{ServerAuth{Audience: "aud"}, "", AuthGoogle},
		{ServerAuth{Audience: "aud", Mode: AuthGitHubActions}, "", AuthGitHubActions},
		{ServerAuth{Audience: "aud", Token: "t"}, ErrAmbiguousAuth.Error(), AuthGoogle},
		{ServerAuth{Audience: "aud", Token: "t", Mode: AuthGitHubActions}, ErrAmbiguousAuth.Error(), AuthGitHubActions},
		{ServerAuth{Mode: AuthGitHubActions}, `auth "github-actions" needs an audience`, AuthGitHubActions},
		{ServerAuth{Mode: AuthGoogle, Token: "t"}, `auth "google" needs an audience`, AuthGoogle},
		{ServerAuth{Mode: "aws", Audience: "aud"}, `auth "aws" is not a way to authenticate`, "aws"},
	} {
		err := tc.a.Check()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: Check() = %v, want %q", tc.a, err, tc.want)
		}
		if got := tc.a.Resolved(); got != tc.resolved {
			t.Errorf("%+v: Resolved() = %q, want %q", tc.a, got, tc.resolved)
		}
		if err != nil {
			if tf, terr := tc.a.TokenFunc(mapEnv(nil)); tf != nil || terr == nil || terr.Error() != err.Error() {
				t.Errorf("%+v: TokenFunc = %v, %v; want Check's error", tc.a, tf != nil, terr)
			}
		}
	}
}

// With github-actions the server gets the job's OIDC token as the bearer, and the token
// endpoint gets the request token: neither sees the other's.
func TestRunClientGitHubActions(t *testing.T) {
	noADC(t)
	e := testkit.NewActionsOIDC(t)
	m := newMemServer()
	srv := m.start(t)
	for name, tc := range map[string]struct {
		block Environment
		env   map[string]string
	}{
		"the block's auth":                {Environment{Audience: "tfstackplan", Auth: AuthGitHubActions}, nil},
		"TFSTACKPLAN_AUTH over the block": {Environment{Audience: "tfstackplan", Auth: AuthGoogle}, map[string]string{EnvAuth: AuthGitHubActions}},
		"all from the variables":          {Environment{}, map[string]string{EnvAuth: AuthGitHubActions, EnvAudience: "tfstackplan"}},
	} {
		t.Run(name, func(t *testing.T) {
			env := map[string]string{EnvServer: srv.URL}
			for k, v := range tc.env {
				env[k] = v
			}
			c, err := RunClient(tc.block, e.Getenv(env))
			if err != nil {
				t.Fatalf("RunClient: %v", err)
			}
			if c.AuthMode() != AuthGitHubActions || c.Audience() != "tfstackplan" {
				t.Errorf("auth %q, audience %q", c.AuthMode(), c.Audience())
			}
			for i := range 2 {
				if err := c.Phase(context.Background(), events.PhaseEvent{ExecutionID: "e", Stack: "s", Phase: "p", Seq: int64(i)}); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	tokens := e.Tokens()
	if len(tokens) != 3 {
		t.Fatalf("%d tokens obtained, want one per client", len(tokens))
	}
	for _, r := range e.Requests() {
		if r.Authorization != "Bearer "+e.RequestToken || r.Query.Get("audience") != "tfstackplan" {
			t.Errorf("the token endpoint got Authorization %q, audience %q", r.Authorization, r.Query.Get("audience"))
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.auth) != 6 {
		t.Fatalf("the server got %d requests, want 6", len(m.auth))
	}
	for i, a := range m.auth {
		if a != "Bearer "+tokens[i/2] {
			t.Errorf("request %d to the server had Authorization %q, want client %d's token", i, a, i/2)
		}
	}
}

// The choice is refused before a request when it cannot work; and google, when chosen over
// the block's github-actions, is Google's.
func TestRunClientGitHubActionsRefusals(t *testing.T) {
	noADC(t)
	e := testkit.NewActionsOIDC(t)
	block := Environment{Server: "http://127.0.0.1:1", Audience: "aud", Auth: AuthGitHubActions}
	for name, tc := range map[string]struct {
		block  Environment
		getenv func(string) string
		is     error
		want   []string
	}{
		"no id-token permission": {block, mapEnv(nil), gauth.ErrNoGitHubToken,
			[]string{`no GitHub Actions OIDC token for audience "aud": `, gauth.EnvActionsTokenURL + " and " + gauth.EnvActionsRequestToken + " are not set", "permissions: id-token: write"}},
		"no audience": {Environment{Server: block.Server, Auth: AuthGitHubActions}, e.Getenv(nil), nil,
			[]string{`auth "github-actions" needs an audience`}},
		"a token too": {block, e.Getenv(map[string]string{EnvToken: "static"}), ErrAmbiguousAuth, nil},
		"unknown TFSTACKPLAN_AUTH": {block, e.Getenv(map[string]string{EnvAuth: "oidc"}), nil,
			[]string{`auth "oidc" is not a way to authenticate`}},
		"google over the block": {block, e.Getenv(map[string]string{EnvAuth: AuthGoogle}), gauth.ErrNoCredentials,
			[]string{`no Google Application Default Credentials for audience "aud"`}},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := RunClient(tc.block, tc.getenv)
			if c != nil || err == nil || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("RunClient = %v, %v; want an error that is %v", c != nil, err, tc.is)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	if n := len(e.Requests()); n != 0 {
		t.Errorf("the token endpoint got %d requests, want none", n)
	}
}

// ClientFromEnv chooses as RunClient does, but goes unauthenticated (with a warning) when the
// tokens cannot be obtained.
func TestClientFromEnvGitHubActions(t *testing.T) {
	e := testkit.NewActionsOIDC(t)
	m := newMemServer()
	srv := m.start(t)
	t.Setenv(EnvServer, srv.URL)
	t.Setenv(EnvAudience, "tfstackplan")
	t.Setenv(EnvAuth, AuthGitHubActions)
	t.Setenv(EnvToken, "")
	t.Setenv(gauth.EnvActionsTokenURL, e.URL)
	t.Setenv(gauth.EnvActionsRequestToken, e.RequestToken)
	c := ClientFromEnv()
	if err := c.Phase(context.Background(), events.PhaseEvent{ExecutionID: "e", Stack: "s", Phase: "p"}); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	auth := slices.Clone(m.auth)
	m.mu.Unlock()
	if tokens := e.Tokens(); len(tokens) != 1 || !slices.Equal(auth, []string{"Bearer " + tokens[0]}) {
		t.Fatalf("the server got %q; tokens %q", auth, tokens)
	}
	t.Setenv(gauth.EnvActionsRequestToken, "")
	if c := ClientFromEnv(); !c.Enabled() || c.token != nil {
		t.Errorf("without the request token: enabled %v, token %v; want an unauthenticated client", c.Enabled(), c.token != nil)
	}
	t.Setenv(EnvAuth, "oidc")
	if c := ClientFromEnv(); c.Enabled() || c.Broken() == nil {
		t.Errorf("an unknown TFSTACKPLAN_AUTH: enabled %v, broken %v; want a broken client", c.Enabled(), c.Broken())
	}
}

// A tick without the driver authenticates as the driver told it to, through the environment.
func TestTickWithGitHubActionsAuth(t *testing.T) {
	e := testkit.NewActionsOIDC(t)
	m := newMemServer()
	srv := m.start(t)
	getenv := e.Getenv(map[string]string{EnvServer: srv.URL, EnvExecution: "exec-1", EnvStack: "stacks/prod/a",
		EnvAudience: "tfstackplan", EnvAuth: AuthGitHubActions})
	if w, err := Tick(context.Background(), TickOptions{Phase: "plan", Getenv: getenv}); w != "" || err != nil {
		t.Fatalf("Tick: %q, %v", w, err)
	}
	tokens := e.Tokens()
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(tokens) != 1 || len(m.phases) != 1 || !slices.Equal(m.auth, []string{"Bearer " + tokens[0]}) {
		t.Fatalf("phases %d, Authorization %q, tokens %q", len(m.phases), m.auth, tokens)
	}
}
