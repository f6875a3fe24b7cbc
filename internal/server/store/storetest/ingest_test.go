package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/postgres"
)

// replica opens one more PostgreSQL store on the schema u selects, closed when the test ends.
func replica(t *testing.T, u, channel string) store.Store {
	t.Helper()
	s, err := postgres.Open(ctx, u, postgres.Options{Channel: channel})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// Notifications leave the writes' transactions and are coalesced: a burst of writes from
// several goroutines on one replica is still heard, every execution of it, on another.
func TestPostgresNotificationsCoalesceWithoutLoss(t *testing.T) {
	u, channel := PostgresURL(t)
	a, b := replica(t, u, channel), replica(t, u, channel)
	heard := make(chan string, 1024)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = b.Listen(lctx, func(id string) { heard <- id }) }()
	// The LISTEN is up once a probe write is heard.
	deadline := time.After(15 * time.Second)
	for probed := false; !probed; {
		write(t, a, func(tx store.Tx) error { return tx.Notify("probe") })
		select {
		case <-heard:
			probed = true
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatal("replica b heard nothing")
		}
	}
	const n = 50
	done := make(chan error, n)
	for i := range n {
		go func() {
			done <- a.Write(ctx, func(tx store.Tx) error {
				if _, err := tx.CreateExecution(exec1(fmt.Sprint("c", i), t0)); err != nil {
					return err
				}
				for range 3 {
					if err := tx.Notify(fmt.Sprint("c", i)); err != nil {
						return err
					}
				}
				return nil
			})
		}()
	}
	for range n {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]bool{}
	for i := range n {
		want[fmt.Sprint("c", i)] = true
	}
	for len(want) > 0 {
		select {
		case id := <-heard:
			delete(want, id)
		case <-deadline:
			t.Fatalf("never heard %d executions, e.g. %v", len(want), want)
		}
	}
}
