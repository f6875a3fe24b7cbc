package runner

import (
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// A script run's output is read in batches. terramate prints a line for every command it
// starts (a stack of the script library runs about eight, ticks included), and the scripts'
// tools write in small pieces; copying each piece as it comes wakes the driver hundreds of times
// a second for bytes nobody needs sooner than a human reads a CI log. So terramate's stdout and
// stderr share one pipe, as they share a terminal (each byte keeps its place among the others:
// a command's line always comes before its output), read once per scriptOutputInterval while
// terramate runs (the kernel holds what is written meanwhile), and without pauses once it has
// exited.
//
// The pauses must never hold the writers back: a child writing to a full pipe blocks, and with
// it the stack's script. The pipe is made large (pacedPipeSize, where the system allows), a
// read that found it filling up is followed by another at once, and while output flows faster
// than a quarter of the pipe per interval the pause shortens to the time the writers take to
// fill a quarter of it at the pace they kept since the previous pause (see pacedPause).

// scriptOutputInterval is the time between two reads of a script run's output pipe while
// terramate runs (sooner when the previous read found the pipe filling up).
const scriptOutputInterval = 200 * time.Millisecond

// pacedWriter is a destination that takes a child's output in batches read at most once per
// readInterval (see tmRealExec). Given as both stdout and stderr, it gets one pipe for both.
// Implementations are pointers (tmRealExec compares them).
type pacedWriter interface {
	io.Writer
	readInterval() time.Duration
}

// pacedOutput paces the output copied to its Writer.
type pacedOutput struct {
	io.Writer
	every time.Duration
}

func (p *pacedOutput) readInterval() time.Duration { return p.every }

// pacedPipe is a pipe whose read end a goroutine copies to a pacedWriter.
//
// The read end stays outside the Go runtime's poller: a non-blocking descriptor read with plain
// read(2) calls. A descriptor in the poller (os.Pipe) is watched edge-triggered, so every write
// by the child makes the runtime's netpoll return, wake a thread and look for a goroutine to
// run, even while the copy is deliberately paused and none waits on it; on a 200-stack run
// that was about 2,000 wake-ups of the driver for nothing. Here a pause costs one timer, and
// an empty pipe is waited on through a oneShot (Linux; elsewhere it is looked at again on a
// timer): the next write wakes the copy once, and a quiet child costs nothing.
type pacedPipe struct {
	dst      pacedWriter
	capacity int      // the pipe's capacity in bytes
	rfd      int      // the read end; the copy goroutine owns it once started, and closes it
	w        *os.File // the write end, the child's
	ready    readiness
	done     chan struct{}
	err      error         // the first write error, once done is closed
	exited   chan struct{} // closed when the child exited: read without pauses
	stop     chan struct{} // closed when the grace ran out: stop reading
}

// readiness waits for a descriptor to become readable: wait blocks until it is (rearm first,
// for every wait), Close ends a wait in progress. A *oneShot.
type readiness interface {
	wait() error
	rearm() error
	Close() error
}

// newPacedPipe returns a pipe to dst; the caller gives p.w to the child, then calls start.
func newPacedPipe(dst pacedWriter) (*pacedPipe, error) {
	var fds [2]int
	// As os.Pipe does where pipe2 is missing: close-on-exec set under ForkLock, so that no
	// other child started meanwhile inherits the descriptors.
	syscall.ForkLock.RLock()
	err := syscall.Pipe(fds[:])
	if err == nil {
		syscall.CloseOnExec(fds[0])
		syscall.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, os.NewSyscallError("pipe", err)
	}
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		_ = syscall.Close(fds[0])
		_ = syscall.Close(fds[1])
		return nil, os.NewSyscallError("setnonblock", err)
	}
	p := &pacedPipe{
		// The write end is blocking, so os.NewFile leaves it out of the poller too; os/exec
		// hands an *os.File to the child as it is, with no copying goroutine.
		dst: dst, rfd: fds[0], w: os.NewFile(uintptr(fds[1]), "|1"),
		done: make(chan struct{}), exited: make(chan struct{}), stop: make(chan struct{}),
	}
	p.capacity, _ = growPipe(fds[0]) // a smaller pipe still works, with shorter pauses
	if r, err := newReadiness(fds[0]); err == nil {
		p.ready = r
	}
	return p, nil
}

// start closes the parent's write end and copies until every writer closed it (see finish).
func (p *pacedPipe) start() {
	_ = p.w.Close()
	go func() {
		defer close(p.done)
		defer syscall.Close(p.rfd)
		c := pacedCopy{w: p.dst, fd: p.rfd, every: p.dst.readInterval(), capacity: p.capacity, exited: p.exited, stop: p.stop, ready: p.ready}
		p.err = c.run()
		if p.ready != nil {
			_ = p.ready.Close()
		}
	}()
}

// abandonPaced closes both ends of pipes that start never ran on.
func abandonPaced(pipes []*pacedPipe) {
	for _, p := range pipes {
		if p.ready != nil {
			_ = p.ready.Close()
		}
		_ = syscall.Close(p.rfd)
		_ = p.w.Close()
	}
}

// finishPaced is called once the child exited: each copy goes on without pauses until every
// writer (a leftover grandchild too) closed its pipe, for at most grace in all, after which the
// copies stop and what was not read yet is dropped. It returns the first write error, or
// exec.ErrWaitDelay when the grace ran out (as os/exec's own copying does).
func finishPaced(pipes []*pacedPipe, grace time.Duration) error {
	for _, p := range pipes {
		close(p.exited)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	var err error
	expired := false
	for _, p := range pipes {
		select {
		case <-p.done:
		case <-t.C:
			expired = true
			for _, q := range pipes {
				close(q.stop)
				if q.ready != nil {
					_ = q.ready.Close() // ends a wait for the next write
				}
			}
			<-p.done
		}
		if err == nil {
			err = p.err
		}
	}
	if err == nil && expired {
		err = exec.ErrWaitDelay
	}
	return err
}

// pacedPipeSize is what a paced pipe asks for: 512 KiB holds two and a half seconds of output
// at 200 KB/s, and a 200-stack --dry-run's whole burst, so that a burst waits in the kernel,
// not in a blocked writer. It is charged to the user's pipe page budget (pipe-user-pages-soft,
// 64 MiB by default, shared by every process of the user: past it, every new pipe of theirs is
// small): 128 drivers at once on one machine under one user would spend it. A read that returns
// a quarter of the pipe's capacity or more found it filling up: the next read follows at once.
const pacedPipeSize = 512 << 10

// minPipeSize is the capacity a paced copy assumes when it cannot learn it: the smallest usual
// one (a macOS pipe starts at 16 KiB).
const minPipeSize = 16 << 10

// pacedPause is the pause after a read that left the pipe not filling up: every, shortened to
// the time the writers take to fill a quarter of a pipe of capacity bytes at the pace they kept
// recently (read bytes in over), never below leftoverPoll.
func pacedPause(every time.Duration, read int, over time.Duration, capacity int) time.Duration {
	d := every
	if read > 0 && over > 0 && capacity > 0 {
		// In floating point: a tiny read after hours of quiet must not overflow a Duration.
		if fill := float64(over) * float64(capacity/4) / float64(read); fill < float64(d) {
			d = time.Duration(fill)
		}
	}
	return max(d, leftoverPoll)
}

// leftoverPoll is how often a pipe without a readiness waiter is looked at when it was empty
// once the child exited, while some other writer (a grandchild it left behind) still holds
// it open; and the shortest pause of such a pipe's copy.
const leftoverPoll = 10 * time.Millisecond

// pacedCopy copies what the non-blocking descriptor fd yields to w: at once, then at most once
// per every (sooner while output flows fast: see pacedPause) until exited is closed, then
// without pauses until every writer closed the pipe or stop is closed. An empty pipe is waited
// on with ready (nil: looked at again after every, or leftoverPoll once exited). A write error
// stops the writing, not the reading (the child must never block on a full pipe); it is
// returned once the pipe ends.
type pacedCopy struct {
	w            io.Writer
	fd           int
	every        time.Duration
	capacity     int // the pipe's capacity (<= 0: unknown, taken as minPipeSize)
	exited, stop <-chan struct{}
	ready        readiness
	reads        int // read(2) calls made (tests)
	fullPauses   int // pauses of the whole interval (tests)
}

func (c *pacedCopy) run() error {
	buf := make([]byte, 256<<10)
	capacity := c.capacity
	if capacity <= 0 {
		capacity = minPipeSize
	}
	busy := capacity / 4
	// The pace of the writers: bytes read since the previous pause began.
	since, read := time.Now(), 0
	var werr error
	pause := time.NewTimer(time.Hour)
	pause.Stop()
	// sleep waits d (or until exited, when wake is set) and reports false when stop came.
	sleep := func(d time.Duration, wake bool) bool {
		var exited <-chan struct{}
		if wake {
			exited = c.exited
		}
		pause.Reset(d)
		select {
		case <-pause.C:
		case <-exited:
			pause.Stop()
		case <-c.stop:
			pause.Stop()
			return false
		}
		return true
	}
	for {
		select {
		case <-c.stop:
			return werr
		default:
		}
		n, err := readFD(c.fd, buf)
		c.reads++
		read += n // readFD never returns less than 0
		if n > 0 && werr == nil {
			_, werr = c.w.Write(buf[:n])
		}
		exited := isClosed(c.exited)
		switch {
		case err == nil && n == 0:
			return werr // every writer closed the pipe
		case err != nil && err != syscall.EAGAIN:
			if werr == nil {
				werr = os.NewSyscallError("read", err)
			}
			return werr
		case n >= busy || n > 0 && exited:
			// A pipe that filled up between two reads is read again at once: a writer that
			// fast must not be slowed to a pipe-full per interval. Nor is the end, once the
			// child exited.
			continue
		case n == 0 && c.ready != nil:
			// Empty: wait for the next write (or for the last writer to close the pipe).
			if err := c.ready.rearm(); err != nil {
				c.ready = nil
				continue
			}
			if err := c.ready.wait(); err != nil && isClosed(c.stop) {
				return werr
			} else if err != nil {
				c.ready = nil // broken: look on a timer from now on
			}
		case n == 0 && exited:
			if !sleep(leftoverPoll, false) {
				return werr
			}
		default: // the pause after a read, or an empty pipe looked at again on a timer
			now := time.Now()
			d := pacedPause(c.every, read, now.Sub(since), capacity)
			if d >= c.every {
				c.fullPauses++
			}
			since, read = now, 0
			if !sleep(d, true) {
				return werr
			}
		}
	}
}

// isClosed reports whether ch is closed (it is only ever closed, never sent on).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// readFD is read(2), retried when a signal interrupted it.
func readFD(fd int, buf []byte) (int, error) {
	for {
		n, err := syscall.Read(fd, buf)
		if err == syscall.EINTR {
			continue
		}
		if n < 0 {
			n = 0
		}
		return n, err
	}
}
