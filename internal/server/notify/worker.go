package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/textfit"
)

// Delivery defaults.
const (
	// DefaultTimeout is how long an attempt waits for the receiver's answer.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxAge is how long a delivery is retried before it is marked failed.
	DefaultMaxAge = 24 * time.Hour
	// DefaultConcurrency is how many requests one worker has out at once.
	DefaultConcurrency = 8
	// DefaultPoll is the longest a worker waits before it looks at the outbox again.
	DefaultPoll = time.Second
	// FirstRetry and MaxRetry bound the wait between attempts before its jitter.
	FirstRetry = 10 * time.Second
	MaxRetry   = time.Hour
)

// Headers of a delivery.
const (
	HeaderEvent     = "X-Tfstackplan-Event"
	HeaderDelivery  = "X-Tfstackplan-Delivery"
	HeaderSignature = "X-Tfstackplan-Signature-256"
)

// Backoff is the default wait after failed attempt n (1, 2, ...): FirstRetry doubled each
// attempt up to MaxRetry, then a random half of it taken off (jitter), so that the deliveries a
// receiver's outage failed together do not come back together.
func Backoff(n int) time.Duration {
	d := FirstRetry
	for i := 1; i < n && d < MaxRetry; i++ {
		d *= 2
	}
	d = min(d, MaxRetry)
	return d/2 + rand.N(d/2+1)
}

// Worker sends the outbox's deliveries. Several workers (of one replica or several) may share a
// store: each delivery is held by one of them at a time (store.Outbox.ClaimDeliveries).
type Worker struct {
	// Store is the outbox.
	Store store.Outbox
	// Targets are the configured receivers, by name; a delivery of a target no longer
	// configured is marked failed.
	Targets []Target
	// Client sends the requests (nil: a client of its own; every attempt is bounded by Timeout).
	Client *http.Client
	// Timeout, MaxAge, Concurrency and Poll default to DefaultTimeout, DefaultMaxAge,
	// DefaultConcurrency and DefaultPoll.
	Timeout, MaxAge time.Duration
	Concurrency     int
	Poll            time.Duration
	// Backoff is the wait after failed attempt n (nil: Backoff).
	Backoff func(n int) time.Duration
	// Retain, when > 0, deletes the deliveries that ended and were written longer ago.
	Retain time.Duration
	// Wake, when set, signals that something may have been written to the outbox.
	Wake <-chan struct{}
	// Metrics, when set, counts the deliveries.
	Metrics *Metrics
	// Log receives what went wrong with the store (nil: discarded). Receivers' failures are
	// recorded on their deliveries, not logged.
	Log *slog.Logger
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Metrics are the notification metrics.
type Metrics struct {
	deliveries *prometheus.CounterVec
	pending    prometheus.Gauge
	age        prometheus.Gauge
}

// NewMetrics registers the notification metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tfstackplan_notify_deliveries_total",
			Help: "Delivery attempts by outcome: delivered (2xx), retried (to be sent again), failed (given up)."}, []string{"outcome"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tfstackplan_notify_outbox_pending",
			Help: "Deliveries waiting in the outbox."}),
		age: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tfstackplan_notify_outbox_oldest_pending_seconds",
			Help: "Age of the oldest delivery waiting in the outbox (0: none waits)."}),
	}
	reg.MustRegister(m.deliveries, m.pending, m.age)
	for _, o := range []string{"delivered", "retried", "failed"} {
		m.deliveries.WithLabelValues(o)
	}
	return m
}

func (w *Worker) now() time.Time {
	if w.Now != nil {
		return w.Now()
	}
	return time.Now().UTC()
}

func (w *Worker) target(name string) (Target, bool) {
	for _, t := range w.Targets {
		if t.Name == name {
			return t, true
		}
	}
	return Target{}, false
}

// Gather is how long a worker woken by Wake waits before it looks at the outbox: the events
// written meanwhile are taken together, one store write for many (on SQLite, every write waits
// for the single writer the runners' requests wait for too).
const Gather = 5 * time.Millisecond

// maxFinishBatch bounds the results one store write records.
const maxFinishBatch = 256

// outcome is one attempt's result, on its way to the store.
type outcome struct {
	f    store.Finished
	name string // the metrics' outcome
}

// Run sends deliveries as they come due until ctx ends; the requests out then are abandoned
// (their deliveries stay pending, to be sent again once their hold ends).
func (w *Worker) Run(ctx context.Context) {
	conc := cmpOr(w.Concurrency, DefaultConcurrency)
	poll := cmpOr(w.Poll, DefaultPoll)
	hold := cmpOr(w.Timeout, DefaultTimeout) + 20*time.Second
	freed := make(chan struct{}, 1)
	slots := make(chan struct{}, conc)
	results := make(chan outcome, conc)
	finished := make(chan struct{})
	go func() { defer close(finished); w.finish(ctx, results) }()
	var wg sync.WaitGroup
	defer func() { wg.Wait(); close(results); <-finished }()
	lastHousekeeping := time.Time{}
	for ctx.Err() == nil {
		if now := w.now(); now.Sub(lastHousekeeping) >= 5*time.Second {
			lastHousekeeping = now
			w.housekeeping(ctx, now)
		}
		free := conc - len(slots)
		claimed := 0
		// Claims are taken for half the slots or more at once (one store write for many).
		tried := 2*free >= conc
		if tried {
			ds, err := w.Store.ClaimDeliveries(ctx, w.now(), hold, free)
			if err != nil && ctx.Err() == nil {
				w.log("claim deliveries", err)
			}
			for _, d := range ds {
				slots <- struct{}{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if o, ok := w.send(ctx, d); ok {
						results <- o // before the slot is freed: a slow store slows the sending
					}
					<-slots
					select {
					case freed <- struct{}{}:
					default:
					}
				}()
			}
			claimed = len(ds)
		}
		if claimed > 0 && claimed == free {
			continue // more may be due
		}
		wait := poll
		if tried {
			if due, err := w.Store.NextDue(ctx); err == nil && !due.IsZero() {
				wait = min(poll, max(due.Sub(w.now()), time.Millisecond))
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-w.Wake:
			t.Reset(Gather)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		case <-freed:
		}
		t.Stop()
	}
}

// finish records the results that come on results, as many together as are waiting, until
// results is closed.
func (w *Worker) finish(ctx context.Context, results <-chan outcome) {
	for o := range results {
		batch := []outcome{o}
	more:
		for len(batch) < maxFinishBatch {
			select {
			case o, ok := <-results:
				if !ok {
					break more
				}
				batch = append(batch, o)
			default:
				break more
			}
		}
		fs := make([]store.Finished, len(batch))
		for i, o := range batch {
			fs[i] = o.f
		}
		// The results are recorded even when the worker stops meanwhile.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		ok, err := w.Store.FinishDeliveries(fctx, fs)
		cancel()
		if err != nil {
			w.log("record deliveries", err)
			continue
		}
		if w.Metrics != nil {
			for i, o := range batch {
				if ok[i] {
					w.Metrics.deliveries.WithLabelValues(o.name).Inc()
				}
			}
		}
	}
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func (w *Worker) log(what string, err error) {
	if w.Log != nil {
		w.Log.Warn("notify: "+what, "err", err)
	}
}

// housekeeping prunes the deliveries that ended past Retain and updates the outbox gauges.
func (w *Worker) housekeeping(ctx context.Context, now time.Time) {
	if w.Retain > 0 {
		if _, err := w.Store.PruneDeliveries(ctx, now.Add(-w.Retain), 1000); err != nil && ctx.Err() == nil {
			w.log("prune deliveries", err)
		}
	}
	if w.Metrics == nil {
		return
	}
	counts, oldest, err := w.Store.OutboxStats(ctx)
	if err != nil {
		return
	}
	w.Metrics.pending.Set(float64(counts[store.DeliveryPending]))
	age := 0.0
	if !oldest.IsZero() {
		age = max(now.Sub(oldest).Seconds(), 0)
	}
	w.Metrics.age.Set(age)
}

// send makes one attempt of d and returns its result; ok is false when the worker stopped
// meanwhile (the delivery stays held, then pending: a stopping server records nothing).
func (w *Worker) send(ctx context.Context, d store.Delivery) (o outcome, ok bool) {
	r := w.attempt(ctx, d)
	if ctx.Err() != nil {
		return outcome{}, false
	}
	r.At = w.now()
	name := "delivered"
	switch {
	case r.Delivered:
	case r.Failed:
		name = "failed"
	default:
		backoff := w.Backoff
		if backoff == nil {
			backoff = Backoff
		}
		r.Next = r.At.Add(backoff(d.Attempts + 1))
		if r.Next.Sub(d.CreatedAt) > cmpOr(w.MaxAge, DefaultMaxAge) {
			r.Failed, name = true, "failed"
			r.Err = strings.TrimSpace(r.Err + " (given up: retried for " + cmpOr(w.MaxAge, DefaultMaxAge).String() + ")")
		} else {
			name = "retried"
		}
	}
	return outcome{f: store.Finished{ID: d.ID, HeldUntil: d.NextAt, Result: r}, name: name}, true
}

// maxAnswer is how much of a receiver's answer is kept with a failed attempt.
const maxAnswer = 512

// attempt POSTs d to its target.
func (w *Worker) attempt(ctx context.Context, d store.Delivery) store.DeliveryResult {
	t, ok := w.target(d.Target)
	if !ok {
		return store.DeliveryResult{Failed: true, Err: fmt.Sprintf("no notify block %q is configured any more", d.Target)}
	}
	actx, cancel := context.WithTimeout(ctx, cmpOr(w.Timeout, DefaultTimeout))
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, t.URL, bytes.NewReader(d.Body))
	if err != nil {
		return store.DeliveryResult{Failed: true, Err: "the target's url makes no request"}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "tfstackplan-notify")
	req.Header.Set(HeaderEvent, d.Event)
	req.Header.Set(HeaderDelivery, d.Delivery)
	req.Header.Set(HeaderSignature, t.Sign(d.Body))
	client := w.Client
	if client == nil {
		client = defaultClient
	}
	res, err := client.Do(req)
	if err != nil {
		return store.DeliveryResult{Err: requestError(err, actx)}
	}
	defer res.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(res.Body, maxAnswer))
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10)) // lets the connection be reused
	if res.StatusCode >= 200 && res.StatusCode < 300 {
		return store.DeliveryResult{Status: res.StatusCode, Delivered: true}
	}
	msg := fmt.Sprintf("HTTP %d", res.StatusCode)
	if a := strings.TrimSpace(textfit.Inert(string(answer))); a != "" {
		msg += ": " + textfit.Prefix(textfit.Sanitize(a), maxAnswer)
	}
	return store.DeliveryResult{Status: res.StatusCode, Err: msg}
}

// defaultClient follows no redirect (a receiver answers; a 3xx is a failure to look at).
var defaultClient = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// requestError says why a request got no answer without the URL, which may carry a secret.
func requestError(err error, ctx context.Context) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return "no answer within the timeout"
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return textfit.Prefix(textfit.Sanitize(err.Error()), maxAnswer)
}

// Start runs a Worker over st's outbox for targets until ctx ends, registering its metrics on
// reg (when not nil); wake signals writes that may have added deliveries. With a store that
// keeps no outbox it returns at once (an error when targets are configured).
func Start(ctx context.Context, st store.Store, targets []Target, wake <-chan struct{}, reg prometheus.Registerer, retain time.Duration, log *slog.Logger) error {
	ob, ok := st.(store.Outbox)
	if !ok {
		if len(targets) > 0 {
			return fmt.Errorf("notify: the %s store keeps no outbox", st.Kind())
		}
		return nil
	}
	w := &Worker{Store: ob, Targets: targets, Wake: wake, Retain: retain, Log: log}
	if reg != nil {
		w.Metrics = NewMetrics(reg)
	}
	w.Run(ctx)
	return nil
}
