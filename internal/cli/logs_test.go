package cli

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

// waitFor waits until cond holds, for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// post stores log chunks of execution id as the runner.
func (s *opServe) post(t *testing.T, chunks ...api.LogChunk) {
	t.Helper()
	r, err := s.client(t, opRunnerToken).LogChunksWithResponse(context.Background(), api.LogChunks{Chunks: chunks})
	if err != nil || r.StatusCode() != 200 {
		t.Fatalf("log chunks: %v %s", err, r.Body)
	}
}

func TestLogs(t *testing.T) {
	s := startOpServe(t)
	ctx := context.Background()
	s.seed(t, opRunnerToken, "plan-1", "prod", api.ExecutionOpPlan, 7, true,
		seedStack{name: "stacks/app", class: api.Additive, log: "line 1\n"}, seedStack{name: "stacks/db", class: api.Additive})
	// bytes [7, 12) lost, then more; and a second generation.
	s.post(t,
		api.LogChunk{ExecutionID: "plan-1", Stack: "stacks/app", Offset: 7, GapLength: 5},
		api.LogChunk{ExecutionID: "plan-1", Stack: "stacks/app", Offset: 12, Data: []byte("line 3 \x1b[1mbold\x1b[0m\n")},
	)
	logs := func(o LogsOptions) (string, string, error) {
		var out, errOut testkit.SyncBuffer
		o.IO, o.Conn, o.Execution = &IO{Out: &out, ErrOut: &errOut}, s.conn(opRunnerToken), "plan-1"
		err := runLogs(ctx, &o)
		return out.String(), errOut.String(), err
	}
	// The bytes as they are; the gap on stderr.
	out, errOut, err := logs(LogsOptions{Stack: "stacks/app"})
	if err != nil || out != "line 1\nline 3 \x1b[1mbold\x1b[0m\n" || errOut != "[5 bytes missing]\n" {
		t.Fatalf("logs: %v %q %q", err, out, errOut)
	}
	// A leading slash, as terramate prints stacks, finds the stack.
	if out, _, err = logs(LogsOptions{Stack: "/stacks/app"}); err != nil || !strings.HasPrefix(out, "line 1\n") {
		t.Fatalf("logs /stacks/app: %v %q", err, out)
	}
	if _, _, err = logs(LogsOptions{Stack: "stacks/web"}); err == nil || !strings.Contains(err.Error(), `execution plan-1 has no stack "stacks/web" (its stacks: stacks/app, stacks/db)`) {
		t.Fatalf("unknown stack: %v", err)
	}
	// The latest generation by default; --generation picks one.
	s.post(t, api.LogChunk{ExecutionID: "plan-1", Stack: "stacks/app", Generation: 1, Data: []byte("again\n")})
	if out, _, err = logs(LogsOptions{Stack: "stacks/app"}); err != nil || out != "again\n" {
		t.Fatalf("latest generation: %v %q", err, out)
	}
	if out, _, err = logs(LogsOptions{Stack: "stacks/app", Generation: new(int64(0))}); err != nil || !strings.HasPrefix(out, "line 1\n") {
		t.Fatalf("--generation 0: %v %q", err, out)
	}
	// A stack without a log prints nothing.
	if out, errOut, err = logs(LogsOptions{Stack: "stacks/db"}); err != nil || out != "" || errOut != "" {
		t.Fatalf("empty log: %v %q %q", err, out, errOut)
	}
	ios, _, _ := testIO()
	err = runLogs(ctx, &LogsOptions{IO: ios, Conn: connTo(s.URL, ""), Execution: "plan-1", Stack: "stacks/app"})
	wantAPIError(t, err, 401, "logs: unauthenticated")
}

// TestLogsFollow: --follow prints bytes as they arrive, follows a restarted log into its new
// generation, and ends once the execution is finalized.
func TestLogsFollow(t *testing.T) {
	s := startOpServe(t)
	s.seed(t, opRunnerToken, "plan-1", "prod", api.ExecutionOpPlan, 7, true, seedStack{name: "stacks/app", class: api.Additive, log: "first\n"})
	var out, errOut testkit.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runLogs(context.Background(), &LogsOptions{IO: &IO{Out: &out, ErrOut: &errOut}, Conn: s.conn(opRunnerToken),
			Execution: "plan-1", Stack: "stacks/app", Follow: true, PollMin: 10 * time.Millisecond, PollMax: 40 * time.Millisecond})
	}()
	waitFor(t, "the first line", func() bool { return out.String() == "first\n" })
	s.post(t, api.LogChunk{ExecutionID: "plan-1", Stack: "stacks/app", Offset: 6, Data: []byte("second\n")})
	waitFor(t, "the second line", func() bool { return out.String() == "first\nsecond\n" })
	s.post(t, api.LogChunk{ExecutionID: "plan-1", Stack: "stacks/app", Offset: 13, GapLength: 100},
		api.LogChunk{ExecutionID: "plan-1", Stack: "stacks/app", Offset: 113, Data: []byte("after the gap\n")})
	waitFor(t, "the bytes after the gap", func() bool { return strings.HasSuffix(out.String(), "after the gap\n") })
	s.post(t, api.LogChunk{ExecutionID: "plan-1", Stack: "stacks/app", Generation: 1, Data: []byte("restarted\n")})
	waitFor(t, "the new generation", func() bool { return strings.HasSuffix(out.String(), "restarted\n") })
	select {
	case err := <-done:
		t.Fatalf("follow ended before the execution was finalized: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	// The last bytes and the finalize arrive together: they are printed before the end.
	s.post(t, api.LogChunk{ExecutionID: "plan-1", Stack: "stacks/app", Generation: 1, Offset: 10, Data: []byte("done\n")})
	r, err := s.client(t, opRunnerToken).FinalizeWithResponse(context.Background(), api.Finalize{ExecutionID: "plan-1", Status: api.ExecutionStatusSucceeded,
		Stacks: []api.StackResult{{Stack: "stacks/app", Status: api.StackStatusSucceeded, Class: api.Additive}}})
	if err != nil || r.StatusCode() != 200 {
		t.Fatalf("finalize: %v %s", err, r.Body)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not end after the execution was finalized")
	}
	if got := out.String(); got != "first\nsecond\nafter the gap\nrestarted\ndone\n" {
		t.Fatalf("stdout %q", got)
	}
	if got := errOut.String(); got != "[100 bytes missing]\n[log restarted: generation 1]\n" {
		t.Fatalf("stderr %q", got)
	}
}

// TestLogsFollowInterrupted: a signal ends --follow at once, silently, with 128+signal.
func TestLogsFollowInterrupted(t *testing.T) {
	s := startOpServe(t)
	s.seed(t, opRunnerToken, "plan-1", "prod", api.ExecutionOpPlan, 7, true, seedStack{name: "stacks/app", class: api.Additive, log: "first\n"})
	var out, errOut testkit.SyncBuffer
	sigs := make(chan os.Signal, 1)
	done := make(chan error, 1)
	go func() {
		done <- runLogs(context.Background(), &LogsOptions{IO: &IO{Out: &out, ErrOut: &errOut}, Conn: s.conn(opRunnerToken),
			Execution: "plan-1", Stack: "stacks/app", Follow: true, PollMin: time.Second, Signals: sigs})
	}()
	waitFor(t, "the first line", func() bool { return out.String() == "first\n" })
	sigs <- os.Interrupt
	select {
	case err := <-done:
		if ExitCode(err) != 130 || !errors.Is(err, ErrSilent) {
			t.Fatalf("err %v, exit %d: want a silent 130", err, ExitCode(err))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("follow did not stop on the signal")
	}
}

func TestLogsUsage(t *testing.T) {
	wantUsage(t, "accepts 2 arg", "logs", "e1")
	wantUsage(t, "--generation must not be negative", "logs", "e1", "s", "--generation", "-1")
	ios, _, _ := testIO()
	wantNoServer(t, "logs", runLogs(context.Background(), &LogsOptions{IO: ios, Conn: noServer, Execution: "x", Stack: "s"}))
}
