package runner

// This file is the sending of chunks: one at a time or grouped by the batcher, with open
// chunks of idle stacks taken along (see Piggybacking in pump.go), and what an answer means:
// acknowledged, retried after a backoff, given up, or the end of posting.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
)

// post sends the head of the queue in the background. s.mu is held.
func (s *stackTail) post() {
	p := s.p
	lc := s.seize()
	if p.batchCh != nil {
		select {
		case p.batchCh <- pumpBatchReq{lc: lc, done: s.done}:
		case <-p.postCtx.Done():
			<-p.sem
			s.done <- p.postCtx.Err()
		}
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(p.postCtx, p.opts.PostTimeout)
		err := p.poster.LogChunk(ctx, lc)
		cancel()
		<-p.sem
		s.done <- err
	}()
}

// seize seals the head of the queue and marks it in flight; its outcome comes on s.done.
// s.mu is held.
func (s *stackTail) seize() events.LogChunk {
	s.queue[0].open = false
	s.inflight = true
	return s.queue[0].lc
}

// pumpBatchReq is one stack's chunk waiting for a batch; done gets the batch's outcome.
type pumpBatchReq struct {
	lc   events.LogChunk
	done chan<- error
}

// batcher groups the chunks posted at about the same time into LogChunks requests. It takes
// whatever is waiting when a request can leave, so under light load a chunk goes out alone and
// at once, and under heavy load requests grow instead of multiplying. Each request also takes
// the open chunks of otherwise idle stacks along (see piggyback). Every chunk holds a post slot
// until its batch is answered, so MaxInFlight still bounds what is in flight.
func (p *LogPump) batcher(bp LogBatchPoster) {
	defer p.bg.Done()
	free := make(chan struct{}, 4) // concurrent batch requests
	for {
		var first pumpBatchReq
		select {
		case first = <-p.batchCh:
		case <-p.postCtx.Done():
			return
		}
		select {
		case free <- struct{}{}:
		case <-p.postCtx.Done():
			p.answer([]pumpBatchReq{first}, p.postCtx.Err())
			return
		}
		batch := []pumpBatchReq{first}
		size := len(first.lc.Data)
	collect:
		for len(batch) < p.opts.MaxBatch {
			select {
			case r := <-p.batchCh:
				batch = append(batch, r)
				if size += len(r.lc.Data); size >= p.opts.BatchBytes {
					break collect
				}
			default:
				break collect
			}
		}
		batch = p.piggyback(batch, size)
		go func() {
			defer func() { <-free }()
			chunks := make([]events.LogChunk, len(batch))
			for i, r := range batch {
				chunks[i] = r.lc
			}
			ctx, cancel := context.WithTimeout(p.postCtx, p.opts.PostTimeout)
			err := bp.LogChunks(ctx, chunks)
			cancel()
			if len(batch) > 1 && logConflict(err) {
				// The server stored none of them: one chunk differs from its log. Posted one by
				// one, only that chunk is refused (and given up), the others are stored.
				p.postEach(batch)
				return
			}
			p.answer(batch, err)
		}()
	}
}

// piggyback adds to a batch about to leave the open chunks of stacks that are otherwise idle:
// nothing in flight, no retry pending, the head of the queue is the open chunk and it has
// data. Each is sealed then and there, before it is due, instead of falling due a little later
// and making a request of its own; a byte is thus posted earlier than Coalesce after it was
// read, never later. Chunks that are due come first (they are already in the batch), and a
// rider must fit within MaxBatch and BatchBytes and find a free post slot without waiting. A
// rider is taken only while at most half of the MaxInFlight slots would be in use, so that a
// chunk falling due while the request is answered is not kept waiting for a slot a rider took.
// The batcher never waits for a stack: one whose goroutine is busy (its mu is held) is left
// for the next batch, so a slow file or a stuck stack cannot hold a request back.
func (p *LogPump) piggyback(batch []pumpBatchReq, size int) []pumpBatchReq {
	if len(batch) >= p.opts.MaxBatch || size >= p.opts.BatchBytes {
		return batch
	}
	p.ridersMu.Lock()
	cands := p.riders
	p.riders = nil
	for _, s := range cands {
		s.listed.Store(false)
	}
	p.ridersMu.Unlock()
	keep := cands[:0]
	for _, s := range cands {
		if len(batch) >= p.opts.MaxBatch || !s.mu.TryLock() {
			keep = append(keep, s)
			continue
		}
		lc, took, later := s.ride(p.opts.BatchBytes - size)
		s.mu.Unlock()
		switch {
		case took:
			batch = append(batch, pumpBatchReq{lc: lc, done: s.done})
			size += len(lc.Data)
			p.piggybacked.Add(1)
		case later:
			keep = append(keep, s)
		}
	}
	for _, s := range keep {
		s.list()
	}
	return batch
}

// ride seals the open chunk for a batch about to leave and marks it in flight, if the stack
// is a rider (see piggyback), the chunk's data fits in room bytes and a post slot is free.
// later: it may ride another time (it is still a rider). s.mu is held.
func (s *stackTail) ride(room int) (lc events.LogChunk, took, later bool) {
	if s.gone || s.p.stopped.Load() != nil || !s.rider() {
		return lc, false, false
	}
	if len(s.queue[0].lc.Data) > room || 2*(len(s.p.sem)+1) > cap(s.p.sem) {
		return lc, false, true
	}
	select {
	case s.p.sem <- struct{}{}:
	default:
		return lc, false, true
	}
	return s.seize(), true, false
}

// rider reports whether the stack's open chunk may be taken by a batch that another stack's
// chunk sends (see piggyback). s.mu is held.
func (s *stackTail) rider() bool {
	return !s.inflight && len(s.queue) > 0 && s.queue[0].open && len(s.queue[0].lc.Data) > 0 &&
		s.retryAt.IsZero()
}

// offer lists the stack as a rider when it has become one; the batcher takes it off the list
// when it looks at it. s.mu is held.
func (s *stackTail) offer() {
	if s.p.batchCh != nil && !s.listed.Load() && s.rider() {
		s.list()
	}
}

// list puts the stack on the riders list once.
func (s *stackTail) list() {
	p := s.p
	p.ridersMu.Lock()
	defer p.ridersMu.Unlock()
	if !s.listed.Load() {
		s.listed.Store(true)
		p.riders = append(p.riders, s)
	}
}

// retire tells the batcher the goroutine ended, so that it no longer takes the stack's chunks.
func (s *stackTail) retire() {
	s.mu.Lock()
	s.gone = true
	s.mu.Unlock()
}

// postEach posts the chunks of a batch one by one and tells each stack its own outcome.
func (p *LogPump) postEach(batch []pumpBatchReq) {
	for _, r := range batch {
		ctx, cancel := context.WithTimeout(p.postCtx, p.opts.PostTimeout)
		err := p.poster.LogChunk(ctx, r.lc)
		cancel()
		p.answer([]pumpBatchReq{r}, err)
	}
}

// quotaExceeded reports whether the server refused a request for a quota (429, its message
// starting "quota exceeded"), not for the rate of requests: waiting does not help a log.
func quotaExceeded(ae *APIError) bool {
	return ae.StatusCode == http.StatusTooManyRequests && strings.HasPrefix(ae.Message, "quota exceeded")
}

// logConflict reports whether err is the server's 409: the chunk's bytes differ from the log
// it stored at that offset (another copy of the run, or one killed and started again, sent
// other bytes there first). Resending never helps.
func logConflict(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.StatusCode == http.StatusConflict
}

// answer releases the batch's post slots and tells each stack the outcome.
func (p *LogPump) answer(batch []pumpBatchReq, err error) {
	for _, r := range batch {
		<-p.sem
		r.done <- err
	}
}

// posted handles the outcome of the post of the head of the queue.
func (s *stackTail) posted(err error) {
	p := s.p
	if err != nil && logConflict(err) {
		s.giveUp(err)
		return
	}
	if err != nil {
		if p.opts.Permanent(err) {
			p.stopped.CompareAndSwap(nil, &err)
			p.pokeAllAsync()
			return
		}
		s.attempts++
		back := p.opts.RetryMin << min(s.attempts-1, 20)
		back = min(back, p.opts.RetryMax)
		back = back/2 + rand.N(back/2+1)
		s.retryAt = time.Now().Add(back)
		return
	}
	it := s.queue[0]
	s.queue = s.queue[1:]
	s.attempts, s.retryAt = 0, time.Time{}
	if it.lc.GapLength > 0 {
		s.gaps[it.gapIdx].Reported = true
		return
	}
	s.sentChunks++
	s.sentBytes += it.rawLen
	if it.cost > 0 {
		p.budget.release(it.cost)
	}
}

// giveUp drops the head of the queue, which the server refused for good (logConflict): the
// range stays in the DrainReport as not sent, with a warning, and the stack goes on with its
// next chunk. s.mu is held.
func (s *stackTail) giveUp(err error) {
	it := s.queue[0]
	s.queue = s.queue[1:]
	s.attempts, s.retryAt = 0, time.Time{}
	lc := it.lc
	what := fmt.Sprintf("%d bytes", len(lc.Data))
	if lc.GapLength > 0 {
		what = fmt.Sprintf("a gap record of %d bytes", lc.GapLength) // its gap stays unreported
	} else {
		s.gaps = append(s.gaps, StackGap{Stack: s.name, Generation: lc.Generation, From: lc.Offset, To: lc.Offset + int64(len(lc.Data)), Unsent: true})
	}
	s.errs = append(s.errs, fmt.Sprintf("stack %q: the server refused %s at offset %d of generation %d, not sending them again: %v",
		s.name, what, lc.Offset, lc.Generation, err))
	if it.cost > 0 {
		s.p.budget.release(it.cost)
	}
}

// pokeAllAsync wakes every stack from a stack goroutine (which must not wait on p.mu while
// holding nothing else, but may run concurrently with AddStack).
func (p *LogPump) pokeAllAsync() { go p.pokeAll() }
