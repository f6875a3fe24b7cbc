package service

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/notify"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// benchEvents is how many events BenchmarkNotifyOutbox sends.
const benchEvents = 10_000

// BenchmarkNotifyOutbox sends benchEvents apply.succeeded events (one per apply's Finalize, the
// runner request that causes it) through the outbox to a loopback receiver, on each store. It
// reports the Finalize's p50 and p99 with a notify block and without one (alternating requests
// to two services, so that both see the same machine), the p99 the outbox added, the events
// delivered per second from the first Finalize to the last delivery (while the requests go
// on), and the rate at which a worker drains benchEvents waiting in the outbox. Run it with
// -benchtime=1x.
func BenchmarkNotifyOutbox(b *testing.B) {
	for _, backend := range storetest.Backends() {
		b.Run(backend.Name, func(b *testing.B) {
			for range b.N {
				benchNotify(b, backend)
			}
		})
	}
}

func benchNotify(b *testing.B, backend storetest.Backend) {
	var delivered atomic.Int64
	allIn := make(chan time.Time, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if delivered.Add(1) == benchEvents {
			allIn <- time.Now()
		}
	}))
	defer srv.Close()
	b.Setenv("TFSTACKPLAN_NOTIFY_BENCH_SECRET", "bench-secret")
	p, err := ParsePolicy("policy.hcl", []byte(testPolicy+`
notify "bench" {
  url        = "`+srv.URL+`"
  secret_env = "TFSTACKPLAN_NOTIFY_BENCH_SECRET"
  events     = ["apply.succeeded"]
}
`))
	if err != nil {
		b.Fatal(err)
	}
	plain, err := ParsePolicy("policy.hcl", []byte(testPolicy))
	if err != nil {
		b.Fatal(err)
	}
	with, without := New(backend.Open(b), p), New(backend.Open(b), plain)
	wake, unsubscribe := with.Hub.Subscribe(AllExecutions)
	defer unsubscribe()
	runCtx, stop := context.WithCancel(ctx)
	go func() { _ = with.Run(runCtx) }()
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&notify.Worker{Store: with.Store.(store.Outbox), Targets: p.Notify, Wake: wake}).Run(runCtx)
	}()
	finalize := func(s *Service, id string) time.Duration {
		_, err := s.Init(ctx, runner, &api.Init{ExecutionID: id, Environment: "dev", Op: "apply", PR: 1, SHA: "abc", Stacks: []string{"a"}})
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		_, err = s.Finalize(ctx, runner, &api.Finalize{ExecutionID: id, Status: "succeeded", Stacks: []api.StackResult{{Stack: "a", Status: "succeeded"}}})
		d := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	var lw, lo []time.Duration
	b.ResetTimer()
	first := time.Now()
	for i := range benchEvents {
		id := fmt.Sprint("apply-", i)
		lo = append(lo, finalize(without, id))
		lw = append(lw, finalize(with, id))
	}
	var last time.Time
	select {
	case last = <-allIn:
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d of %d delivered", delivered.Load(), benchEvents)
	}
	stop()
	<-done
	b.StopTimer()
	p50w, p99w, p50o, p99o := pct(lw, 50), pct(lw, 99), pct(lo, 50), pct(lo, 99)
	b.ReportMetric(float64(p50w.Microseconds()), "p50-µs-notify")
	b.ReportMetric(float64(p99w.Microseconds()), "p99-µs-notify")
	b.ReportMetric(float64(p50o.Microseconds()), "p50-µs-plain")
	b.ReportMetric(float64(p99o.Microseconds()), "p99-µs-plain")
	b.ReportMetric(float64((p99w - p99o).Microseconds()), "p99-µs-added")
	b.ReportMetric(benchEvents/last.Sub(first).Seconds(), "delivered/s-under-load")
	b.ReportMetric(drain(b, backend), "delivered/s-drain")
}

// drain writes benchEvents deliveries to a fresh outbox, then times a worker sending them all.
func drain(b *testing.B, backend storetest.Backend) float64 {
	var n atomic.Int64
	allIn := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == benchEvents {
			close(allIn)
		}
	}))
	defer srv.Close()
	st := backend.Open(b)
	tg := []notify.Target{(notify.Target{Name: "bench", URL: srv.URL, Format: notify.FormatJSON}).WithSecret([]byte("k"))}
	now := time.Now().UTC()
	for i := 0; i < benchEvents; i += 500 {
		err := st.Write(ctx, func(tx store.Tx) error {
			for j := i; j < i+500; j++ {
				ds, err := notify.Deliveries(tg, notify.Event{Name: notify.ApplySucceeded, Repo: testRepo, Environment: "dev", ExecutionID: fmt.Sprint("e", j)}, now)
				if err != nil {
					return err
				}
				if err := tx.(store.OutboxTx).Enqueue(ds); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); (&notify.Worker{Store: st.(store.Outbox), Targets: tg}).Run(runCtx) }()
	select {
	case <-allIn:
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d of %d drained", n.Load(), benchEvents)
	}
	elapsed := time.Since(start)
	stop()
	<-done
	return benchEvents / elapsed.Seconds()
}

// pct is the p-th percentile of ds.
func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}
