package runner

// This file is one stack's state (stackTail) and the loop of its goroutine, which looks at
// the log, reads it and decides when the head of its queue is posted.

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
)

// pumpItem is one queued post: a data chunk or a gap record. The last data item of a stack
// may be open: bytes read are appended to it until it is sealed, when it is first posted
// (after the coalescing delay, full, or taken along by a batch) or its generation ends.
type pumpItem struct {
	lc     events.LogChunk
	rawLen int64 // file bytes a data chunk covers
	cost   int64 // budget bytes held while queued
	gapIdx int   // index into stackTail.gaps for a gap record
	open   bool
	opened time.Time // when an open item got its first bytes
}

// maxQueuedGaps bounds the gap records waiting to be posted per stack; older ones stay in the
// DrainReport as unreported.
const maxQueuedGaps = 1024

// headLen and anchorLen are how many bytes at the start of a generation, and just before the
// read position, are compared on every look to recognise a rewritten file.
const (
	headLen   = 32
	anchorLen = 32
)

// stackTail is the state of one stack. Fields after the first block are owned by its
// goroutine and read by report only after it ended; the batcher may also take the open chunk
// (see piggyback), so the goroutine holds mu except while it waits, and the batcher holds it
// to look at queue, inflight and retryAt.
type stackTail struct {
	p        *LogPump
	name     string
	firstGen int64 // the generation of the first file seen (PumpOptions.FirstGenerations)
	// earlier is the log an earlier run left at path (PumpOptions.Fresh), until it changes.
	earlier  os.FileInfo
	path     string // the log file as last resolved (changed by the goroutine, under mu)
	absent   string // the log's path, unresolved, once a resolution found it missing (idem)
	watchDir string
	wake     chan struct{}
	polled   atomic.Bool
	// pathChanged is set when the path may name another file now (any event but a write, a
	// poll, an overflow); until then a watched stack only needs to fstat what it has open.
	pathChanged atomic.Bool
	obsGen      atomic.Int64 // generation and size last observed (for tests and diagnostics)
	obsSize     atomic.Int64
	obsRead     atomic.Int64 // bytes of the generation read into memory
	done        chan error   // the outcome of the post in flight
	listed      atomic.Bool  // on p.riders; set and cleared under p.ridersMu

	mu       sync.Mutex
	gone     bool // the goroutine ended: the batcher leaves the stack alone
	f        *os.File
	fi       os.FileInfo
	gen      int64 // -1 until a file was seen
	readOff  int64 // next file byte to read
	emitOff  int64 // first file byte not yet in a chunk (the hold-back starts here)
	sendOff  int64 // posted offset of emitOff (after masking)
	seen     int64 // largest size observed in this generation
	head     []byte
	anchor   []byte // the bytes just before readOff
	ms       maskStream
	queue    []*pumpItem
	inflight bool
	attempts int
	retryAt  time.Time
	waiter   *budgetWaiter
	granted  int64 // budget bytes granted for the next read

	gaps       []StackGap
	sentChunks int64
	sentBytes  int64
	errs       []string
	refused    bool // a problem with the log file was already recorded

	pending bool // owned by the dispatch goroutine: on the current round's list
}

// asLastSeen reports whether the stack's log is as the stack last saw it, by the checks its look
// (observe) makes first: the open log still at its path with the size seen and the bytes before
// the read position in place, or the missing log still missing in a directory still there. A
// safety poll wakes only the stacks for which it is false. It runs on the poller's goroutine; a
// stack busy at that moment counts as changed.
func (s *stackTail) asLastSeen() bool {
	if !s.mu.TryLock() {
		return false
	}
	defer s.mu.Unlock()
	switch {
	case s.f != nil:
		li, err := os.Lstat(s.path)
		return err == nil && os.SameFile(s.fi, li) && li.Size() == s.seen && s.unchanged()
	case s.earlier != nil:
		return s.asEarlier()
	case s.absent != "":
		if _, err := os.Lstat(s.absent); !errors.Is(err, fs.ErrNotExist) {
			return false
		}
		_, err := os.Stat(s.watchDir)
		return err == nil
	}
	return false
}

// asEarlier reports whether the log an earlier run left (Fresh) is still at the path, as it
// was: the same file, size and modification time.
func (s *stackTail) asEarlier() bool {
	li, err := os.Lstat(s.path)
	return err == nil && os.SameFile(s.earlier, li) && li.Size() == s.earlier.Size() && li.ModTime().Equal(s.earlier.ModTime())
}

// poke wakes the stack's goroutine without blocking.
func (s *stackTail) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// observed returns the generation and size last observed (for tests).
func (s *stackTail) observed() (int64, int64) { return s.obsGen.Load(), s.obsSize.Load() }

func (s *stackTail) run(ctx context.Context) {
	p := s.p
	defer p.wg.Done()
	defer s.releaseBudget()
	defer s.retire()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	drainCh := p.drainCh
	var drainDone <-chan struct{}
	draining := false
	// A post-slot token is taken BEFORE the next chunk is read, so a chunk that waited for a
	// slot still carries everything appended meanwhile.
	haveToken := false
	defer func() {
		if haveToken {
			<-p.sem
		}
	}()
	// look: whether the file may have changed since the last observation or a read is about to
	// happen (a post's outcome or a timer alone do not need a new look).
	look := true
	for {
		s.mu.Lock()
		if drainCh == nil && !draining {
			draining = true
			drainDone = p.drainCtx.Done()
			// Events may still be on their way: look at the path itself, not just the open file.
			s.pathChanged.Store(true)
			look = true
		}
		if look {
			s.observe()
			look = false
		}
		stopped := p.stopped.Load() != nil
		if stopped && !s.inflight {
			s.mu.Unlock()
			return
		}
		if !stopped {
			// Read eagerly, post lazily: bytes in memory survive a truncation that follows.
			s.fill(draining)
			s.obsRead.Store(s.readOff)
		}
		if haveToken {
			if due, _ := s.postDue(draining); due && !stopped && !s.inflight {
				s.post() // the post releases the token
			} else {
				<-p.sem // not due, or the batcher took the chunk meanwhile (see piggyback)
			}
			haveToken = false
		}
		if draining && !s.inflight && len(s.queue) == 0 && (s.f == nil || (s.readOff >= s.seen && len(s.ms.hold) == 0)) {
			s.mu.Unlock()
			return
		}
		var budgetCh <-chan struct{}
		if s.waiter != nil {
			budgetCh = s.waiter.ch
		}
		// The timer runs only until the head of the queue falls due; then the stack waits for a
		// post slot, and the slot's release wakes it.
		var semCh chan<- struct{}
		sleep := time.Hour
		if !s.inflight {
			if due, wait := s.postDue(draining); due && !stopped {
				semCh = p.sem
			} else if wait > 0 {
				sleep = wait
			}
		}
		s.offer()
		s.mu.Unlock()
		timer.Reset(sleep)
		select {
		case semCh <- struct{}{}:
			haveToken, look = true, true
		case <-ctx.Done():
			return
		case <-drainDone:
			return
		case <-drainCh:
			drainCh = nil
		case <-s.wake:
			look = true
		case <-timer.C:
		case <-budgetCh:
			s.granted, s.waiter, look = s.waiter.n, nil, true
		case err := <-s.done:
			s.mu.Lock()
			s.inflight = false
			s.posted(err)
			s.mu.Unlock()
		}
		if draining {
			// Nothing wakes a draining stack for its log any more (the watcher and the poller
			// stopped as the drain began): it looks again before it decides that it is done.
			look = true
		}
		p.stackWakes.Add(1)
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// postDue reports whether the head of the queue may be posted now: a gap record or a sealed
// chunk once its backoff passed; the open chunk once it is full, its coalescing delay passed,
// or the pump drains. If not, wait is how long until it may (0 when the queue is empty).
func (s *stackTail) postDue(draining bool) (due bool, wait time.Duration) {
	if len(s.queue) == 0 {
		return false, 0
	}
	at := s.retryAt
	if head := s.queue[0]; head.open && !draining && !s.full(head) {
		if c := head.opened.Add(s.p.opts.Coalesce); c.After(at) {
			at = c
		}
	}
	if wait := time.Until(at); wait > 0 {
		return false, wait
	}
	return true, 0
}
