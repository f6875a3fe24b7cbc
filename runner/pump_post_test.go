package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
)

func TestPumpDrainGivesUpOnDeadServer(t *testing.T) {
	root := t.TempDir()
	pumpWriteLog(t, pumpStackDir(t, root, "a"), []byte("hello, nobody\n"))
	coll := newPumpCollector(3)
	coll.setFailure(0, 0, 0, true)
	pump := pumpSimple(t, root, coll, PumpOptions{}, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	rep := pumpDrainOrHang(t, pump, ctx)
	if rep.Complete || len(rep.Gaps) != 1 || !rep.Gaps[0].Unsent || rep.Gaps[0].From != 0 || rep.Gaps[0].To != 14 {
		t.Fatalf("report %+v", rep)
	}
}

func TestPumpStopsOnCancelledExecution(t *testing.T) {
	root := t.TempDir()
	pumpWriteLog(t, pumpStackDir(t, root, "a"), []byte("cancelled\n"))
	var calls atomic.Int64
	poster := pumpFuncPoster(func(ctx context.Context, lc events.LogChunk) error {
		calls.Add(1)
		return fmt.Errorf("log chunk: %w", ErrCancelRequested)
	})
	pump := pumpSimple(t, root, poster, PumpOptions{Coalesce: time.Millisecond}, "a")
	rep := pump.Drain(context.Background())
	if !errors.Is(rep.Stopped, ErrCancelRequested) || rep.Complete || calls.Load() != 1 {
		t.Fatalf("report %+v after %d calls", rep, calls.Load())
	}
}

// A server that refuses the runner the execution's logs (403: another principal announced it)
// stops posting for good, as a cancel does: one refusal, not a retry every few seconds until
// the drain gives up. Other refusals are retried.
func TestPumpStopsWhenRefused(t *testing.T) {
	for _, c := range []struct {
		status int
		stops  bool
	}{{http.StatusForbidden, true}, {http.StatusServiceUnavailable, false}} {
		root := t.TempDir()
		pumpWriteLog(t, pumpStackDir(t, root, "a"), []byte("refused\n"))
		var calls atomic.Int64
		refusal := &APIError{Op: "LogChunk", StatusCode: c.status}
		poster := pumpFuncPoster(func(ctx context.Context, lc events.LogChunk) error {
			calls.Add(1)
			return refusal
		})
		pump := pumpSimple(t, root, poster, PumpOptions{Coalesce: time.Millisecond, RetryMin: time.Millisecond, RetryMax: time.Millisecond}, "a")
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		rep := pump.Drain(ctx)
		cancel()
		if stopped := errors.Is(rep.Stopped, refusal); stopped != c.stops || rep.Complete {
			t.Errorf("%d: report %+v, want stopped %v", c.status, rep, c.stops)
		}
		if c.stops && calls.Load() != 1 {
			t.Errorf("%d: %d posts, want 1", c.status, calls.Load())
		}
		if !c.stops && calls.Load() < 2 {
			t.Errorf("%d: %d posts, want it retried", c.status, calls.Load())
		}
	}
}

// pumpFuncPoster adapts a function to LogPoster.
type pumpFuncPoster func(ctx context.Context, lc events.LogChunk) error

func (f pumpFuncPoster) LogChunk(ctx context.Context, lc events.LogChunk) error { return f(ctx, lc) }

// *Client is the production LogPoster.
var _ LogPoster = (*Client)(nil)

func TestPumpThroughClientOverLoopback(t *testing.T) {
	root := t.TempDir()
	pumpStackDir(t, root, "a")
	coll := newPumpCollector(7)
	var cancelled atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunks, err := pumpDecodeChunks(r)
		if err != nil {
			http.Error(w, `{"code":"INVALID_ARGUMENT","message":"bad chunk"}`, http.StatusBadRequest)
			return
		}
		for _, lc := range chunks {
			_ = coll.LogChunk(r.Context(), lc)
		}
		w.Header().Set("Content-Type", "application/json")
		if cancelled.Load() {
			_, _ = w.Write([]byte(`{"cancel":true,"reason":"stopped by an admin"}`))
			return
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	client, err := NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	pump := pumpSimple(t, root, client, PumpOptions{Coalesce: time.Millisecond}, "a")
	path := filepath.Join(root, "a", "tfstackplan.log")
	pumpWriteLog(t, path, []byte("before the cancel\n"))
	pumpWaitObserved(t, pump, "a", 0, 18)
	deadline := time.Now().Add(10 * time.Second)
	for len(pumpCollected(t, coll, "a", 0)) < 18 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancelled.Store(true)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("after the cancel\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep := pump.Drain(ctx)
	if !errors.Is(rep.Stopped, ErrCancelRequested) {
		t.Fatalf("the pump did not stop on the server's cancel: %+v", rep)
	}
	if got := pumpCollected(t, coll, "a", 0); !bytes.HasPrefix(got, []byte("before the cancel\n")) {
		t.Fatalf("collected %q", got)
	}
}
