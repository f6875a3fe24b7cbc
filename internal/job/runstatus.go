package job

import (
	"bytes"
	"io"
	"regexp"
	"strings"
	"sync"

	"github.com/tfstackplan/tfstackplan/runner"
)

// scriptWatcher passes terramate's combined output through to w and notes, per stack (root-
// relative, without the leading slash), which stacks terramate started a command in and which
// it reported failed. terramate prints every command it starts as
// `/<stack> (script:S job:J.C)> <argv>` and every failure as `> execution failed: running ...
// (in /<stack>): ...` (testdata/terramate/cases).
type scriptWatcher struct {
	w io.Writer

	mu      sync.Mutex
	partial []byte
	started map[string]bool
	failed  map[string]bool
	// failedAtInterrupt is failed as it was when the run was interrupted (nil: it was not).
	failedAtInterrupt map[string]bool
	// onStart and onFail, when set, hear of a stack's first command and of its failure.
	onStart, onFail func(stack string)
}

var failedLine = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`execution failed: running .* \(in /(.*)\): `) })

// maxWatchedLine bounds the part of a line kept while waiting for its end; longer lines are
// passed through but not examined (terramate's own lines are short).
const maxWatchedLine = 64 << 10

func newScriptWatcher(w io.Writer) *scriptWatcher {
	return &scriptWatcher{w: w, started: map[string]bool{}, failed: map[string]bool{}}
}

// Write passes p through and examines the complete lines in it.
func (s *scriptWatcher) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	data := p
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			if len(s.partial)+len(data) <= maxWatchedLine {
				s.partial = append(s.partial, data...)
			} else {
				s.partial = append(s.partial[:0], "\x00"...) // too long: never a terramate line
			}
			break
		}
		line := data[:i]
		if len(s.partial) > 0 {
			line = append(s.partial, line...)
			s.partial = s.partial[:0]
		}
		s.examine(string(bytes.TrimRight(line, "\r")))
		data = data[i+1:]
	}
	return s.w.Write(p)
}

func (s *scriptWatcher) examine(line string) {
	if stack, ok := startedStack(line); ok {
		if !s.started[stack] && s.onStart != nil {
			s.onStart(stack)
		}
		s.started[stack] = true
		return
	}
	// The substring test only spares most lines the regular expression, which needs it.
	if strings.Contains(line, "execution failed: running ") {
		if m := failedLine().FindStringSubmatch(line); m != nil {
			if !s.failed[m[1]] && s.onFail != nil {
				s.onFail(m[1])
			}
			s.failed[m[1]] = true
		}
	}
}

// scriptMarker starts what terramate appends to the stack of a command line it starts.
const scriptMarker = " (script:"

// startedStack returns the stack of a line where terramate reports a command it starts: what
// startedLine captures, without running it (terramate prints a line per command of every
// stack). The greedy `(.*)` takes the stack up to the last marker that is complete.
func startedStack(line string) (string, bool) {
	if !strings.HasPrefix(line, "/") {
		return "", false
	}
	for end := len(line); ; {
		i := strings.LastIndex(line[:end], scriptMarker)
		if i < 1 {
			return "", false
		}
		if markerRest(line[i+len(scriptMarker):]) {
			return line[1:i], true
		}
		end = i
	}
}

// markerRest reports whether s starts with the rest of a command line's marker after
// " (script:": `\d+ job:\d+\.\d+\)> `.
func markerRest(s string) bool {
	s, ok := cutDigits(s)
	if !ok || !strings.HasPrefix(s, " job:") {
		return false
	}
	if s, ok = cutDigits(s[len(" job:"):]); !ok || !strings.HasPrefix(s, ".") {
		return false
	}
	s, ok = cutDigits(s[1:])
	return ok && strings.HasPrefix(s, ")> ")
}

// cutDigits removes the ASCII digits s starts with; false when there are none.
func cutDigits(s string) (string, bool) {
	n := 0
	for n < len(s) && '0' <= s[n] && s[n] <= '9' {
		n++
	}
	return s[n:], n > 0
}

// interrupt notes which stacks had failed when the run was interrupted: a stack that fails
// after it was stopped by the interrupt (tofu exits 1 on "execution halted"), not by itself.
func (s *scriptWatcher) interrupt() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failedAtInterrupt = map[string]bool{}
	for k := range s.failed {
		s.failedAtInterrupt[k] = true
	}
}

// failedBefore returns the stacks that had failed when the run was interrupted (nil: it was not).
func (s *scriptWatcher) failedBefore() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failedAtInterrupt
}

// snapshot returns the stacks started and failed so far.
func (s *scriptWatcher) snapshot() (started, failed map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.partial) > 0 {
		s.examine(string(s.partial))
		s.partial = s.partial[:0]
	}
	started, failed = map[string]bool{}, map[string]bool{}
	for k := range s.started {
		started[k] = true
	}
	for k := range s.failed {
		failed[k] = true
	}
	return started, failed
}

// scriptOutcome is what one `terramate script run` told about each stack.
type scriptOutcome struct {
	started, failed map[string]bool
	ticks           map[string]runner.TickStatus
	exitOK          bool // terramate exited 0
	cancelled       bool // the run was interrupted (signal or server cancel)
	// failedBefore, set when the run was interrupted, holds the stacks that had failed by then;
	// a stack that failed afterwards was stopped by the interrupt.
	failedBefore map[string]bool
}

// status decides one stack's status (path is root-relative) from terramate's output and the
// stack's ticks: a stack terramate named as failed, or that ticked a failed status, failed
// (unless it failed only after the run was interrupted: it was cancelled); one terramate never
// started did not run; one that ticked done (or that ran in a run terramate
// ended successfully) succeeded; one started and then stopped (terramate stopped after another
// stack failed, or the run was interrupted) was cancelled. fresh reports whether the stack's
// output file (its plan JSON) was written by this run, which counts as done for a plan.
func (o scriptOutcome) status(path string, fresh bool) string {
	if o.failed[path] {
		if o.cancelled && o.failedBefore != nil && !o.failedBefore[path] {
			return StatusCancelled
		}
		return StatusFailed
	}
	ticked := o.ticks[path]
	if ticked.Failed {
		return StatusFailed
	}
	done := ticked.Done
	if !o.started[path] {
		if done {
			return StatusSucceeded // ticked done: it ran (terramate's echo was not seen)
		}
		return StatusNotRun
	}
	switch {
	case o.exitOK && !o.cancelled:
		return StatusSucceeded
	case done || fresh:
		return StatusSucceeded
	default:
		return StatusCancelled
	}
}
