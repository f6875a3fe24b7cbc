package runner

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A Finalize that finds the server gone (the breaker opens) is sent again once the breaker's
// cool-down lets a probe through, within its budget; a budget shorter than the cool-down gives
// up with the transport error.
func TestFinalizeRetriedAfterTheBreakersCooldown(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cooldown time.Duration
		budget   time.Duration
		stored   int
	}{
		{"within the budget", 100 * time.Millisecond, 20 * time.Second, 1},
		{"past the budget", time.Hour, 3 * time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMemServer()
			m.failFinalize = 3
			srv := m.start(t)
			c, err := NewClient(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			c.breaker.cooldown = tc.cooldown
			ctx, cancel := context.WithTimeout(context.Background(), tc.budget)
			defer cancel()
			err = c.finalizeRetrying(ctx, []byte(`{"execution_id":"e-fin","status":"succeeded"}`))
			m.mu.Lock()
			stored, tried := len(m.finals), m.requests["/events/finalize"]
			m.mu.Unlock()
			if stored != tc.stored {
				t.Fatalf("%d Finalize stored (%d tried), %v; want %d", stored, tried, err, tc.stored)
			}
			var te *TransportError
			if tc.stored == 0 && (!errors.As(err, &te) || ctx.Err() != nil) {
				t.Fatalf("gave up with %v (context %v), want the transport error before the budget ended", err, ctx.Err())
			}
			if tc.stored == 1 && (err != nil || tried < 3) {
				t.Fatalf("Finalize: %v after %d tries", err, tried)
			}
		})
	}
}
