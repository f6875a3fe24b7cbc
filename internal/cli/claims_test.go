package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
)

func TestClaimsListAndRelease(t *testing.T) {
	s := startOpServe(t)
	ctx := context.Background()
	s.seed(t, opRunnerToken, "plan-7", "prod", api.ExecutionOpPlan, 7, false,
		seedStack{name: "stacks/app", class: api.Destructive}, seedStack{name: "stacks/db", class: api.Additive})
	s.seed(t, opOtherToken, "plan-8", "prod", api.ExecutionOpPlan, 8, false, seedStack{name: "stacks/net", class: api.Mutating})

	// A table by default, aligned.
	ios, out, _ := testIO()
	if err := runClaimsList(ctx, &ClaimsListOptions{IO: ios, Conn: s.conn(opRunnerToken), Environment: "prod"}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) != 4 || !regexp.MustCompile(`^REPOSITORY +ENVIRONMENT +STACK +PR +EXECUTION +SHA +CLAIMED +EXPIRES$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^acme/infra +prod +stacks/app +7 +plan-7 +0123456789ab +20\d\d-`).MatchString(lines[1]) {
		t.Fatalf("table:\n%s", out)
	}
	if strings.Index(lines[0], "STACK") != strings.Index(lines[1], "stacks/app") {
		t.Fatalf("columns are not aligned:\n%s", out)
	}

	// --json is the API's claims.
	ios, out, _ = testIO()
	if err := runClaimsList(ctx, &ClaimsListOptions{IO: ios, Conn: s.conn(opRunnerToken), JSON: true}); err != nil {
		t.Fatal(err)
	}
	var claims []api.Claim
	if err := json.Unmarshal(out.Bytes(), &claims); err != nil || len(claims) != 3 || claims[0].ExecutionID != "plan-7" {
		t.Fatalf("json %v: %s", err, out)
	}

	release := func(token string, o ClaimsReleaseOptions) (stdout, stderr string, err error) {
		ios, out, errOut := testIO()
		o.IO, o.Conn, o.Environment, o.Reason = ios, s.conn(token), "prod", "stuck after a failed apply"
		err = runClaimsRelease(ctx, &o)
		return out.String(), errOut.String(), err
	}
	// A runner must name its own execution: the server refuses, and its message is shown.
	_, _, err := release(opRunnerToken, ClaimsReleaseOptions{PR: 7})
	wantAPIError(t, err, http.StatusForbidden, "claims release: permission denied: ")
	if !strings.Contains(err.Error(), "a runner releases only the claims of its own execution") || ExitCode(err) != ExitFailure {
		t.Fatalf("err %v (exit %d)", err, ExitCode(err))
	}
	// ... and not another runner's execution.
	_, _, err = release(opOtherToken, ClaimsReleaseOptions{PR: 7, Execution: "plan-7"})
	wantAPIError(t, err, http.StatusForbidden, "was not announced by other-runner")

	// Its own execution's claim of one stack.
	stdout, stderr, err := release(opRunnerToken, ClaimsReleaseOptions{PR: 7, Execution: "plan-7", Stack: "stacks/db"})
	if err != nil || !strings.Contains(stdout, "released the claims of prod PR #7: stack stacks/db of execution plan-7") || stderr != "" {
		t.Fatalf("release: %v %q %q", err, stdout, stderr)
	}
	// An admin releases a PR's claims.
	if _, _, err := release(opAdminToken, ClaimsReleaseOptions{PR: 8}); err != nil {
		t.Fatal(err)
	}
	ios, out, _ = testIO()
	if err := runClaimsList(ctx, &ClaimsListOptions{IO: ios, Conn: s.conn(opRunnerToken), JSON: true}); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out.Bytes(), &claims); err != nil || len(claims) != 1 || claims[0].Stack != "stacks/app" {
		t.Fatalf("claims left: %v %s", err, out)
	}

	// No claims: nothing on stdout, a note on stderr.
	ios, out, errOut := testIO()
	if err := runClaimsList(ctx, &ClaimsListOptions{IO: ios, Conn: s.conn(opRunnerToken), Environment: "staging"}); err != nil || out.Len() != 0 || !strings.Contains(errOut.String(), "no claims") {
		t.Fatalf("%v %q %q", err, out, errOut)
	}
}

func TestClaimsUsage(t *testing.T) {
	wantUsage(t, "--reason is required", "claims", "release", "-e", "prod", "--pr", "7")
	wantUsage(t, "--reason is required", "claims", "release", "-e", "prod", "--pr", "7", "--reason", "  ")
	wantUsage(t, "--pr must be a pull request number", "claims", "release", "-e", "prod", "--reason", "r")
	wantUsage(t, "--environment is required", "claims", "release", "--pr", "7", "--reason", "r")
	wantUsage(t, "unknown command", "claims", "steal")
}
