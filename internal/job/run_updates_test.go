package job

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server"
	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
	"github.com/tfstackplan/tfstackplan/runner"
)

// manyStacksPlan runs `run plan` over stacks s00..s<n-1> against client. The script writes
// a line to every stack's log, every plan but the last stack's (recorded plans of several classes), ticks the first
// early stacks done in one write to the tick file (so the relay sees them in one period or
// two), echoes the others as started, and ticks the last one failed.
func manyStacksPlan(t *testing.T, c *runner.Client, id string, n, early int) *Result {
	t.Helper()
	var stacks []string
	for i := range n {
		stacks = append(stacks, fmt.Sprintf("s%02d", i))
	}
	root := runRepo(t, stacks)
	kinds := []string{"create", "delete", "no-changes", "update"}
	plans := map[string][]byte{}
	for _, k := range kinds {
		plans[k] = recordedPlan(t, k)
	}
	stage := t.TempDir()
	return runPlanScripted(t, c, root, stacks, id, func(tickDir string, stdout io.Writer) error {
		now := time.Now().UnixNano()
		for i, s := range stacks {
			path := "stacks/prod/" + s
			if err := os.WriteFile(filepath.Join(root, path, runner.DefaultLogFile), []byte("planning "+s+"\n"), 0o644); err != nil {
				return err
			}
			if i == n-1 {
				fmt.Fprintf(stdout, "/%s (script:0 job:0.%d)> plan\n", path, i)
				recordTick(stage, runner.TickRecord{Stack: path, Phase: "plan", Status: "failed", At: now})
				continue
			}
			if err := os.WriteFile(filepath.Join(root, path, runner.DefaultPlanJSONFile), plans[kinds[i%len(kinds)]], 0o644); err != nil {
				return err
			}
			if i < early {
				recordTick(stage, runner.TickRecord{Stack: path, Phase: "done", Status: "succeeded", At: now})
			} else {
				fmt.Fprintf(stdout, "/%s (script:0 job:0.%d)> plan\n", path, i)
			}
		}
		ticks, err := os.ReadFile(filepath.Join(stage, tickFile))
		if err != nil {
			return err
		}
		f, err := os.OpenFile(filepath.Join(tickDir, tickFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.Write(ticks)
		return err
	})
}

// A 20-stack plan reports its stacks' updates in a few Updates requests (those classified in
// one relay period together, the rest together at the end), never one Update per stack, and
// the server holds every stack's update as the result says: its status, class, plan hash and
// destructive addresses, as stored before the Finalize (which would overwrite some of them).
func TestRunPlanBatchesUpdates(t *testing.T) {
	const n, early, id = 20, 15, "exec-batched"
	svc := service.New(storetest.OpenSQLite(t), nil)
	srv, err := server.New(server.Config{Service: svc, Auth: &auth.Authenticator{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	requests := map[string]int{}
	var beforeFinalize *api.Execution
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := strings.TrimPrefix(r.URL.Path, server.BasePath)
		mu.Lock()
		requests[op]++
		if op == "/events/finalize" && beforeFinalize == nil {
			beforeFinalize, _ = svc.Execution(r.Context(), service.Caller{Name: "test"}, id)
		}
		mu.Unlock()
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	c, err := runner.NewClient(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	res := manyStacksPlan(t, c, id, n, early)
	if len(res.Warnings) > 0 {
		t.Errorf("warnings: %v", res.Warnings)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("requests by path: %v", requests)
	// The early stacks' updates go with the relay's Phases request(s), at most one Updates each;
	// the others' in one request after terramate returns.
	if requests["/events/update"] != 0 || requests["/events/updates"] < 2 || requests["/events/updates"] > requests["/events/phases"]+1 ||
		requests["/events/updates"] > 3 {
		t.Errorf("requests %v: want no Update, and one Updates per relay period that classified stacks plus one", requests)
	}
	if beforeFinalize == nil {
		t.Fatal("the run did not finalize")
	}
	onServer := map[string]api.StackState{}
	for _, st := range beforeFinalize.Stacks {
		onServer[st.Stack] = st
	}
	classes := map[events.Class]int{}
	for _, e := range res.Stacks {
		st := onServer[e.Path]
		wantStatus := wireStatus(e.Status)
		if st.Status != wantStatus || st.Class != e.Class || st.PlanHash != e.PlanHash || st.Counts != e.Counts.Events() ||
			!slices.Equal(nonNilStrings(st.Destructive), e.Destructive) {
			t.Errorf("%s on the server before finalize: %s %s %q %+v %v; the run: %s %s %q %+v %v", e.Path,
				st.Status, st.Class, st.PlanHash, st.Counts, st.Destructive, wantStatus, e.Class, e.PlanHash, e.Counts.Events(), e.Destructive)
		}
		classes[e.Class]++
	}
	if len(res.Stacks) != n || res.Stacks[n-1].Status != StatusFailed || classes[events.ClassDestructive] == 0 || classes[events.ClassNoChanges] == 0 {
		t.Errorf("the run's stacks are not the mix this test needs: %d stacks, classes %v", len(res.Stacks), classes)
	}
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// Against a server without Updates, every stack's update still arrives, one a request.
func TestRunPlanUpdatesAnOlderServer(t *testing.T) {
	const n, early = 6, 3
	m, c := memClient(t)
	m.refuseUpdates = http.StatusForbidden
	res := manyStacksPlan(t, c, "exec-old", n, early)
	m.mu.Lock()
	defer m.mu.Unlock()
	got := map[string]events.StackStatus{}
	for _, u := range m.updates {
		got[u.Stack] = u.Status
	}
	for _, e := range res.Stacks {
		if got[e.Path] != wireStatus(e.Status) {
			t.Errorf("%s: the server's last update says %q, the run %q", e.Path, got[e.Path], e.Status)
		}
	}
	if m.requests["/events/updates"] != 1 || m.requests["/events/update"] != n {
		t.Errorf("requests %v, want one refused Updates, then one Update per stack", m.requests)
	}
}

// twoRunners serves the real server (SQLite) to two runner tokens, "mine" and "theirs", and
// returns a client for each and the requests it handled by path.
func twoRunners(t *testing.T) (mine, theirs *runner.Client, svc *service.Service, requests func() map[string]int) {
	t.Helper()
	a := &auth.Authenticator{}
	if err := a.ParseTokens("tokens.hcl", []byte(`
token "mine" {
  secret = "mine-secret-0123456789"
  roles  = ["runner"]
}
token "theirs" {
  secret = "theirs-secret-0123456789"
  roles  = ["runner"]
}
`)); err != nil {
		t.Fatal(err)
	}
	svc = service.New(storetest.OpenSQLite(t), nil)
	srv, err := server.New(server.Config{Service: svc, Auth: a})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[strings.TrimPrefix(r.URL.Path, server.BasePath)]++
		mu.Unlock()
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	for _, c := range []struct {
		c      **runner.Client
		secret string
	}{{&mine, "mine-secret-0123456789"}, {&theirs, "theirs-secret-0123456789"}} {
		if *c.c, err = runner.NewClientTokenSource(ts.URL, runner.StaticToken(c.secret)); err != nil {
			t.Fatal(err)
		}
	}
	return mine, theirs, svc, func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(seen)
	}
}

// Against a server that refuses the execution itself (another principal announced it), a
// refused batch is tried once alone to tell that from an older server, and the rest of it is
// not sent one by one to be refused again: each Phases or Updates call costs two requests,
// and the client still batches afterwards.
func TestClientBatchesRefusedForTheExecution(t *testing.T) {
	mine, theirs, _, requests := twoRunners(t)
	ctx := context.Background()
	stacks := []string{"a", "b", "c", "d"}
	if err := theirs.Init(ctx, events.Init{Repo: "acme/infra", ExecutionID: "x", Op: "plan", Environment: "prod", Stacks: stacks}); err != nil {
		t.Fatal(err)
	}
	var phases []events.PhaseEvent
	var updates []events.Update
	for i, s := range stacks {
		phases = append(phases, events.PhaseEvent{ExecutionID: "x", Stack: s, Phase: "plan", Seq: int64(i + 1)})
		updates = append(updates, events.Update{ExecutionID: "x", Stack: s, Status: events.StackSucceeded, Class: events.ClassNoChanges, Seq: int64(i + 1)})
	}
	for range 2 {
		if err := mine.Phases(ctx, phases); err == nil {
			t.Fatal("another principal's execution took my phases")
		}
		if err := mine.Updates(ctx, updates); err == nil {
			t.Fatal("another principal's execution took my updates")
		}
	}
	want := map[string]int{"/events/init": 1, "/events/phases": 2, "/events/phase": 2, "/events/updates": 2, "/events/update": 2}
	if got := requests(); !reflect.DeepEqual(got, want) {
		t.Fatalf("requests %v, want %v", got, want)
	}
}

// A run whose Init the server refuses (another principal announced the execution id) sends
// nothing more for it: no phases, updates, logs or Finalize, each of which would only be
// refused again. It says so once, and its own result is complete.
func TestRunRefusedExecutionSendsNothingMore(t *testing.T) {
	const n, early, id = 6, 3, "exec-theirs"
	mine, theirs, svc, requests := twoRunners(t)
	if err := theirs.Init(context.Background(), events.Init{Repo: "acme/infra", ExecutionID: id, Op: "plan", Environment: "prod", Stacks: []string{"stacks/prod/s00"}}); err != nil {
		t.Fatal(err)
	}
	res := manyStacksPlan(t, mine, id, n, early)
	if want := map[string]int{"/events/init": 2}; !reflect.DeepEqual(requests(), want) {
		t.Errorf("requests %v, want only the two Inits (theirs, and mine refused)", requests())
	}
	refusals := 0
	for _, w := range res.Warnings {
		if strings.Contains(w, "the server refused this execution") {
			refusals++
		}
		if strings.HasPrefix(w, "logs:") {
			t.Errorf("warning %q: the logs were not even tried", w)
		}
	}
	if refusals != 1 {
		t.Errorf("warnings %q: want the refusal said once", res.Warnings)
	}
	if len(res.Stacks) != n || res.Stacks[n-1].Status != StatusFailed || res.Stacks[0].Status != StatusSucceeded || res.Stacks[0].PlanHash == "" {
		t.Errorf("the run's own result is incomplete: %+v", res.Stacks)
	}
	e, err := svc.Execution(context.Background(), service.Caller{Name: "test"}, id)
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != "running" || len(e.Stacks) != 1 {
		t.Errorf("their execution changed: status %s, %d stacks", e.Status, len(e.Stacks))
	}
}

// An apply whose Init the server refused never asks the gate, and never applies: the refusal
// is doubt, and doubt denies. The run ends as a gate denial, its stacks not run.
func TestRunApplyRefusedExecutionDoesNotAskTheGate(t *testing.T) {
	const id = "exec-theirs-apply"
	mine, theirs, _, requests := twoRunners(t)
	if err := theirs.Init(context.Background(), events.Init{Repo: "acme/infra", ExecutionID: id, Op: "apply", Environment: "prod", Stacks: []string{"stacks/prod/a"}}); err != nil {
		t.Fatal(err)
	}
	stacks := []string{"a"}
	root := runRepo(t, stacks)
	planJSON := recordedPlan(t, "create")
	var scripts []string
	res := runScripted(t, mine, root, stacks, OpApply, id, func(script, _ string, stdout io.Writer) error {
		scripts = append(scripts, script)
		if script == "plan" {
			fmt.Fprintln(stdout, "/stacks/prod/a (script:0 job:0.0)> plan")
			return os.WriteFile(filepath.Join(root, "stacks/prod/a", runner.DefaultPlanJSONFile), planJSON, 0o644)
		}
		return nil
	})
	if res.Error == nil || res.Error.Kind != KindGate || !strings.Contains(res.Error.Tail, "refused") {
		t.Fatalf("error %+v, want a gate denial naming the refusal", res.Error)
	}
	if !slices.Equal(scripts, []string{"plan"}) {
		t.Errorf("scripts run: %v, want the plan only", scripts)
	}
	if got := requests(); got["/gates/check"] != 0 || got["/events/init"] != 2 {
		t.Errorf("requests %v: want the two Inits and no gate check", got)
	}
	if len(res.Stacks) != 1 || res.Stacks[0].Status != StatusNotRun {
		t.Errorf("stacks %+v, want a not run", res.Stacks)
	}
}

// Change reasons the server would refuse (a 2,000-byte file name, bytes that are not UTF-8, a
// module chain of 100 steps) are sent clipped, with a warning: before, they made the server
// refuse the whole Init, and the run went unreported.
func TestRunFitsChangeReasonsToTheServer(t *testing.T) {
	svc := service.New(storetest.OpenSQLite(t), nil)
	srv, err := server.New(server.Config{Service: svc, Auth: &auth.Authenticator{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	c, err := runner.NewClient(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	stacks := []string{"a", "b", "c"}
	longFile := "/" + strings.Repeat("d/", 1000) + "f.json"
	var steps []string
	for i := range 100 {
		steps = append(steps, fmt.Sprintf(`"../m%d"`, i))
	}
	base := scriptedTerramate(stacks, func(context.Context, io.Writer, io.Writer) error { return nil })
	exec := func(ctx context.Context, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
		if slices.Equal(args, []string{"list", "--changed", "--why"}) {
			fmt.Fprintf(stdout, "a - stack changed because watched file %q changed\n", longFile)
			fmt.Fprintf(stdout, "b - stack changed in a way \xff\xfe no one knows\n")
			fmt.Fprintf(stdout, "c - stack changed because %q changed because %s\n", "../m", strings.Join(steps, " changed because "))
			return nil
		}
		return base(ctx, name, args, dir, env, stdout, stderr)
	}
	root := runRepo(t, stacks)
	res := runPlanWith(t, c, root, exec, false)
	if w := strings.Join(res.Warnings, "\n"); !strings.Contains(w, "3 change reasons had texts the server does not take") ||
		strings.Contains(w, "not reported") {
		t.Errorf("warnings %q: want the three reasons clipped, and every report sent", res.Warnings)
	}
	ex, err := svc.Execution(context.Background(), service.Caller{Name: "test"}, res.Execution)
	if err != nil {
		t.Fatalf("the execution is not on the server: %v (warnings %q)", err, res.Warnings)
	}
	got := map[string]api.ChangeReason{}
	for _, st := range ex.Stacks {
		if len(st.Reasons) == 1 {
			got[st.Stack] = st.Reasons[0]
		}
	}
	a, b, cr := got["stacks/prod/a"], got["stacks/prod/b"], got["stacks/prod/c"]
	if a.Kind != string(events.ReasonWatchedFile) || len(a.Detail) > events.MaxReasonText || !strings.HasSuffix(a.Detail, "…") ||
		!strings.HasPrefix(longFile, strings.TrimSuffix(a.Detail, "…")) {
		t.Errorf("a's reason on the server: %s %q… (%d bytes)", a.Kind, firstN(a.Detail, 30), len(a.Detail))
	}
	if b.Raw != "stack changed in a way \uFFFD no one knows" {
		t.Errorf("b's reason on the server: %+v", b)
	}
	if len(cr.Chain) != events.MaxReasonChain || cr.Chain[0] != `"../m0"` || cr.Chain[events.MaxReasonChain-1] != "… 37 more steps" {
		t.Errorf("c's reason on the server: %d steps, %q", len(cr.Chain), cr.Chain)
	}
	// The result document keeps what terramate printed.
	for _, e := range res.Stacks {
		if e.Path == "stacks/prod/a" && (len(e.Why) != 1 || !strings.Contains(e.Why[0], longFile)) {
			t.Errorf("a's why in the result: %q", e.Why)
		}
	}
}

// endOfRunPlan runs `run plan` of execution id over stacks a and b against a SQLite control
// plane behind wrap (which sees every request and passes it on to next, or not), with the tick
// relay and the pump's coalescing at a minute: nothing but Init is sent before terramate
// returns. The script waits for Init to be stored, writes each stack's log and plan, ticks it
// done, and then calls atEnd. It returns the service and the result.
func endOfRunPlan(t *testing.T, id string, wrap func(w http.ResponseWriter, r *http.Request, next http.Handler), atEnd func()) (*service.Service, *Result) {
	t.Helper()
	svc := service.New(storetest.OpenSQLite(t), nil)
	srv, err := server.New(server.Config{Service: svc, Auth: &auth.Authenticator{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { wrap(w, r, srv) }))
	t.Cleanup(ts.Close)
	c, err := runner.NewClient(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	stacks := []string{"a", "b"}
	root := runRepo(t, stacks)
	planJSON := recordedPlan(t, "create")
	res := runScriptedWith(t, c, root, stacks, OpPlan, id, func(o *RunOptions) {
		o.TickRelay = time.Minute
		o.Pump.Coalesce = time.Minute
	}, func(_, tickDir string, stdout io.Writer) error {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if _, err := svc.Execution(context.Background(), service.Caller{Name: "test"}, id); err == nil {
				break
			}
			if time.Now().After(deadline) {
				return errors.New("Init did not arrive")
			}
		}
		for _, s := range stacks {
			dir := filepath.Join(root, "stacks/prod", s)
			fmt.Fprintf(stdout, "/stacks/prod/%s (script:0 job:0.0)> plan\n", s)
			if err := os.WriteFile(filepath.Join(dir, runner.DefaultLogFile), []byte("planning "+s+"\n"), 0o644); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, runner.DefaultPlanJSONFile), planJSON, 0o644); err != nil {
				return err
			}
			recordTick(tickDir, runner.TickRecord{Stack: "stacks/prod/" + s, Phase: "done", Status: "succeeded", At: time.Now().UnixNano()})
		}
		atEnd()
		return nil
	})
	return svc, res
}

// The pump's drain starts as soon as terramate returns: the last log posts reach the server
// while the tick relay's last round is still being handled, not after it. The server holds
// the Phases request until a log post arrives (see endOfRunPlan: nothing is posted before the
// end). A driver that drained the pump only after that round would have its Phases held until
// the test gives up.
func TestRunDrainsTheLogsWithTheRelaysLastRound(t *testing.T) {
	const id = "exec-drain-overlap"
	logPosted := make(chan struct{}, 1)
	var mu sync.Mutex
	var held []string // how each Phases request ended its wait
	svc, res := endOfRunPlan(t, id, func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		switch strings.TrimPrefix(r.URL.Path, server.BasePath) {
		case "/events/logs":
			select {
			case logPosted <- struct{}{}:
			default:
			}
		case "/events/phases":
			how := "a log post came"
			select {
			case <-logPosted:
			case <-time.After(3 * time.Second):
				how = "no log post within 3s"
			}
			mu.Lock()
			held = append(held, how)
			mu.Unlock()
		}
		next.ServeHTTP(w, r)
	}, func() {})
	if res.Error != nil || len(res.Warnings) > 0 {
		t.Fatalf("run: error %+v, warnings %v", res.Error, res.Warnings)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(held, []string{"a log post came"}) {
		t.Errorf("Phases requests: %q, want one, answered once a log post came", held)
	}
	for _, s := range []string{"a", "b"} {
		sl, err := svc.LogRead(context.Background(), service.Caller{Name: "test"}, id, "stacks/prod/"+s, 0, true, 0, 1<<20)
		if err != nil {
			t.Errorf("log of %s on the server: %v", s, err)
		} else if string(sl.Data) != "planning "+s+"\n" {
			t.Errorf("log of %s on the server: %q", s, sl.Data)
		}
	}
}

// A server that stops answering as the scripts end costs the run's end a bounded time: the
// tick relay's last round finds it dead (one call budget), and the pump's drain, started as
// terramate returned with the whole DrainBudget, is then cut to UnreachableDrainBudget instead
// of waiting out its budget against the black hole.
func TestRunDrainCutShortWhenTheServerDiesAtTheEnd(t *testing.T) {
	var dead atomic.Bool
	gone := make(chan struct{})
	defer close(gone) // before the server's Close (a cleanup), which waits for the handlers
	var scriptEnd time.Time
	_, res := endOfRunPlan(t, "exec-dies-at-end", func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if dead.Load() {
			select { // a black hole: the request is read, never answered
			case <-gone:
			case <-r.Context().Done():
			}
			return
		}
		next.ServeHTTP(w, r)
	}, func() {
		dead.Store(true)
		scriptEnd = time.Now()
	})
	end := time.Since(scriptEnd)
	if res.Error != nil {
		t.Fatalf("run error %+v", res.Error)
	}
	if len(res.Warnings) == 0 {
		t.Error("no warning about the server that stopped answering")
	}
	// The relay's last round: one call budget (with its retry); the drain then 200 ms; the
	// Finalize fails fast on the open breaker. Without the cut the drain alone takes 10 s.
	if bound := 2*runner.CallBudget + DrainBudget/4; end > bound {
		t.Errorf("the run took %v after the scripts ended against a dead server, bound %v (warnings %v)", end, bound, res.Warnings)
	}
	t.Logf("%v after the scripts ended; warnings %v", end, res.Warnings)
}

// oddStacks are stack directories whose paths the control plane does not take as names: bytes
// that are not UTF-8, a control character, a path over events.MaxNameLen bytes.
func oddStacks() []string {
	long := strings.Repeat("x", 250)
	return []string{"caf\xe9", "tab\there", strings.Join([]string{long, long, long, long, long}, "/")}
}

// A stack whose path the server does not take as a name is left out of what is reported,
// with a warning naming it; every other stack is reported as usual. Before, the server
// refused the whole Init and nothing of the run was reported.
func TestRunReportsTheStacksTheServerCanName(t *testing.T) {
	const id = "exec-odd-names"
	mine, _, svc, requests := twoRunners(t)
	stacks := append([]string{"a"}, oddStacks()...)
	root := runRepo(t, stacks)
	planJSON := recordedPlan(t, "create")
	// The run graph: a after caf\xe9.
	graph := func(o *RunOptions) {
		exec := o.Terramate.Exec
		o.Terramate.Exec = func(ctx context.Context, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
			if len(args) > 1 && args[0] == "experimental" {
				fmt.Fprintf(stdout, "digraph  {\n\tn1[label=\"/stacks/prod/a\"];\n\tn2[label=\"/stacks/prod/%s\"];\n\tn2 -> n1;\n}\n", stacks[1])
				return nil
			}
			return exec(ctx, name, args, dir, env, stdout, stderr)
		}
	}
	res := runScriptedWith(t, mine, root, stacks, OpPlan, id, graph, func(_, tickDir string, stdout io.Writer) error {
		for _, s := range stacks {
			dir := filepath.Join(root, "stacks/prod", s)
			fmt.Fprintf(stdout, "/stacks/prod/%s (script:0 job:0.0)> plan\n", s)
			recordTick(tickDir, runner.TickRecord{Stack: "stacks/prod/" + s, Phase: "plan", At: time.Now().UnixNano()})
			if err := os.WriteFile(filepath.Join(dir, runner.DefaultLogFile), []byte("planning "+s+"\n"), 0o644); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, runner.DefaultPlanJSONFile), planJSON, 0o644); err != nil {
				return err
			}
			recordTick(tickDir, runner.TickRecord{Stack: "stacks/prod/" + s, Phase: "done", Status: "succeeded", At: time.Now().UnixNano()})
		}
		return nil
	})
	if res.Error != nil {
		t.Fatalf("run: %+v", res.Error)
	}
	var left string
	for _, w := range res.Warnings {
		if strings.Contains(w, "not reported") || strings.HasPrefix(w, "logs:") {
			t.Errorf("warning %q: want everything else reported", w)
		}
		if strings.Contains(w, "names the server does not take") {
			left = w
		}
	}
	for _, want := range []string{`"stacks/prod/caf\xe9" is not valid UTF-8`, `"stacks/prod/tab\there" contains a control character`, `xxx…" is longer than 1024 bytes`, "3 stacks"} {
		if !strings.Contains(left, want) {
			t.Errorf("warning %q: want it to say %s", left, want)
		}
	}
	if len(res.Stacks) != len(stacks) {
		t.Fatalf("result has %d stacks, want %d", len(res.Stacks), len(stacks))
	}
	for _, e := range res.Stacks {
		if e.Status != StatusSucceeded || e.Class != events.ClassAdditive || e.PlanHash == "" {
			t.Errorf("result stack %q: %s %s %q, want each classified as usual", e.Path, e.Status, e.Class, e.PlanHash)
		}
	}
	ex, err := svc.Execution(context.Background(), service.Caller{Name: "test"}, id)
	if err != nil {
		t.Fatalf("the execution is not on the server: %v (warnings %q, requests %v)", err, res.Warnings, requests())
	}
	if ex.Status != "succeeded" || len(ex.Stacks) != 1 || ex.Stacks[0].Stack != "stacks/prod/a" ||
		ex.Stacks[0].Status != "succeeded" || ex.Stacks[0].Class != events.ClassAdditive {
		t.Errorf("on the server: status %s, stacks %+v; want stack a alone, succeeded and additive", ex.Status, ex.Stacks)
	}
	if len(res.Edges) != 1 || len(ex.Edges) != 0 || !ex.EdgesApproximate {
		t.Errorf("edges: %v in the result; %v on the server, approximate %v; want the edge left out there, and the graph marked approximate", res.Edges, ex.Edges, ex.EdgesApproximate)
	}
	logs, err := svc.LogRead(context.Background(), service.Caller{Name: "test"}, id, "stacks/prod/a", 0, true, 0, 0)
	if err != nil || !strings.Contains(string(logs.Data), "planning a") {
		t.Errorf("a's log on the server: %v, %+v", err, logs)
	}
}

// An apply that would change a stack the server cannot name never asks the gate, and never
// applies: the approval could not cover that stack.
func TestRunApplyDeniedForAStackTheServerCannotName(t *testing.T) {
	mine, _, _, requests := twoRunners(t)
	stacks := []string{"a", oddStacks()[0]}
	root := runRepo(t, stacks)
	planJSON := recordedPlan(t, "create")
	var scripts []string
	res := runScripted(t, mine, root, stacks, OpApply, "", func(script, _ string, stdout io.Writer) error {
		scripts = append(scripts, script)
		if script != "plan" {
			return nil
		}
		for _, s := range stacks {
			fmt.Fprintf(stdout, "/stacks/prod/%s (script:0 job:0.0)> plan\n", s)
			if err := os.WriteFile(filepath.Join(root, "stacks/prod", s, runner.DefaultPlanJSONFile), planJSON, 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if res.Error == nil || res.Error.Kind != KindGate || !strings.Contains(res.Error.Tail, `"stacks/prod/caf\xe9"`) {
		t.Fatalf("error %+v, want a gate denial naming the stack", res.Error)
	}
	if !slices.Equal(scripts, []string{"plan"}) {
		t.Errorf("scripts run: %v, want the plan only", scripts)
	}
	if got := requests(); got["/gates/check"] != 0 || got["/events/init"] != 1 || got["/events/finalize"] != 1 {
		t.Errorf("requests %v: want Init and Finalize, and no gate check", got)
	}
	for _, e := range res.Stacks {
		if e.Status != StatusNotRun {
			t.Errorf("stack %q %s, want not run", e.Path, e.Status)
		}
	}
}

// An Init the server answers 400 (here: a commit id longer than it takes) silences the
// execution as a refusal does: nothing more is sent, and the run does not spend its drain
// budget posting logs the server can only answer "no such execution".
func TestRunInvalidInitSendsNothingMore(t *testing.T) {
	mine, _, _, requests := twoRunners(t)
	stacks := []string{"a"}
	root := runRepo(t, stacks)
	planJSON := recordedPlan(t, "create")
	start := time.Now()
	res := runScriptedWith(t, mine, root, stacks, OpPlan, "", func(o *RunOptions) { o.SHA = strings.Repeat("f", 300) }, func(_, tickDir string, stdout io.Writer) error {
		dir := filepath.Join(root, "stacks/prod/a")
		fmt.Fprintln(stdout, "/stacks/prod/a (script:0 job:0.0)> plan")
		if err := os.WriteFile(filepath.Join(dir, runner.DefaultLogFile), []byte("planning a\n"), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, runner.DefaultPlanJSONFile), planJSON, 0o644); err != nil {
			return err
		}
		recordTick(tickDir, runner.TickRecord{Stack: "stacks/prod/a", Phase: "done", Status: "succeeded", At: time.Now().UnixNano()})
		return nil
	})
	took := time.Since(start)
	if res.Error != nil || len(res.Stacks) != 1 || res.Stacks[0].Class != events.ClassAdditive {
		t.Fatalf("run: error %+v, stacks %+v", res.Error, res.Stacks)
	}
	if want := map[string]int{"/events/init": 1}; !reflect.DeepEqual(requests(), want) {
		t.Errorf("requests %v, want only the Init (after %v)", requests(), took)
	}
	// The pump stops at once: its logs are not retried until the drain budget runs out.
	if w := strings.Join(res.Warnings, "\n"); !strings.Contains(w, "the server refused this execution") ||
		!strings.Contains(w, "sha is longer than 256 bytes") || strings.Contains(w, "logs:") {
		t.Errorf("warnings %q: want the refusal and its reason, and nothing said of the logs", res.Warnings)
	}
}

// The logs of run apply reach the server whole and apart: a log file an earlier run left in a
// stack is no part of this execution and is not posted, the plan script's log is, and the
// apply script's log goes on in the generations after the plan's. The server keeps the first
// copy of each (stack, generation, offset): an apply pump that numbered its generations from 0
// again had its log dropped as copies of the plan's.
func TestRunApplyLogsFollowThePlansOnTheServer(t *testing.T) {
	m, c := memClient(t)
	m.mu.Lock()
	m.inits["the-plan"] = api.Init{ExecutionID: "the-plan", PR: 5, Environment: "prod"}
	m.finals = append(m.finals, api.Finalize{ExecutionID: "the-plan"})
	m.mu.Unlock()
	stacks := []string{"a"}
	root := runRepo(t, stacks)
	dir := filepath.Join(root, "stacks/prod/a")
	logFile := filepath.Join(dir, runner.DefaultLogFile)
	if err := os.WriteFile(logFile, []byte("stale: the log of an earlier run\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	planJSON := recordedPlan(t, "create")
	// posted waits until the server has a chunk of stack a holding s (bounded).
	posted := func(s string) bool {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			m.mu.Lock()
			for _, lc := range m.logs {
				if strings.Contains(string(lc.Data), s) {
					m.mu.Unlock()
					return true
				}
			}
			m.mu.Unlock()
		}
		return false
	}
	res := runScripted(t, c, root, stacks, OpApply, "", func(script, _ string, stdout io.Writer) error {
		fmt.Fprintf(stdout, "/stacks/prod/a (script:0 job:0.0)> %s\n", script)
		if script == "plan" {
			if err := os.WriteFile(logFile, []byte("plan: the plan script's own log\n"), 0o644); err != nil {
				return err
			}
			if !posted("plan script") {
				return errors.New("the plan's log was not posted")
			}
			return os.WriteFile(filepath.Join(dir, runner.DefaultPlanJSONFile), planJSON, 0o644)
		}
		return os.WriteFile(logFile, []byte("apply: the apply script's own log\n"), 0o644)
	})
	if res.Error != nil || res.Gate == nil || !res.Gate.Allowed {
		t.Fatalf("run: error %+v, gate %+v", res.Error, res.Gate)
	}
	// The server's view: the first copy of each (generation, offset) wins.
	m.mu.Lock()
	kept := map[[2]int64]string{}
	for _, lc := range m.logs {
		k := [2]int64{lc.Generation, lc.Offset}
		if _, dup := kept[k]; !dup && lc.Stack == "stacks/prod/a" {
			kept[k] = string(lc.Data)
		}
	}
	m.mu.Unlock()
	var plan, apply []int64
	for k, data := range kept {
		switch {
		case strings.Contains(data, "stale"):
			t.Errorf("generation %d holds the earlier run's log: %q", k[0], data)
		case strings.Contains(data, "plan script"):
			plan = append(plan, k[0])
		case strings.Contains(data, "apply script"):
			apply = append(apply, k[0])
		}
	}
	if len(plan) != 1 || len(apply) != 1 || apply[0] <= plan[0] {
		t.Errorf("on the server: the plan's log in generations %v, the apply's in %v (all kept: %v); want one each, the apply's after", plan, apply, kept)
	}
}
