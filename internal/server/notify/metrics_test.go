package notify_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tfstackplan/tfstackplan/internal/server/notify"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// metric returns the value of the metric name (with label outcome, when given) gathered from reg.
func metric(t *testing.T, reg *prometheus.Registry, name, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if outcome != "" && (len(m.GetLabel()) != 1 || m.GetLabel()[0].GetValue() != outcome) {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s %s", name, outcome)
	return 0
}

// TestMetricsCountOutcomesAndTheOutboxAge: a retried then delivered delivery counts once each;
// while one waits, the outbox's age shows it; retention prunes the deliveries that ended and
// keeps the pending ones.
func TestMetricsCountOutcomesAndTheOutboxAge(t *testing.T) {
	st := storetest.OpenSQLite(t)
	ob := st.(store.Outbox)
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	// One old delivery for a receiver that is gone from the policy, one to send.
	old := time.Now().UTC().Add(-time.Hour)
	enqueueAt(t, st, "gone", old)
	enqueueAt(t, st, "ops", time.Now().UTC())
	reg := prometheus.NewRegistry()
	m := notify.NewMetrics(reg)
	w := &notify.Worker{Store: ob, Targets: []notify.Target{(notify.Target{Name: "ops", URL: srv.URL, Format: notify.FormatJSON}).WithSecret([]byte("k"))},
		Metrics: m, Poll: 10 * time.Millisecond, Backoff: func(int) time.Duration { return 10 * time.Millisecond }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && metric(t, reg, "tfstackplan_notify_deliveries_total", "delivered") < 1 {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if d, r, f := metric(t, reg, "tfstackplan_notify_deliveries_total", "delivered"), metric(t, reg, "tfstackplan_notify_deliveries_total", "retried"),
		metric(t, reg, "tfstackplan_notify_deliveries_total", "failed"); d != 1 || r != 1 || f != 1 {
		t.Fatalf("delivered %v, retried %v, failed %v; want 1 each (the one of a receiver gone failed)", d, r, f)
	}
	// The worker's first look saw both pending, the oldest an hour old.
	if age := metric(t, reg, "tfstackplan_notify_outbox_oldest_pending_seconds", ""); age < 3500 {
		t.Fatalf("outbox age %v s, want the hour-old delivery's", age)
	}
	enqueueAt(t, st, "ops", old)
	pruned, err := ob.PruneDeliveries(context.Background(), time.Now().UTC().Add(time.Minute), 100)
	if err != nil || pruned != 2 {
		t.Fatalf("pruned %d (%v), want the 2 that ended", pruned, err)
	}
	counts, oldest, err := ob.OutboxStats(context.Background())
	if err != nil || counts[store.DeliveryPending] != 1 || len(counts) != 1 || oldest.Sub(old).Abs() > time.Microsecond {
		t.Fatalf("after pruning: %v oldest %v (%v)", counts, oldest, err)
	}
}

// enqueueAt writes one delivery of target, created at `at`.
func enqueueAt(t *testing.T, st store.Store, target string, at time.Time) {
	t.Helper()
	ds, err := notify.Deliveries([]notify.Target{{Name: target, Format: notify.FormatJSON}},
		notify.Event{Name: notify.ExecutionStale, Repo: "acme/infra", Environment: "prod", ExecutionID: "e"}, at)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Write(context.Background(), func(tx store.Tx) error { return tx.(store.OutboxTx).Enqueue(ds) }); err != nil {
		t.Fatal(err)
	}
}
