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
// a command's line always comes before its output), read once per ScriptOutputInterval while
// terramate runs (the kernel holds what is written meanwhile; a pipe that filled up is read
// again at once), and without pauses once it has exited.

// ScriptOutputInterval is the time between two reads of a script run's output pipe while
// terramate runs (sooner when the previous read found the pipe filling up).
const ScriptOutputInterval = 200 * time.Millisecond

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
// read(2) calls, and nothing in between. A descriptor in the poller (os.Pipe) is watched
// edge-triggered, so every write by the child makes the runtime's netpoll return, wake a
// thread and look for a goroutine to run, even while the copy is deliberately paused and
// none waits on it; on a 200-stack run that was about 2,000 wake-ups of the driver for
// nothing. Read this way, the pipe costs one wake-up per read, whatever the child writes.
type pacedPipe struct {
	dst    pacedWriter
	rfd    int      // the read end; the copy goroutine owns it once started, and closes it
	w      *os.File // the write end, the child's
	done   chan struct{}
	err    error         // the first write error, once done is closed
	exited chan struct{} // closed when the child exited: read without pauses
	stop   chan struct{} // closed when the grace ran out: stop reading
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
	// The write end is blocking, so os.NewFile leaves it out of the poller too; os/exec hands
	// an *os.File to the child as it is, with no copying goroutine.
	return &pacedPipe{
		dst: dst, rfd: fds[0], w: os.NewFile(uintptr(fds[1]), "|1"),
		done: make(chan struct{}), exited: make(chan struct{}), stop: make(chan struct{}),
	}, nil
}

// start closes the parent's write end and copies until every writer closed it (see finish).
func (p *pacedPipe) start() {
	_ = p.w.Close()
	go func() {
		defer close(p.done)
		defer syscall.Close(p.rfd)
		p.err = copyPaced(p.dst, p.rfd, p.dst.readInterval(), p.exited, p.stop)
	}()
}

// abandonPaced closes both ends of pipes that start never ran on.
func abandonPaced(pipes []*pacedPipe) {
	for _, p := range pipes {
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

// pipeBusy is how much one read must return for the next one not to wait: a quarter of the
// usual Linux pipe capacity (64 KiB).
const pipeBusy = 16 << 10

// leftoverPoll is how often a pipe is looked at once the child exited while some other
// writer (a grandchild it left behind) still holds it open without writing.
const leftoverPoll = 10 * time.Millisecond

// copyPaced copies what the non-blocking descriptor fd yields to w: at once, then at most
// once per every until exited is closed, then without pauses until every writer closed the
// pipe or stop is closed. A write error stops the writing, not the reading (the child must
// never block on a full pipe); it is returned once the pipe ends.
func copyPaced(w io.Writer, fd int, every time.Duration, exited, stop <-chan struct{}) error {
	buf := make([]byte, 64<<10)
	var werr error
	pause := time.NewTimer(time.Hour)
	pause.Stop()
	for {
		select {
		case <-stop:
			return werr
		default:
		}
		n, err := readFD(fd, buf)
		if n > 0 && werr == nil {
			_, werr = w.Write(buf[:n])
		}
		switch {
		case err == nil && n == 0:
			return werr // every writer closed the pipe
		case err != nil && err != syscall.EAGAIN:
			if werr == nil {
				werr = os.NewSyscallError("read", err)
			}
			return werr
		case n >= pipeBusy:
			// A pipe that filled up between two reads is read again at once: a writer that
			// fast must not be slowed to a pipe-full per interval.
			continue
		}
		wait, wake := every, exited
		select {
		case <-exited:
			if n > 0 {
				continue
			}
			wait, wake = leftoverPoll, nil
		default:
		}
		pause.Reset(wait)
		select {
		case <-pause.C:
		case <-wake:
			pause.Stop()
		case <-stop:
			pause.Stop()
			return werr
		}
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
