package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
)

// pumpGate holds the dispatcher's throttle pauses until released, so that a test can queue
// file events in the kernel meanwhile; after the release pauses pass at once.
type pumpGate struct {
	held chan struct{}
	open chan struct{}
}

// pumpGated starts a pump (watching with fsnotify) whose dispatcher pauses are controlled by
// the returned gate.
func pumpGated(t *testing.T, root string, p LogPoster, o PumpOptions, stacks ...string) (*LogPump, *pumpGate) {
	t.Helper()
	g := &pumpGate{held: make(chan struct{}, 1), open: make(chan struct{})}
	pump := pumpNew(t, root, p, o, stacks...)
	pump.holdHook = func(time.Duration) {
		select {
		case g.held <- struct{}{}:
		default:
		}
		<-g.open
	}
	t.Cleanup(g.release)
	return pumpWatching(t, pump), g
}

// pause writes lines to l until the dispatcher pauses (the first event after a quiet spell
// makes a round at once, the next ones are held) and returns the rounds made so far.
func (g *pumpGate) pause(t *testing.T, pump *LogPump, l *pumpLog) int64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		l.write("before the pause " + strconv.Itoa(i) + "\n")
		select {
		case <-g.held:
			return pump.rounds.Load()
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the dispatcher did not pause")
		}
	}
}

// roundsSince returns the dispatcher rounds made since the count was rounds, once there is
// one (bounded): a stack may see its bytes before the round that wakes it is counted (a post
// slot makes it look too).
func roundsSince(pump *LogPump, rounds int64) int64 {
	for deadline := time.Now().Add(10 * time.Second); pump.rounds.Load() == rounds && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	return pump.rounds.Load() - rounds
}

func (g *pumpGate) release() {
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

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

// pumpDelivered drains the pump and checks that every log arrived whole and in order.
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

// A burst of writes to one log during a throttle pause costs one dispatcher round, and a
// handful of events (the kernel merges the identical ones), not one wake-up per write.
func TestPumpBurstOfWritesIsOneRound(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // where the dispatcher keeps its round marker
	root := t.TempDir()
	a := openPumpLog(t, root, "a")
	coll := newPumpCollector(21)
	pump, gate := pumpGated(t, root, coll, PumpOptions{MinReadInterval: time.Hour, SafetyPoll: time.Hour, Coalesce: time.Millisecond}, "a")

	rounds := gate.pause(t, pump, a)
	const n = 1000
	for i := range n {
		a.write(fmt.Sprintf("line %d\n", i))
	}
	gate.release()
	a.observed(pump)
	if r := roundsSince(pump, rounds); r != 1 {
		t.Errorf("%d dispatcher rounds after the pause, want 1", r)
	}
	if e := pump.events.Load(); e > 20 {
		t.Errorf("the dispatcher received %d events for %d writes", e, n+2)
	}
	pumpDelivered(t, pump, coll, a)
	if ents, err := os.ReadDir(tmp); err != nil || len(ents) != 0 {
		t.Errorf("the round marker was not removed: %v %v", ents, err)
	}
}

// Events queued during a pause from several logs (which the kernel cannot merge) are all
// taken by the round that ends it, and nothing is lost; with fsnotify and no round marker (no
// usable temporary directory) rounds may take less, but still nothing is lost.
func TestPumpRoundTakesEverythingQueuedDuringThePause(t *testing.T) {
	for _, marker := range []bool{true, false} {
		t.Run(fmt.Sprintf("marker=%v", marker), func(t *testing.T) {
			tmp := t.TempDir()
			if !marker {
				tmp = filepath.Join(tmp, "missing")
			}
			t.Setenv("TMPDIR", tmp)
			root := t.TempDir()
			a, b := openPumpLog(t, root, "a"), openPumpLog(t, root, "b")
			pumpStackDir(t, root, "c") // its log appears during the pause
			coll := newPumpCollector(22)
			pump, gate := pumpGated(t, root, coll, PumpOptions{MinReadInterval: time.Hour, SafetyPoll: time.Hour, Coalesce: time.Millisecond}, "a", "b", "c")

			rounds := gate.pause(t, pump, a)
			c := openPumpLog(t, root, "c")
			for i := range 300 {
				line := "line " + strconv.Itoa(i) + "\n"
				a.write(line)
				b.write(line)
				c.write(line)
			}
			gate.release()
			for _, l := range []*pumpLog{a, b, c} {
				l.observed(pump)
			}
			if r := roundsSince(pump, rounds); marker && r != 1 {
				t.Errorf("%d dispatcher rounds after the pause, want 1: it takes everything queued", r)
			}
			pumpDelivered(t, pump, coll, a, b, c)
		})
	}
}

// An inotify queue overflow during a pause (the round marker's own event is dropped too) ends
// the round and makes every stack look: a log whose event was dropped is still read.
func TestPumpQueueOverflowDuringPauseRecovers(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events")
	if err != nil {
		t.Skip("no inotify queue limit to exceed here")
	}
	limit, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || limit > 1<<16 {
		t.Skipf("inotify queue limit %q: too large to exceed in a test", b)
	}
	t.Setenv("TMPDIR", t.TempDir())
	root := t.TempDir()
	x, y := openPumpLog(t, root, "x"), openPumpLog(t, root, "y")
	pumpStackDir(t, root, "z")
	coll := newPumpCollector(23)
	// The safety poll is longer than the test: only the overflow handling can find z's log.
	pump, gate := pumpGated(t, root, coll, PumpOptions{MinReadInterval: time.Hour, SafetyPoll: time.Hour, Coalesce: time.Millisecond}, "x", "y", "z")

	gate.pause(t, pump, x)
	for range limit + 100 { // alternating logs: nothing to merge, the queue overflows
		x.write("x")
		y.write("y")
	}
	z := openPumpLog(t, root, "z") // its events are dropped
	z.write("after the overflow\n")
	gate.release()
	for _, l := range []*pumpLog{x, y, z} {
		l.observed(pump)
	}
	pumpDelivered(t, pump, coll, x, y, z)
}

// Rounds go on when a temporary-directory cleaner removes fsnotify's round marker.
func TestPumpSurvivesRemovedRoundMarker(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	root := t.TempDir()
	a := openPumpLog(t, root, "a")
	coll := newPumpCollector(26)
	pump := pumpWatching(t, pumpNew(t, root, coll, PumpOptions{MinReadInterval: 5 * time.Millisecond, SafetyPoll: time.Hour, Coalesce: time.Millisecond}, "a"))
	a.write("before\n")
	a.observed(pump)
	// The dispatcher makes its marker as it starts, maybe after the stack first looked.
	var dirs []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		var err error
		if dirs, err = filepath.Glob(filepath.Join(tmp, "tfstackplan-pump-*")); err != nil || len(dirs) > 1 {
			t.Fatalf("round marker directories: %v %v", dirs, err)
		}
		if len(dirs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no round marker directory")
		}
	}
	if err := os.RemoveAll(dirs[0]); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		a.write("after " + strconv.Itoa(i) + "\n")
		a.observed(pump)
	}
	pumpDelivered(t, pump, coll, a)
}

// With every stack watched and nothing written, neither the dispatcher nor the poller nor a
// stack wakes up (the poller's timer is armed for the safety poll only); a polled stack
// brings the poll interval back.
func TestPumpTimersRestWhenIdle(t *testing.T) {
	root := t.TempDir()
	pumpStackDir(t, root, "a")
	pumpStackDir(t, root, "b")
	coll := newPumpCollector(24)
	pump := pumpWatching(t, pumpNew(t, root, coll, PumpOptions{PollInterval: time.Millisecond, SafetyPoll: time.Hour}, "a", "b"))
	time.Sleep(50 * time.Millisecond) // fifty poll intervals
	if p, r, s := pump.pollWakes.Load(), pump.rounds.Load(), pump.stackWakes.Load(); p+r+s != 0 {
		t.Errorf("idle pump woke up: poller %d, dispatcher %d, stacks %d times", p, r, s)
	}
	if err := pump.AddStack("later"); err != nil { // no directory yet: polled
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for pump.pollWakes.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatal("a polled stack is not polled")
		}
		time.Sleep(time.Millisecond)
	}
	if rep := pump.Drain(context.Background()); !rep.Complete {
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

// A safety poll wakes only the stacks whose log is not as they last saw it: idle stacks (a log
// read to its end, a log not there yet) sleep through it.
func TestPumpSafetyPollLeavesUnchangedStacksAsleep(t *testing.T) {
	root := t.TempDir()
	a, b := openPumpLog(t, root, "a"), openPumpLog(t, root, "b")
	pumpStackDir(t, root, "c") // its log never appears
	coll := newPumpCollector(26)
	pump := pumpWatching(t, pumpNew(t, root, coll, PumpOptions{Coalesce: time.Millisecond, SafetyPoll: 5 * time.Millisecond}, "a", "b", "c"))
	a.write("one line\n")
	b.write("another\n")
	a.observed(pump)
	b.observed(pump)
	deadline := time.Now().Add(10 * time.Second)
	for string(pumpCollected(t, coll, "a", 0)) != string(a.data) || string(pumpCollected(t, coll, "b", 0)) != string(b.data) {
		if time.Now().After(deadline) {
			t.Fatal("the logs were not posted")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // the posts' outcomes reach their stacks
	polls, wakes := pump.pollWakes.Load(), pump.stackWakes.Load()
	for pump.pollWakes.Load() < polls+10 {
		if time.Now().After(deadline) {
			t.Fatal("no safety polls")
		}
		time.Sleep(time.Millisecond)
	}
	if n := pump.stackWakes.Load() - wakes; n != 0 {
		t.Errorf("%d safety polls of unchanged logs woke stacks %d times", pump.pollWakes.Load()-polls, n)
	}
	pumpDelivered(t, pump, coll, a, b)
}

// What the watcher does not report (here: events held back for an hour) a safety poll still
// finds: bytes appended to an open log, and a log that appears.
func TestPumpSafetyPollFindsUnreportedChanges(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir()) // where the dispatcher keeps its round marker
	root := t.TempDir()
	a := openPumpLog(t, root, "a")
	pumpStackDir(t, root, "b")
	coll := newPumpCollector(27)
	pump, gate := pumpGated(t, root, coll, PumpOptions{MinReadInterval: time.Hour, SafetyPoll: 5 * time.Millisecond, Coalesce: time.Millisecond}, "a", "b")
	gate.pause(t, pump, a)
	a.write("written while the events are held\n")
	b := openPumpLog(t, root, "b")
	b.write("a log that appeared meanwhile\n")
	a.observed(pump)
	b.observed(pump)
	gate.release()
	pumpDelivered(t, pump, coll, a, b)
}

func TestPumpLateStackDirectoryIsPolled(t *testing.T) {
	root := t.TempDir()
	coll := newPumpCollector(5)
	pump := pumpSimple(t, root, coll, PumpOptions{Coalesce: time.Millisecond, PollInterval: time.Millisecond}, "later/stack")
	pump.mu.Lock()
	polled := pump.byName["later/stack"].polled.Load()
	pump.mu.Unlock()
	if !polled {
		t.Fatal("a stack whose directory does not exist yet is not polled")
	}
	pumpWriteLog(t, pumpStackDir(t, root, "later", "stack"), []byte("late\n"))
	pumpWaitObserved(t, pump, "later/stack", 0, 5)
	rep := pump.Drain(context.Background())
	if got := pumpCollected(t, coll, "later/stack", 0); string(got) != "late\n" || !rep.Complete {
		t.Fatalf("got %q, report %+v", got, rep)
	}
}

func TestPumpFallsBackToPollingWhenTheWatcherFails(t *testing.T) {
	root := t.TempDir()
	pumpStackDir(t, root, "a")
	coll := newPumpCollector(6)
	// A safety poll longer than the test: only the fallback can find the bytes in time.
	pump := pumpWatching(t, pumpNew(t, root, coll, PumpOptions{Coalesce: time.Millisecond, PollInterval: time.Millisecond, SafetyPoll: time.Hour}, "a"))
	_ = pump.watcher.Close() // the watcher dies
	pumpWriteLog(t, filepath.Join(root, "a", "tfstackplan.log"), []byte("still here\n"))
	pumpWaitObserved(t, pump, "a", 0, 11)
	rep := pump.Drain(context.Background())
	if got := pumpCollected(t, coll, "a", 0); string(got) != "still here\n" || !rep.Complete {
		t.Fatalf("got %q, report %+v", got, rep)
	}
}

// A watched stack directory that is renamed away, or removed, and made again loses its watch:
// the stack is polled from then on, and the log written in the new directory arrives as a new
// generation. (A removal sends no event for the directory while the pump has the old log
// inside it open: the log's own removal, and the directory found missing, make it polled.)
func TestPumpStackDirectoryReplaced(t *testing.T) {
	for _, how := range []string{"renamed", "removed"} {
		t.Run(how, func(t *testing.T) {
			root := t.TempDir()
			log := pumpStackDir(t, root, "a")
			coll := newPumpCollector(27)
			// A safety poll longer than the test: only the watch's end can make a poll.
			pump := pumpWatching(t, pumpNew(t, root, coll, PumpOptions{Coalesce: time.Millisecond, PollInterval: time.Millisecond, SafetyPoll: time.Hour}, "a"))
			pumpWriteLog(t, log, []byte("one\n"))
			pumpWaitObserved(t, pump, "a", 0, 4)
			dir := filepath.Dir(log)
			var err error
			if how == "removed" {
				err = os.RemoveAll(dir)
			} else {
				err = os.Rename(dir, dir+".old")
			}
			if err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for pump.npolled.Load() == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the stack is not polled after its directory was %s", how)
				}
				time.Sleep(time.Millisecond)
			}
			pumpWriteLog(t, pumpStackDir(t, root, "a"), []byte("two\n"))
			pumpWaitObserved(t, pump, "a", 1, 4)
			rep := pump.Drain(context.Background())
			if g0, g1 := pumpCollected(t, coll, "a", 0), pumpCollected(t, coll, "a", 1); string(g0) != "one\n" || string(g1) != "two\n" || !rep.Complete {
				t.Fatalf("generations %q and %q, report %+v", g0, g1, rep)
			}
		})
	}
}
