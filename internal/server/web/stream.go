package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Live-stream tuning.
const (
	// InitialLogTail is how much of each stack's log a freshly opened page receives.
	InitialLogTail = 256 << 10
	// DefaultMaxStreams and DefaultMaxStreamsPerPrincipal are the live-stream caps when
	// UI.MaxStreams and UI.MaxStreamsPerPrincipal are zero.
	DefaultMaxStreams             = 1000
	DefaultMaxStreamsPerPrincipal = 50

	// maxLogPerPush bounds the log bytes one update renders per stack, maxLogPerUpdate per view.
	maxLogPerPush   = 1 << 20
	maxLogPerUpdate = 4 << 20
	// maxLogStepsPerPush bounds the log reads and events one update renders per stack (and a
	// snapshot per stack), maxLogStepsPerUpdate per view: a log of many small pieces (a byte, a
	// gap, a byte…) costs an event per piece however few its bytes.
	maxLogStepsPerPush   = 4096
	maxLogStepsPerUpdate = 16384
	// feedBytes bounds the rendered events a feed keeps for its streams to catch up on.
	feedBytes    = 16 << 20
	coalesce     = 100 * time.Millisecond
	refresh      = 10 * time.Second
	writeTimeout = 10 * time.Second
)

// keepalive is how often an idle stream sends a comment, and a stream opened by a session
// checks that the session still lives (a variable so that tests wait less).
var keepalive = 15 * time.Second

// Renders counts the views rendered for live streams since the process started: one per feed
// update, however many streams show the feed.
func (u *UI) Renders() int64 { return u.feeds.renders.Load() }

// streamCaps counts live streams, in all and per principal.
type streamCaps struct {
	mu          sync.Mutex
	total       int
	per         map[string]int
	max, maxPer int
}

// acquire takes a stream for who, or says why not.
func (c *streamCaps) acquire(who string) (release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.per[who] >= c.maxPer:
		return nil, fmt.Errorf("too many live streams for %s: the limit is %d; close other pages and retry", who, c.maxPer)
	case c.total >= c.max:
		return nil, fmt.Errorf("too many live streams on this server: the limit is %d; retry later", c.max)
	}
	c.per[who]++
	c.total++
	return sync.OnceFunc(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.total--
		if c.per[who]--; c.per[who] == 0 {
			delete(c.per, who)
		}
	}), nil
}

// event renders one Server-Sent Event.
func event(name string, v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, "event: %s\ndata: %s\n\n", name, data), nil
}

// htmlEvent renders template tmpl of data as the event name carrying {"html": …}.
func htmlEvent(name, tmpl string, data any) ([]byte, error) {
	var buf bytes.Buffer
	if err := execute(&buf, tmpl, data); err != nil {
		return nil, err
	}
	return event(name, map[string]string{"html": buf.String()})
}

// view is what a feed renders: the executions list under one filter, or one execution.
type view interface {
	// execID is the execution whose changes the view follows (service.AllExecutions: any).
	execID() string
	// update renders the events the view gained since its last update; more reports that it
	// stopped short and should run again soon.
	update(ctx context.Context) (events [][]byte, more bool, err error)
	// snapshot renders the events that bring a new stream to the view as of its last update.
	snapshot(ctx context.Context) ([][]byte, error)
}

// feeds holds the live feeds by key.
type feeds struct {
	mu      sync.Mutex
	m       map[string]*feed
	renders atomic.Int64
}

// feed renders one view once per change and keeps the rendered events for every stream that
// shows it: 300 viewers of one execution cost one render per change, not 300.
type feed struct {
	key  string
	v    view
	refs int // guarded by feeds.mu
	stop context.CancelFunc
	// ready is closed after the first update; err is that update's error.
	ready chan struct{}
	err   error

	// viewMu serializes update and snapshot, which share the view's state.
	viewMu  sync.Mutex
	snap    [][]byte // the last snapshot, valid while no event follows it
	snapSeq uint64

	mu      sync.Mutex
	events  [][]byte // events first..next-1, never modified in place (readers hold slices of it)
	first   uint64
	next    uint64
	size    int
	changed chan struct{} // closed when events grow
	readers map[*reader]struct{}
}

// reader is one stream's place in its feed: the sequence number of the next event it sends.
type reader struct{ seq uint64 }

// join returns the feed of key, started with newView if there is none, once its first update is
// done.
func (u *UI) join(ctx context.Context, key string, newView func() view) (*feed, error) {
	fs := &u.feeds
	fs.mu.Lock()
	f := fs.m[key]
	if f == nil {
		fctx, stop := context.WithCancel(context.Background())
		f = &feed{key: key, v: newView(), stop: stop, ready: make(chan struct{}), changed: make(chan struct{}),
			readers: map[*reader]struct{}{}}
		fs.m[key] = f
		go u.run(fctx, f)
	}
	f.refs++
	fs.mu.Unlock()
	select {
	case <-f.ready:
	case <-ctx.Done():
		u.leave(f)
		return nil, ctx.Err()
	}
	if f.err != nil {
		u.leave(f)
		return nil, f.err
	}
	return f, nil
}

// leave drops a stream's hold on f; the last one stops it.
func (u *UI) leave(f *feed) {
	fs := &u.feeds
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f.refs--; f.refs == 0 {
		if fs.m[f.key] == f {
			delete(fs.m, f.key)
		}
		f.stop()
	}
}

// run updates f now and after every change of its execution (coalesced), and every refresh,
// until its last stream leaves or the server stops.
func (u *UI) run(ctx context.Context, f *feed) {
	ch, unsubscribe := u.Service.Hub.Subscribe(f.v.execID())
	defer unsubscribe()
	rf := time.NewTicker(refresh)
	defer rf.Stop()
	more, err := u.update(ctx, f)
	f.err = err
	close(f.ready)
	if err != nil {
		return
	}
	for {
		if !more {
			select {
			case <-ctx.Done():
				return
			case <-u.Done:
				return
			case <-ch:
			case <-rf.C:
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(coalesce):
		}
		// An update that fails (the database, briefly) keeps the feed; the next signal retries.
		more, _ = u.update(ctx, f)
	}
}

// update renders f's view and appends what changed.
func (u *UI) update(ctx context.Context, f *feed) (bool, error) {
	f.viewMu.Lock()
	defer f.viewMu.Unlock()
	u.feeds.renders.Add(1)
	evs, more, err := f.v.update(ctx)
	if err != nil || len(evs) == 0 {
		return more, err
	}
	f.snap = nil
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, evs...)
	f.next += uint64(len(evs))
	for _, ev := range evs {
		f.size += len(ev)
	}
	f.trim()
	close(f.changed)
	f.changed = make(chan struct{})
	return more, nil
}

// trim drops the events every reader has sent, and then the oldest while they hold more than
// feedBytes (a reader that still needs those ends its stream). f.mu is held.
func (f *feed) trim() {
	keep := f.next
	for rd := range f.readers {
		keep = min(keep, max(rd.seq, f.first))
	}
	drop, size := int(keep-f.first), f.size
	for _, ev := range f.events[:drop] {
		size -= len(ev)
	}
	for ; size > feedBytes && drop < len(f.events); drop++ {
		size -= len(f.events[drop])
	}
	if drop > 0 {
		f.events = slices.Clone(f.events[drop:])
		f.first += uint64(drop)
		f.size = size
	}
}

// snapshot returns the events a new stream starts with and its place in f after them (end it
// with f.detach); streams that join between two updates share one snapshot.
func (f *feed) snapshot(ctx context.Context) ([][]byte, *reader, error) {
	f.viewMu.Lock()
	defer f.viewMu.Unlock()
	f.mu.Lock()
	seq := f.next
	f.mu.Unlock()
	if f.snap == nil || f.snapSeq != seq {
		snap, err := f.v.snapshot(ctx)
		if err != nil {
			return nil, nil, err
		}
		f.snap, f.snapSeq = snap, seq
	}
	rd := &reader{seq: seq}
	f.mu.Lock()
	f.readers[rd] = struct{}{}
	f.mu.Unlock()
	return f.snap, rd, nil
}

// detach ends a reader.
func (f *feed) detach(rd *reader) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.readers, rd)
}

// since returns the events rd has yet to send, counting them as sent, and a channel closed when
// there are more; ok is false when rd fell so far behind that they are gone.
func (f *feed) since(rd *reader) (evs [][]byte, changed <-chan struct{}, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if rd.seq < f.first {
		return nil, nil, false
	}
	evs = f.events[rd.seq-f.first:]
	rd.seq = f.next
	return evs, f.changed, true
}

// stream serves one live stream of the view key: the snapshot, then every event the feed renders,
// within the principal's and the server's stream caps.
func (u *UI) stream(w http.ResponseWriter, r *http.Request, key string, newView func() view) {
	p, _ := auth.From(r.Context())
	release, err := u.streams.acquire(p.QuotaKey())
	if err != nil {
		w.Header().Set("Retry-After", "5")
		http.Error(w, err.Error(), http.StatusTooManyRequests)
		return
	}
	defer release()
	f, err := u.join(r.Context(), key, newView)
	if err != nil {
		u.fail(w, err)
		return
	}
	defer u.leave(f)
	snap, rd, err := f.snapshot(r.Context())
	if err != nil {
		u.fail(w, err)
		return
	}
	defer f.detach(rd)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	// http.Server does not reset a write deadline between requests of a connection.
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	// A stream whose reader stopped reading is ended, not waited for.
	send := func(evs [][]byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		for _, ev := range evs {
			if _, err := w.Write(ev); err != nil {
				return false
			}
		}
		return rc.Flush() == nil
	}
	if !send(snap) {
		return
	}
	ka := time.NewTicker(keepalive)
	defer ka.Stop()
	ping := [][]byte{[]byte(": keepalive\n\n")}
	for {
		evs, changed, ok := f.since(rd)
		if !ok {
			return // the browser reconnects and starts from a new snapshot
		}
		if len(evs) > 0 {
			if !send(evs) {
				return
			}
			continue
		}
		select {
		case <-r.Context().Done():
			return
		case <-u.Done:
			return
		case <-ka.C:
			if sess := SessionFrom(r.Context()); sess != nil && u.sessionEnded(r.Context(), sess) {
				return // the browser reconnects, and is asked to sign in again
			}
			if !p.Expires.IsZero() && !u.now().Before(p.Expires) {
				return // the ID token that opened it expired: reconnecting needs a live one
			}
			if !send(ping) {
				return
			}
		case <-changed:
		}
	}
}

// A feed is shared by every stream of one key, so its views read as feedReader, who may read
// everything: a stream joins a feed only after its own caller was found to may read what the
// key selects (the repository resolved into the list's filter; the execution itself).
var feedReader = service.Caller{Name: "page feed"}

func (u *UI) streamList(w http.ResponseWriter, r *http.Request) {
	f, _, err := listFilter(r)
	if err == nil {
		f.Repo, err = u.caller(r).ReadRepo(f.Repo)
	}
	if err != nil {
		u.fail(w, err)
		return
	}
	key := fmt.Sprintf("list\x00%s\x00%s\x00%d\x00%s\x00%s", f.Repo, f.Environment, f.PR, f.Before.Format(time.RFC3339Nano), f.BeforeID)
	u.stream(w, r, key, func() view { return &listView{ui: u, f: f} })
}

func (u *UI) streamExecution(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := u.Service.MayRead(r.Context(), u.caller(r), id); err != nil {
		u.fail(w, err)
		return
	}
	u.stream(w, r, "execution\x00"+id, func() view { return &executionView{ui: u, id: id, cursors: map[string]*logCursor{}} })
}

// listView is the executions list under one filter.
type listView struct {
	ui   *UI
	f    store.ExecutionFilter
	rows []byte // the last rows event
}

func (v *listView) execID() string { return service.AllExecutions }

func (v *listView) update(ctx context.Context) ([][]byte, bool, error) {
	xs, err := v.ui.Service.Executions(ctx, feedReader, v.f)
	if err != nil {
		return nil, false, err
	}
	ev, err := htmlEvent("rows", "execrows", xs)
	if err != nil || bytes.Equal(ev, v.rows) {
		return nil, false, err
	}
	v.rows = ev
	return [][]byte{ev}, false, nil
}

func (v *listView) snapshot(context.Context) ([][]byte, error) { return [][]byte{v.rows}, nil }

var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]`)

// logCursor is where a stack's log was rendered up to.
type logCursor struct{ gen, off int64 }

// executionView is one execution: its state and its stacks' logs.
type executionView struct {
	ui      *UI
	id      string
	started bool
	state   []byte   // the last state event
	stacks  []string // those with a cursor, in the execution's order
	cursors map[string]*logCursor
}

func (v *executionView) execID() string { return v.id }

func (v *executionView) update(ctx context.Context) ([][]byte, bool, error) {
	ep, err := v.ui.Service.ExecutionPage(ctx, feedReader, v.id, false, liveSpans)
	if err != nil {
		return nil, false, err
	}
	x := ep.Execution
	ev, err := htmlEvent("state", "state", liveState(x, ep.Spans))
	if err != nil {
		return nil, false, err
	}
	var evs [][]byte
	if !bytes.Equal(ev, v.state) {
		v.state = ev
		evs = append(evs, ev)
	}
	budget, steps, more := maxLogPerUpdate, maxLogStepsPerUpdate, false
	for _, st := range x.Stacks {
		if st.LogBytes == 0 && st.LogGeneration == 0 {
			continue
		}
		c, seen := v.cursors[st.Stack]
		reset := false
		if !seen || c.gen != st.LogGeneration {
			// What a log held before the feed started, new streams get from their snapshot.
			from := st.LogBytes
			if v.started {
				from = max(0, st.LogBytes-InitialLogTail)
			}
			c = &logCursor{gen: st.LogGeneration, off: from}
			v.cursors[st.Stack] = c
			reset = seen
		}
		// Up to where the state says the log ends: a stack with nothing new costs no read (a
		// page of a 200-stack execution read every log on every update). What arrives after the
		// state was read wakes the feed again.
		logs, n, k, full := v.readLog(ctx, st.Stack, c, st.LogBytes, min(maxLogPerPush, budget), min(maxLogStepsPerPush, steps), reset)
		if reset && len(logs) == 0 {
			// The old generation's text goes even before the new one has any.
			if ev, err := event("log", logEvent{Stack: st.Stack, Reset: true}); err == nil {
				logs = [][]byte{ev}
			}
		}
		evs = append(evs, logs...)
		budget -= n
		steps -= k
		more = more || full
		if budget <= 0 || steps <= 0 {
			break
		}
	}
	v.started = true
	v.stacks = v.stacks[:0]
	for _, st := range x.Stacks {
		if v.cursors[st.Stack] != nil {
			v.stacks = append(v.stacks, st.Stack)
		}
	}
	return evs, more, nil
}

func (v *executionView) snapshot(ctx context.Context) ([][]byte, error) {
	evs := [][]byte{v.state}
	for _, stack := range v.stacks {
		c := v.cursors[stack]
		from := &logCursor{gen: c.gen, off: max(0, c.off-InitialLogTail)}
		logs, _, _, _ := v.readLog(ctx, stack, from, c.off, InitialLogTail, maxLogStepsPerPush, false)
		evs = append(evs, logs...)
	}
	return evs, nil
}

type logEvent struct {
	Stack string `json:"stack"`
	Text  string `json:"text,omitempty"`
	Reset bool   `json:"reset,omitempty"`
	Gap   int64  `json:"gap,omitempty"`
}

// readLog renders a stack's log from c up to end (< 0: as far as it is stored), at most limit
// bytes in at most maxSteps steps (a read, an event), and advances c; it returns the events, the
// bytes and steps they took, and whether a bound stopped it. Each event is a gap's lost bytes
// and the text after it. reset marks the first event as starting a new generation.
func (v *executionView) readLog(ctx context.Context, stack string, c *logCursor, end int64, limit, maxSteps int, reset bool) (evs [][]byte, sent, steps int, full bool) {
	until := int64(math.MaxInt64)
	if end >= 0 {
		until = end
	}
	for sent < limit && steps < maxSteps && c.off < until {
		steps++
		sp, err := v.ui.Service.ReadLogSpan(ctx, feedReader, v.id, stack, c.gen, c.off, until, limit-sent, max(1, maxSteps-steps))
		if err != nil || sp.NextOffset == c.off {
			return evs, sent, steps, false
		}
		var read []logEvent
		var lost int64
		n := 0
		for _, p := range sp.Parts {
			if p.Data == nil {
				lost += p.Lost
				continue
			}
			read = append(read, logEvent{Stack: stack, Text: ansi.ReplaceAllString(string(p.Data), ""), Gap: lost})
			lost = 0
			n += len(p.Data)
		}
		if lost > 0 {
			read = append(read, logEvent{Stack: stack, Gap: lost})
		}
		if len(read) > 0 {
			read[0].Reset = reset
		}
		rendered := make([][]byte, 0, len(read))
		for _, le := range read {
			ev, err := event("log", le)
			if err != nil {
				return evs, sent, steps, false
			}
			rendered = append(rendered, ev)
		}
		evs = append(evs, rendered...)
		reset = reset && len(read) == 0
		steps += len(read)
		sent += n
		c.off = sp.NextOffset
	}
	return evs, sent, steps, sent >= limit || steps >= maxSteps
}
