package cli

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// parseOnly builds a command with a run function that keeps its options, runs it with args
// and returns the options it was given (nil when it was not run) and the error.
func parseOnly[O any](t *testing.T, newCmd func(*IO, RunFunc[O]) *cobra.Command, args ...string) (*O, error) {
	t.Helper()
	ios, _, _ := testIO()
	var got *O
	cmd := newCmd(ios, func(_ context.Context, o *O) error {
		got = o
		return nil
	})
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	return got, cmd.Execute()
}

// mustParse is parseOnly for a command line that parses.
func mustParse[O any](t *testing.T, newCmd func(*IO, RunFunc[O]) *cobra.Command, args ...string) *O {
	t.Helper()
	o, err := parseOnly(t, newCmd, args...)
	if err != nil || o == nil {
		t.Fatalf("%q: %v (run: %v)", args, err, o != nil)
	}
	return o
}

func TestOperatorFlagsParse(t *testing.T) {
	conn := []string{"--server", "http://cp.example", "--audience", "aud", "--auth", "github-actions", "--timeout", "5s"}
	wantConn := func(t *testing.T, c ConnOptions) {
		t.Helper()
		if c.Server != "http://cp.example" || c.Audience != "aud" || c.Auth != "github-actions" || c.Timeout != 5*time.Second {
			t.Fatalf("connection options %+v", c)
		}
	}

	cl := mustParse(t, newClaimsListCmd, append([]string{"--repo", "acme/infra", "-e", "prod", "--json"}, conn...)...)
	wantConn(t, cl.Conn)
	if cl.Repo != "acme/infra" || cl.Environment != "prod" || !cl.JSON {
		t.Errorf("claims list: %+v", cl)
	}

	cr := mustParse(t, newClaimsReleaseCmd, "-e", "prod", "--pr", "7", "--stack", "stacks/a", "--execution", "plan-1", "--reason", "stuck")
	if cr.Environment != "prod" || cr.PR != 7 || cr.Stack != "stacks/a" || cr.Execution != "plan-1" || cr.Reason != "stuck" ||
		cr.Conn.Timeout != DefaultOperatorTimeout {
		t.Errorf("claims release: %+v", cr)
	}

	co := mustParse(t, newAdminChecksOverrideCmd, "--repo", "acme/infra", "--environment", "prod", "--pr", "3", "--check", "tfstackplan/plan",
		"--conclusion", "success", "--reason", "flaky")
	if co.Repo != "acme/infra" || co.Environment != "prod" || co.PR != 3 || co.Check != "tfstackplan/plan" || co.Conclusion != "success" || co.Reason != "flaky" {
		t.Errorf("admin checks override: %+v", co)
	}

	ec := mustParse(t, newAdminExecutionsCancelCmd, "plan-9", "--reason", "runaway")
	if ec.Execution != "plan-9" || ec.Reason != "runaway" {
		t.Errorf("admin executions cancel: %+v", ec)
	}
	if _, err := parseOnly(t, newAdminExecutionsCancelCmd, "--reason", "r"); err == nil {
		t.Error("admin executions cancel without an execution parsed")
	}

	gs := mustParse(t, newAdminGatesSatisfyCmd, "-e", "prod", "--pr", "7", "--class", "destructive", "--target", "**", "--latest",
		"--expires-in", "2h", "--reason", "reviewed")
	if gs.Environment != "prod" || gs.PR != 7 || gs.Class != "destructive" || gs.Target != "**" || !gs.Latest || gs.Execution != "" ||
		gs.ExpiresIn != 2*time.Hour || gs.Reason != "reviewed" {
		t.Errorf("admin gates satisfy: %+v", gs)
	}

	gr := mustParse(t, newAdminGrantsReleaseCmd, "-e", "prod", "--pr", "7", "--class", "additive", "--target", "stacks/*", "--reason", "done")
	if gr.Environment != "prod" || gr.PR != 7 || gr.Class != "additive" || gr.Target != "stacks/*" || gr.Reason != "done" {
		t.Errorf("admin grants release: %+v", gr)
	}

	el := mustParse(t, newExecutionsListCmd)
	if el.Limit != 50 || el.PR != 0 || el.JSON {
		t.Errorf("executions list defaults: %+v", el)
	}
	el = mustParse(t, newExecutionsListCmd, "--pr", "4", "--limit", "10", "-e", "dev", "--json")
	if el.Limit != 10 || el.PR != 4 || el.Environment != "dev" || !el.JSON {
		t.Errorf("executions list: %+v", el)
	}

	es := mustParse(t, newExecutionsShowCmd, "plan-1", "--json")
	if es.Execution != "plan-1" || !es.JSON {
		t.Errorf("executions show: %+v", es)
	}

	lg := mustParse(t, newLogsCmd, "plan-1", "stacks/a", "-f", "--generation", "2")
	if lg.Execution != "plan-1" || lg.Stack != "stacks/a" || !lg.Follow || lg.Generation == nil || *lg.Generation != 2 {
		t.Errorf("logs: %+v", lg)
	}
	if lg := mustParse(t, newLogsCmd, "plan-1", "stacks/a"); lg.Generation != nil || lg.Follow {
		t.Errorf("logs without --generation: %+v", lg)
	}
}

func TestOtherCommandsFlagsParse(t *testing.T) {
	r := mustParse(t, newRenderCmd, "--plan", "p.json", "--stack", "stacks/a", "--format", "json", "--color", "always", "--execution-url", "http://x/e")
	if r.Plan != "p.json" || r.Stack != "stacks/a" || r.Format != "json" || r.Color == nil || !*r.Color || r.ExecutionURL != "http://x/e" {
		t.Errorf("render: %+v", r)
	}
	if r := mustParse(t, newRenderCmd, "--plan", "p.json"); r.Format != "text" || r.Color != nil {
		t.Errorf("render defaults: %+v", r)
	}
	if r, err := parseOnly(t, newRenderCmd, "--plan", "p.json", "--color", "sometimes"); ExitCode(err) != ExitUsage || r != nil {
		t.Errorf("render --color sometimes: %v, run: %v", err, r != nil)
	}

	t.Setenv(EnvMetricsToken, "from-the-environment-0123456789")
	s := mustParse(t, newServeCmd, "--listen", "127.0.0.1:0", "--db", "sqlite:x.db")
	if s.Listen != "127.0.0.1:0" || s.DB != "sqlite:x.db" || s.MetricsToken != "from-the-environment-0123456789" {
		t.Errorf("serve: %+v", s)
	}
	if s := mustParse(t, newServeCmd, "--metrics-token", "from-the-flag-0123456789abc"); s.MetricsToken != "from-the-flag-0123456789abc" {
		t.Errorf("serve --metrics-token: %+v", s)
	}

	if v := mustParse(t, newVersionCmd, "--raw"); !v.Raw {
		t.Errorf("version --raw: %+v", v)
	}
	if c := mustParse(t, newCopyCmd, "/tmp/dest"); c.Dest != "/tmp/dest" {
		t.Errorf("copy: %+v", c)
	}
	if c, err := parseOnly(t, newCopyCmd); ExitCode(err) != ExitUsage || c != nil {
		t.Errorf("copy without a destination: %v, run: %v", err, c != nil)
	}
}
