package runner

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
)

// inotifyWatcher watches the stack directories on Linux without waking the driver for events
// it is holding back (see dispatchInotify).
//
// fsnotify keeps its inotify descriptor in the Go runtime's poller, edge-triggered, and hands
// events over one at a time on an unbuffered channel. While the dispatcher holds events back
// (MinReadInterval), every event the kernel queues still makes the runtime's netpoll return
// and wake a thread that then finds nothing to run: on a 200-stack run, about 2,000 wake-ups
// for nothing, most of them for the other files in the stack directories (the saved plan, the
// plan JSON being written and renamed). Here the inotify descriptor stays out of the runtime's
// poller (see oneShot): the first event after a round wakes the dispatcher once; until the
// next round re-arms it, the kernel queues events without waking anyone. A round then reads
// the whole queue with plain read(2) calls.
type inotifyWatcher struct {
	fd    int      // the inotify instance: non-blocking, read with read(2) only
	ready *oneShot // wakes the dispatcher once for fd until rearmed
	buf   []byte

	mu     sync.Mutex
	closed bool             // fd was closed (by the dispatcher, as it ended)
	dirs   map[int32]string // watch descriptor → the directory as added
	// closeFD closes the inotify instance (unix.Close; tests hold it), on a goroutine of its
	// own: see shutdown.
	closeFD func(fd int) error
}

// inotifyMask is the events fsnotify watches a directory for, the ones the pump relies on.
const inotifyMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_DELETE |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF

// inotifyReadsPerRound bounds the reads of one round: a queue refilled faster than it is read
// must not keep a round going; what is left is read by the next round.
const inotifyReadsPerRound = 8

func newInotifyWatcher() (*inotifyWatcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("inotify_init1", err)
	}
	o, err := newOneShot(fd)
	if err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	return &inotifyWatcher{fd: fd, ready: o, buf: make([]byte, 64<<10), dirs: map[int32]string{}, closeFD: unix.Close}, nil
}

// Add watches dir (a directory already watched keeps its watch).
func (w *inotifyWatcher) Add(dir string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return fsnotify.ErrClosed
	}
	wd, err := unix.InotifyAddWatch(w.fd, dir, inotifyMask)
	if err != nil {
		return &os.PathError{Op: "inotify_add_watch", Path: dir, Err: err}
	}
	w.dirs[int32(wd)] = dir
	return nil
}

// Close ends the dispatcher's wait; the dispatcher then closes the inotify instance.
func (w *inotifyWatcher) Close() error { return w.ready.Close() }

// shutdown closes the inotify instance; called by the dispatcher as it ends, so that no read
// can meet a descriptor number reused meanwhile. The close itself goes on without anyone
// waiting: closing an instance that watches directories waits for the kernel to free the
// watches, an RCU grace period, which took 13 to 19 ms in 3 runs of 5 of the 200-stack
// benchmark, on the drain's path at the very end of the run.
func (w *inotifyWatcher) shutdown() {
	w.mu.Lock()
	defer w.mu.Unlock()
	_ = w.ready.Close()
	if !w.closed {
		w.closed = true
		go w.closeFD(w.fd)
	}
}

// wait blocks until the inotify instance has events, or until Close.
func (w *inotifyWatcher) wait() error { return w.ready.wait() }

// rearm has the next event reported (at once if events arrived since the last read).
func (w *inotifyWatcher) rearm() error { return w.ready.rearm() }

// read takes the queued events (up to inotifyReadsPerRound reads), handing each to note as
// fsnotify would describe it; overflow reports that the kernel dropped events.
func (w *inotifyWatcher) read(note func(fsnotify.Event)) (n int, overflow bool, err error) {
	for range inotifyReadsPerRound {
		k, err := unix.Read(w.fd, w.buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return n, overflow, nil
		case err != nil:
			return n, overflow, os.NewSyscallError("read", err)
		case k < unix.SizeofInotifyEvent:
			return n, overflow, errors.New("inotify: short read")
		}
		for b := w.buf[:k]; len(b) >= unix.SizeofInotifyEvent; {
			raw := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
			end := unix.SizeofInotifyEvent + int(raw.Len)
			if end > len(b) {
				return n, overflow, errors.New("inotify: truncated event")
			}
			name := string(bytes.TrimRight(b[unix.SizeofInotifyEvent:end], "\x00"))
			b = b[end:]
			n++
			if raw.Mask&unix.IN_Q_OVERFLOW != 0 {
				overflow = true
				continue
			}
			w.mu.Lock()
			dir, ok := w.dirs[raw.Wd]
			if raw.Mask&unix.IN_IGNORED != 0 {
				delete(w.dirs, raw.Wd)
			}
			w.mu.Unlock()
			if !ok {
				continue
			}
			if raw.Mask&unix.IN_IGNORED != 0 {
				// The watch is gone (its directory removed or unmounted, the event saying so
				// perhaps lost to an overflow): as for a removed directory, its stacks are
				// polled from now on.
				note(fsnotify.Event{Name: dir, Op: fsnotify.Remove})
				continue
			}
			if op := inotifyOp(raw.Mask); op != 0 {
				ev := fsnotify.Event{Name: dir, Op: op}
				if name != "" {
					ev.Name = filepath.Join(dir, name)
				}
				note(ev)
			}
		}
	}
	return n, overflow, nil
}

// inotifyOp is the fsnotify operation an inotify event mask stands for (0: none the pump uses).
func inotifyOp(mask uint32) fsnotify.Op {
	var op fsnotify.Op
	if mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
		op |= fsnotify.Create
	}
	if mask&unix.IN_MODIFY != 0 {
		op |= fsnotify.Write
	}
	if mask&unix.IN_ATTRIB != 0 {
		op |= fsnotify.Chmod
	}
	if mask&(unix.IN_DELETE|unix.IN_DELETE_SELF) != 0 {
		op |= fsnotify.Remove
	}
	if mask&(unix.IN_MOVED_FROM|unix.IN_MOVE_SELF) != 0 {
		op |= fsnotify.Rename
	}
	return op
}
