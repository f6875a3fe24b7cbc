package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
)

// hostile holds what a pull request's job controls and a server may send back as it is:
// escape sequences (one that hides everything after it), a carriage return that overwrites
// the line, C1 controls and a bidirectional override.
const hostile = "\x1b[8m\r\u009b2J\u202e"

// The server's fields reach the approver's terminal only through the one sanitizer:
// `admin gates satisfy --latest` prints a plan whose sha, stacks, plan hashes and gates carry
// control characters, and the table after the sha is still there to read.
func TestGatesSatisfyLatestNeutralisesControlCharacters(t *testing.T) {
	plan := api.Execution{ExecutionID: "plan-1", Environment: "prod", Op: api.ExecutionOpPlan, PR: 7, Repo: "acme/infra",
		Status: api.ExecutionStatusSucceeded, SHA: hostile + "0123456789abcdef", Actor: "mallory" + hostile, Base: "main" + hostile,
		Stacks: []api.StackState{{Stack: "stacks/app" + hostile, Status: api.StackStatusSucceeded, Class: api.Destructive,
			Counts: api.Counts{Delete: 1}, PlanHash: "v1:abc" + hostile}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		var v any
		switch r.URL.Path {
		case "/api/v1/plans/latest":
			v = plan
		case "/api/v1/gates":
			v = []api.Gate{{ExecutionID: "plan-1", Environment: "prod", PR: 7, Class: "destructive" + hostile, Target: "**" + hostile,
				Stacks: []string{"stacks/app" + hostile}}}
		case "/api/v1/admin/gates/satisfy":
			v = api.Ack{}
		default:
			http.NotFound(w, r)
			return
		}
		if err := json.NewEncoder(w).Encode(v); err != nil {
			t.Error(err)
		}
	}))
	t.Cleanup(srv.Close)

	ios, out, _ := testIO()
	err := runAdminGatesSatisfy(context.Background(), &AdminGatesSatisfyOptions{IO: ios, Conn: connTo(srv.URL, opAdminToken),
		Environment: "prod", PR: 7, Class: "destructive", Target: "**", Latest: true, Reason: "reviewed"})
	if err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, bad := range []string{"\x1b", "\r", "\u009b", "\u202e"} {
		if strings.Contains(got, bad) {
			t.Fatalf("%q reached the terminal:\n%q", bad, got)
		}
	}
	for _, want := range []string{"commit ?[8m??2J?, ", "stacks/app?[8m??2J?  destructive", "v1:abc?[8m??2J?\n", "gate: destructive?[8m??2J? on **?[8m??2J?",
		"plan plan-1 approved"} {
		if !strings.Contains(got, want) {
			t.Errorf("the output lacks %q:\n%s", want, got)
		}
	}
}

// An error that carries a server's message reaches stderr through the same sanitizer, in
// Main, whatever the command.
func TestMainNeutralisesControlCharactersInErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_ = json.NewEncoder(w).Encode(api.Error{Code: "PERMISSION_DENIED" + hostile, Message: "no" + hostile})
	}))
	t.Cleanup(srv.Close)
	t.Setenv("TFSTACKPLAN_TOKEN", "t")
	code, _, errOut := runMain("executions", "show", "x", "--server", srv.URL)
	if code != ExitFailure || !strings.Contains(errOut, "executions show: permission denied: no?[8m??2J?") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, bad := range []string{"\x1b", "\r", "\u009b", "\u202e"} {
		if strings.Contains(errOut, bad) {
			t.Fatalf("%q reached the terminal: %q", bad, errOut)
		}
	}
}
