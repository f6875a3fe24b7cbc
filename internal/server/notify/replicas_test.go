package notify_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/notify"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/postgres"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// countingReceiver counts each delivery id's requests and how many of them were in progress at
// once.
type countingReceiver struct {
	mu                 sync.Mutex
	inFlight, requests map[string]int
	overlaps           int
}

func (c *countingReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(notify.HeaderDelivery)
	c.mu.Lock()
	c.inFlight[id]++
	c.requests[id]++
	if c.inFlight[id] > 1 {
		c.overlaps++
	}
	c.mu.Unlock()
	time.Sleep(2 * time.Millisecond)
	c.mu.Lock()
	c.inFlight[id]--
	c.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// enqueue writes n deliveries of target "ops" through st's write transactions.
func enqueue(t *testing.T, st store.Store, n int) {
	t.Helper()
	tg := []notify.Target{(notify.Target{Name: "ops", Format: notify.FormatJSON})}
	now := time.Now().UTC()
	for i := 0; i < n; i += 50 {
		err := st.Write(context.Background(), func(tx store.Tx) error {
			for j := i; j < min(i+50, n); j++ {
				ds, err := notify.Deliveries(tg, notify.Event{Name: notify.ApplySucceeded, Repo: "acme/infra", Environment: "prod", ExecutionID: fmt.Sprint("e", j)}, now)
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
			t.Fatal(err)
		}
	}
}

// TestReplicasDeliverEachOnceAtATime: two workers, on PostgreSQL each over its own store as two
// replicas are, on SQLite sharing one store, send every delivery, none twice at once (nor twice
// at all: no hold ran out).
func TestReplicasDeliverEachOnceAtATime(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			var stores []store.Store
			if b.Name == "postgres" {
				u, channel := storetest.PostgresURL(t)
				for range 2 {
					s, err := postgres.Open(context.Background(), u, postgres.Options{Channel: channel})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = s.Close() })
					stores = append(stores, s)
				}
			} else {
				s := b.Open(t)
				stores = []store.Store{s, s}
			}
			const n = 300
			enqueue(t, stores[0], n)
			rc := &countingReceiver{inFlight: map[string]int{}, requests: map[string]int{}}
			srv := httptest.NewServer(rc)
			defer srv.Close()
			tg := (notify.Target{Name: "ops", URL: srv.URL, Format: notify.FormatJSON}).WithSecret([]byte("k"))
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for _, s := range stores {
				wg.Add(1)
				go func() {
					defer wg.Done()
					(&notify.Worker{Store: s.(store.Outbox), Targets: []notify.Target{tg}, Poll: 10 * time.Millisecond}).Run(ctx)
				}()
			}
			ob := stores[1].(store.Outbox)
			deadline := time.Now().Add(60 * time.Second)
			for time.Now().Before(deadline) {
				counts, _, err := ob.OutboxStats(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if counts[store.DeliveryDelivered] == n {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
			wg.Wait()
			counts, _, err := ob.OutboxStats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			rc.mu.Lock()
			defer rc.mu.Unlock()
			if counts[store.DeliveryDelivered] != n || len(rc.requests) != n || rc.overlaps != 0 {
				t.Fatalf("delivered %d of %d, %d ids received, %d overlapping requests", counts[store.DeliveryDelivered], n, len(rc.requests), rc.overlaps)
			}
			for id, k := range rc.requests {
				if k != 1 {
					t.Fatalf("delivery %s received %d times", id, k)
				}
			}
		})
	}
}
