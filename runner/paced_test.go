package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// countingWriter records what it was given (the first keep bytes when keep is set) and in
// how many writes, and counts the bytes.
type countingWriter struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes int
	bytes  int64
	keep   int
	fail   error
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail != nil {
		return 0, c.fail
	}
	c.writes++
	c.bytes += int64(len(p))
	if c.keep > 0 {
		_, _ = c.buf.Write(p[:min(len(p), max(c.keep-c.buf.Len(), 0))])
		return len(p), nil
	}
	return c.buf.Write(p)
}

func (c *countingWriter) snapshot() (string, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String(), c.writes
}

// A paced pipe is read once, then not again until the process exits (an interval that never
// ends): everything the process wrote meanwhile arrives, in order, in a handful of writes, and
// the call returns as soon as the process is gone instead of waiting out the interval.
func TestPacedOutputBatchesReadsAndEndsWithTheProcess(t *testing.T) {
	var out, errOut countingWriter
	script := `for i in $(seq 1 200); do echo "out $i"; echo "err $i" >&2; done`
	err := tmRealExec(context.Background(), nil, DefaultInterruptGrace, "sh", []string{"-c", script}, t.TempDir(), nil,
		&pacedOutput{Writer: &out, every: time.Hour}, &pacedOutput{Writer: &errOut, every: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var wantOut, wantErr strings.Builder
	for i := 1; i <= 200; i++ {
		fmt.Fprintf(&wantOut, "out %d\n", i)
		fmt.Fprintf(&wantErr, "err %d\n", i)
	}
	for _, c := range []struct {
		name string
		w    *countingWriter
		want string
	}{{"stdout", &out, wantOut.String()}, {"stderr", &errOut, wantErr.String()}} {
		got, writes := c.w.snapshot()
		if got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
		// One read before the pause, then what the pipe holds once the process exited.
		if writes > 3 {
			t.Errorf("%s: %d writes for 200 lines; the pipe was not read in batches", c.name, writes)
		}
	}
}

// A destination that is not paced keeps os/exec's own copying, and a paced one next to it
// gets only its own stream.
func TestPacedOutputOnlyWherePaced(t *testing.T) {
	var out bytes.Buffer
	var errOut countingWriter
	err := tmRealExec(context.Background(), nil, DefaultInterruptGrace, "sh", []string{"-c", `echo out; echo err >&2; exit 3`}, t.TempDir(), nil,
		&out, &pacedOutput{Writer: &errOut, every: time.Hour})
	var ee interface{ ExitCode() int }
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("err = %v, want exit status 3", err)
	}
	if got, _ := errOut.snapshot(); out.String() != "out\n" || got != "err\n" {
		t.Fatalf("stdout %q, stderr %q", out.String(), got)
	}
}

// runLeavingGrandchild runs script (which starts a grandchild holding the output pipe and
// writes its pid to ./pid) with one paced destination, kills the grandchild when the test
// ends, and returns what the destination got. The call must end, with
// exec.ErrWaitDelay (as os/exec's own copying reports it), within a minute.
func runLeavingGrandchild(t *testing.T, script string) (string, int64) {
	t.Helper()
	dir := t.TempDir()
	out := countingWriter{keep: 1 << 20}
	done := make(chan error, 1)
	paced := &pacedOutput{Writer: &out, every: time.Hour}
	go func() {
		done <- tmRealExec(context.Background(), nil, DefaultInterruptGrace, "sh", []string{"-c", script}, dir, nil, paced, paced)
	}()
	t.Cleanup(func() {
		if b, err := os.ReadFile(filepath.Join(dir, "pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	select {
	case err := <-done:
		if !errors.Is(err, exec.ErrWaitDelay) {
			t.Fatalf("err = %v, want %v", err, exec.ErrWaitDelay)
		}
	case <-time.After(time.Minute):
		t.Fatal("a grandchild holding the output pipe held the call for a minute")
	}
	got, _ := out.snapshot()
	return got, out.bytes
}

// A grandchild left holding the pipe does not hold the call up past outputGrace, and what was
// written before is delivered.
func TestPacedOutputLeftoverGrandchild(t *testing.T) {
	if got, _ := runLeavingGrandchild(t, `sleep 3600 & echo $! > pid; echo before`); got != "before\n" {
		t.Fatalf("output %q", got)
	}
}

// A grandchild that keeps writing after the child exited does not hold the call up past
// outputGrace either: the copy reads without pauses then, and still stops when the grace
// runs out.
func TestPacedOutputFloodingGrandchild(t *testing.T) {
	got, n := runLeavingGrandchild(t, `echo before; yes flood & echo $! > pid`)
	if !strings.HasPrefix(got, "before\nflood\n") || n < 1<<20 {
		t.Fatalf("%d bytes starting %.40q; want \"before\" then the flood, read on after the exit", n, got)
	}
}

// rawPipe is a pipe of the usual capacity whose read end is non-blocking and has a one-shot
// waiter, as newPacedPipe makes them (the test is skipped where there is no waiter); the read
// end and the waiter are closed when the test ends, the write end is the caller's.
func rawPipe(t *testing.T) ([2]int, readiness) {
	t.Helper()
	var fds [2]int
	if err := syscall.Pipe(fds[:]); err != nil {
		t.Fatal(err)
	}
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fds[0]) })
	ready, err := newReadiness(fds[0])
	if err != nil {
		_ = syscall.Close(fds[1])
		t.Skipf("no one-shot waiter here: %v", err)
	}
	t.Cleanup(func() { _ = ready.Close() })
	return fds, ready
}

// A child that writes nothing for a while costs the copy nothing meanwhile: an empty pipe is
// waited on, not looked at again every interval (where the platform has a one-shot waiter).
func TestPacedCopyWaitsOnAQuietPipe(t *testing.T) {
	fds, ready := rawPipe(t)
	var out countingWriter
	c := pacedCopy{w: &out, fd: fds[0], every: time.Millisecond, exited: make(chan struct{}), stop: make(chan struct{}), ready: ready}
	done := make(chan error, 1)
	go func() { done <- c.run() }()
	w := os.NewFile(uintptr(fds[1]), "|1")
	for _, s := range []string{"x\n", "y\n"} {
		time.Sleep(300 * time.Millisecond) // three hundred intervals
		if _, err := w.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	_ = w.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, _ := out.snapshot(); got != "x\ny\n" || c.reads > 12 {
		t.Fatalf("%q in %d reads over 600 quiet intervals; want x and y in a handful", got, c.reads)
	}
}

// A destination that fails stops taking bytes, but the pipe is still drained (the process never
// blocks on it) and the failure is the call's error when the process itself succeeded.
func TestPacedOutputWriteError(t *testing.T) {
	broken := errors.New("disk full")
	out := &countingWriter{fail: broken}
	err := tmRealExec(context.Background(), nil, DefaultInterruptGrace, "sh", []string{"-c", `head -c 4000000 /dev/zero`}, t.TempDir(), nil,
		&pacedOutput{Writer: out, every: time.Millisecond}, &pacedOutput{Writer: &countingWriter{}, every: time.Millisecond})
	if !errors.Is(err, broken) {
		t.Fatalf("err = %v, want %v", err, broken)
	}
}

// ScriptRun hands terramate one paced destination for both streams.
func TestScriptRunPacesBothStreamsAsOne(t *testing.T) {
	tm := &Terramate{Exec: func(ctx context.Context, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
		p, ok := stdout.(pacedWriter)
		if !ok || stderr != stdout || p.readInterval() != scriptOutputInterval {
			t.Errorf("ScriptRun gave %T and %T, not one paced writer", stdout, stderr)
		}
		return nil
	}}
	if err := tm.ScriptRun(context.Background(), &bytes.Buffer{}, ScriptRunOptions{Script: "plan"}); err != nil {
		t.Fatal(err)
	}
}

// One paced destination given as both streams gets one pipe: the lines of the two streams keep
// the order they were written in, as on a terminal, however long the reads wait.
func TestPacedOutputOneDestinationKeepsOrder(t *testing.T) {
	var out countingWriter
	paced := &pacedOutput{Writer: &out, every: time.Hour}
	script := `for i in $(seq 1 100); do echo "cmd $i" >&2; echo "out $i"; done`
	if err := tmRealExec(context.Background(), nil, DefaultInterruptGrace, "sh", []string{"-c", script}, t.TempDir(), nil, paced, paced); err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for i := 1; i <= 100; i++ {
		fmt.Fprintf(&want, "cmd %d\nout %d\n", i, i)
	}
	if got, writes := out.snapshot(); got != want.String() || writes > 3 {
		t.Fatalf("%d writes of %q, want at most 3 of %q", writes, got, want.String())
	}
}

// The pause after a read shortens while the writers keep a pace that would fill a quarter of
// the pipe before the interval ends, and is the whole interval otherwise.
func TestPacedPause(t *testing.T) {
	const every = 200 * time.Millisecond
	for _, c := range []struct {
		read     int
		over     time.Duration
		capacity int
		want     time.Duration
	}{
		{0, every, 1 << 20, every},                                        // nothing came
		{40 << 10, every, 1 << 20, every},                                 // 200 KB/s into a 1 MiB pipe
		{40 << 10, every, 64 << 10, 80 * time.Millisecond},                // the same into 64 KiB
		{1 << 20, 100 * time.Millisecond, 1 << 20, 25 * time.Millisecond}, // 10 MB/s
		{64 << 20, time.Millisecond, 1 << 20, leftoverPoll},               // never below leftoverPoll
		{1, 0, 1 << 20, every},                                            // no time passed: no pace
		{1, 100 * time.Hour, 1 << 20, every},                              // a trickle after hours: no overflow
		{1 << 20, time.Second, 0, every},                                  // capacity unknown here
	} {
		if got := pacedPause(every, c.read, c.over, c.capacity); got != c.want {
			t.Errorf("pacedPause(%v, %d, %v, %d) = %v, want %v", every, c.read, c.over, c.capacity, got, c.want)
		}
	}
}

// A paced pipe is made large where the system allows it, so that a burst of output waits in
// the kernel rather than in a blocked writer.
func TestPacedPipeIsLarge(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/fs/pipe-max-size")
	if err != nil {
		t.Skipf("no pipe capacity to set here: %v", err)
	}
	if max, err := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || max < pacedPipeSize {
		t.Skipf("pipe-max-size %q is below %d", b, pacedPipeSize)
	}
	p, err := newPacedPipe(&pacedOutput{Writer: io.Discard, every: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer abandonPaced([]*pacedPipe{p})
	if n, err := growPipe(p.rfd); errors.Is(err, syscall.EPERM) {
		t.Skipf("this user's pipe page budget is spent (capacity %d): %v", n, err)
	}
	if p.capacity != pacedPipeSize {
		t.Fatalf("capacity %d, want %d", p.capacity, pacedPipeSize)
	}
}

// A writer much faster than one pipe-full per interval is kept up with: a writer of short lines
// (as terramate prints its commands) makes small reads, and each is followed by a pause, which
// must not be the whole interval, or the writer would block on the full pipe until the next
// read and go at one pipe-full per interval. 16 MiB go through although the interval is an
// hour. The pipe keeps its usual capacity here, the worst case.
func TestPacedCopyKeepsUpWithAFastWriter(t *testing.T) {
	fds, ready := rawPipe(t)
	var out countingWriter
	stop := make(chan struct{})
	c := pacedCopy{w: &out, fd: fds[0], every: time.Hour, exited: make(chan struct{}), stop: stop, ready: ready}
	done := make(chan error, 1)
	go func() { done <- c.run() }()
	w := os.NewFile(uintptr(fds[1]), "|1")
	const total = 16 << 20
	wrote := make(chan error, 1)
	go func() {
		chunk := append(bytes.Repeat([]byte("x"), 127), '\n')
		for n := 0; n < total; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- w.Close()
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second): // a guard against hanging, not a speed check
		close(stop)
		_ = ready.Close()
		<-done
		t.Fatalf("the writer is still blocked after %d bytes and %d whole-interval pauses", out.bytes, c.fullPauses)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if out.bytes != total || c.fullPauses != 0 {
		t.Fatalf("%d bytes copied with %d whole-interval pauses; want %d with none", out.bytes, c.fullPauses, total)
	}
}
