package runner

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
)

// pumpRequests is a batching poster that stores through a pumpCollector and keeps every
// request's chunks, in the order the requests came; hold, when set, makes each request wait
// until it returns.
type pumpRequests struct {
	*pumpCollector
	reqMu sync.Mutex
	reqs  [][]events.LogChunk
	got   chan struct{} // receives once per request, without blocking
	hold  func(chunks []events.LogChunk)
}

func newPumpRequests(seed uint64) *pumpRequests {
	return &pumpRequests{pumpCollector: newPumpCollector(seed), got: make(chan struct{}, 1024)}
}

func (r *pumpRequests) LogChunks(ctx context.Context, chunks []events.LogChunk) error {
	r.reqMu.Lock()
	r.reqs = append(r.reqs, chunks)
	r.reqMu.Unlock()
	select {
	case r.got <- struct{}{}:
	default:
	}
	if r.hold != nil {
		r.hold(chunks)
	}
	for _, lc := range chunks {
		if err := r.LogChunk(ctx, lc); err != nil {
			return err
		}
	}
	return nil
}

// requests returns the stacks of each request's chunks, e.g. ["a b c"].
func (r *pumpRequests) requests() []string {
	r.reqMu.Lock()
	defer r.reqMu.Unlock()
	var out []string
	for _, chunks := range r.reqs {
		var names []string
		for _, lc := range chunks {
			names = append(names, lc.Stack)
		}
		out = append(out, strings.Join(names, " "))
	}
	return out
}

// wait waits for the n-th request (counting from 1).
func (r *pumpRequests) wait(t *testing.T, n int, why string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for len(r.requests()) < n {
		select {
		case <-r.got:
		case <-deadline:
			t.Fatalf("%s: requests so far %q", why, r.requests())
		}
	}
}

// pumpStack returns a stack's state.
func pumpStack(pump *LogPump, name string) *stackTail {
	pump.mu.Lock()
	defer pump.mu.Unlock()
	return pump.byName[name]
}

// pumpWaitRider waits until l's bytes were read into an open chunk that a batch may take
// along. (The stack's goroutine may still be awake: a late event wakes it again.)
func pumpWaitRider(t *testing.T, pump *LogPump, l *pumpLog) {
	t.Helper()
	s := pumpStack(pump, l.stack)
	deadline := time.Now().Add(10 * time.Second)
	for s.obsRead.Load() < int64(len(l.data)) || !s.listed.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("stack %s: its open chunk was not offered", l.stack)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// pumpNoErrors checks the collector's own findings (order per stack, retried bytes).
func pumpNoErrors(t *testing.T, c *pumpCollector) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.errs {
		t.Error(e)
	}
}

// pumpPiggybackOpts: chunks fall due only when full (1 KiB) or at the drain, and nothing wakes a
// stack but its own writes.
var pumpPiggybackOpts = PumpOptions{MaxChunk: 1024, Coalesce: time.Hour, SafetyPoll: time.Hour}

// pumpFullChunk is exactly one full chunk under pumpPiggybackOpts.
var pumpFullChunk = strings.Repeat(strings.Repeat("x", 63)+"\n", 16)

// When one stack's chunk falls due, the open chunks of idle stacks ride in its request, long
// before they would fall due themselves, and never make a request of their own.
func TestPumpPiggybacksIdleOpenChunks(t *testing.T) {
	root := t.TempDir()
	a, b, c, d := openPumpLog(t, root, "a"), openPumpLog(t, root, "b"), openPumpLog(t, root, "c"), openPumpLog(t, root, "d")
	coll := newPumpRequests(31)
	pump := pumpSimple(t, root, coll, pumpPiggybackOpts, "a", "b", "c", "d")
	for _, l := range []*pumpLog{b, c, d} {
		l.write("a line of " + l.stack + "\n")
		pumpWaitRider(t, pump, l)
	}
	if r := coll.requests(); len(r) != 0 {
		t.Fatalf("requests before any chunk was due: %q", r)
	}
	// Each of a's full chunks is due at once. A stack whose goroutine happens to be awake when
	// a request leaves (a late event) rides with a later one.
	rode := func() bool {
		coll.pumpCollector.mu.Lock()
		defer coll.pumpCollector.mu.Unlock()
		for _, l := range []*pumpLog{b, c, d} {
			if len(coll.data[pumpKey{l.stack, 0}]) == 0 {
				return false
			}
		}
		return true
	}
	for n := 1; !rode(); n++ {
		if n > 20 {
			t.Fatalf("b, c and d did not ride along: requests %q", coll.requests())
		}
		a.write(pumpFullChunk)
		coll.wait(t, n, "a's full chunk was not posted")
	}
	reqs := coll.requests()
	for i, r := range reqs {
		if !strings.HasPrefix(r, "a") {
			t.Errorf("request %d carries %q: a request without a due chunk", i, r)
		}
	}
	if n := pump.piggybacked.Load(); n != 3 {
		t.Errorf("%d chunks rode along, want 3", n)
	}
	if len(reqs) == 1 && reqs[0] != "a b c d" {
		t.Errorf("first request carries %q, want a's chunk and the open ones of b, c, d", reqs[0])
	}
	pumpDelivered(t, pump, coll.pumpCollector, a, b, c, d)
	pumpNoErrors(t, coll.pumpCollector)
}

// The batcher never waits for a stack: one whose goroutine is busy (its lock held) stays
// behind, and the due chunk leaves at once.
func TestPumpPiggybackNeverWaitsForABusyStack(t *testing.T) {
	root := t.TempDir()
	a, b := openPumpLog(t, root, "a"), openPumpLog(t, root, "b")
	coll := newPumpRequests(32)
	pump := pumpSimple(t, root, coll, pumpPiggybackOpts, "a", "b")
	b.write("a line of b\n")
	pumpWaitRider(t, pump, b)
	busy := pumpStack(pump, "b")
	busy.mu.Lock() // as if b's goroutine were stuck reading a slow file
	a.write(pumpFullChunk)
	coll.wait(t, 1, "a's due chunk waited for a busy stack")
	busy.mu.Unlock()
	if r := coll.requests(); r[0] != "a" {
		t.Errorf("first request carries %q, want a's chunk alone", r[0])
	}
	pumpDelivered(t, pump, coll.pumpCollector, a, b)
	pumpNoErrors(t, coll.pumpCollector)
}

// Riders use only the spare half of the post slots: a chunk falling due while a request is
// slow to answer still finds a slot, and is not posted later because a chunk that was not due
// yet took it.
func TestPumpPiggybackLeavesSlotsForDueChunks(t *testing.T) {
	root := t.TempDir()
	a, b, c := openPumpLog(t, root, "a"), openPumpLog(t, root, "b"), openPumpLog(t, root, "c")
	coll := newPumpRequests(33)
	slow := make(chan struct{})
	coll.hold = func(chunks []events.LogChunk) {
		if chunks[0].Stack == "a" {
			<-slow
		}
	}
	o := pumpPiggybackOpts
	o.MaxInFlight = 2
	pump := pumpSimple(t, root, coll, o, "a", "b", "c")
	b.write("a line of b\n")
	pumpWaitRider(t, pump, b)
	a.write(pumpFullChunk) // its request is not answered until slow is closed
	coll.wait(t, 1, "a's full chunk was not posted")
	c.write(pumpFullChunk) // due at once: it needs the second slot
	coll.wait(t, 2, "c's due chunk waited for a slot")
	close(slow)
	if r := coll.requests(); r[0] != "a" || r[1] != "c" {
		t.Errorf("requests %q, want a's chunk alone, then c's", r)
	}
	pumpDelivered(t, pump, coll.pumpCollector, a, b, c)
	pumpNoErrors(t, coll.pumpCollector)
}

// Stacks that write out of phase share requests: each line opens a chunk that, alone, would
// fall due at its own time, yet most requests carry a chunk of every stack; every byte
// arrives in order.
func TestPumpPiggybackStaggeredWriters(t *testing.T) {
	const (
		nStacks  = 4
		lines    = 10
		coalesce = 40 * time.Millisecond
		offset   = 10 * time.Millisecond // between stacks, longer than MinReadInterval
		period   = 50 * time.Millisecond // between a stack's lines, longer than coalesce
	)
	root := t.TempDir()
	coll := newPumpRequests(34)
	var logs []*pumpLog
	var names []string
	for i := range nStacks {
		l := openPumpLog(t, root, fmt.Sprintf("s%d", i))
		logs = append(logs, l)
		names = append(names, l.stack)
	}
	pump := pumpSimple(t, root, coll, PumpOptions{Coalesce: coalesce, MinReadInterval: 5 * time.Millisecond, PollInterval: 5 * time.Millisecond}, names...)
	start := time.Now()
	var wg sync.WaitGroup
	for i, l := range logs {
		wg.Go(func() {
			for j := range lines {
				time.Sleep(time.Until(start.Add(time.Duration(i)*offset + time.Duration(j)*period)))
				l.write(fmt.Sprintf("%s line %d\n", l.stack, j))
			}
		})
	}
	wg.Wait()
	for _, l := range logs {
		l.observed(pump)
	}
	time.Sleep(2 * coalesce) // the last lines fall due
	reqs := coll.requests()
	pumpDelivered(t, pump, coll.pumpCollector, logs...)
	pumpNoErrors(t, coll.pumpCollector)
	chunks := 0
	for _, r := range reqs {
		chunks += len(strings.Fields(r))
	}
	t.Logf("%d chunks in %d requests before the drain (%d rode along)", chunks, len(reqs), pump.piggybacked.Load())
	// Without riders, about one chunk a request.
	if len(reqs) == 0 || chunks < 2*len(reqs) {
		t.Errorf("%d chunks in %d requests before the drain, want at least 2 a request: %q", chunks, len(reqs), reqs)
	}
}
