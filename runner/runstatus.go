package runner

import (
	"bytes"
	"io"
	"regexp"
	"strings"
	"sync"
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
}

var (
	startedLine = regexp.MustCompile(`^/(.*) \(script:\d+ job:\d+\.\d+\)> `)
	failedLine  = regexp.MustCompile(`execution failed: running .* \(in /(.*)\): `)
)

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
	// The substring tests only spare most lines the regular expressions, which need them.
	if strings.HasPrefix(line, "/") && strings.Contains(line, ")> ") {
		if m := startedLine.FindStringSubmatch(line); m != nil {
			s.started[m[1]] = true
			return
		}
	}
	if strings.Contains(line, "execution failed: running ") {
		if m := failedLine.FindStringSubmatch(line); m != nil {
			s.failed[m[1]] = true
		}
	}
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
	ticks           map[string][]tickRecord
	exitOK          bool // terramate exited 0
	cancelled       bool // the run was interrupted (signal or server cancel)
}

// status decides one stack's status (path is root-relative) from terramate's output and the
// stack's ticks: a stack terramate named as failed, or that ticked a failed status, failed; one
// terramate never started did not run; one that ticked done (or that ran in a run terramate
// ended successfully) succeeded; one started and then stopped (terramate stopped after another
// stack failed, or the run was interrupted) was cancelled. fresh reports whether the stack's
// output file (its plan JSON) was written by this run, which counts as done for a plan.
func (o scriptOutcome) status(path string, fresh bool) string {
	if o.failed[path] {
		return StatusFailed
	}
	done := false
	for _, t := range o.ticks[path] {
		switch strings.ToLower(t.Status) {
		case "failed", "failure", "error", "errored":
			return StatusFailed
		}
		if t.Phase == "done" {
			done = true
		}
	}
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
