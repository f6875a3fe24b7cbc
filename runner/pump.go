package runner

// This file is the LogPump: it tails every stack's log file and streams the appended bytes to
// the control plane.
//
// Offsets. Offsets count bytes of the log AS POSTED, i.e. after masking, within a generation:
// every chunk starts where the previous chunk's Data (or the previous gap's GapLength) ended, so
// the server can tile a generation with offset+len(data) and offset+gap_length alone. A secret
// replaced by "***" changes lengths, so after the first such replacement the posted offsets
// differ from file offsets by the accumulated difference (a gap's length is always counted in
// file bytes, which were never read and so never masked). Without masking, offsets are file
// offsets. A chunk is built once and kept until acknowledged; a retry resends the very same
// chunk (same offset, same bytes), which is what makes the server's (execution, stack,
// generation, offset) dedup an exactly-once effect.
//
// Generations. The first file seen is generation 0 (or the stack's FirstGenerations); with
// Fresh, a log file a stack has when it is added counts only from its first change. A
// truncation (the size shrinks, or the bytes the pump already read changed: `tee` without -a
// truncates at every command) or a new file at the path (deleted and recreated, renamed over)
// starts the next generation at offset 0. A rewrite that reproduces the first bytes and the
// bytes just before the read position of the previous generation, before the pump looked
// again, cannot be told from an append; bytes appended and then truncated away before the
// pump looked at all leave no trace to report.
//
// Watching. Each stack's DIRECTORY is watched with fsnotify (one watch per directory, not per
// file). A write event makes the stack fstat
// the file it has open, any other event (create, remove, rename) makes it resolve the path
// again. A stack whose directory cannot be watched (missing, watches exhausted) or goes away,
// or every stack once the watcher fails, is polled every PollInterval; watched stacks are also
// polled every SafetyPoll in case an event was lost, the poller waking only those whose log is
// no longer as they last saw it (see asLastSeen). Both ways run the same code on the same
// observations, so they yield the same result.
//
// Wake-ups. Events are taken in rounds at least MinReadInterval apart (the first after a quiet
// spell at once); meanwhile the kernel queues them, so a log written line by line wakes the
// pump's goroutines once per MinReadInterval, not once per write (see dispatch). The Go
// runtime itself still wakes, briefly, for every event the kernel queues without merging it:
// fsnotify keeps its descriptor in the runtime's poller. With 200 stacks each appending a line
// every 10 ms (and saving a plan file every second) that cost the pump about 0.2 CPU-seconds
// more per 5 seconds, with three times the context switches, than an inotify watcher kept out
// of the poller; not worth system calls of our own. No timer runs unless something is due: the
// poller's only while a stack is polled (otherwise once per SafetyPoll), a stack's only until
// its next chunk is due (a due chunk waiting for a post slot is woken by the slot).
//
// Liveness. A byte appended to a watched stack's log is read at most MinReadInterval after it
// was written (plus the time the round takes to collect the events queued meanwhile), at most
// PollInterval after for a polled stack, and at most SafetyPoll after should its event be lost
// (a queue overflow wakes every stack at once). It is posted at most Coalesce after it was
// read, unless the server is slower than the logs grow (MaxInFlight posts in flight, MaxBuffered
// bytes held). With the defaults: 100 ms + 250 ms for a watched stack, 100 ms + 250 ms polled
// (piggybacking, below, only ever posts a byte sooner). Bytes truncated away (the next
// command's `tee`) sooner than that after they were written may be lost, and are reported as a
// gap.
//
// Why those defaults. A person watching a log does not tell a third of a second from a
// twentieth, but the machine running the scripts does: every round and every post wakes the
// driver, and every post is a request the control plane handles, on CI runners whose cores the
// scripts already keep busy. On the 200-stack benchmark (scripts/bench.sh), going from 20 ms
// rounds and 50 ms coalescing to 100 ms and 250 ms cut the log posts from about 170 to about
// 95, the driver's CPU by about a sixth and the server's by about a quarter.
//
// Reading and memory. Appended bytes are read as soon as the pump sees them (so that a truncation
// right after them, the next command's `tee`, loses nothing) into the stack's open chunk, which is
// posted once it is full or Coalesce after its first byte, or sooner along with another stack's
// (see Piggybacking). A stack holds at most one chunk being posted and one open chunk, and every
// byte held is charged to a global budget (MaxBuffered): when a slow or dead server has used it
// up, the pump stops reading and the file itself is the buffer. Memory is thus bounded by
// MaxBuffered plus a small hold-back per stack whatever the log sizes, and writers are never
// blocked. Bytes are lost only when the file is truncated or replaced before the pump read them;
// such a range becomes a gap {stack, generation, from, to}, posted to the server in order (when it
// answers again) and listed in the DrainReport with what was still unsent when Drain gave up.
//
// Piggybacking. With a batching poster, a request that leaves because some chunk is due also
// takes along the open chunks of stacks that are otherwise idle (nothing in flight, no retry
// pending), sealing them before they are due: several stacks writing out of phase then share
// one request per coalescing period instead of making one each. Such a chunk is posted sooner
// than Coalesce after its first byte, never later; its stack's next bytes start a new chunk.
// Riders never delay a due chunk: the batcher only takes a stack it can lock without waiting,
// and within the MaxBatch, BatchBytes and post-slot room the due chunks leave (see piggyback).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/tfstackplan/tfstackplan/events"
)

// LogPoster is the narrow interface the pump posts through; *Client satisfies it.
type LogPoster interface {
	LogChunk(ctx context.Context, lc events.LogChunk) error
}

// LogBatchPoster is implemented by posters that can send several chunks in one request
// (*Client does, through the LogChunks operation). The pump then groups the chunks of all
// stacks that are due together, and takes the open chunks of idle stacks along (see
// Piggybacking in pump.go), so a busy run costs about one request per coalescing period
// instead of one per stack.
type LogBatchPoster interface {
	LogChunks(ctx context.Context, chunks []events.LogChunk) error
}

// PumpOptions tunes a LogPump. Zero fields take the defaults documented on each field.
type PumpOptions struct {
	// MaxChunk bounds the file bytes one chunk covers (default 256 KiB). Masking can make Data
	// longer only when a secret is shorter than "***", at most three times as long: the default
	// stays well within the server's chunk limit (1,500,000 bytes). A stack has one chunk in
	// flight at a time, so a log that grows fast reaches the server at MaxChunk per round trip:
	// 64 KiB chunks took 4.3 s to drain 20 MB from five stacks through a 50 ms round trip,
	// 256 KiB chunks 1.1 s.
	MaxChunk int
	// Coalesce is how long bytes read may wait for more before they are posted (default
	// 250 ms). A full chunk is posted at once, and an open chunk may be posted sooner, along
	// with another stack's due chunk (see Piggybacking in pump.go).
	Coalesce time.Duration
	// MaxInFlight bounds the chunks in flight across all stacks. With a batching poster (the
	// Client) the default is 64: they travel in at most four requests at a time, and chunks
	// taken along before they are due (see Piggybacking in pump.go) use only the first half of
	// the slots; with 16, a 200-stack run with four stacks at a time needed about 95 requests,
	// because the riders of a request ran out of slots, and with 64 about 40. Posted one by one
	// (NoBatch, or a poster that does not batch), each chunk is a request, and the default is 16.
	MaxInFlight int
	// MaxBuffered bounds the bytes read from files and not yet acknowledged, across all stacks
	// (default 16 MiB). Each stack also holds back at most 2*MaxSecretLength bytes for masking.
	MaxBuffered int64
	// Poll forces polling instead of fsnotify directory watches.
	Poll bool
	// PollInterval is how often polled stacks are looked at (default 100 ms). A stack is polled
	// when its directory cannot be watched (missing, watches exhausted) or fsnotify failed.
	PollInterval time.Duration
	// SafetyPoll is how often every watched stack is looked at anyway, in case an event was
	// lost (default 2 s).
	SafetyPoll time.Duration
	// MaxBatch bounds the chunks one batch request carries when the poster batches (default
	// 128); BatchBytes bounds their data (default 2 MiB). NoBatch posts chunk by chunk even
	// when the poster could batch.
	MaxBatch   int
	BatchBytes int
	NoBatch    bool
	// MinReadInterval spaces out the rounds in which file events reach the stacks (default
	// 100 ms): the first event after a quiet spell is handled at once, later ones wait, queued
	// in the kernel, until MinReadInterval after the previous round. Without it a log written
	// in many small pieces wakes the pump once per write. It bounds how late a watched stack
	// reads what was written (see Liveness in pump.go).
	MinReadInterval time.Duration
	// PostTimeout bounds one post attempt (default 10 s).
	PostTimeout time.Duration
	// RetryMin and RetryMax bound the exponential backoff between attempts at the same chunk
	// (defaults 50 ms and 2 s).
	RetryMin, RetryMax time.Duration
	// Masker masks secrets; nil keeps the pump's current one (see LogPump.Masker).
	Masker *Masker
	// Fresh makes the log file a stack has when AddStack is called an earlier run's: none of
	// it is posted while it stays as it was (the same file, size and modification time); its
	// first change (the scripts start every log afresh) starts the stack's first generation,
	// from its first byte. run plan and run apply set it.
	Fresh bool
	// FirstGenerations numbers the first log file of each stack it names (default 0): a later
	// pump of the same execution goes on where an earlier one ended (NextGenerations), since
	// the server keeps the first copy of each (stack, generation, offset).
	FirstGenerations map[string]int64
	// Permanent reports whether a post error means the server will never accept more (default:
	// a server-side cancel, a 403: the server refuses this runner the execution's logs, a 429
	// for a quota: the execution's logs reached what the server stores of one, or a
	// run that sends nothing for its execution: its Init was refused or panicked, errSilenced).
	// Posting then stops; what is left is reported unsent.
	Permanent func(error) bool
}

// The default MaxInFlight with a batching poster, and posting chunk by chunk.
const (
	defaultInFlightBatched = 64
	defaultInFlightSingle  = 16
)

// batches reports whether chunks posted through poster with options o travel in batches.
func batches(poster LogPoster, o PumpOptions) bool {
	_, ok := poster.(LogBatchPoster)
	return ok && !o.NoBatch
}

// withDefaults fills in the zero fields of o; batching: see batches.
func (o PumpOptions) withDefaults(batching bool) PumpOptions {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if o.MaxChunk <= 0 {
		o.MaxChunk = 256 << 10
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = defaultInFlightSingle
		if batching {
			o.MaxInFlight = defaultInFlightBatched
		}
	}
	if o.MaxBuffered <= 0 {
		o.MaxBuffered = 16 << 20
	}
	o.MaxBuffered = max(o.MaxBuffered, int64(o.MaxChunk))
	if o.MaxBatch <= 0 {
		o.MaxBatch = 128
	}
	if o.BatchBytes <= 0 {
		o.BatchBytes = 2 << 20
	}
	def(&o.Coalesce, 250*time.Millisecond)
	def(&o.PollInterval, 100*time.Millisecond)
	def(&o.SafetyPoll, 2*time.Second)
	def(&o.MinReadInterval, 100*time.Millisecond)
	def(&o.PostTimeout, 10*time.Second)
	def(&o.RetryMin, 50*time.Millisecond)
	def(&o.RetryMax, 2*time.Second)
	if o.Masker == nil {
		o.Masker = NewMasker()
	}
	if o.Permanent == nil {
		o.Permanent = func(err error) bool {
			var ae *APIError
			return errors.Is(err, ErrCancelRequested) || errors.Is(err, errSilenced) ||
				errors.As(err, &ae) && (ae.StatusCode == http.StatusForbidden || quotaExceeded(ae))
		}
	}
	return o
}

// StackGap is a range [From, To) of one generation of a stack's log that the server does not
// have (as far as the pump knows), in posted offsets (see pump.go: file offsets unless masking
// changed a length earlier in the generation).
type StackGap struct {
	Stack      string
	Generation int64
	From, To   int64
	// Unsent: the bytes were there but the pump did not get them acknowledged before Drain
	// ended (a post may still have landed). Otherwise they were lost: the file was truncated or
	// replaced before the pump read them.
	Unsent bool
	// Reported: the server acknowledged a gap record for this range.
	Reported bool
}

// DrainReport says what a LogPump delivered and what it did not.
type DrainReport struct {
	Stacks int   // stacks tailed
	Chunks int64 // data chunks acknowledged
	Bytes  int64 // file bytes covered by acknowledged chunks
	// Gaps lists, per stack in order, every range the server may lack: lost ranges and ranges
	// left unsent.
	Gaps []StackGap
	// Complete is true when every stack was read to its end, every byte read was acknowledged
	// and every gap was reported to the server (lost bytes may still be listed in Gaps).
	Complete bool
	// Stopped is the error that stopped posting for good (see PumpOptions.Permanent), if any.
	Stopped error
	// Errors are per-stack problems, e.g. a log file refused because it links outside the root.
	Errors []string
}

// LostBytes returns the number of bytes in gaps (lost or unsent).
func (r DrainReport) LostBytes() int64 {
	var n int64
	for _, g := range r.Gaps {
		n += g.To - g.From
	}
	return n
}

// LogPump tails each stack's log file (<root>/<stack>/<file>) and posts newly appended bytes
// through a LogPoster, masked, in order per stack, in parallel across stacks. All posting is
// best-effort; see the comment at the top of pump.go for offsets, generations and memory.
type LogPump struct {
	poster  LogPoster
	root    stackRoot // the project root, resolved once (rootErr: it could not be)
	rootErr error
	file    string
	execID  string
	opts    PumpOptions

	mu       sync.Mutex
	stacks   []*stackTail
	byName   map[string]*stackTail
	byDir    map[string][]*stackTail
	started  bool
	draining bool
	runCtx   context.Context
	watcher  *fsnotify.Watcher // nil: every stack is polled
	wg       sync.WaitGroup    // stack goroutines
	bg       sync.WaitGroup    // dispatcher and poller

	sem        chan struct{}
	batchCh    chan pumpBatchReq // nil unless the poster batches
	budget     *byteBudget
	drainCh    chan struct{} // closed when Drain begins
	drainCtx   context.Context
	stopBg     chan struct{}
	stopOnce   sync.Once
	postCtx    context.Context // cancelled when posting must end
	cancelPost context.CancelFunc
	watchBroke atomic.Bool
	stopped    atomic.Pointer[error]
	npolled    atomic.Int64  // stacks polled every PollInterval
	pollKick   chan struct{} // tells the poller a stack became polled

	// riders lists the stacks that may have an open chunk to piggyback (see piggyback); a
	// stack is on it at most once (stackTail.listed).
	ridersMu sync.Mutex
	riders   []*stackTail

	// Counters for tests and diagnostics: events and errors dispatch received (the round
	// markers' included), its rounds, the poller's wake-ups and the stack goroutines', and the
	// chunks that rode in a batch before they were due.
	events, rounds, pollWakes, stackWakes, piggybacked atomic.Int64
	// holdHook, when set (tests), is called as dispatch holds events back, and the hold lasts
	// until it returns.
	holdHook func(time.Duration)
}

// NewLogPump builds a pump that posts via p, reading the file named file in each stack
// directory under root and tagging chunks with execID. Add stacks with AddStack, then Start;
// end with Drain. A nil p, or one with an Enabled method reporting false (a disabled *Client),
// makes a pump that reads nothing.
func NewLogPump(p LogPoster, root, file, execID string) *LogPump {
	postCtx, cancel := context.WithCancel(context.Background())
	lp := &LogPump{
		poster: p, file: file, execID: execID,
		opts:   PumpOptions{}.withDefaults(batches(p, PumpOptions{})),
		byName: map[string]*stackTail{}, byDir: map[string][]*stackTail{},
		drainCh: make(chan struct{}), stopBg: make(chan struct{}), pollKick: make(chan struct{}, 1),
		postCtx: postCtx, cancelPost: cancel,
	}
	lp.root, lp.rootErr = newStackRoot(root)
	return lp
}

// SetOptions replaces the pump's options; it must be called before Start. A nil Masker keeps
// the current one (and the secrets already added to it).
func (p *LogPump) SetOptions(o PumpOptions) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started {
		return errors.New("log pump: SetOptions after Start")
	}
	if o.Masker == nil {
		o.Masker = p.opts.Masker
	}
	p.opts = o.withDefaults(batches(p.poster, o))
	return nil
}

// Masker returns the masker applied to every byte before it is posted; add configured secret
// values to it (values announced with `::add-mask::` in a log are added automatically).
func (p *LogPump) Masker() *Masker { return p.opts.Masker }

// enabled reports whether there is anywhere to post to.
func (p *LogPump) enabled() bool {
	if p.poster == nil {
		return false
	}
	if e, ok := p.poster.(interface{ Enabled() bool }); ok {
		return e.Enabled()
	}
	return true
}

// AddStack starts tailing stack's log (now, or at Start). The stack path is resolved under the
// root and refused when it escapes it ("..", absolute, a symbolic link pointing outside); the
// log file itself is checked the same way every time it is opened.
func (p *LogPump) AddStack(stack string) error {
	if p.rootErr != nil {
		return fmt.Errorf("log pump: %w", p.rootErr)
	}
	// The stack directory and the log file are both checked: an escaping stack path, or a log
	// that is a link pointing outside (or dangling) right now, refuses the stack.
	path, li, err := p.root.stackFileInfo(stack, p.file)
	if err != nil {
		return fmt.Errorf("log pump: stack %q: %w", stack, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.draining {
		return fmt.Errorf("log pump: stack %q added after Drain", stack)
	}
	if _, dup := p.byName[stack]; dup {
		return fmt.Errorf("log pump: stack %q added twice", stack)
	}
	s := &stackTail{p: p, name: stack, path: path, watchDir: filepath.Dir(path), wake: make(chan struct{}, 1), done: make(chan error, 1), gen: -1, firstGen: p.opts.FirstGenerations[stack]}
	if p.opts.Fresh && li != nil && li.Mode().IsRegular() {
		s.earlier = li
	}
	p.stacks = append(p.stacks, s)
	p.byName[stack] = s
	if p.started {
		p.launch(s)
	}
	return nil
}

// Start begins tailing; the end of ctx stops the pump abruptly (Drain is the orderly end, and
// still reports afterwards). Stacks added later start at once.
func (p *LogPump) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started {
		return errors.New("log pump: started twice")
	}
	p.started = true
	p.runCtx = ctx
	if !p.enabled() {
		return nil
	}
	p.sem = make(chan struct{}, p.opts.MaxInFlight)
	if batches(p.poster, p.opts) {
		p.batchCh = make(chan pumpBatchReq, p.opts.MaxInFlight)
		p.bg.Add(1)
		go p.batcher(p.poster.(LogBatchPoster))
	}
	p.budget = newByteBudget(p.opts.MaxBuffered)
	if !p.opts.Poll {
		p.startWatcher()
	}
	p.bg.Add(1)
	go p.poll()
	for _, s := range p.stacks {
		p.launch(s)
	}
	context.AfterFunc(ctx, func() {
		p.cancelPost()
		p.stopBackground()
	})
	return nil
}

// launch watches s's directory (or marks it polled) and starts its goroutine. p.mu is held.
func (p *LogPump) launch(s *stackTail) {
	if !p.enabled() {
		return
	}
	s.ms = maskStream{m: p.opts.Masker, lineStart: true}
	watched := false
	if p.watcher != nil && !p.watchBroke.Load() {
		if err := p.watcher.Add(s.watchDir); err == nil {
			watched = true
			p.byDir[s.watchDir] = append(p.byDir[s.watchDir], s)
		}
	}
	if !watched {
		p.markPolled(s)
	}
	p.wg.Add(1)
	go s.run(p.runCtx)
}

// Drain posts everything left (reading every log to its current end and flushing held-back
// bytes), bounded by ctx, stops the pump and reports what was delivered and what was not.
// Call it once, after the writers are done.
func (p *LogPump) Drain(ctx context.Context) DrainReport {
	p.mu.Lock()
	if !p.started {
		p.mu.Unlock()
		_ = p.Start(ctx)
		p.mu.Lock()
	}
	if p.draining {
		p.mu.Unlock()
		return DrainReport{Errors: []string{"log pump: Drain called twice"}}
	}
	p.draining = true
	p.drainCtx = ctx
	close(p.drainCh)
	p.mu.Unlock()
	// Every stack now looks at its log once more and reads it to its end: the watcher and the
	// poller have nothing left to wake, and the watcher's end overlaps the last reads and posts.
	p.stopBackground()

	stopPosts := context.AfterFunc(ctx, p.cancelPost)
	p.wg.Wait()
	stopPosts()
	p.cancelPost()
	p.bg.Wait()
	return p.report()
}

// NextGenerations returns, once Drain has returned, the generation each stack's log would go
// on in: one past the last this pump numbered, or its first when it saw no file. A later pump
// of the same execution takes it as FirstGenerations.
func (p *LogPump) NextGenerations() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	next := make(map[string]int64, len(p.stacks))
	for _, s := range p.stacks {
		s.mu.Lock()
		next[s.name] = s.firstGen
		if s.gen >= s.firstGen {
			next[s.name] = s.gen + 1
		}
		s.mu.Unlock()
	}
	return next
}

// stopBackground ends the dispatcher and the poller (once: Drain or the end of Start's ctx).
func (p *LogPump) stopBackground() {
	p.stopOnce.Do(func() {
		close(p.stopBg)
		if p.watcher != nil {
			_ = p.watcher.Close()
		}
	})
}

// report assembles the DrainReport once every stack goroutine has ended.
func (p *LogPump) report() DrainReport {
	r := DrainReport{Stacks: len(p.stacks), Complete: true}
	if e := p.stopped.Load(); e != nil {
		r.Stopped = *e
		r.Complete = false
	}
	for _, s := range p.stacks {
		r.Chunks += s.sentChunks
		r.Bytes += s.sentBytes
		r.Errors = append(r.Errors, s.errs...)
		gaps := append([]StackGap(nil), s.gaps...)
		for _, it := range s.queue {
			if it.lc.GapLength == 0 {
				gaps = append(gaps, StackGap{Stack: s.name, Generation: it.lc.Generation, From: it.lc.Offset, To: it.lc.Offset + int64(len(it.lc.Data)), Unsent: true})
			}
		}
		if s.f != nil && s.seen > s.emitOff {
			gaps = append(gaps, StackGap{Stack: s.name, Generation: s.gen, From: s.sendOff, To: s.sendOff + s.seen - s.emitOff, Unsent: true})
		}
		if s.f != nil {
			_ = s.f.Close()
		}
		sort.SliceStable(gaps, func(i, j int) bool {
			if gaps[i].Generation != gaps[j].Generation {
				return gaps[i].Generation < gaps[j].Generation
			}
			return gaps[i].From < gaps[j].From
		})
		for _, g := range gaps {
			if g.Unsent || !g.Reported {
				r.Complete = false
			}
		}
		r.Gaps = append(r.Gaps, gaps...)
	}
	return r
}
