package runner

// This file is how the LogPump learns that a log changed: the fsnotify watch of each stack
// directory and its dispatcher, which wakes the stacks concerned in rounds, and the poller,
// which looks at polled stacks and, once per SafetyPoll, at every stack (see Watching and
// Wake-ups in pump.go).

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/fsnotify/fsnotify"
)

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
