package runner

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
)

func clientRoundTripEvents() (events.Init, events.PhaseEvent, events.Update, events.LogChunk, events.Finalize) {
	at := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	in := events.Init{
		ExecutionID: "exec-1", Repo: "acme/infra", PR: 42, SHA: "deadbeef", Base: "main",
		Environment: "prod", Op: events.OpPlan, Actor: "octocat", RunURL: "https://ci.example/run/1",
		Stacks:    []string{"network", "cluster/a", "odd - name"},
		Edges:     []events.Edge{{From: "network", To: "cluster/a"}},
		Reasons:   []events.ChangeReason{{Stack: "network", Kind: events.ReasonUnmerged, Raw: "stack has unmerged changes"}},
		StartedAt: at,
	}
	ph := events.PhaseEvent{ExecutionID: "exec-1", Stack: "network", Phase: "plan", Status: "started", Seq: 1, At: at}
	up := events.Update{ExecutionID: "exec-1", Stack: "network", Seq: 2, Status: events.StackSucceeded,
		Class: events.ClassDestructive, Counts: events.Counts{Create: 1, Delete: 2}, PlanHash: "abc", Destructive: []string{"x.y"}, At: at}
	lc := events.LogChunk{ExecutionID: "exec-1", Stack: "network", Generation: 1, Offset: 0, Data: []byte("hello\x00\xff world\n")}
	fin := events.Finalize{ExecutionID: "exec-1", Status: events.ExecutionSucceeded, Class: events.ClassDestructive,
		Stacks: []events.StackResult{{Stack: "network", Status: events.StackSucceeded, Class: events.ClassDestructive, PlanHash: "abc"}}, FinishedAt: at}
	return in, ph, up, lc, fin
}

// TestClientRoundTrip sends every operation through the generated client and strict server
// interface and checks the server received exactly what was sent.
func TestClientRoundTrip(t *testing.T) {
	mem := newMemServer()
	srv := mem.start(t)
	c, err := NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Enabled() {
		t.Fatal("client with a URL must be enabled")
	}
	ctx := context.Background()
	in, ph, up, lc, fin := clientRoundTripEvents()

	if v := c.GateCheck(ctx, events.GateCheck{ExecutionID: "apply-0", Environment: "prod", PR: 42}); v.Kind != VerdictNotClassified || v.Allowed() {
		t.Fatalf("gate before finalize: %v", v)
	}
	for name, err := range map[string]error{
		"Init": c.Init(ctx, in), "Phase": c.Phase(ctx, ph), "Update": c.Update(ctx, up), "LogChunk": c.LogChunk(ctx, lc),
	} {
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	batch := []events.LogChunk{
		{ExecutionID: "exec-1", Stack: "network", Generation: 1, Offset: int64(len(lc.Data)), Data: []byte("more\n")},
		{ExecutionID: "exec-1", Stack: "cluster/a", Generation: 0, Offset: 0, Data: []byte("a\n")},
	}
	if err := c.LogChunks(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if err := c.Finalize(ctx, fin); err != nil {
		t.Fatal(err)
	}
	claims, err := c.ClaimsList(ctx, "acme/infra", "prod")
	if err != nil || len(claims) != 1 || claims[0].Stack != "network" || claims[0].PR != 42 {
		t.Fatalf("ClaimsList = %+v, %v", claims, err)
	}
	gc := events.GateCheck{ExecutionID: "apply-1", Environment: "prod", PR: 42, SHA: "deadbeef", Stacks: []events.StackPlan{{Stack: "network", PlanHash: "abc", Class: "mutating"}}}
	v := c.GateCheck(ctx, gc)
	if !v.Allowed() || v.Requester != mem.requester {
		t.Fatalf("GateCheck = %v", v)
	}
	gr := events.GateRevoke{ExecutionID: "apply-1", Environment: "prod", PR: 42, Requester: v.Requester, Outcome: "succeeded"}
	release := api.ClaimsRelease{Repo: "acme/infra", Environment: "prod", PR: 42, Stack: "network"}
	override := api.ChecksOverride{Repo: "acme/infra", PR: 42, Environment: "prod", Check: "tfstackplan/prod", Conclusion: "success", Reason: "hotfix"}
	satisfy := api.GatesSatisfy{Repo: "acme/infra", PR: 42, Environment: "prod", Class: "destructive", Target: "network", Reason: "approved in #ops", ExecutionID: "exec-1"}
	grantRelease := api.GrantsRelease{Repo: "acme/infra", PR: 42, Environment: "prod", Class: "destructive", Target: "network", Reason: "done"}
	steps := []struct {
		name string
		err  error
	}{
		{"GateRevoke", c.GateRevoke(ctx, gr)},
		{"ClaimsRelease", c.ClaimsRelease(ctx, release)},
		{"AdminChecksOverride", c.AdminChecksOverride(ctx, override)},
		{"AdminGatesSatisfy", c.AdminGatesSatisfy(ctx, satisfy)},
		{"AdminGrantsRelease", c.AdminGrantsRelease(ctx, grantRelease)},
		{"AdminExecutionsCancel", c.AdminExecutionsCancel(ctx, "exec-1", "wrong branch")},
	}
	for _, s := range steps {
		if s.err != nil {
			t.Fatalf("%s: %v", s.name, s.err)
		}
	}
	// After the cancel, the runner's next event is answered with cancel.
	err = c.Phase(ctx, events.PhaseEvent{ExecutionID: "exec-1", Stack: "network", Phase: "apply", Seq: 3})
	var ce *CancelledError
	if !errors.Is(err, ErrCancelRequested) || !errors.As(err, &ce) || ce.Reason != "wrong branch" {
		t.Fatalf("event after cancel: %v", err)
	}

	mem.mu.Lock()
	defer mem.mu.Unlock()
	check := func(name string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: server got\n%+v\nwant\n%+v", name, got, want)
		}
	}
	check("Init", mem.inits["exec-1"], in)
	check("Phase", mem.phases[0], ph)
	check("Update", mem.updates[0], up)
	check("LogChunk", mem.logs[0], lc)
	check("LogChunks", mem.logs[1:], batch)
	check("Finalize", mem.finals[0], fin)
	check("GateCheck", mem.checks[1], gc)
	check("GateRevoke", mem.revokes[0], gr)
	check("ClaimsRelease", mem.released[0], release)
	check("AdminChecksOverride", mem.overrides[0], override)
	check("AdminGatesSatisfy", mem.satisfied[0], satisfy)
	check("AdminGrantsRelease", mem.releases[0], grantRelease)
	check("AdminExecutionsCancel", mem.cancels["exec-1"], "wrong branch")
	if len(mem.claims) != 0 {
		t.Errorf("claims after release: %+v", mem.claims)
	}
	for _, a := range mem.auth {
		if a != "" {
			t.Fatalf("unauthenticated client sent Authorization %q", a)
		}
	}
}

// TestClientReadEndpoints exercises the read operations of the contract through the
// generated client, as the CLI and web page use them.
func TestClientReadEndpoints(t *testing.T) {
	mem := newMemServer()
	srv := mem.start(t)
	c, _ := NewClient(srv.URL)
	ctx := context.Background()
	in, _, _, lc, _ := clientRoundTripEvents()
	if err := c.Init(ctx, in); err != nil {
		t.Fatal(err)
	}
	if err := c.LogChunk(ctx, lc); err != nil {
		t.Fatal(err)
	}
	gen, err := api.NewClientWithResponses(srv.URL + "/api/v1")
	if err != nil {
		t.Fatal(err)
	}
	ex, err := gen.ExecutionGetWithResponse(ctx, "exec-1")
	if err != nil || ex.JSON200 == nil || len(ex.JSON200.Stacks) != 3 || ex.JSON200.Stacks[2].Stack != "odd - name" {
		t.Fatalf("ExecutionGet: %v %+v", err, ex)
	}
	missing, err := gen.ExecutionGetWithResponse(ctx, "nope")
	if err != nil || missing.StatusCode() != 404 || missing.JSONDefault == nil || missing.JSONDefault.Code != "NOT_FOUND" {
		t.Fatalf("ExecutionGet missing: %v %+v", err, missing)
	}
	list, err := gen.ExecutionsListWithResponse(ctx, &api.ExecutionsListParams{})
	if err != nil || list.JSON200 == nil || len(*list.JSON200) != 1 {
		t.Fatalf("ExecutionsList: %v %+v", err, list)
	}
	logs, err := gen.LogReadWithResponse(ctx, "exec-1", &api.LogReadParams{Stack: "network"})
	if err != nil || logs.JSON200 == nil || string(logs.JSON200.Data) != string(lc.Data) {
		t.Fatalf("LogRead: %v %+v", err, logs)
	}
	h, err := gen.HealthWithResponse(ctx)
	if err != nil || h.JSON200 == nil || h.JSON200.Status != "ok" {
		t.Fatalf("Health: %v %+v", err, h)
	}
}

func TestDisabledClient(t *testing.T) {
	c, err := NewClient("")
	if err != nil || c.Enabled() {
		t.Fatalf("NewClient(\"\") = %v, %v", c, err)
	}
	ctx := context.Background()
	in, ph, up, lc, fin := clientRoundTripEvents()
	errs := []error{
		c.Init(ctx, in), c.Phase(ctx, ph), c.Update(ctx, up), c.Updates(ctx, []events.Update{up}), c.LogChunk(ctx, lc), c.LogChunks(ctx, []events.LogChunk{lc}), c.Finalize(ctx, fin),
		c.GateRevoke(ctx, events.GateRevoke{ExecutionID: "x"}), c.ClaimsRelease(ctx, api.ClaimsRelease{Environment: "prod", PR: 1}),
		c.AdminChecksOverride(ctx, api.ChecksOverride{PR: 1}), c.AdminExecutionsCancel(ctx, "x", "r"),
		c.AdminGatesSatisfy(ctx, api.GatesSatisfy{PR: 1}), c.AdminGrantsRelease(ctx, api.GrantsRelease{PR: 1}),
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d on a disabled client: %v", i, err)
		}
	}
	claims, err := c.ClaimsList(ctx, "", "prod")
	if claims != nil || err != nil {
		t.Errorf("ClaimsList = %v, %v; want nil, nil", claims, err)
	}
	if v := c.GateCheck(ctx, events.GateCheck{}); !v.Allowed() || v.Kind != VerdictSatisfied {
		t.Errorf("ungated disabled GateCheck = %v", v)
	}
	c.gated = true
	if v := c.GateCheck(ctx, events.GateCheck{}); v.Allowed() || v.Kind != VerdictNotSatisfied || !errors.Is(v.Err, ErrGatedWithoutServer) {
		t.Errorf("gated disabled GateCheck = %v", v)
	}
	var nilClient *Client
	if nilClient.Enabled() {
		t.Error("nil client enabled")
	}
}

func TestNewClientRejectsMalformedURLs(t *testing.T) {
	for _, u := range []string{"://x", "ftp://host", "http://", "http://user:pw@host", "not a url", "http://host/?q=1", "http://[::1"} {
		if _, err := NewClient(u); err == nil {
			t.Errorf("NewClient(%q) accepted a malformed URL", u)
		} else if !strings.Contains(err.Error(), "server URL") {
			t.Errorf("NewClient(%q) error does not name the server URL: %v", u, err)
		}
	}
	for _, u := range []string{"http://127.0.0.1:8080", "https://tfstackplan.example.com/", "http://[::1]:9/prefix"} {
		if _, err := NewClient(u); err != nil {
			t.Errorf("NewClient(%q): %v", u, err)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := map[string]time.Duration{
		"": 0, "3": 3 * time.Second, "-1": 0, "junk": 0,
		now.Add(2 * time.Second).Format(http.TimeFormat): 2 * time.Second,
		now.Add(-time.Hour).Format(http.TimeFormat):      0,
	}
	for in, want := range cases {
		if got := parseRetryAfter(in, now); got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestBreakerOpensProbesAndCloses(t *testing.T) {
	now := time.Unix(0, 0)
	b := &breaker{threshold: 2, cooldown: time.Second, maxCooldown: 4 * time.Second, now: func() time.Time { return now }}
	if !b.allow() || b.failure() {
		t.Fatal("one failure must not open the breaker")
	}
	if !b.failure() || b.allow() {
		t.Fatal("two failures must open the breaker")
	}
	now = now.Add(1100 * time.Millisecond)
	if !b.allow() {
		t.Fatal("after the cool-down one probe goes through")
	}
	if b.allow() {
		t.Fatal("only one probe at a time")
	}
	b.failure() // failed probe doubles the cool-down
	now = now.Add(1500 * time.Millisecond)
	if b.allow() {
		t.Fatal("cool-down should have doubled to 2s")
	}
	now = now.Add(time.Second)
	if !b.allow() {
		t.Fatal("probe after the doubled cool-down")
	}
	b.success()
	if !b.allow() || !b.allow() {
		t.Fatal("a successful probe closes the breaker")
	}
	b.failure()
	b.failure()
	now = now.Add(1100 * time.Millisecond)
	if !b.allow() {
		t.Fatal("cool-down restarts at its base after a success")
	}
	b.settle()
	if b.allow() {
		t.Fatal("a settled probe reopens the breaker for a cool-down")
	}
}
