package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server"
	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// historyTokens are two runners, each limited to its own repository.
const historyTokens = `
token "mine" {
  secret       = "mine-secret-0123456789"
  repositories = ["acme/infra"]
  roles        = ["runner"]
}
token "theirs" {
  secret       = "theirs-secret-0123456789"
  repositories = ["acme/other"]
  roles        = ["runner"]
}
`

// historyServer is the real server on one store, over loopback, to a runner of acme/infra
// (mine) and one of acme/other (theirs), with the requests it handled by path.
type historyServer struct {
	mine, theirs *Client
	mu           sync.Mutex
	seen         map[string]int
}

// requests returns how many requests the server handled by path below the API's base.
func (h *historyServer) requests() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.seen)
}

// gets counts the requests that read one execution.
func (h *historyServer) gets() int {
	n := 0
	for p, c := range h.requests() {
		if strings.HasPrefix(p, "/executions/") {
			n += c
		}
	}
	return n
}

func newHistoryServer(t *testing.T, b storetest.Backend) *historyServer {
	t.Helper()
	a := &auth.Authenticator{}
	if err := a.ParseTokens("tokens.hcl", []byte(historyTokens)); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Service: service.New(b.Open(t), nil), Auth: a})
	if err != nil {
		t.Fatal(err)
	}
	h := &historyServer{seen: map[string]int{}}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.seen[strings.TrimPrefix(r.URL.Path, server.BasePath)]++
		h.mu.Unlock()
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	for _, c := range []struct {
		c      **Client
		secret string
	}{{&h.mine, "mine-secret-0123456789"}, {&h.theirs, "theirs-secret-0123456789"}} {
		if *c.c, err = NewClientTokenSource(ts.URL, StaticToken(c.secret)); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// forEachHistoryServer runs fn against a fresh server on every store backend.
func forEachHistoryServer(t *testing.T, fn func(t *testing.T, h *historyServer)) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) { fn(t, newHistoryServer(t, b)) })
	}
}

// ran is one stack of a seeded execution: its status and, when it took a time, its phase
// events that far apart; a succeeded stack is additive unless it destroys something.
type ran struct {
	stack       string
	status      events.StackStatus
	took        time.Duration
	destructive []string
}

// historyClock orders the seeded executions: each starts a minute after the one before, all
// within the two hours before now (the server keeps a started_at that recent).
type historyClock struct{ next time.Time }

func newHistoryClock() *historyClock {
	return &historyClock{next: time.Now().Add(-2 * time.Hour).Truncate(time.Second)}
}

// seed reports an execution as a runner does (Init, phases, updates and, unless status is
// running, Finalize), started a minute after the previous one.
func (hc *historyClock) seed(t *testing.T, c *Client, in events.Init, status events.ExecutionStatus, stacks ...ran) {
	t.Helper()
	ctx := context.Background()
	hc.next = hc.next.Add(time.Minute)
	in.StartedAt = hc.next
	in.Stacks = nil
	for _, s := range stacks {
		in.Stacks = append(in.Stacks, s.stack)
	}
	if err := c.Init(ctx, in); err != nil {
		t.Fatal(err)
	}
	var phases []events.PhaseEvent
	var updates []events.Update
	var results []events.StackResult
	for _, s := range stacks {
		if s.took > 0 {
			phases = append(phases,
				events.PhaseEvent{ExecutionID: in.ExecutionID, Stack: s.stack, Phase: "init", Seq: 1, At: in.StartedAt},
				events.PhaseEvent{ExecutionID: in.ExecutionID, Stack: s.stack, Phase: "plan", Seq: 2, At: in.StartedAt.Add(s.took)})
		}
		u := events.Update{ExecutionID: in.ExecutionID, Stack: s.stack, Seq: 3, Status: s.status}
		switch {
		case len(s.destructive) > 0:
			u.Class, u.Counts, u.Destructive = events.ClassDestructive, api.Counts{Delete: len(s.destructive)}, s.destructive
		case s.status == events.StackSucceeded:
			u.Class, u.Counts = events.ClassAdditive, api.Counts{Create: 1}
		}
		if s.status == events.StackSucceeded {
			u.PlanHash = "v1:" + in.ExecutionID + "/" + s.stack
		}
		updates = append(updates, u)
		if s.status != events.StackRunning && s.status != events.StackPending {
			results = append(results, events.StackResult{Stack: s.stack, Status: s.status, Class: u.Class, Counts: u.Counts, PlanHash: u.PlanHash})
		}
	}
	if err := c.Phases(ctx, phases); err != nil {
		t.Fatal(err)
	}
	if err := c.Updates(ctx, updates); err != nil {
		t.Fatal(err)
	}
	if status == events.ExecutionRunning {
		return
	}
	if err := c.Finalize(ctx, events.Finalize{ExecutionID: in.ExecutionID, Status: status, Stacks: results}); err != nil {
		t.Fatal(err)
	}
}

func prodPlan(id string, pr int) events.Init {
	return events.Init{ExecutionID: id, Repo: "acme/infra", Environment: "prod", Op: events.OpPlan, PR: pr}
}

func wantDurations(t *testing.T, got map[string]time.Duration, want map[string]time.Duration) {
	t.Helper()
	if !maps.Equal(got, want) {
		t.Fatalf("durations %v, want %v", got, want)
	}
}

// Each stack's duration comes from the newest finished plan that has one; an older plan fills
// only the stacks the newer ones left without (a skipped stack, a stack the newest did not
// name), and reading stops once every stack seen has one. Applies, running plans, another
// environment and another repository are not read.
func TestLastDurationsNewestFirstOlderFillTheGaps(t *testing.T) {
	forEachHistoryServer(t, func(t *testing.T, h *historyServer) {
		hc := newHistoryClock()
		s := events.StackSucceeded
		hc.seed(t, h.mine, prodPlan("p0", 1), events.ExecutionSucceeded, ran{"e", s, 5 * time.Second, nil})
		hc.seed(t, h.mine, prodPlan("p1", 2), events.ExecutionSucceeded,
			ran{"a", s, 10 * time.Second, nil}, ran{"b", s, 20 * time.Second, nil}, ran{"c", s, 30 * time.Second, nil}, ran{"d", s, 40 * time.Second, nil})
		hc.seed(t, h.mine, prodPlan("p2", 3), events.ExecutionFailed,
			ran{"a", s, 11*time.Second + 250*time.Millisecond, nil}, ran{"b", events.StackFailed, 21 * time.Second, nil}, ran{"c", events.StackSkipped, 0, nil})
		apply := prodPlan("a1", 3)
		apply.Op = events.OpApply
		hc.seed(t, h.mine, apply, events.ExecutionSucceeded, ran{"a", s, 99 * time.Second, nil})
		dev := prodPlan("dev1", 3)
		dev.Environment = "dev"
		hc.seed(t, h.mine, dev, events.ExecutionSucceeded, ran{"a", s, 98 * time.Second, nil})
		hc.seed(t, h.mine, prodPlan("p3", 4), events.ExecutionRunning, ran{"a", s, 97 * time.Second, nil})
		hc.seed(t, h.theirs, events.Init{ExecutionID: "o1", Repo: "acme/other", Environment: "prod", Op: events.OpPlan, PR: 3},
			events.ExecutionSucceeded, ran{"a", s, 96 * time.Second, nil}, ran{"z", s, 95 * time.Second, nil})

		got, err := h.mine.LastDurations(context.Background(), "acme/infra", "prod", nil)
		if err != nil {
			t.Fatal(err)
		}
		wantDurations(t, got, map[string]time.Duration{"a": 11*time.Second + 250*time.Millisecond, "b": 21 * time.Second, "c": 30 * time.Second, "d": 40 * time.Second})
		if n := h.gets(); n != 2 {
			t.Fatalf("%d executions read, want 2 (p2, then p1 for c; p0 not needed): %v", n, h.requests())
		}
		// With the stacks the caller needs, the read stops once they all have one: a alone is
		// in the newest plan; e, which only the oldest plan timed, takes all three.
		for _, c := range []struct {
			want  []string
			reads int
		}{{[]string{"a"}, 1}, {[]string{"a", "d"}, 2}, {[]string{"a", "e"}, 3}} {
			before := h.gets()
			got, err := h.mine.LastDurations(context.Background(), "acme/infra", "prod", c.want)
			if err != nil {
				t.Fatal(err)
			}
			if n := h.gets() - before; n != c.reads || got["a"] != 11*time.Second+250*time.Millisecond {
				t.Errorf("want %v: %d executions read (want %d), durations %v", c.want, n, c.reads, got)
			}
		}
		// The repository left to the server is the principal's own.
		got, err = h.theirs.LastDurations(context.Background(), "", "prod", nil)
		if err != nil {
			t.Fatal(err)
		}
		wantDurations(t, got, map[string]time.Duration{"a": 96 * time.Second, "z": 95 * time.Second})
		// Another repository's durations are refused, not mixed in.
		if got, err := h.theirs.LastDurations(context.Background(), "acme/infra", "prod", nil); err == nil || len(got) != 0 {
			t.Fatalf("acme/other's runner read acme/infra's durations: %v, %v", got, err)
		}
		if _, err := h.mine.LastDurations(context.Background(), "acme/infra", "", nil); err == nil || !strings.Contains(err.Error(), "environment") {
			t.Fatalf("no environment: %v", err)
		}
	})
}

// LastDurations reads at most MaxDurationExecutions executions: a stack that no plan among them
// timed stays unknown even when an older one did.
func TestLastDurationsReadsAtMostTheCap(t *testing.T) {
	forEachHistoryServer(t, func(t *testing.T, h *historyServer) {
		hc := newHistoryClock()
		hc.seed(t, h.mine, prodPlan("old", 1), events.ExecutionSucceeded, ran{"x", events.StackSucceeded, 3 * time.Second, nil})
		for i := range MaxDurationExecutions + 1 {
			hc.seed(t, h.mine, prodPlan(fmt.Sprintf("p%d", i), 1), events.ExecutionSucceeded,
				ran{"x", events.StackSkipped, 0, nil}, ran{"y", events.StackSucceeded, time.Duration(i+1) * time.Second, nil})
		}
		got, err := h.mine.LastDurations(context.Background(), "", "prod", nil)
		if err != nil {
			t.Fatal(err)
		}
		wantDurations(t, got, map[string]time.Duration{"y": time.Duration(MaxDurationExecutions+1) * time.Second})
		if n := h.gets(); n != MaxDurationExecutions {
			t.Fatalf("%d executions read, want %d", n, MaxDurationExecutions)
		}
	})
}

// A disabled client answers without a request: no durations, no error; no latest execution.
func TestHistoryReadsOfADisabledClient(t *testing.T) {
	c, err := NewClient("")
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.LastDurations(context.Background(), "acme/infra", "prod", nil)
	if got != nil || err != nil {
		t.Fatalf("disabled: %v, %v", got, err)
	}
	if x, err := c.LatestExecution(context.Background(), "acme/infra", "prod", 1, "plan"); x != nil || !errors.Is(err, ErrDisabled) {
		t.Fatalf("disabled: %v, %v", x, err)
	}
}

// A server that refuses connections costs a call its attempts and opens the breaker; the next
// call fails at once without a request. A server that never answers costs no more than the
// budget.
func TestLastDurationsOfADownServerIsBounded(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		c, err := NewClient("http://" + addr)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.LastDurations(context.Background(), "acme/infra", "prod", nil)
		var te *TransportError
		if len(got) != 0 || !errors.As(err, &te) {
			t.Fatalf("down server: %v, %v", got, err)
		}
		if !c.Unreachable() {
			t.Fatal("the breaker is closed after a refused read")
		}
		if _, err := c.LastDurations(context.Background(), "acme/infra", "prod", nil); !errors.Is(err, ErrCircuitOpen) {
			t.Fatalf("with the breaker open: %v", err)
		}
		if _, err := c.LatestExecution(context.Background(), "acme/infra", "prod", 1, "plan"); !errors.Is(err, ErrCircuitOpen) {
			t.Fatalf("with the breaker open: %v", err)
		}
	})
	t.Run("silent", func(t *testing.T) {
		release := make(chan struct{})
		var mu sync.Mutex
		arrived := 0
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			arrived++
			mu.Unlock()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		t.Cleanup(ts.Close)
		t.Cleanup(func() { close(release) })
		c, err := NewClient(ts.URL)
		if err != nil {
			t.Fatal(err)
		}
		c.historyBudget = 300 * time.Millisecond
		start := time.Now()
		_, err = c.LastDurations(context.Background(), "acme/infra", "prod", nil)
		took := time.Since(start)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("silent server: %v", err)
		}
		// A bound, not a speed: the budget is 300 ms, and no retry outlives it.
		if took > 5*time.Second {
			t.Fatalf("the read took %v with a budget of %v", took, c.historyBudget)
		}
		mu.Lock()
		defer mu.Unlock()
		if arrived != 1 {
			t.Fatalf("%d requests within the budget, want the one attempt it had time for", arrived)
		}
	})
}

// LatestExecution returns the PR's newest execution of the op asked for in the environment,
// with its stacks (status, class, counts, plan hash, destructive addresses, durations of the
// ended ones) and edges, whatever its status; another PR, environment, op or repository is not
// it, and none is ErrNoExecution.
func TestLatestExecutionOfAPR(t *testing.T) {
	forEachHistoryServer(t, func(t *testing.T, h *historyServer) {
		hc := newHistoryClock()
		ctx := context.Background()
		s := events.StackSucceeded
		hc.seed(t, h.mine, prodPlan("p1", 7), events.ExecutionSucceeded, ran{"a", s, time.Second, nil})
		latest := prodPlan("p2", 7)
		latest.Edges = []events.Edge{{From: "a", To: "b"}}
		hc.seed(t, h.mine, latest, events.ExecutionFailed,
			ran{"a", s, 2 * time.Second, []string{"aws_db.main"}}, ran{"b", events.StackFailed, 3 * time.Second, nil},
			ran{"c", events.StackRunning, time.Second, nil})
		apply := prodPlan("a1", 7)
		apply.Op = events.OpApply
		hc.seed(t, h.mine, apply, events.ExecutionSucceeded, ran{"a", s, time.Second, nil})
		dev := prodPlan("dev1", 7)
		dev.Environment = "dev"
		hc.seed(t, h.mine, dev, events.ExecutionSucceeded, ran{"a", s, time.Second, nil})
		hc.seed(t, h.mine, prodPlan("p8", 8), events.ExecutionSucceeded, ran{"a", s, time.Second, nil})
		hc.seed(t, h.theirs, events.Init{ExecutionID: "o1", Repo: "acme/other", Environment: "prod", Op: events.OpPlan, PR: 7},
			events.ExecutionSucceeded, ran{"z", s, time.Second, nil})

		x, err := h.mine.LatestExecution(ctx, "acme/infra", "prod", 7, "plan")
		if err != nil {
			t.Fatal(err)
		}
		if x.ExecutionID != "p2" || x.Status != api.ExecutionStatusFailed || len(x.Edges) != 1 || x.Edges[0] != (api.Edge{From: "a", To: "b"}) {
			t.Fatalf("latest plan %s (%s), edges %v; want p2, failed, a → b", x.ExecutionID, x.Status, x.Edges)
		}
		byName := map[string]api.StackState{}
		for _, st := range x.Stacks {
			byName[st.Stack] = st
		}
		a, b, c := byName["a"], byName["b"], byName["c"]
		if len(byName) != 3 || a.Status != api.StackStatusSucceeded || a.Class != api.Destructive || a.PlanHash != "v1:p2/a" ||
			a.Counts.Delete != 1 || len(a.Destructive) != 1 || a.Destructive[0] != "aws_db.main" || b.Status != api.StackStatusFailed {
			t.Fatalf("stacks %+v", x.Stacks)
		}
		if a.DurationMS == nil || *a.DurationMS != 2000 || b.DurationMS == nil || *b.DurationMS != 3000 || c.DurationMS != nil {
			t.Fatalf("durations a %v, b %v, c %v; want 2000, 3000 and none for the stack that did not end", a.DurationMS, b.DurationMS, c.DurationMS)
		}
		if x, err := h.mine.LatestExecution(ctx, "", "prod", 7, "apply"); err != nil || x.ExecutionID != "a1" {
			t.Fatalf("latest apply: %v, %v", x, err)
		}
		if x, err := h.mine.LatestExecution(ctx, "acme/infra", "prod", 9, "plan"); !errors.Is(err, ErrNoExecution) || x != nil {
			t.Fatalf("a PR without executions: %v, %v", x, err)
		}
		if x, err := h.mine.LatestExecution(ctx, "acme/infra", "dev", 7, "apply"); !errors.Is(err, ErrNoExecution) || x != nil {
			t.Fatalf("no apply in dev: %v, %v", x, err)
		}
		// Another repository's runner gets its own execution, never acme/infra's.
		if x, err := h.theirs.LatestExecution(ctx, "", "prod", 7, "plan"); err != nil || x.ExecutionID != "o1" {
			t.Fatalf("acme/other's latest plan: %v, %v", x, err)
		}
		var ae *APIError
		if x, err := h.theirs.LatestExecution(ctx, "acme/infra", "prod", 7, "plan"); x != nil || !errors.As(err, &ae) || ae.StatusCode != http.StatusForbidden {
			t.Fatalf("acme/other's runner reading acme/infra: %v, %v", x, err)
		}
		for _, bad := range []struct {
			env, op string
			pr      int
			says    string
		}{{"", "plan", 7, "environment"}, {"prod", "plan", 0, "pr 0"}, {"prod", "destroy", 7, `"destroy"`}} {
			if _, err := h.mine.LatestExecution(ctx, "", bad.env, bad.pr, bad.op); err == nil || !strings.Contains(err.Error(), bad.says) {
				t.Fatalf("%+v: %v", bad, err)
			}
		}
	})
}

// An execution of the op asked for behind a page of the PR's other executions is found on the
// next page. (An apply: the latest plan is the server's own answer, GET /plans/latest, with no
// list read at all.)
func TestLatestExecutionBehindAPage(t *testing.T) {
	h := newHistoryServer(t, storetest.Backends()[0])
	hc := newHistoryClock()
	s := events.StackSucceeded
	old := prodPlan("a-old", 5)
	old.Op = events.OpApply
	hc.seed(t, h.mine, old, events.ExecutionSucceeded, ran{"a", s, time.Second, nil})
	for i := range historyPage + 3 {
		hc.seed(t, h.mine, prodPlan(fmt.Sprintf("p%02d", i), 5), events.ExecutionSucceeded, ran{"a", s, time.Second, nil})
	}
	x, err := h.mine.LatestExecution(context.Background(), "", "prod", 5, "apply")
	if err != nil || x.ExecutionID != "a-old" {
		t.Fatalf("latest apply behind %d plans: %v, %v", historyPage+3, x, err)
	}
	if n := h.requests()["/executions"]; n != 2 {
		t.Fatalf("%d list requests, want 2", n)
	}
	x, err = h.mine.LatestExecution(context.Background(), "", "prod", 5, "plan")
	if err != nil || x.ExecutionID != fmt.Sprintf("p%02d", historyPage+2) {
		t.Fatalf("latest plan: %v, %v", x, err)
	}
	if n := h.requests()["/executions"]; n != 2 {
		t.Fatalf("%d list requests after the plan's read, want still 2", n)
	}
}

// An execution of thousands of stacks, a larger answer than MaxResponseBytes, is read whole.
func TestLatestExecutionOfThousandsOfStacks(t *testing.T) {
	h := newHistoryServer(t, storetest.Backends()[0])
	// The answer is megabytes: time enough to build it on a busy test machine.
	h.mine.callBudget, h.mine.attemptTimeout, h.mine.historyBudget = time.Minute, time.Minute, time.Minute
	stacks := make([]ran, 5000)
	for i := range stacks {
		stacks[i] = ran{fmt.Sprintf("stacks/service-%05d/production/eu-west-1", i), events.StackSucceeded, time.Second, nil}
	}
	newHistoryClock().seed(t, h.mine, prodPlan("big", 3), events.ExecutionSucceeded, stacks...)
	x, err := h.mine.LatestExecution(context.Background(), "", "prod", 3, "plan")
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(x)
	if err != nil {
		t.Fatal(err)
	}
	if len(x.Stacks) != len(stacks) || len(b) <= MaxResponseBytes {
		t.Fatalf("read %d stacks in %d bytes, want %d stacks in more than %d bytes", len(x.Stacks), len(b), len(stacks), MaxResponseBytes)
	}
}

// The latest plan is the one the server received last: a plan whose runner's clock ran ahead
// does not hide a plan that came after it (issue 37 item 7), and an apply is still the newest
// listed.
func TestLatestPlanIsTheOneReceivedLast(t *testing.T) {
	forEachHistoryServer(t, func(t *testing.T, h *historyServer) {
		hc := newHistoryClock()
		ctx := context.Background()
		s := events.StackSucceeded
		hc.next = time.Now().Add(4 * time.Minute).Truncate(time.Second) // the first runner's clock is ahead
		hc.seed(t, h.mine, prodPlan("ahead", 7), events.ExecutionSucceeded, ran{"a", s, time.Second, nil})
		hc.next = time.Now().Add(-time.Hour).Truncate(time.Second)
		hc.seed(t, h.mine, prodPlan("after", 7), events.ExecutionSucceeded, ran{"a", s, time.Second, nil})
		x, err := h.mine.LatestExecution(ctx, "acme/infra", "prod", 7, "plan")
		if err != nil || x.ExecutionID != "after" {
			t.Fatalf("latest plan: %v, %v; want the plan received last, after", x, err)
		}
		if x, err := h.mine.LatestPlan(ctx, "acme/infra", "prod", 7); err != nil || x.ExecutionID != "after" {
			t.Fatalf("LatestPlan: %v, %v", x, err)
		}
		if _, err := h.mine.LatestPlan(ctx, "acme/infra", "prod", 8); !isNotFound(err) {
			t.Fatalf("a PR without a plan: %v, want 404", err)
		}
	})
}
