package runner

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"time"
)

// A script run's output is read in batches. terramate prints a line for every command it
// starts (a stack of the script library runs about eight, ticks included), and the scripts'
// tools write in small pieces; copying each piece as it comes wakes the driver hundreds of times
// a second for bytes nobody needs sooner than a human reads a CI log. So terramate's stdout and
// stderr share one pipe, as they share a terminal (each byte keeps its place among the others:
// a command's line always comes before its output), read at most once per
// ScriptOutputInterval while terramate runs (the kernel holds what is written meanwhile; a
// pipe that filled up is read again at once), and without pauses once it has exited.

// ScriptOutputInterval is the shortest time between two reads of a script run's stdout (or
// stderr) pipe while terramate runs.
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
type pacedPipe struct {
	dst    pacedWriter
	r, w   *os.File
	done   chan struct{}
	err    error // the first write error, once done is closed
	exited chan struct{}
}

// newPacedPipe returns a pipe to dst; the caller gives p.w to the child, then calls start.
func newPacedPipe(dst pacedWriter) (*pacedPipe, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	return &pacedPipe{dst: dst, r: r, w: w, done: make(chan struct{}), exited: make(chan struct{})}, nil
}

// start closes the parent's write end and copies until every writer closed it (see finish).
func (p *pacedPipe) start() {
	_ = p.w.Close()
	go func() {
		defer close(p.done)
		p.err = copyPaced(p.dst, p.r, p.dst.readInterval(), p.exited)
	}()
}

// abandonPaced closes both ends of pipes that start never ran on.
func abandonPaced(pipes []*pacedPipe) {
	for _, p := range pipes {
		_ = p.r.Close()
		_ = p.w.Close()
	}
}

// finishPaced is called once the child exited: each copy goes on without pauses until every
// writer (a leftover grandchild too) closed its pipe, for at most grace in all, after which the
// read ends are closed and what was not read yet is dropped. It returns the first write error,
// or exec.ErrWaitDelay when the grace ran out (as os/exec's own copying does).
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
				_ = q.r.Close()
			}
			<-p.done
		}
		_ = p.r.Close()
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

// copyPaced copies r to w, reading at most once per every until exited is closed. A write
// error stops the writing, not the reading (the child must never block on a full pipe); it
// is returned once r ends.
func copyPaced(w io.Writer, r io.Reader, every time.Duration, exited <-chan struct{}) error {
	buf := make([]byte, 64<<10)
	var werr error
	var last time.Time
	busy := false
	pause := time.NewTimer(0)
	<-pause.C
	for {
		// A pipe that filled up between two reads is read again at once: a writer that fast
		// must not be slowed to a pipe-full per interval.
		if !last.IsZero() && !busy {
			if wait := every - time.Since(last); wait > 0 {
				pause.Reset(wait)
				select {
				case <-pause.C:
				case <-exited:
					pause.Stop()
				}
			}
		}
		n, err := r.Read(buf)
		last, busy = time.Now(), n >= pipeBusy
		if n > 0 && werr == nil {
			_, werr = w.Write(buf[:n])
		}
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) {
				return werr
			}
			if werr == nil {
				werr = err
			}
			return werr
		}
	}
}
