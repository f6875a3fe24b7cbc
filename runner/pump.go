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
// pump once per MinReadInterval, not once per write (see dispatch). No
// timer runs unless something is due: the poller's only while a stack is polled (otherwise
// once per SafetyPoll), a stack's only until its next chunk is due (a due chunk waiting for a
// post slot is woken by the slot).
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
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
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

// startWatcher starts the directory watcher and its dispatcher; without one every stack is
// polled.
func (p *LogPump) startWatcher() {
	if w, err := fsnotify.NewWatcher(); err == nil {
		p.watcher = w
		p.bg.Add(1)
		go p.dispatch(w)
	}
}

// dispatch turns fsnotify events on stack directories into wake-ups of the stacks concerned.
//
// It throttles at the source, in rounds at least MinReadInterval apart: the first event after
// a quiet spell starts a round at once; an event that comes sooner is held until
// MinReadInterval after the previous round began. Meanwhile dispatch does not receive, so
// fsnotify's reader blocks on its unbuffered channel instead of waking for every write, and
// the kernel queues the events (merging consecutive identical ones, as a log written line by
// line makes). A round takes every event queued before it began and wakes each stack concerned
// once. When nothing happens, dispatch waits without any timer.
//
// fsnotify hands events over one at a time, so "everything queued" needs a marker: each round
// begins by writing to a file in a private temporary directory that is watched too, and takes
// events until that write's own event comes through, or an overflow (which may have dropped
// it), or MinReadInterval passed (it was lost some other way). Without a usable marker a round
// takes what fsnotify has at hand, and an event its reader had not handed over yet waits for
// the next round.
func (p *LogPump) dispatch(w *fsnotify.Watcher) {
	defer p.bg.Done()
	d := &dispatcher{p: p, w: w, base: filepath.Base(p.file)}
	defer d.setMarker()()
	hold := time.NewTimer(time.Hour)
	hold.Stop()
	var last time.Time // when the last round began
	for {
		if _, alive := d.take(true, nil); !alive {
			return
		}
		if wait := p.opts.MinReadInterval - time.Since(last); wait > 0 && !p.holdEvents(hold, wait) {
			return
		}
		last = time.Now()
		p.rounds.Add(1)
		if !d.drain(hold) {
			return
		}
		d.wake()
	}
}

// dispatcher is dispatch's state: the round marker and the stacks the current round wakes.
type dispatcher struct {
	p       *LogPump
	w       *fsnotify.Watcher
	base    string
	pending []*stackTail

	marker     *os.File // nil: no marker, rounds end when fsnotify has nothing at hand
	markerDir  string
	markerName string
	marked     bool // the marker's event (or an overflow) came through
}

// setMarker creates and watches the round marker (see dispatch), if it can, and returns the
// function that removes it.
func (d *dispatcher) setMarker() (remove func()) {
	dir, err := os.MkdirTemp("", "tfstackplan-pump-")
	if err != nil {
		return func() {}
	}
	removeDir := func() { _ = os.RemoveAll(dir) }
	// Created before the directory is watched, so that only the rounds' writes make events.
	f, err := os.Create(filepath.Join(dir, "round"))
	if err != nil {
		return removeDir
	}
	if err := d.w.Add(dir); err != nil {
		_ = f.Close()
		return removeDir
	}
	d.marker, d.markerDir, d.markerName = f, dir, f.Name()
	return func() {
		_ = f.Close()
		removeDir()
	}
}

// take receives one event or error and notes what it means. With block set it waits for one,
// for the end of the pump or for timeout (nil: none). got: something was received; alive:
// dispatch goes on.
func (d *dispatcher) take(block bool, timeout <-chan time.Time) (got, alive bool) {
	var (
		ev      fsnotify.Event
		err     error
		isEvent bool
		ok      bool
	)
	if block {
		select {
		case <-d.p.stopBg:
			return false, false
		case <-timeout:
			return false, true
		case ev, ok = <-d.w.Events:
			isEvent = true
		case err, ok = <-d.w.Errors:
		}
	} else {
		select {
		case ev, ok = <-d.w.Events:
			isEvent = true
		case err, ok = <-d.w.Errors:
		default:
			return false, true
		}
	}
	p := d.p
	p.events.Add(1)
	switch {
	case !ok:
		// The watcher was closed.
		p.pollEverything()
		return false, false
	case isEvent && d.marker != nil && (ev.Name == d.markerName || ev.Name == d.markerDir):
		d.marked = true
		if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
			// Gone (a temporary-directory cleaner): rounds go on without it.
			_ = d.marker.Close()
			d.marker = nil
		}
	case isEvent:
		d.note(ev)
	default:
		if !errors.Is(err, fsnotify.ErrEventOverflow) {
			p.pollEverything()
		}
		// Events were dropped (or fsnotify failed): every stack looks again.
		p.pokeAll()
		d.marked = true // the marker's event may be among those dropped
	}
	return true, true
}

// drain takes the events of a round (see dispatch): up to the marker's, within MinReadInterval
// (timed with t), or without a marker whatever fsnotify has at hand (yielding once before
// concluding that nothing is left, to let its reader reach its next send). It reports false
// when dispatch must end.
func (d *dispatcher) drain(t *time.Timer) bool {
	if d.marker != nil {
		if _, err := d.marker.WriteAt([]byte{'.'}, 0); err == nil {
			t.Reset(d.p.opts.MinReadInterval)
			defer t.Stop()
			for d.marked = false; !d.marked; {
				got, alive := d.take(true, t.C)
				if !alive {
					return false
				}
				if !got {
					return true // the marker's event is late or lost: the rest waits for the next round
				}
			}
			return true
		}
	}
	yielded := false
	for {
		got, alive := d.take(false, nil)
		switch {
		case !alive:
			return false
		case got:
			yielded = false
		case yielded:
			return true
		default:
			runtime.Gosched()
			yielded = true
		}
	}
}

// note records which stacks an event concerns; wake wakes them.
func (d *dispatcher) note(ev fsnotify.Event) {
	p := d.p
	p.mu.Lock()
	inDir := p.byDir[filepath.Dir(ev.Name)]
	self := p.byDir[ev.Name]
	p.mu.Unlock()
	if filepath.Base(ev.Name) == d.base {
		for _, s := range inDir {
			if !ev.Has(fsnotify.Write) {
				s.pathChanged.Store(true)
			}
			d.add(s)
		}
	}
	for _, s := range self {
		// The directory itself went away: its watch is gone, fall back to polling.
		if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
			p.markPolled(s)
		}
		s.pathChanged.Store(true)
		d.add(s)
	}
}

// add puts s on the round's list once.
func (d *dispatcher) add(s *stackTail) {
	if !s.pending {
		s.pending = true
		d.pending = append(d.pending, s)
	}
}

// wake wakes the stacks the round's events concern, once each.
func (d *dispatcher) wake() {
	for _, s := range d.pending {
		s.pending = false
		s.poke()
	}
	clear(d.pending)
	d.pending = d.pending[:0]
}

// holdEvents waits for d (or the end of the pump) without receiving events; it reports false
// when dispatch must end.
func (p *LogPump) holdEvents(t *time.Timer, d time.Duration) bool {
	if p.holdHook != nil {
		p.holdHook(d)
		d = 0
	}
	t.Reset(d)
	select {
	case <-p.stopBg:
		t.Stop()
		return false
	case <-t.C:
		return true
	}
}

// pollEverything is the fallback when fsnotify fails or its watcher goes away: every stack
// is polled from now on.
func (p *LogPump) pollEverything() {
	p.watchBroke.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.stacks {
		p.markPolled(s)
		s.pathChanged.Store(true)
		s.poke()
	}
}

// markPolled makes s polled every PollInterval from now on (a stack never goes back to
// being watched) and has the poller adjust its timer.
func (p *LogPump) markPolled(s *stackTail) {
	if s.polled.Swap(true) {
		return
	}
	p.npolled.Add(1)
	select {
	case p.pollKick <- struct{}{}:
	default:
	}
}

// poll wakes polled stacks every PollInterval and every stack every SafetyPoll. Its timer is
// armed for the next PollInterval only while some stack is polled; otherwise it fires once
// per SafetyPoll.
func (p *LogPump) poll() {
	defer p.bg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	now := time.Now()
	nextPoll, nextSafety := now.Add(p.opts.PollInterval), now.Add(p.opts.SafetyPoll)
	for {
		at := nextSafety
		if p.npolled.Load() > 0 && nextPoll.Before(at) {
			at = nextPoll
		}
		t.Reset(time.Until(at))
		select {
		case <-p.stopBg:
			return
		case <-p.pollKick:
			// A stack became polled: its first poll is due PollInterval after the last one.
			continue
		case <-t.C:
		}
		p.pollWakes.Add(1)
		now := time.Now()
		all := !now.Before(nextSafety)
		if all {
			nextSafety = now.Add(p.opts.SafetyPoll)
		}
		nextPoll = now.Add(p.opts.PollInterval)
		p.mu.Lock()
		stacks := p.stacks // only ever appended to: this prefix stays as it is
		p.mu.Unlock()
		for _, s := range stacks {
			polled := s.polled.Load()
			// A watched stack whose log is as it last saw it has nothing to look at: waking
			// every stack of a 200-stack run at once, every SafetyPoll, was a quarter of the
			// driver's goroutine wake-ups.
			if polled || all && !s.asLastSeen() {
				s.pathChanged.Store(true)
				s.poke()
			}
		}
	}
}

// pokeAll wakes every stack and makes it look at its path again.
func (p *LogPump) pokeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.stacks {
		s.pathChanged.Store(true)
		s.poke()
	}
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

// full reports whether an open chunk has no room left for another read.
func (s *stackTail) full(it *pumpItem) bool {
	return it.rawLen+int64(len(s.ms.hold)) >= int64(s.p.opts.MaxChunk)
}

// pread reads exactly len(b) bytes at off, or reports false.
func (s *stackTail) pread(b []byte, off int64) bool {
	n, err := s.f.ReadAt(b, off)
	return n == len(b) && (err == nil || errors.Is(err, io.EOF))
}

// sameBytesAt reports whether the file still holds want at off.
func (s *stackTail) sameBytesAt(want []byte, off int64) bool {
	if len(want) == 0 {
		return true
	}
	got := make([]byte, len(want))
	return s.pread(got, off) && bytes.Equal(got, want)
}

// unchanged reports whether the bytes of this generation the pump already looked at are still
// there: the bytes just before the read position, or the head of the file before any was read.
func (s *stackTail) unchanged() bool {
	if len(s.anchor) > 0 {
		return s.sameBytesAt(s.anchor, s.readOff-int64(len(s.anchor)))
	}
	return s.sameBytesAt(s.head, 0)
}

// observe looks at the file: it opens it when it appears, detects a new generation
// (truncation, rewrite, replacement) and records the size.
func (s *stackTail) observe() {
	defer func() {
		s.obsGen.Store(s.gen)
		s.obsSize.Store(s.seen)
	}()
	if s.f != nil && !s.pathChanged.Swap(false) && !s.polled.Load() {
		// Watched, and only writes happened: the open file is still the one at the path.
		if fi, err := s.f.Stat(); err == nil {
			s.checkSize(fi.Size())
			return
		}
	}
	if s.f != nil {
		// The file the pump has open is still at the path it was resolved to.
		if li, err := os.Lstat(s.path); err == nil && os.SameFile(s.fi, li) {
			s.checkSize(li.Size())
			return
		}
	}
	if s.f == nil && s.earlier != nil {
		if s.asEarlier() {
			return // nothing of it is posted
		}
		s.earlier = nil
	}
	if s.f == nil && s.absent != "" {
		// Still absent at its path, links on the way followed as they are now (a link repointed
		// since is followed to where it points now): nothing to open, and no need to walk the
		// stack path again on every look at an idle stack. Anything found there is resolved in
		// full before it is opened.
		if _, err := os.Lstat(s.absent); errors.Is(err, fs.ErrNotExist) {
			s.checkDirGone(err)
			return
		}
		s.absent = ""
	}
	// Absent, replaced or never opened: resolve the path again before opening anything.
	path, li, err := s.p.root.stackFileInfo(s.name, s.p.file)
	if err != nil {
		s.complain(err)
		s.checkDirGone(err)
		s.statOpen()
		return
	}
	if li == nil { // nothing at the path
		if s.f == nil {
			s.absent = filepath.Join(s.p.root.real, filepath.FromSlash(s.name), filepath.FromSlash(s.p.file))
		}
		s.checkDirGone(fs.ErrNotExist)
		s.statOpen()
		return
	}
	s.path = path
	if s.f == nil || !os.SameFile(s.fi, li) {
		f, fi, err := openResolved(path)
		if err != nil {
			s.complain(err)
			s.statOpen()
			return
		}
		if s.f != nil {
			// Replaced: the old inode is still readable, and its size is exact.
			lost := s.seen
			if oi, err := s.f.Stat(); err == nil {
				lost = max(lost, oi.Size())
			}
			_ = s.f.Close()
			s.endGeneration(lost)
		} else {
			s.gen = s.firstGen
		}
		s.f, s.fi = f, fi
		s.seen = fi.Size()
		s.captureHead()
		return
	}
	s.checkSize(li.Size())
}

// checkDirGone makes a watched stack polled when its log is missing because its directory is
// gone. The directory's watch says nothing more then: not even that the directory went away,
// while the pump still has the old log inside it open (that keeps the directory's inode, so
// the kernel sends no delete event for it).
func (s *stackTail) checkDirGone(err error) {
	if !errors.Is(err, fs.ErrNotExist) || s.polled.Load() {
		return
	}
	if _, derr := os.Stat(s.watchDir); errors.Is(derr, fs.ErrNotExist) {
		s.p.markPolled(s)
	}
}

// complain records, once per stack, why its log file cannot be used (a missing file is not a
// problem: it may appear later).
func (s *stackTail) complain(err error) {
	if s.refused || errors.Is(err, fs.ErrNotExist) {
		return
	}
	s.refused = true
	if errors.Is(err, ErrPathEscapes) {
		s.errs = append(s.errs, fmt.Sprintf("stack %q: log file refused: %v", s.name, err))
		return
	}
	s.errs = append(s.errs, fmt.Sprintf("stack %q: log file unreadable: %v", s.name, err))
}

// statOpen updates the size from the open file when the path is gone or unusable (a deleted
// file can still be read through its descriptor).
func (s *stackTail) statOpen() {
	if s.f == nil {
		return
	}
	if fi, err := s.f.Stat(); err == nil {
		s.checkSize(fi.Size())
	}
}

// checkSize records size, starting a new generation when the file was truncated or rewritten.
func (s *stackTail) checkSize(size int64) {
	if size < s.seen || size < s.readOff || !s.unchanged() {
		s.endGeneration(s.seen)
		// size was taken before the content check; the new generation may already be larger
		// or smaller.
		size = 0
		if fi, err := s.f.Stat(); err == nil {
			size = fi.Size()
		}
	}
	s.seen = max(s.seen, size)
	s.captureHead()
}

// captureHead remembers the first bytes of the generation once they exist.
func (s *stackTail) captureHead() {
	if len(s.head) >= headLen || s.seen <= int64(len(s.head)) {
		return
	}
	h := make([]byte, min(int64(headLen), s.seen))
	if !s.pread(h, 0) || !bytes.Equal(h[:len(s.head)], s.head) {
		return
	}
	s.head = h
}

// endGeneration closes the current generation: held-back bytes are flushed as its last chunk
// (or counted lost when the stack is already behind), bytes up to lostTo that were never read
// become a gap, and the next generation starts at offset 0.
func (s *stackTail) endGeneration(lostTo int64) {
	from := s.readOff
	if len(s.ms.hold) > 0 {
		if s.openItem() == nil && s.dataItems() >= 2 {
			from = s.emitOff // already behind: the held-back bytes go with the loss
		} else {
			// Small (bounded by the hold-back), so it is not charged to the budget.
			c, out := s.ms.cut(s.ms.window(0), true)
			s.enqueueData(out, c, 0)
		}
	}
	s.seal()
	if lostTo > from {
		s.addGap(from, lostTo)
	}
	s.ms.reset()
	s.gen++
	s.readOff, s.emitOff, s.sendOff, s.seen = 0, 0, 0, 0
	s.head, s.anchor = nil, nil
}

// addGap records the loss of file bytes [from, to), which start at emitOff (held-back bytes
// were flushed or are part of the loss), and queues its gap record.
func (s *stackTail) addGap(from, to int64) {
	at := s.sendOff
	s.sendOff += to - from
	s.gaps = append(s.gaps, StackGap{Stack: s.name, Generation: s.gen, From: at, To: s.sendOff})
	queued, oldest := 0, -1
	for i, it := range s.queue {
		if it.lc.GapLength > 0 {
			queued++
			if oldest < 0 && !(i == 0 && s.inflight) {
				oldest = i
			}
		}
	}
	if queued >= maxQueuedGaps && oldest >= 0 {
		// The oldest record is not posted; it stays in the DrainReport as unreported.
		s.queue = append(s.queue[:oldest], s.queue[oldest+1:]...)
	}
	s.queue = append(s.queue, &pumpItem{
		lc:     events.LogChunk{ExecutionID: s.p.execID, Stack: s.name, Generation: s.gen, Offset: at, GapLength: to - from},
		gapIdx: len(s.gaps) - 1,
	})
}

// dataItems counts the data chunks queued.
func (s *stackTail) dataItems() int {
	n := 0
	for _, it := range s.queue {
		if it.lc.GapLength == 0 {
			n++
		}
	}
	return n
}

// openItem returns the open chunk at the tail of the queue, if any.
func (s *stackTail) openItem() *pumpItem {
	if n := len(s.queue); n > 0 && s.queue[n-1].open {
		return s.queue[n-1]
	}
	return nil
}

// seal closes the open chunk: it is posted as it is from now on.
func (s *stackTail) seal() {
	if it := s.openItem(); it != nil {
		it.open = false
	}
}

// enqueueData appends masked bytes covering rawLen file bytes to the open chunk, opening one
// when there is none.
func (s *stackTail) enqueueData(out []byte, rawLen int, cost int64) {
	it := s.openItem()
	if it == nil {
		it = &pumpItem{
			lc:     events.LogChunk{ExecutionID: s.p.execID, Stack: s.name, Generation: s.gen, Offset: s.sendOff},
			open:   true,
			opened: time.Now(),
		}
		s.queue = append(s.queue, it)
	}
	if it.lc.Data == nil {
		it.lc.Data = out
	} else {
		it.lc.Data = append(it.lc.Data, out...)
	}
	it.rawLen += int64(rawLen)
	it.cost += cost
	s.emitOff += int64(rawLen)
	s.sendOff += int64(len(out))
}

// fill reads what was appended into the open chunk (opening one if at most one sealed chunk
// waits), as far as the chunk size and the byte budget allow; draining, it also flushes the
// held-back bytes at the end of the file.
func (s *stackTail) fill(draining bool) {
	if s.f == nil {
		return
	}
	open := s.openItem()
	if open == nil && s.dataItems() >= 2 {
		return
	}
	avail := s.seen - s.readOff
	if avail <= 0 {
		if draining && len(s.ms.hold) > 0 {
			// Small (bounded by the hold-back), so it is not charged to the budget.
			c, out := s.ms.cut(s.ms.window(0), true)
			s.enqueueData(out, c, 0)
		}
		return
	}
	room := int64(s.p.opts.MaxChunk - len(s.ms.hold))
	if open != nil {
		room -= open.rawLen
		if room <= 0 {
			return
		}
	} else {
		room = max(room, 512) // a long hold-back must not stall the stream
	}
	n := min(avail, room)
	if s.granted == 0 {
		if s.waiter != nil {
			return
		}
		ok, w := s.p.budget.acquire(n)
		if !ok {
			s.waiter = w
			return
		}
		s.granted = n
	}
	n = min(n, s.granted)
	w := s.ms.window(int(n))
	if !s.pread(w[len(w)-int(n):], s.readOff) || !s.unchanged() {
		// Truncated or rewritten under us: what was read may belong to the next generation.
		s.endGeneration(s.seen)
		return
	}
	s.readOff += n
	s.anchor = bytes.Clone(w[max(0, len(w)-anchorLen):])
	if len(s.anchor) > int(s.readOff) {
		s.anchor = s.anchor[len(s.anchor)-int(s.readOff):]
	}
	c, out := s.ms.cut(w, draining && s.readOff >= s.seen)
	granted := s.granted
	s.granted = 0
	if c == 0 {
		s.p.budget.release(granted)
		return
	}
	cost := int64(len(out))
	s.p.budget.adjust(granted, cost) // a masked chunk can be a little larger than what was read
	s.enqueueData(out, c, cost)
}

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
