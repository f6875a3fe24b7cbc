package runner

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
)

// pumpLog is a stack's log file as a test writes it, one write per call.
type pumpLog struct {
	t     *testing.T
	stack string
	f     *os.File
	data  []byte
}

// openPumpLog creates stack's directory and log file (before the pump starts, it makes no
// event).
func openPumpLog(t *testing.T, root, stack string) *pumpLog {
	t.Helper()
	f, err := os.Create(pumpStackDir(t, root, stack))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &pumpLog{t: t, stack: stack, f: f}
}

func (l *pumpLog) write(s string) {
	l.t.Helper()
	if _, err := l.f.WriteString(s); err != nil {
		l.t.Fatal(err)
	}
	l.data = append(l.data, s...)
}

// observed waits until the pump has seen everything written.
func (l *pumpLog) observed(pump *LogPump) {
	l.t.Helper()
	pumpWaitObserved(l.t, pump, l.stack, 0, int64(len(l.data)))
}

// delivered drains the pump and checks that every log arrived whole and in order.
func pumpDelivered(t *testing.T, pump *LogPump, coll *pumpCollector, logs ...*pumpLog) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep := pump.Drain(ctx)
	for _, l := range logs {
		if got := pumpCollected(t, coll, l.stack, 0); string(got) != string(l.data) {
			t.Errorf("stack %s: posted %d bytes, want the %d written", l.stack, len(got), len(l.data))
		}
	}
	if !rep.Complete || len(rep.Gaps) != 0 {
		t.Errorf("report %+v", rep)
	}
}

// A stack whose chunk is due while every post slot is taken sleeps until a slot frees instead
// of looking again every millisecond.
func TestPumpStackWaitingForPostSlotSleeps(t *testing.T) {
	root := t.TempDir()
	a, b := openPumpLog(t, root, "a"), openPumpLog(t, root, "b")
	coll := newPumpCollector(25)
	unblock := make(chan struct{})
	first := true
	blocking := pumpFuncPoster(func(ctx context.Context, lc events.LogChunk) error {
		coll.mu.Lock()
		wait := first
		first = false
		coll.mu.Unlock()
		if wait {
			<-unblock // the only slot stays taken
		}
		return coll.LogChunk(ctx, lc)
	})
	pump := pumpSimple(t, root, blocking, PumpOptions{MaxInFlight: 1, Coalesce: time.Millisecond, SafetyPoll: time.Hour}, "a", "b")
	a.write("takes the slot\n")
	a.observed(pump)
	deadline := time.Now().Add(10 * time.Second)
	for len(pump.sem) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a's chunk was not posted")
		}
		time.Sleep(time.Millisecond)
	}
	b.write("waits for it\n")
	b.observed(pump)
	time.Sleep(5 * time.Millisecond) // b's chunk is due: it waits for the slot
	before := pump.stackWakes.Load()
	time.Sleep(50 * time.Millisecond)
	if n := pump.stackWakes.Load() - before; n > 2 {
		t.Errorf("stacks woke up %d times in 50 ms while waiting for a post slot", n)
	}
	close(unblock)
	pumpDelivered(t, pump, coll, a, b)
}
