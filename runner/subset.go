package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
)

// Running a script in a chosen set of stacks (a shard of a fan-out): terramate 0.17 selects
// stacks only by directory, change detection and tags, so the driver runs one
// `terramate --chdir=<stack> script run --no-recursive <script>` per stack and does the ordering
// itself, from the run graph's edges among the chosen stacks. A shard never splits a chain of
// dependent stacks (see Cut), so every edge that orders two of its stacks is among them.

// ScriptRunStacks runs the script in exactly stacks (relative to Dir, as List returns them), in
// order: a stack starts once every stack after[stack] names has ended, and at most o.Parallel
// at once (1 when 0). Like terramate, a failed stack stops the run from starting others unless
// o.ContinueOnError; the stacks running then finish. o.Changed and o.Base are ignored (the
// stacks are chosen). The invocations' output goes to w whole lines at a time, so their lines
// do not mix. The error is nil when every stack succeeded; else a *TerramateError: the first
// failure that is not a stack's own (untracked files, a configuration error, ...) or one
// naming every failed stack (ErrScriptFailed).
func (t *Terramate) ScriptRunStacks(ctx context.Context, w io.Writer, o ScriptRunOptions, stacks []string, after map[string][]string) error {
	words := strings.Fields(o.Script)
	if len(words) == 0 {
		return errors.New("terramate script run: no script name given")
	}
	if o.Parallel < 0 {
		return fmt.Errorf("terramate script run: --parallel must not be negative, got %d", o.Parallel)
	}
	if len(stacks) == 0 {
		return nil
	}
	slots := max(o.Parallel, 1)
	chosen := make(map[string]bool, len(stacks))
	for _, s := range stacks {
		chosen[s] = true
	}
	waiting := make(map[string]int, len(stacks)) // stack → predecessors not ended yet
	next := map[string][]string{}                // stack → the stacks waiting for it
	for _, s := range stacks {
		for _, p := range after[s] {
			if chosen[p] && p != s {
				waiting[s]++
				next[p] = append(next[p], s)
			}
		}
	}
	var ready []string
	for _, s := range stacks {
		if waiting[s] == 0 {
			ready = append(ready, s)
		}
	}
	if len(ready) == 0 {
		return fmt.Errorf("terramate script run: the stacks' ordering has a cycle among %s", strings.Join(stacks, ", "))
	}

	shared := &lineSink{w: w}
	type ended struct {
		stack string
		err   error
	}
	done := make(chan ended)
	running, started := 0, 0
	stop := false // a failure (or the caller) stopped new starts
	var failures []*TerramateError
	var other error
	for started < len(stacks) || running > 0 {
		for !stop && running < slots && len(ready) > 0 && ctx.Err() == nil {
			s := ready[0]
			ready = ready[1:]
			running++
			started++
			go func() {
				done <- ended{s, t.runOneStack(ctx, shared, o, words, s)}
			}()
		}
		if running == 0 {
			break // nothing left that may start
		}
		e := <-done
		running--
		if e.err != nil {
			var te *TerramateError
			if errors.As(e.err, &te) && errors.Is(te, ErrScriptFailed) {
				failures = append(failures, te)
			} else if other == nil {
				other = e.err
			}
			if !o.ContinueOnError || other != nil {
				stop = true
			}
		}
		for _, n := range next[e.stack] {
			if waiting[n]--; waiting[n] == 0 {
				ready = append(ready, n)
			}
		}
	}
	if other != nil {
		return other
	}
	if len(failures) == 0 && !stop && ctx.Err() == nil && started < len(stacks) {
		return fmt.Errorf("terramate script run: the stacks' ordering has a cycle: %d of %d stacks never became ready", len(stacks)-started, len(stacks))
	}
	if len(failures) == 0 {
		if err := ctx.Err(); err != nil && started < len(stacks) {
			return &TerramateError{Args: append([]string{"script", "run"}, words...), ExitCode: -1, Err: fmt.Errorf("%w: %w", err, context.Cause(ctx))}
		}
		return nil
	}
	first := *failures[0]
	first.FailedStacks = nil
	for _, f := range failures {
		first.FailedStacks = append(first.FailedStacks, f.FailedStacks...)
	}
	return &first
}

// runOneStack runs the script in one stack.
func (t *Terramate) runOneStack(ctx context.Context, shared *lineSink, o ScriptRunOptions, words []string, stack string) error {
	// --chdir=DIR, one argument: a stack directory named like a flag stays a directory.
	args := []string{"--chdir=" + stack, "script", "run", "--no-recursive"}
	if o.DryRun {
		args = append(args, "--dry-run")
	}
	args = append(args, words...)
	tail := newTMTailBuffer(stderrTailLimit)
	lines := &lineWriter{sink: shared}
	out := &pacedOutput{Writer: &tmLockedWriter{w: io.MultiWriter(lines, tail)}, every: scriptOutputInterval}
	err := t.exec()(ctx, t.bin(), args, t.Dir, t.env(o.Env), out, out)
	lines.flush()
	if err == nil {
		return nil
	}
	te := t.newError(ctx, args, tail.String(), err)
	if errors.Is(te, ErrScriptFailed) && len(te.FailedStacks) == 0 {
		te.FailedStacks = []string{"/" + stack}
	}
	if errors.Is(te, ErrUntrackedFiles) {
		te.Untracked = t.untrackedFiles(ctx)
		te.StackFiles = o.StackFiles
	}
	return te
}

// lineSink is the destination several invocations share.
type lineSink struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *lineSink) write(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.w.Write(p)
}

// maxPendingLine bounds what lineWriter holds back waiting for a newline: a longer line goes
// out in pieces.
const maxPendingLine = 64 << 10

// lineWriter passes whole lines to its sink (one invocation's output).
type lineWriter struct {
	sink    *lineSink
	pending []byte
}

func (l *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	l.pending = append(l.pending, p...)
	if i := bytes.LastIndexByte(l.pending, '\n'); i >= 0 {
		l.sink.write(l.pending[:i+1])
		l.pending = append(l.pending[:0], l.pending[i+1:]...)
	}
	if len(l.pending) > maxPendingLine {
		l.flush()
	}
	return n, nil
}

// flush passes on what is left (the output ended without a newline).
func (l *lineWriter) flush() {
	if len(l.pending) > 0 {
		l.sink.write(l.pending)
		l.pending = l.pending[:0]
	}
}
