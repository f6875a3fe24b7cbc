package runner

// This file is the pump's memory bound: every byte read and not yet acknowledged is charged
// to one budget of MaxBuffered bytes, handed out first come, first served.

import "sync"

// releaseBudget gives back what the stack still holds when its goroutine ends.
func (s *stackTail) releaseBudget() {
	b := s.p.budget
	if s.waiter != nil {
		b.cancel(s.waiter)
		s.waiter = nil
	}
	if s.granted > 0 {
		b.release(s.granted)
		s.granted = 0
	}
	for _, it := range s.queue {
		if it.cost > 0 {
			b.release(it.cost)
			it.cost = 0
		}
	}
}

// byteBudget is a counting semaphore in bytes with first-come, first-served waiters, so a
// stack waiting for memory is not starved by busier ones.
type byteBudget struct {
	mu      sync.Mutex
	avail   int64
	waiters []*budgetWaiter
}

// budgetWaiter is a queued request; ch is closed once the bytes were granted to it.
type budgetWaiter struct {
	n       int64
	ch      chan struct{}
	granted bool
}

func newByteBudget(n int64) *byteBudget { return &byteBudget{avail: n} }

// acquire takes n bytes now, or queues a waiter whose channel closes when they are granted.
func (b *byteBudget) acquire(n int64) (bool, *budgetWaiter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.waiters) == 0 && b.avail >= n {
		b.avail -= n
		return true, nil
	}
	w := &budgetWaiter{n: n, ch: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	return false, w
}

// release returns n bytes and grants waiters in order.
func (b *byteBudget) release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.avail += n
	b.grant()
}

// adjust changes a holding from old to new bytes without waiting (a masked chunk can be a
// little larger than what was read).
func (b *byteBudget) adjust(old, new int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.avail += old - new
	b.grant()
}

func (b *byteBudget) grant() {
	for len(b.waiters) > 0 && b.avail >= b.waiters[0].n {
		w := b.waiters[0]
		b.waiters = b.waiters[1:]
		b.avail -= w.n
		w.granted = true
		close(w.ch)
	}
}

// cancel withdraws a waiter, returning its bytes if they were granted meanwhile.
func (b *byteBudget) cancel(w *budgetWaiter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.granted {
		b.avail += w.n
		b.grant()
		return
	}
	for i, x := range b.waiters {
		if x == w {
			b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
			return
		}
	}
}

// budgetUsed returns the bytes currently charged to the read budget (for tests and benchmarks).
func (p *LogPump) budgetUsed() int64 {
	if p.budget == nil {
		return 0
	}
	p.budget.mu.Lock()
	defer p.budget.mu.Unlock()
	return p.opts.MaxBuffered - p.budget.avail
}
