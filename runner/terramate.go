package runner

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
)

// DefaultRunGraphBudget is how long RunGraph lets `terramate experimental run-graph` run before
// it derives the edges from `terramate debug show metadata` instead. Real run-graph is
// exponential on dense graphs: 150 densely linked stacks take about 2 s, 200 take 16 s.
const DefaultRunGraphBudget = 5 * time.Second

// DefaultInterruptGrace is how long a cancelled terramate gets between the interrupt (which it
// forwards to the running scripts, so tofu can stop and release its state lock) and SIGKILL,
// unless the run says otherwise (--interrupt-grace). GitHub Actions cancels a job with SIGINT,
// SIGTERM 7.5 s later and SIGKILL 2.5 s after that: 6 s leaves the driver about 4 s to drain
// the logs, finalize the execution, revoke the lease and write its result.
const DefaultInterruptGrace = 6 * time.Second

// ErrKilledAfterGrace is in the error of an invocation whose process group was killed because
// it had not stopped within the interrupt grace: what it ran could not clean up (a tofu killed
// so keeps its state lock).
var ErrKilledAfterGrace = errors.New("killed: it had not stopped within the interrupt grace")

// ExecFunc runs one process: name with args in dir, with env as its complete environment (nil:
// inherit), streaming to stdout and stderr. It returns nil on exit status 0, otherwise an error
// whose ExitCode() method (as *exec.ExitError has) tells the status when the process ran. When
// ctx is done the process must be stopped.
type ExecFunc func(ctx context.Context, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error

// Terramate shells out to the terramate binary. Dir is the process working directory of every
// invocation (so asdf resolves the project's .tool-versions and terramate works on that tree,
// whose stacks it lists relative to Dir); no --chdir is used.
type Terramate struct {
	Bin string // terramate binary; defaults to "terramate"
	Dir string // working directory of every invocation; "" is the current directory

	// Env is added to the inherited environment of every invocation (KEY=VALUE).
	Env []string
	// RunGraphBudget bounds `experimental run-graph` (0: DefaultRunGraphBudget).
	RunGraphBudget time.Duration
	// Exec runs the processes; nil runs them for real (tests substitute it).
	Exec ExecFunc
	// Procs, when set, tracks the process groups of running invocations (see
	// ProcessGroups.Kill).
	Procs *ProcessGroups
	// InterruptGrace is how long a cancelled invocation gets to stop before its process group
	// is killed (0: DefaultInterruptGrace).
	InterruptGrace time.Duration
}

// ScriptRunOptions controls `terramate script run`.
type ScriptRunOptions struct {
	Script          string   // the terramate script name (e.g. "plan"); words separated by spaces
	Changed         bool     // --changed: only changed stacks
	Parallel        int      // --parallel N (0 = terramate default)
	Base            string   // -B <ref> for change detection
	ContinueOnError bool     // --continue-on-error: keep running the other stacks after a failure
	DryRun          bool     // --dry-run: print the commands without running them
	Env             []string // KEY=VALUE added to terramate's (and so the scripts') environment

	// StackFiles names the per-stack files the scripts write (log, plan); when terramate
	// refuses to run because of untracked files, the error tells which of them to git-ignore.
	StackFiles []string
}

func (t *Terramate) bin() string {
	if t.Bin == "" {
		return "terramate"
	}
	return t.Bin
}

func (t *Terramate) exec() ExecFunc {
	if t.Exec != nil {
		return t.Exec
	}
	return func(ctx context.Context, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
		return tmRealExec(ctx, t.Procs, cmp.Or(t.InterruptGrace, DefaultInterruptGrace), name, args, dir, env, stdout, stderr)
	}
}

// tmRealExec runs the process for real, in a process group of its own (so the scripts it
// starts can be signalled together, and a terminal's Ctrl-C reaches them only through the
// driver). Cancellation sends the group the signal the context was cancelled with (SIGINT
// unless a SignalCause says otherwise: terramate forwards it to the running scripts and lets
// them clean up), then SIGKILL once grace has passed.
func tmRealExec(ctx context.Context, procs *ProcessGroups, grace time.Duration, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A leftover grandchild holding the output pipes must not keep Wait from returning.
	cmd.WaitDelay = outputGrace
	// A paced destination gets a pipe of the driver's own, read in batches (see pacedWriter);
	// one given as both stdout and stderr gets one pipe for both.
	var paced []*pacedPipe
	for _, out := range []*io.Writer{&cmd.Stdout, &cmd.Stderr} {
		dst, ok := (*out).(pacedWriter)
		if !ok {
			continue
		}
		if len(paced) == 1 && paced[0].dst == dst {
			*out = paced[0].w
			continue
		}
		p, err := newPacedPipe(dst)
		if err != nil {
			abandonPaced(paced)
			return err
		}
		paced = append(paced, p)
		*out = p.w
	}
	if err := cmd.Start(); err != nil {
		abandonPaced(paced)
		return err
	}
	for _, p := range paced {
		p.start()
	}
	pgid := cmd.Process.Pid
	procs.add(pgid)
	defer procs.remove(pgid)
	done := make(chan struct{})
	stopped := make(chan struct{})
	killed := false // written by the goroutine before it closes stopped
	go func() {
		defer close(stopped)
		select {
		case <-done:
			return
		case <-ctx.Done():
		}
		if hard, _ := ctx.Value(hardKillKey{}).(bool); hard {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			return
		}
		_ = syscall.Kill(-pgid, signalOf(ctx))
		select {
		case <-done:
		case <-time.After(grace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			killed = true
		}
	}()
	err := cmd.Wait()
	if perr := finishPaced(paced, outputGrace); err == nil && perr != nil {
		err = perr
	}
	close(done)
	<-stopped
	if killed {
		if err == nil {
			err = ctx.Err()
		}
		err = fmt.Errorf("%w after %s: %w", ErrKilledAfterGrace, grace, err)
	}
	if err == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// outputGrace is how long the driver keeps reading a process's output once it exited: a
// leftover grandchild holding the pipes must not hold the run up.
const outputGrace = 2 * time.Second

// env returns the environment of an invocation: nil (inherit) unless something is added.
func (t *Terramate) env(extra []string) []string {
	if len(t.Env) == 0 && len(extra) == 0 {
		return nil
	}
	env := os.Environ()
	env = append(env, t.Env...)
	return append(env, extra...)
}

// invoke runs terramate with args, streaming stdout to out, and classifies a failure.
func (t *Terramate) invoke(ctx context.Context, out io.Writer, extraEnv []string, args ...string) error {
	tail := newTMTailBuffer(stderrTailLimit)
	err := t.exec()(ctx, t.bin(), args, t.Dir, t.env(extraEnv), out, tail)
	if err == nil {
		return nil
	}
	return t.newError(ctx, args, tail.String(), err)
}

// output runs terramate with args and returns its stdout.
func (t *Terramate) output(ctx context.Context, args ...string) ([]byte, error) {
	var out bytes.Buffer
	if err := t.invoke(ctx, &out, nil, args...); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// tmLines splits terramate output into its non-empty lines (a trailing carriage return
// dropped), however long: the output is already in memory, so no line is too long to keep.
func tmLines(b []byte) []string {
	out := []string{}
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if l := strings.TrimRight(string(line), "\r"); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// List returns the stacks under Dir, relative to Dir, in terramate's (lexical) order.
func (t *Terramate) List(ctx context.Context) ([]string, error) {
	out, err := t.output(ctx, "list")
	if err != nil {
		return nil, err
	}
	return tmLines(out), nil
}

func tmChangedArgs(base string, extra ...string) []string {
	args := []string{"list", "--changed"}
	if base != "" {
		args = append(args, "-B", base)
	}
	return append(args, extra...)
}

// ChangedStacks returns the stacks changed relative to base (empty uses terramate's configured
// default), relative to Dir.
func (t *Terramate) ChangedStacks(ctx context.Context, base string) ([]string, error) {
	out, err := t.output(ctx, tmChangedArgs(base)...)
	if err != nil {
		return nil, err
	}
	return tmLines(out), nil
}

// ScriptRun runs a terramate script across (changed) stacks, streaming terramate's combined
// output (the commands it echoes and the scripts' own output) to w. It returns terramate's exit
// error, a *TerramateError, so a failed stack fails the run.
func (t *Terramate) ScriptRun(ctx context.Context, w io.Writer, o ScriptRunOptions) error {
	words := strings.Fields(o.Script)
	if len(words) == 0 {
		return errors.New("terramate script run: no script name given")
	}
	if o.Parallel < 0 {
		return fmt.Errorf("terramate script run: --parallel must not be negative, got %d", o.Parallel)
	}
	args := []string{"script", "run"}
	if o.Changed {
		args = append(args, "--changed")
	}
	if o.Base != "" {
		args = append(args, "-B", o.Base)
	}
	if o.Parallel > 0 {
		args = append(args, "--parallel", strconv.Itoa(o.Parallel))
	}
	if o.ContinueOnError {
		args = append(args, "--continue-on-error")
	}
	if o.DryRun {
		args = append(args, "--dry-run")
	}
	args = append(args, words...)

	// Both streams in one paced pipe (see pacedWriter): the tail an error quotes is then the
	// end of the output as a terminal shows it, the tools' own messages included.
	tail := newTMTailBuffer(stderrTailLimit)
	out := &pacedOutput{Writer: &tmLockedWriter{w: io.MultiWriter(w, tail)}, every: scriptOutputInterval}
	err := t.exec()(ctx, t.bin(), args, t.Dir, t.env(o.Env), out, out)
	if err == nil {
		return nil
	}
	te := t.newError(ctx, args, tail.String(), err)
	if errors.Is(te, ErrUntrackedFiles) {
		te.Untracked = t.untrackedFiles(ctx)
		te.StackFiles = o.StackFiles
	}
	return te
}

// untrackedFiles asks git which files are untracked under Dir (best effort, bounded).
func (t *Terramate) untrackedFiles(ctx context.Context) []string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := t.exec()(ctx, "git", []string{"ls-files", "--others", "--exclude-standard"}, t.Dir, nil, &out, io.Discard); err != nil {
		return nil
	}
	files := tmLines(out.Bytes())
	if len(files) > maxListedUntracked {
		files = append(files[:maxListedUntracked:maxListedUntracked], fmt.Sprintf("… %d more", len(files)-maxListedUntracked))
	}
	return files
}

const maxListedUntracked = 10

// tmLockedWriter serialises the writes of terramate's stdout and stderr copiers.
type tmLockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *tmLockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// WhyChanged returns why each changed stack changed relative to base (empty uses terramate's
// configured default), from `terramate list --changed --why`. Each line is resolved against the
// changed stacks terramate lists, so stack paths containing spaces or " - " are split right.
func (t *Terramate) WhyChanged(ctx context.Context, base string) ([]events.ChangeReason, error) {
	stacks, err := t.ChangedStacks(ctx, base)
	if err != nil {
		return nil, err
	}
	return t.WhyChangedFor(ctx, base, stacks)
}

// WhyChangedFor is WhyChanged for a caller that already listed the changed stacks (relative
// to Dir, as ChangedStacks returns them), saving one `terramate list --changed`.
func (t *Terramate) WhyChangedFor(ctx context.Context, base string, stacks []string) ([]events.ChangeReason, error) {
	lines, err := t.WhyLines(ctx, base)
	if err != nil {
		return nil, err
	}
	return ParseWhyLines(lines, stacks), nil
}

// WhyLines returns the lines of `terramate list --changed --why`, for ParseWhyLines. The job
// asks for them while it lists the changed stacks (the two calls overlap), then parses them.
func (t *Terramate) WhyLines(ctx context.Context, base string) ([]string, error) {
	out, err := t.output(ctx, tmChangedArgs(base, "--why")...)
	if err != nil {
		return nil, err
	}
	return tmLines(out), nil
}
