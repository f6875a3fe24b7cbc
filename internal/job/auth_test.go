package job

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/runner"

	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

// runWithAuth runs op over one stack with the client RunClient builds from getenv, and returns
// the result and the environment the script run got (nil: it did not run).
func runWithAuth(t *testing.T, op string, getenv func(string) string) (*Result, []string) {
	t.Helper()
	var scriptEnv []string
	res := runRepoOpts(t, runRepo(t, []string{"a"}), op, func(o *RunOptions) {
		o.Getenv = getenv
		exec := o.Terramate.Exec
		o.Terramate = &runner.Terramate{Exec: func(ctx context.Context, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
			if len(args) > 0 && args[0] == "script" {
				scriptEnv = env
			}
			return exec(ctx, name, args, dir, env, stdout, stderr)
		}}
	})
	return res, scriptEnv
}

// A run with github-actions authenticates with the job's token and tells the scripts so.
func TestRunWithGitHubActionsAuth(t *testing.T) {
	e := testkit.NewActionsOIDC(t)
	m := newMemServer()
	srv := m.start(t)
	res, env := runWithAuth(t, OpPlan, e.Getenv(map[string]string{runner.EnvServer: srv.URL, runner.EnvAudience: "tfstackplan", runner.EnvAuth: runner.AuthGitHubActions}))
	if res.Server != srv.URL || len(res.Warnings) != 0 {
		t.Fatalf("server %q, warnings %q", res.Server, res.Warnings)
	}
	for _, kv := range []string{runner.EnvAudience + "=tfstackplan", runner.EnvAuth + "=" + runner.AuthGitHubActions, runner.EnvServer + "=" + srv.URL} {
		if !slices.Contains(env, kv) {
			t.Errorf("the scripts' environment lacks %s: %q", kv, env)
		}
	}
	tokens := e.Tokens()
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(tokens) != 1 || len(m.auth) == 0 || len(m.inits) != 1 {
		t.Fatalf("tokens %d, requests %d, inits %d", len(tokens), len(m.auth), len(m.inits))
	}
	for _, a := range m.auth {
		if a != "Bearer "+tokens[0] {
			t.Fatalf("the server got Authorization %q", a)
		}
	}
}

// Without a usable token a plan warns once and reports nothing, and an apply is denied with
// the reason before anything runs.
func TestRunWithoutGitHubActionsToken(t *testing.T) {
	m := newMemServer()
	srv := m.start(t)
	getenv := mapEnv(map[string]string{runner.EnvServer: srv.URL, runner.EnvAudience: "tfstackplan", runner.EnvAuth: runner.AuthGitHubActions})
	const why = "ACTIONS_ID_TOKEN_REQUEST_URL and ACTIONS_ID_TOKEN_REQUEST_TOKEN are not set"

	res, env := runWithAuth(t, OpPlan, getenv)
	if res.Error != nil || res.Status != StatusSucceeded || res.Server != "" {
		t.Fatalf("plan: status %s, error %+v, server %q; want a success reported nowhere", res.Status, res.Error, res.Server)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "reporting is off") || !strings.Contains(res.Warnings[0], why) {
		t.Errorf("plan warnings %q, want one naming the variables", res.Warnings)
	}
	for _, kv := range []string{runner.EnvServer + "=", runner.EnvAudience + "=", runner.EnvAuth + "="} {
		if !slices.Contains(env, kv) {
			t.Errorf("the scripts' environment lacks %s: %q", kv, env)
		}
	}

	res, env = runWithAuth(t, OpApply, getenv)
	if res.Error == nil || res.Error.Kind != KindGate || !strings.Contains(res.Error.Tail, why) || !strings.Contains(res.Error.Tail, "permissions: id-token: write") {
		t.Fatalf("apply: error %+v, want a gate denial naming the variables and the permission", res.Error)
	}
	if res.Gate == nil || res.Gate.Verdict != runner.VerdictNotSatisfied.String() || env != nil {
		t.Errorf("apply: gate %+v, scripts ran %v", res.Gate, env != nil)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.auth) != 0 {
		t.Errorf("the server got %d requests, want none", len(m.auth))
	}
}
