package job

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/runner"
)

// waitFor polls cond until it holds or a generous deadline passes (it fails the test then).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A run heartbeats its execution from Init's answer until it finalizes, and a cancel a
// heartbeat brings back stops the run.
func TestRunHeartbeatsUntilStopped(t *testing.T) {
	m := newMemServer()
	srv := m.start(t)
	c, err := runner.NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	r := newRun(RunOptions{Client: c, ExecutionID: "e-beat", Heartbeat: 10 * time.Millisecond})
	r.client = c
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	r.cancelRun = cancel
	announced := make(chan struct{})
	r.announced = announced
	stop := r.heartbeat(ctx, announced)
	beats := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.heartbeats)
	}
	time.Sleep(50 * time.Millisecond)
	if n := beats(); n != 0 {
		t.Fatalf("%d heartbeats before Init was answered", n)
	}
	close(announced)
	waitFor(t, "three heartbeats", func() bool { return beats() >= 3 })
	m.mu.Lock()
	if m.heartbeats[0].ExecutionID != "e-beat" {
		t.Errorf("heartbeat %+v", m.heartbeats[0])
	}
	m.cancels["e-beat"] = "stop it"
	m.mu.Unlock()
	waitFor(t, "the run cancelled by a heartbeat's answer", func() bool { return ctx.Err() != nil })
	if !errors.Is(context.Cause(ctx), runner.ErrCancelRequested) {
		t.Errorf("cancelled with %v", context.Cause(ctx))
	}
	stop()
	after := beats()
	time.Sleep(50 * time.Millisecond)
	if n := beats(); n != after {
		t.Fatalf("%d heartbeats after stop", n-after)
	}
}
