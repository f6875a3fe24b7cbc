package cli

import (
	"bytes"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

// The GitHub Actions trust model end to end: `serve` verifies the ID tokens of a loopback OIDC
// issuer the test starts (its own keys and discovery document), and every job acts only where
// its verified claims allow, on SQLite and on PostgreSQL.

const e2eAudience = "https://tfstackplan.example.com"

const e2eTokens = `
github "acme/infra" {
  roles = ["runner"]
}
github "acme/other" {
  roles = ["runner"]
}
token "admin" {
  secret = "e2e-admin-secret-0123456789"
  roles  = ["admin"]
}
`

const e2ePolicy = `
environment "prod" {
  requester     = "deployer@proj.iam.gserviceaccount.com"
  runner_member = "principalSet://iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/gh/attribute.run_id/{run_id}"
  apply_from {
    refs         = ["refs/heads/main"]
    workflows    = ["acme/infra/.github/workflows/apply.yml@refs/heads/main", "acme/other/.github/workflows/apply.yml@refs/heads/main"]
    environments = ["prod"]
  }
  gate {
    classes = ["destructive"]
    stacks  = ["stacks/prod/**"]
  }
}
`

// e2eServer is a serve that trusts iss, with the test's tokens and policy.
type e2eServer struct {
	t    *testing.T
	base string
	iss  *testkit.OIDCIssuer
}

// jobToken mints the ID token of a job of repo on ref, from the workflow file wf at ref, in the
// GitHub environment env (none: ""), of run run; edit changes the claims before signing.
func (s *e2eServer) jobToken(repo, ref, wf, env, run string, edit ...func(map[string]any)) string {
	c := s.iss.GitHubClaims(e2eAudience, repo)
	event := "push"
	if strings.HasPrefix(ref, "refs/pull/") {
		event = "pull_request"
	}
	workflow := repo + "/" + wf + "@" + ref
	c["ref"], c["event_name"], c["workflow_ref"], c["job_workflow_ref"], c["run_id"] = ref, event, workflow, workflow, run
	c["sub"] = "repo:" + repo + ":ref:" + ref
	if env != "" {
		c["environment"] = env
		c["sub"] = "repo:" + repo + ":environment:" + env
	}
	for _, e := range edit {
		e(c)
	}
	return s.iss.Mint(s.t, c)
}

// prJob is the token of pull request pr's plan job of repo.
func (s *e2eServer) prJob(repo string, pr int, run string) string {
	return s.jobToken(repo, fmt.Sprintf("refs/pull/%d/merge", pr), ".github/workflows/plan.yml", "", run)
}

// call sends body (nil: none) to the API as the holder of token and returns the status and the
// answer's message or body.
func (s *e2eServer) call(token, method, path string, body any) (int, string) {
	s.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.base+"/api/v1"+path, r)
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	var e struct{ Code, Message string }
	if resp.StatusCode >= 400 && json.Unmarshal(out, &e) == nil && e.Code != "" {
		return resp.StatusCode, e.Code + ": " + e.Message
	}
	return resp.StatusCode, string(out)
}

// want fails unless a call answered status with a body mentioning each of contains.
func (s *e2eServer) want(what string, status int, body string, wantStatus int, contains ...string) {
	s.t.Helper()
	if status != wantStatus {
		s.t.Fatalf("%s: %d %s, want %d", what, status, body, wantStatus)
	}
	for _, c := range contains {
		if !strings.Contains(body, c) {
			s.t.Fatalf("%s: %d %s, want it to mention %q", what, status, body, c)
		}
	}
}

// plan announces and finalizes a plan of pr in prod as token, with one destructive stack.
func (s *e2eServer) plan(token, repo, id string, pr int, hash string) {
	s.t.Helper()
	st, body := s.call(token, "POST", "/events/init", map[string]any{"execution_id": id, "repo": repo, "environment": "prod", "op": "plan",
		"pr": pr, "sha": "s-" + id, "stacks": []string{"stacks/prod/db"}})
	s.want("init "+id, st, body, 200)
	st, body = s.call(token, "POST", "/events/finalize", map[string]any{"execution_id": id, "status": "succeeded",
		"stacks": []map[string]any{{"stack": "stacks/prod/db", "status": "succeeded", "class": "destructive", "plan_hash": hash}}})
	s.want("finalize "+id, st, body, 200)
}

func TestGitHubJobsEndToEnd(t *testing.T) {
	t.Setenv("GCE_METADATA_HOST", "127.0.0.1:1")
	t.Setenv("GCE_METADATA_IP", "127.0.0.1:1")
	dbs := map[string]func(t *testing.T) string{
		"sqlite": func(t *testing.T) string { return "sqlite:" + filepath.Join(t.TempDir(), "e2e.db") },
	}
	if os.Getenv(storetest.PostgresEnv) != "" {
		dbs["postgres"] = func(t *testing.T) string { u, _ := storetest.PostgresURL(t); return u }
	}
	for name, db := range dbs {
		t.Run(name, func(t *testing.T) {
			iss := testkit.NewOIDCIssuer(t)
			policy := filepath.Join(t.TempDir(), "policy.hcl")
			if err := os.WriteFile(policy, []byte(e2ePolicy), 0o600); err != nil {
				t.Fatal(err)
			}
			base := serveInProcess(t, &ServeOptions{DB: db(t), Tokens: writeTokensFile(t, e2eTokens), Policy: policy,
				Audience: e2eAudience, GitHubIssuer: iss.URL})
			gitHubJobsEndToEnd(t, &e2eServer{t: t, base: base, iss: iss})
		})
	}
}

func gitHubJobsEndToEnd(t *testing.T, s *e2eServer) {
	const admin = "e2e-admin-secret-0123456789"
	infra, other := s.prJob("acme/infra", 42, "1001"), s.prJob("acme/other", 42, "2001")

	// A pull request's job reports its pull request, in its repository, and nothing else.
	s.plan(infra, "", "infra-42", 42, "v1:infra")
	st, body := s.call(infra, "POST", "/events/init", map[string]any{"execution_id": "x1", "environment": "prod", "op": "plan", "pr": 43})
	s.want("a PR 42 job announcing PR 43", st, body, 403, "a job of pull request #42 reports only PR #42, not #43")
	st, body = s.call(infra, "POST", "/events/init", map[string]any{"execution_id": "x2", "repo": "acme/other", "environment": "prod", "op": "plan", "pr": 42})
	s.want("a job of acme/infra announcing in acme/other", st, body, 403, "may not act in repository acme/other")
	st, body = s.call(s.prJob("acme/infra", 43, "1002"), "POST", "/events/update", map[string]any{"execution_id": "infra-42", "stack": "stacks/prod/db", "status": "failed"})
	s.want("another job writing PR 42's plan", st, body, 403, "was not announced by github:acme/infra:run:1002")

	// PR 42 of the other repository is another pull request.
	s.plan(other, "acme/other", "other-42", 42, "v1:other")
	for _, c := range []struct{ token, repo, exec string }{{infra, "acme/infra", "infra-42"}, {other, "acme/other", "other-42"}} {
		st, body = s.call(c.token, "GET", "/claims?environment=prod", nil)
		var claims []map[string]any
		if err := json.Unmarshal([]byte(body), &claims); st != 200 || err != nil || len(claims) != 1 || claims[0]["repo"] != c.repo || claims[0]["execution_id"] != c.exec {
			t.Fatalf("claims as a job of %s: %d %s", c.repo, st, body)
		}
	}
	st, body = s.call(other, "GET", "/executions/infra-42", nil)
	s.want("acme/other's job reading acme/infra's plan", st, body, 404)
	st, body = s.call(admin, "POST", "/admin/gates/satisfy", map[string]any{"repo": "acme/infra", "environment": "prod", "pr": 42,
		"class": "destructive", "target": "stacks/prod/**", "reason": "e2e", "execution_id": "other-42"})
	s.want("approving acme/other's plan for acme/infra's PR 42", st, body, 409, "is not the latest plan of acme/infra prod PR #42: plan infra-42")
	st, body = s.call(admin, "POST", "/admin/gates/satisfy", map[string]any{"repo": "acme/infra", "environment": "prod", "pr": 42,
		"class": "destructive", "target": "stacks/prod/**", "reason": "e2e", "execution_id": "infra-42"})
	s.want("approving acme/infra's plan", st, body, 200)

	// Only the apply workflow on main, in the GitHub environment prod, passes the gate.
	check := func(token, id string) (int, string) {
		return s.call(token, "POST", "/gates/check", map[string]any{"execution_id": id, "environment": "prod", "pr": 42, "sha": "s",
			"stacks": []map[string]any{{"stack": "stacks/prod/db", "plan_hash": "v1:infra", "class": "destructive"}}})
	}
	for _, c := range []struct{ what, token, why string }{
		{"the plan job", infra, `the job's ref "refs/pull/42/merge" is not among apply_from's refs`},
		{"apply.yml edited on a PR branch", s.jobToken("acme/infra", "refs/pull/42/merge", ".github/workflows/apply.yml", "prod", "1003"), "is not among apply_from's refs"},
		{"apply.yml of a PR branch, run on main", s.jobToken("acme/infra", "refs/heads/main", ".github/workflows/apply.yml", "prod", "1004",
			func(c map[string]any) {
				c["job_workflow_ref"] = "acme/infra/.github/workflows/apply.yml@refs/pull/42/merge"
			}),
			`the job's workflow "acme/infra/.github/workflows/apply.yml@refs/pull/42/merge" is not among apply_from's workflows`},
		{"a job outside the GitHub environment", s.jobToken("acme/infra", "refs/heads/main", ".github/workflows/apply.yml", "", "1005"),
			`the job's GitHub environment "" is not among apply_from's environments`},
	} {
		st, body := check(c.token, "apply-"+c.what)
		s.want(c.what+" at the gate", st, body, 403, c.why)
	}
	apply := s.jobToken("acme/infra", "refs/heads/main", ".github/workflows/apply.yml", "prod", "1006")
	st, body = check(apply, "apply-ok")
	s.want("the apply workflow on main", st, body, 200, "deployer@proj.iam.gserviceaccount.com")
	st, body = s.call(admin, "GET", "/audit?repo=acme/infra&limit=1", nil)
	s.want("the audit of the allowed check", st, body, 200, `"principal":"github:acme/infra:run:1006"`, "ref=refs/heads/main", "environment=prod", "run=1006/1")

	// Tokens that do not verify are refused before anything else.
	_, alien := testkit.NewOIDCIssuer(t).Key()
	for _, c := range []struct {
		what  string
		token string
	}{
		{"expired", s.jobToken("acme/infra", "refs/heads/main", ".github/workflows/apply.yml", "prod", "9", func(c map[string]any) {
			c["iat"], c["nbf"], c["exp"] = time.Now().Add(-time.Hour).Unix(), time.Now().Add(-time.Hour).Unix(), time.Now().Add(-10*time.Minute).Unix()
		})},
		{"wrong audience", s.jobToken("acme/infra", "refs/heads/main", ".github/workflows/apply.yml", "prod", "9", func(c map[string]any) { c["aud"] = "https://other.example" })},
		{"wrong issuer", s.jobToken("acme/infra", "refs/heads/main", ".github/workflows/apply.yml", "prod", "9", func(c map[string]any) { c["iss"] = "https://token.actions.githubusercontent.com" })},
		{"wrongly signed", wronglySigned(t, s, alien)},
	} {
		st, body := check(c.token, "apply-"+c.what)
		s.want(c.what+" token", st, body, 401, "UNAUTHENTICATED")
	}
}

// wronglySigned is a valid apply job's token signed by another key under the issuer's kid.
func wronglySigned(t *testing.T, s *e2eServer, other *rsa.PrivateKey) string {
	c := s.iss.GitHubClaims(e2eAudience, "acme/infra")
	c["ref"], c["environment"], c["job_workflow_ref"] = "refs/heads/main", "prod", "acme/infra/.github/workflows/apply.yml@refs/heads/main"
	kid, _ := s.iss.Key()
	return testkit.SignRS256(t, other, kid, c)
}
