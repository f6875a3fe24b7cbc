package cli

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
)

func TestAdminGatesAndGrants(t *testing.T) {
	s := startOpServe(t)
	ctx := context.Background()
	satisfy := func(token string, o AdminGatesSatisfyOptions) (string, error) {
		ios, out, _ := testIO()
		o.IO, o.Conn, o.Environment, o.PR, o.Class = ios, s.conn(token), "prod", 7, "destructive"
		if o.Target == "" {
			o.Target = "**"
		}
		if o.Reason == "" {
			o.Reason = "reviewed the destroy"
		}
		err := runAdminGatesSatisfy(ctx, &o)
		return out.String(), err
	}

	// Nothing to approve before the PR has a plan.
	_, err := satisfy(opAdminToken, AdminGatesSatisfyOptions{Execution: "plan-a"})
	wantAPIError(t, err, http.StatusPreconditionFailed, "admin gates satisfy: failed precondition: acme/infra prod PR #7 has no plan to approve")
	if _, err = satisfy(opAdminToken, AdminGatesSatisfyOptions{Latest: true}); err == nil || !strings.Contains(err.Error(), "prod PR #7 has no plan to approve") {
		t.Fatalf("--latest without a plan: %v", err)
	}

	s.seed(t, opRunnerToken, "plan-a", "prod", api.ExecutionOpPlan, 7, false, seedStack{name: "stacks/app", class: api.Destructive})
	s.seed(t, opRunnerToken, "plan-b", "prod", api.ExecutionOpPlan, 7, false, seedStack{name: "stacks/app", class: api.Destructive})

	// A runner is not an admin.
	_, err = satisfy(opRunnerToken, AdminGatesSatisfyOptions{Execution: "plan-b"})
	wantAPIError(t, err, http.StatusForbidden, "permission denied: ")
	if !strings.Contains(err.Error(), "lacks the admin role") {
		t.Fatal(err)
	}
	// An expiry in the past is the operator's mistake: the server's 400 exits 2.
	_, err = satisfy(opAdminToken, AdminGatesSatisfyOptions{Execution: "plan-b", ExpiresAt: "2001-01-01T00:00:00Z"})
	wantAPIError(t, err, http.StatusBadRequest, "is in the past")
	if ExitCode(err) != ExitUsage {
		t.Fatalf("exit %d", ExitCode(err))
	}
	// A plan that is not the PR's latest (older, unknown, another PR's) is not approved: the
	// approver has not seen what would be applied.
	for _, id := range []string{"plan-a", "nope"} {
		_, err = satisfy(opAdminToken, AdminGatesSatisfyOptions{Execution: id})
		wantAPIError(t, err, http.StatusConflict, "execution "+id+" is not the latest plan of acme/infra prod PR #7: plan plan-b")
	}
	// A gate the plan does not require approves nothing.
	_, err = satisfy(opAdminToken, AdminGatesSatisfyOptions{Execution: "plan-b", Target: "stacks/*"})
	wantAPIError(t, err, http.StatusPreconditionFailed, `requires no gate destructive on "stacks/*"; the gates it requires: destructive on ** (stacks/app)`)

	// The named plan, for an hour.
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	out, err := satisfy(opAdminToken, AdminGatesSatisfyOptions{Execution: "plan-b", ExpiresIn: time.Hour, Now: func() time.Time { return now }})
	if err != nil || out != "gate destructive on \"**\" of prod PR #7 satisfied: plan plan-b approved, until 2030-01-02T04:04:05Z\n" {
		t.Fatalf("satisfy: %v %q", err, out)
	}
	// The latest plan, printed first; its content is approved already, so no second grant.
	out, err = satisfy(opAdminToken, AdminGatesSatisfyOptions{Latest: true})
	for _, want := range []string{"latest plan of acme/infra prod PR #7: plan-b", "stacks/app", "destructive", "gate: destructive on ** (stacks stacks/app)",
		"plan plan-b approved, until released"} {
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("satisfy --latest: %v, output lacks %q:\n%s", err, want, out)
		}
	}
	grants := s.grants(t)
	if len(grants) != 1 || grants[0].ExecutionID != "plan-b" || !grants[0].ExpiresAt.Equal(now.Add(time.Hour)) || grants[0].Reason != "reviewed the destroy" ||
		grants[0].Principal != "admin" || grants[0].Repo != "acme/infra" {
		t.Fatalf("grants: %+v", grants)
	}

	ios, stdout, _ := testIO()
	if err := runAdminGrantsRelease(ctx, &AdminGrantsReleaseOptions{IO: ios, Conn: s.conn(opAdminToken), Environment: "prod", PR: 7,
		Class: "destructive", Target: "**", Reason: "superseded"}); err != nil || !strings.Contains(stdout.String(), "released") {
		t.Fatalf("release: %v %q", err, stdout)
	}
	for _, g := range s.grants(t) {
		if g.ReleasedAt.IsZero() || g.ReleasedBy != "admin" {
			t.Fatalf("grant not released: %+v", g)
		}
	}
}

// grants lists the server's grants of prod PR 7.
func (s *opServe) grants(t *testing.T) []api.Grant {
	t.Helper()
	r, err := s.client(t, opAdminToken).GrantsListWithResponse(context.Background(), &api.GrantsListParams{Environment: "prod", Pr: 7})
	if err != nil || r.JSON200 == nil {
		t.Fatalf("grants: %v %s", err, r.Body)
	}
	return *r.JSON200
}

func TestAdminChecksOverrideAndCancel(t *testing.T) {
	s := startOpServe(t)
	ctx := context.Background()
	s.seed(t, opRunnerToken, "plan-run", "prod", api.ExecutionOpPlan, 9, true, seedStack{name: "stacks/app", class: api.Additive})

	ios, out, _ := testIO()
	o := &AdminChecksOverrideOptions{IO: ios, Conn: s.conn(opAdminToken), Environment: "prod", PR: 9, Check: "tfstackplan/plan",
		Conclusion: "success", Reason: "flaky runner"}
	if err := runAdminChecksOverride(ctx, o); err != nil || out.String() != "check tfstackplan/plan of prod PR #9 overridden: success\n" {
		t.Fatalf("override: %v %q", err, out)
	}
	r, err := s.client(t, opAdminToken).ChecksListWithResponse(ctx, &api.ChecksListParams{Environment: "prod", Pr: 9})
	if err != nil || r.JSON200 == nil || len(*r.JSON200) != 1 || !(*r.JSON200)[0].Overridden || (*r.JSON200)[0].Reason != "flaky runner" {
		t.Fatalf("checks: %v %s", err, r.Body)
	}

	cancel := func(id string) (string, error) {
		ios, out, _ := testIO()
		err := runAdminExecutionsCancel(ctx, &AdminExecutionsCancelOptions{IO: ios, Conn: s.conn(opAdminToken), Execution: id, Reason: "wrong branch"})
		return out.String(), err
	}
	_, err = cancel("no-such-execution")
	wantAPIError(t, err, http.StatusNotFound, "admin executions cancel: not found: ")
	if out, err := cancel("plan-run"); err != nil || !strings.Contains(out, "execution plan-run cancelled") {
		t.Fatalf("cancel: %v %q", err, out)
	}
	e, err := s.client(t, opAdminToken).ExecutionGetWithResponse(ctx, "plan-run")
	if err != nil || e.JSON200 == nil || e.JSON200.Status != api.ExecutionStatusCancelled || e.JSON200.CancelReason != "wrong branch" {
		t.Fatalf("execution: %v %s", err, e.Body)
	}
}

// TestAdminUsage: every admin action without --reason, or with a value the server would refuse,
// is a usage error (exit 2) before anything is sent.
func TestAdminUsage(t *testing.T) {
	for _, args := range [][]string{
		{"admin", "checks", "override", "-e", "prod", "--pr", "7", "--check", "tfstackplan/plan", "--conclusion", "success"},
		{"admin", "executions", "cancel", "e1"},
		{"admin", "gates", "satisfy", "-e", "prod", "--pr", "7", "--class", "destructive", "--target", "**", "--latest"},
		{"admin", "grants", "release", "-e", "prod", "--pr", "7", "--class", "destructive", "--target", "**"},
		{"admin", "grants", "release", "-e", "prod", "--pr", "7", "--class", "destructive", "--target", "**", "--reason", "  "},
	} {
		wantUsage(t, "--reason is required", args...)
	}
	satisfy := []string{"admin", "gates", "satisfy", "-e", "prod", "--pr", "7", "--target", "**", "--reason", "r", "--latest"}
	wantUsage(t, "--execution ID (the plan you reviewed) or --latest", "admin", "gates", "satisfy", "-e", "prod", "--pr", "7", "--class", "destructive", "--target", "**", "--reason", "r")
	wantUsage(t, "--execution ID (the plan you reviewed) or --latest", append(satisfy, "--class", "destructive", "--execution", "p1")...)
	wantUsage(t, "--repo: repository", append(satisfy, "--class", "destructive", "--repo", "acme")...)
	wantUsage(t, `--class "big"`, append(satisfy, "--class", "big")...)
	wantUsage(t, "exclude each other", append(satisfy, "--class", "destructive", "--expires-at", "2030-01-01T00:00:00Z", "--expires-in", "1h")...)
	wantUsage(t, "RFC 3339", append(satisfy, "--class", "destructive", "--expires-at", "tomorrow")...)
	wantUsage(t, "--expires-in must be positive", append(satisfy, "--class", "destructive", "--expires-in", "-1h")...)
	wantUsage(t, `--conclusion "great"`, "admin", "checks", "override", "-e", "prod", "--pr", "7", "--check", "c", "--conclusion", "great", "--reason", "r")
	wantUsage(t, "accepts 1 arg", "admin", "executions", "cancel", "--reason", "r")
	wantUsage(t, "tfstackplan admin needs a sub-command", "admin")
	wantUsage(t, "tfstackplan admin gates needs a sub-command", "admin", "gates")

	ios, _, _ := testIO()
	wantNoServer(t, "cancel", runAdminExecutionsCancel(context.Background(), &AdminExecutionsCancelOptions{IO: ios, Conn: noServer, Execution: "x", Reason: "r"}))
}
