package cli

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
)

func TestExecutionsListAndShow(t *testing.T) {
	s := startOpServe(t)
	ctx := context.Background()
	s.seed(t, opRunnerToken, "plan-1", "prod", api.ExecutionOpPlan, 7, false,
		seedStack{name: "stacks/network", class: api.Additive}, seedStack{name: "stacks/app", class: api.Destructive})
	s.seed(t, opRunnerToken, "plan-2", "staging", api.ExecutionOpPlan, 8, true, seedStack{name: "stacks/app", class: api.Mutating})
	r, err := s.client(t, opRunnerToken).FinalizeWithResponse(ctx, api.Finalize{ExecutionID: "plan-2", Status: api.ExecutionStatusFailed,
		Error: "terramate failed:\n\x1b[31mexit status 1"})
	if err != nil || r.StatusCode() != 200 {
		t.Fatalf("finalize: %v %s", err, r.Body)
	}

	list := func(o ExecutionsListOptions) string {
		t.Helper()
		ios, out, _ := testIO()
		o.IO, o.Conn = ios, s.conn(opRunnerToken)
		if o.Limit == 0 {
			o.Limit = 50
		}
		if err := runExecutionsList(ctx, &o); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	out := list(ExecutionsListOptions{})
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 3 || !regexp.MustCompile(`^EXECUTION +REPOSITORY +ENVIRONMENT +PR +OP +STATUS +CLASS +CHANGES +STARTED +DURATION +ACTOR$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^plan-2 +acme/infra +staging +8 +plan +failed +mutating +- +20\d\d-\S+ +\d+s +ci$`).MatchString(lines[1]) ||
		!regexp.MustCompile(`^plan-1 +acme/infra +prod +7 +plan +succeeded +destructive +\+2 ~0 ±0 -2 +20`).MatchString(lines[2]) {
		t.Fatalf("table:\n%s", out)
	}
	var got []api.Execution
	if err := json.Unmarshal([]byte(list(ExecutionsListOptions{PR: 7, JSON: true})), &got); err != nil || len(got) != 1 || got[0].ExecutionID != "plan-1" {
		t.Fatalf("--pr 7 --json: %v %+v", err, got)
	}
	if err := json.Unmarshal([]byte(list(ExecutionsListOptions{Environment: "staging", JSON: true})), &got); err != nil || len(got) != 1 || got[0].ExecutionID != "plan-2" {
		t.Fatalf("--environment staging --json: %v %+v", err, got)
	}
	if err := json.Unmarshal([]byte(list(ExecutionsListOptions{Limit: 1, JSON: true})), &got); err != nil || len(got) != 1 || got[0].ExecutionID != "plan-2" {
		t.Fatalf("--limit 1 --json: %v %+v", err, got)
	}

	show := func(id string, asJSON bool) string {
		t.Helper()
		ios, out, _ := testIO()
		if err := runExecutionsShow(ctx, &ExecutionsShowOptions{IO: ios, Conn: s.conn(opRunnerToken), Execution: id, JSON: asJSON}); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	out = show("plan-1", false)
	for _, want := range []string{
		`(?m)^execution +plan-1$`, `(?m)^status +succeeded$`, `(?m)^class +destructive$`, `(?m)^changes +\+2 ~0 ±0 -2$`,
		`(?m)^STACK +STATUS +CLASS +CHANGES +PHASE +PLAN +LOG$`,
		`(?m)^stacks/network +succeeded +additive +\+1 ~0 ±0 -0 +plan: ok +v1:[0-9a-f]{12} +-$`,
		`(?m)^stacks/app +succeeded +destructive +\+1 ~0 ±0 -2 +plan: ok +v1:[0-9a-f]{12} +-$`,
		`(?m)^  stacks/network -> stacks/app$`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("show lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "error") {
		t.Errorf("an execution without an error shows one:\n%s", out)
	}
	out = show("plan-2", false)
	if !strings.Contains(out, "\nerror:\n  terramate failed:\n  ?[31mexit status 1\n") {
		t.Errorf("show lacks the error, made printable:\n%s", out)
	}
	var e api.Execution
	if err := json.Unmarshal([]byte(show("plan-2", true)), &e); err != nil || e.Error == "" || len(e.Stacks) != 1 || e.Stacks[0].Class != api.Mutating {
		t.Fatalf("show --json: %v %+v", err, e)
	}

	ios, _, _ := testIO()
	err = runExecutionsShow(ctx, &ExecutionsShowOptions{IO: ios, Conn: s.conn(opRunnerToken), Execution: "nope"})
	wantAPIError(t, err, 404, "executions show: not found")
}

func TestExecutionsUsage(t *testing.T) {
	wantUsage(t, "--limit must be between 1 and 500", "executions", "list", "--limit", "0")
	wantUsage(t, "--limit must be between 1 and 500", "executions", "list", "--limit", "501")
	wantUsage(t, "accepts 1 arg", "executions", "show")
	wantUsage(t, "invalid argument", "executions", "list", "--pr", "seven")
}

// A stack's log cell counts its gaps, and says when the server listed only the first ones.
func TestLogCellCountsGaps(t *testing.T) {
	gaps := make([]api.LogGap, 3)
	for _, tc := range []struct {
		st   api.StackState
		want string
	}{
		{api.StackState{}, ""},
		{api.StackState{LogBytes: 10, LogGeneration: 1}, "10 B gen 1"},
		{api.StackState{LogBytes: 10, Gaps: gaps}, "10 B (3 gaps)"},
		{api.StackState{LogBytes: 10, Gaps: gaps, GapsTruncated: true}, "10 B (3+ gaps)"},
	} {
		if got := logCell(tc.st); got != tc.want {
			t.Errorf("logCell(%+v) = %q, want %q", tc.st, got, tc.want)
		}
	}
}
