package service

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/notify"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// received is one request a test receiver took, its signature checked as a receiver checks it.
type received struct {
	event, delivery string
	body            []byte
	signed          bool
}

// receiver is a loopback webhook receiver; answer decides each request's fate (nil: 200).
type receiver struct {
	*httptest.Server
	secret []byte
	mu     sync.Mutex
	got    []received
	answer func(n int, r received) int
}

func newReceiver(t *testing.T, secret string) *receiver {
	rc := &receiver{secret: []byte(secret)}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		// What a receiver does: the HMAC-SHA256 of the raw body under the shared secret, hex,
		// compared in constant time with the header.
		m := hmac.New(sha256.New, rc.secret)
		m.Write(body)
		want := "sha256=" + hex.EncodeToString(m.Sum(nil))
		got := received{event: r.Header.Get("X-Tfstackplan-Event"), delivery: r.Header.Get("X-Tfstackplan-Delivery"), body: body,
			signed: hmac.Equal([]byte(want), []byte(r.Header.Get("X-Tfstackplan-Signature-256"))) && r.Header.Get("Content-Type") == "application/json"}
		rc.mu.Lock()
		rc.got = append(rc.got, got)
		n := len(rc.got)
		answer := rc.answer
		rc.mu.Unlock()
		code := http.StatusOK
		if answer != nil {
			code = answer(n, got)
		}
		if code == 0 { // hang past the worker's timeout
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			return
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}

// notifyFixture is a service whose policy has one notify block per format toward rc.
func notifyFixture(t *testing.T, b storetest.Backend, rc *receiver, format string) *fixture {
	t.Setenv("TFSTACKPLAN_NOTIFY_TEST_SECRET", string(rc.secret))
	p, err := ParsePolicy("policy.hcl", []byte(testPolicy+`
notify "ops" {
  url        = "`+rc.URL+`/hook"
  secret_env = "TFSTACKPLAN_NOTIFY_TEST_SECRET"
  format     = "`+format+`"
}
`))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{Service: New(b.Open(t), p), t: t, now: time.Now().UTC().Truncate(time.Second)}
	f.Now = func() time.Time { return f.now }
	f.ExternalURL = "https://tfstackplan.example.com/"
	return f
}

// deliver runs a worker until every delivery ended (or the test's patience did).
func (f *fixture) deliver(timeout time.Duration) []store.Delivery {
	f.t.Helper()
	ob := f.Store.(store.Outbox)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	start, base := time.Now(), f.now
	w := &notify.Worker{Now: func() time.Time { return base.Add(time.Since(start)) }, Store: ob, Targets: f.Policy.Notify, Timeout: 300 * time.Millisecond, Poll: 20 * time.Millisecond,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond }}
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ds, err := ob.Deliveries(ctx, store.DeliveryFilter{Status: store.DeliveryPending})
		f.must(err)
		if len(ds) == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	ds, err := ob.Deliveries(ctx, store.DeliveryFilter{Limit: 500})
	f.must(err)
	return ds
}

// TestNotifySignedRetriedWithOneDeliveryID: a plan waiting for its gate is delivered signed;
// after a 503 and an attempt that got no answer in time, the third attempt carries the same
// delivery id and body, and its 2xx ends the delivery.
func TestNotifySignedRetriedWithOneDeliveryID(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			rc := newReceiver(t, "s3cret-key-for-tests")
			rc.answer = func(n int, r received) int {
				switch n {
				case 1:
					return http.StatusServiceUnavailable
				case 2:
					return 0
				}
				return http.StatusNoContent
			}
			f := notifyFixture(t, b, rc, notify.FormatJSON)
			f.plan("p1", "prod", 7, "abc", map[string]api.Class{"db": "destructive", "net": "additive"})
			ds := f.deliver(20 * time.Second)
			if len(ds) != 1 || ds[0].Status != store.DeliveryDelivered || ds[0].Attempts != 3 || ds[0].LastStatus != 204 || ds[0].Event != notify.GateWaiting {
				t.Fatalf("deliveries %+v", ds)
			}
			got := rc.requests()
			if len(got) != 3 {
				t.Fatalf("%d requests, want 3", len(got))
			}
			for _, r := range got {
				if !r.signed || r.delivery != ds[0].Delivery || r.event != notify.GateWaiting || string(r.body) != string(got[0].body) {
					t.Fatalf("request %+v, want signed, delivery %s, the same body", r, ds[0].Delivery)
				}
			}
			var p struct {
				Event, Delivery, Repository, Environment, ExecutionID, URL string
				PR                                                         int
				Data                                                       notify.GateWaitingData
			}
			if err := json.Unmarshal(got[0].body, &p); err != nil {
				t.Fatal(err)
			}
			if p.Repository != testRepo || p.Environment != "prod" || p.PR != 7 || p.Delivery != ds[0].Delivery ||
				len(p.Data.Gates) != 1 || p.Data.Gates[0].Class != "destructive" || len(p.Data.Commands) != 1 {
				t.Fatalf("payload %s", got[0].body)
			}
			var raw map[string]any
			_ = json.Unmarshal(got[0].body, &raw)
			if raw["execution_id"] != "p1" || raw["url"] != "https://tfstackplan.example.com/ui/executions/p1" {
				t.Fatalf("payload %s: want execution_id p1 and its page", got[0].body)
			}
			// A tampered body fails the receiver's check.
			if notify.Verify(rc.secret, append(got[0].body, ' '), notify.Signature(rc.secret, got[0].body)) {
				t.Fatal("a changed body verified")
			}
		})
	}
}

// TestNotifyEventsOfApprovalsAppliesAndStaleness: gate.approved, apply.succeeded, apply.denied
// (an apply whose gate check was refused), apply.failed and execution.stale, each once.
func TestNotifyEventsOfApprovalsAppliesAndStaleness(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			rc := newReceiver(t, "another-secret")
			f := notifyFixture(t, b, rc, notify.FormatJSON)
			f.plan("p1", "prod", 7, "abc", map[string]api.Class{"db": "destructive"})
			// Denied: no grant yet.
			_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "a1", Environment: "prod", Op: "apply", PR: 7, SHA: "abc", Stacks: []string{"db"}})
			f.must(err)
			_, err = f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "a1", Environment: "prod", PR: 7, SHA: "abc", Stacks: []api.StackPlan{{Stack: "db", PlanHash: "h-db"}}})
			wantErr(t, err, store.ErrDenied, "")
			_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "a1", Status: "failed", Error: "the gate did not allow the apply"})
			f.must(err)
			_, err = f.SatisfyGate(ctx, adminOf("alice"), &api.GatesSatisfy{Environment: "prod", PR: 7, Class: "destructive", Target: "**", ExecutionID: "p1", Reason: "reviewed"})
			f.must(err)
			for id, status := range map[string]api.ExecutionStatus{"a2": "succeeded", "a3": "failed"} {
				_, err = f.Init(ctx, runner, &api.Init{ExecutionID: id, Environment: "prod", Op: "apply", PR: 7, SHA: "abc", Stacks: []string{"db"}})
				f.must(err)
				_, err = f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: id, Environment: "prod", PR: 7, SHA: "abc", Stacks: []api.StackPlan{{Stack: "db", PlanHash: "h-db"}}})
				f.must(err)
				_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: id, Status: status, Stacks: []api.StackResult{{Stack: "db", Status: api.StackStatus(status)}}})
				f.must(err)
			}
			_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "quiet", Environment: "dev", Op: "plan", PR: 8, Stacks: []string{"x"}})
			f.must(err)
			f.now = f.now.Add(time.Hour)
			n, err := f.SweepStale(ctx, 10*time.Minute, 10)
			f.must(err)
			if n != 1 {
				t.Fatalf("swept %d", n)
			}
			ds := f.deliver(20 * time.Second)
			var got []string
			for _, d := range ds {
				if d.Status != store.DeliveryDelivered {
					t.Errorf("delivery %+v not delivered", d)
				}
				got = append(got, d.Event+":"+d.ExecutionID)
			}
			sort.Strings(got)
			want := "[apply.denied:a1 apply.failed:a3 apply.succeeded:a2 execution.stale:quiet gate.approved:p1 gate.waiting:p1]"
			if fmt.Sprint(got) != want {
				t.Fatalf("events %v, want %s", got, want)
			}
			for _, r := range rc.requests() {
				if r.event == notify.GateApproved && !strings.Contains(string(r.body), `"by":"alice"`) {
					t.Fatalf("gate.approved %s does not name the approver", r.body)
				}
			}
		})
	}
}

// TestNotifyDriftOncePerChange: drift.detected when a stack goes from not drifted to drifted,
// drift.resolved back, nothing on the drift runs that change nothing.
func TestNotifyDriftOncePerChange(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			rc := newReceiver(t, "drift-secret")
			f := notifyFixture(t, b, rc, notify.FormatJSON)
			ok := func(stack string) api.StackResult {
				return api.StackResult{Stack: stack, Status: "succeeded", Class: "no-changes"}
			}
			drifted := func(stack string) api.StackResult {
				return api.StackResult{Stack: stack, Status: "succeeded", Class: "mutating", Drifted: true}
			}
			failed := func(stack string) api.StackResult { return api.StackResult{Stack: stack, Status: "failed"} }
			f.drift("d1", ok("a"), ok("b"))
			f.drift("d2", drifted("a"), ok("b"))      // a detected
			f.drift("d3", drifted("a"), ok("b"))      // nothing
			f.drift("d4", failed("a"), drifted("b"))  // b detected; a's failed check says nothing
			f.drift("d5", drifted("a"), drifted("b")) // nothing
			f.drift("d6", ok("a"), ok("b"))           // a and b resolved
			f.drift("d7", ok("a"), ok("b"))           // nothing
			ds := f.deliver(20 * time.Second)
			var got []string
			for i := len(ds) - 1; i >= 0; i-- {
				var p struct{ Data notify.DriftData }
				_ = json.Unmarshal(ds[i].Body, &p)
				got = append(got, ds[i].Event+":"+ds[i].ExecutionID+":"+strings.Join(p.Data.Stacks, ","))
			}
			want := "drift.detected:d2:a drift.detected:d4:b drift.resolved:d6:a,b"
			if strings.Join(got, " ") != want {
				t.Fatalf("events %q, want %q", strings.Join(got, " "), want)
			}
			if n := len(rc.requests()); n != 3 {
				t.Fatalf("%d requests, want 3", n)
			}
		})
	}
}

// TestNotifySlackShape: a slack target's body is an incoming webhook's message: text, and
// blocks of known types whose texts are mrkdwn.
func TestNotifySlackShape(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			rc := newReceiver(t, "slack-secret")
			rc.answer = func(n int, r received) int {
				var msg struct {
					Text   *string `json:"text"`
					Blocks []struct {
						Type string `json:"type"`
						Text *struct {
							Type, Text string
						} `json:"text"`
						Elements []struct{ Type, Text string } `json:"elements"`
					} `json:"blocks"`
				}
				dec := json.NewDecoder(strings.NewReader(string(r.body)))
				dec.DisallowUnknownFields()
				if err := dec.Decode(&msg); err != nil || msg.Text == nil || *msg.Text == "" || len(msg.Blocks) == 0 {
					return http.StatusBadRequest
				}
				for _, bl := range msg.Blocks {
					switch {
					case bl.Type == "section" && bl.Text != nil && bl.Text.Type == "mrkdwn" && bl.Text.Text != "":
					case bl.Type == "context" && len(bl.Elements) > 0 && bl.Elements[0].Type == "mrkdwn":
					default:
						return http.StatusBadRequest
					}
				}
				if !strings.Contains(string(r.body), "<https://tfstackplan.example.com/ui/executions/p1|") {
					return http.StatusBadRequest
				}
				return http.StatusOK
			}
			f := notifyFixture(t, b, rc, notify.FormatSlack)
			f.plan("p1", "prod", 7, "abc", map[string]api.Class{"db<&>": "destructive"})
			ds := f.deliver(20 * time.Second)
			if len(ds) != 1 || ds[0].Status != store.DeliveryDelivered || ds[0].Attempts != 1 {
				t.Fatalf("deliveries %+v", ds)
			}
		})
	}
}

// TestNotifyPolicyErrors: a notify block whose secret is not in the environment, an http:// URL
// off loopback or an unknown event is refused, and the secret never shows in what is said.
func TestNotifyPolicyErrors(t *testing.T) {
	t.Setenv("TFSTACKPLAN_NOTIFY_SET", "the-secret-value")
	for _, tc := range []struct{ block, want string }{
		{`url = "https://h.example.com/x"
		  secret_env = "TFSTACKPLAN_NOTIFY_UNSET"`, "secret_env TFSTACKPLAN_NOTIFY_UNSET is not set in the server's environment"},
		{`url = "http://hooks.example.com/x"
		  secret_env = "TFSTACKPLAN_NOTIFY_SET"`, "http:// is allowed only on a loopback host"},
		{`url = "https://h.example.com/x"
		  secret_env = "TFSTACKPLAN_NOTIFY_SET"
		  events = ["gate.wating"]`, `event "gate.wating" is not one of`},
		{`url = "https://h.example.com/x"
		  secret_env = "TFSTACKPLAN_NOTIFY_SET"
		  format = "teams"`, `format "teams"`},
	} {
		_, err := ParsePolicy("policy.hcl", []byte("notify \"ops\" {\n"+tc.block+"\n}\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "the-secret-value") {
			t.Errorf("err %v, want one mentioning %q", err, tc.want)
		}
	}
	p, err := ParsePolicy("policy.hcl", []byte(`notify "ops" {
  url = "http://127.0.0.1:9/x"
  secret_env = "TFSTACKPLAN_NOTIFY_SET"
  environments = ["prod"]
  repositories = ["Acme/Infra"]
}`))
	if err != nil {
		t.Fatal(err)
	}
	tg := p.Notify[0]
	if s := fmt.Sprintf("%v %+v %#v %s", tg, tg, tg, tg); strings.Contains(s, "the-secret-value") {
		t.Fatalf("a target prints its secret: %s", s)
	}
	if !tg.Wants(notify.ApplyFailed, "acme/infra", "prod") || tg.Wants(notify.ApplyFailed, "acme/infra", "dev") || tg.Wants(notify.ApplyFailed, "acme/other", "prod") {
		t.Fatal("environments and repositories do not select")
	}
}

// TestNotifyHangingReceiverDoesNotHoldRequests: while the receiver holds every request open,
// runners' finalizes that cause events still complete (were they to wait for the delivery, they
// would wait for the receiver, which answers only once they are done).
func TestNotifyHangingReceiverDoesNotHoldRequests(t *testing.T) {
	b := storetest.Backends()[0]
	release := make(chan struct{})
	rc := newReceiver(t, "hang-secret")
	rc.answer = func(n int, r received) int {
		<-release
		return http.StatusOK
	}
	defer close(release)
	f := notifyFixture(t, b, rc, notify.FormatJSON)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&notify.Worker{Store: f.Store.(store.Outbox), Targets: f.Policy.Notify, Timeout: time.Minute, Poll: 10 * time.Millisecond}).Run(runCtx)
	}()
	defer func() { stop(); <-done }()
	f.plan("p0", "prod", 1, "abc", map[string]api.Class{"db": "destructive"})
	for len(rc.requests()) == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	for i := range 20 {
		f.plan(fmt.Sprint("p", i+1), "prod", i+2, "abc", map[string]api.Class{"db": "destructive"})
	}
	ds, err := f.Store.(store.Outbox).Deliveries(ctx, store.DeliveryFilter{Status: store.DeliveryPending})
	f.must(err)
	if len(ds) != 21 {
		t.Fatalf("%d deliveries pending, want the 21 events'", len(ds))
	}
}

// TestNotifyGivesUpAfterMaxAge: a delivery no attempt delivered for MaxAge is marked failed,
// and stays listed.
func TestNotifyGivesUpAfterMaxAge(t *testing.T) {
	b := storetest.Backends()[0]
	rc := newReceiver(t, "dead-secret")
	rc.answer = func(int, received) int { return http.StatusBadGateway }
	f := notifyFixture(t, b, rc, notify.FormatJSON)
	f.plan("p1", "prod", 7, "abc", map[string]api.Class{"db": "destructive"})
	ob := f.Store.(store.Outbox)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	start, base := time.Now(), f.now
	go func() {
		defer close(done)
		(&notify.Worker{Store: ob, Targets: f.Policy.Notify, Poll: 10 * time.Millisecond, MaxAge: time.Hour,
			// A clock a thousand times as fast: an hour of retries takes seconds.
			Now: func() time.Time { return base.Add(time.Since(start) * 1000) }}).Run(runCtx)
	}()
	deadline := time.Now().Add(20 * time.Second)
	var ds []store.Delivery
	for time.Now().Before(deadline) {
		var err error
		ds, err = ob.Deliveries(ctx, store.DeliveryFilter{Status: store.DeliveryFailed})
		f.must(err)
		if len(ds) == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done
	if len(ds) != 1 || ds[0].LastStatus != http.StatusBadGateway || !strings.Contains(ds[0].LastError, "given up") || ds[0].Attempts < 2 {
		t.Fatalf("failed deliveries %+v", ds)
	}
}
