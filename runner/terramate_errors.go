package runner

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

// The causes of a terramate failure a user can act on; test them with errors.Is on the
// *TerramateError that Terramate's methods return.
var (
	ErrTerramateNotInstalled = errors.New("terramate is not installed (or not on PATH)")
	ErrNotTerramateProject   = errors.New("not inside a terramate project (no git repository or terramate config above the directory)")
	ErrTerramateConfig       = errors.New("terramate configuration does not parse")
	ErrUnknownScript         = errors.New("terramate script not found")
	ErrStackCycle            = errors.New("stack ordering has a cycle")
	ErrUntrackedFiles        = errors.New("repository has untracked files")
	ErrUncommittedFiles      = errors.New("repository has uncommitted files")
	ErrScriptFailed          = errors.New("a stack's script command failed")
)

// stderrTailLimit bounds the stderr kept in a TerramateError.
const stderrTailLimit = 4096

// TerramateError is a failed terramate invocation.
type TerramateError struct {
	Args     []string // argv after the binary
	ExitCode int      // -1 when the process did not run or was killed
	Stderr   string   // the last (at most 4 KiB) bytes of its stderr (of its stdout and stderr together for a script run, see ScriptRun)
	Cause    error    // one of the Err* causes above, or nil when unrecognised
	Err      error    // the underlying exec error

	Location     string           // ErrTerramateConfig: the file:line terramate reports
	Script       string           // ErrUnknownScript: the script name
	Cycle        *StackCycleError // ErrStackCycle: the stacks in the cycle
	FailedStacks []string         // ErrScriptFailed: the stacks whose command failed ("/stacks/x")
	Untracked    []string         // ErrUntrackedFiles: what git reports as untracked (best effort)
	StackFiles   []string         // ErrUntrackedFiles: the per-stack files the scripts write
}

// StackCycleError names the stacks of a dependency cycle: in cycle order when terramate printed
// the path, else sorted.
type StackCycleError struct {
	Stacks []string
}

// Error names the stacks on the cycle.
func (e *StackCycleError) Error() string {
	return "stack ordering has a cycle between " + strings.Join(e.Stacks, ", ") + "; fix the before/after (or tag) ordering of these stacks"
}

// cyclePath splits terramate's "a -> b -> c -> a" into its stacks, without the repeat.
func cyclePath(s string) []string {
	parts := strings.Split(s, " -> ")
	if len(parts) > 1 && parts[0] == parts[len(parts)-1] {
		parts = parts[:len(parts)-1]
	}
	return parts
}

// Is makes errors.Is(err, ErrStackCycle) true.
func (e *StackCycleError) Is(target error) bool { return target == ErrStackCycle }

// Error names the command, its exit code, the cause and the stderr tail.
func (e *TerramateError) Error() string {
	cmd := "terramate " + strings.Join(e.Args, " ")
	var b strings.Builder
	b.WriteString(cmd)
	b.WriteString(": ")
	switch e.Cause {
	case nil:
		if e.ExitCode >= 0 {
			fmt.Fprintf(&b, "exit status %d", e.ExitCode)
		} else {
			b.WriteString(e.Err.Error())
		}
		if last := tmLastLine(e.Stderr); last != "" {
			b.WriteString(": ")
			b.WriteString(last)
		}
		return b.String()
	case ErrTerramateNotInstalled:
		b.WriteString("terramate is not installed or not on PATH: install terramate 0.17 (e.g. via asdf or the GitHub release) or set its path")
	case ErrNotTerramateProject:
		b.WriteString("not a terramate project: run inside the git repository (or add a terramate.tm.hcl at the project root)")
	case ErrTerramateConfig:
		b.WriteString("terramate configuration does not parse")
		if e.Location != "" {
			b.WriteString(" at " + e.Location)
		}
		if m := tmLastLine(e.Stderr); m != "" {
			b.WriteString(": " + m)
		}
	case ErrUnknownScript:
		fmt.Fprintf(&b, "script %q is not defined in the terramate project (see `terramate script list`)", e.Script)
	case ErrStackCycle:
		b.WriteString(e.Cycle.Error())
	case ErrUntrackedFiles:
		b.WriteString("terramate refuses to run because the repository has untracked files; git-ignore the per-stack log and plan files")
		if len(e.StackFiles) > 0 {
			b.WriteString(" (add " + strings.Join(e.StackFiles, ", ") + " to .gitignore)")
		}
		if len(e.Untracked) > 0 {
			b.WriteString("; untracked: " + strings.Join(e.Untracked, ", "))
		}
	case ErrUncommittedFiles:
		b.WriteString("terramate refuses to run because the repository has uncommitted changes; commit them or git-ignore the files the scripts write")
	case ErrScriptFailed:
		b.WriteString("a script command failed")
		if len(e.FailedStacks) > 0 {
			b.WriteString(" in " + strings.Join(e.FailedStacks, ", "))
		}
	}
	if e.ExitCode >= 0 {
		fmt.Fprintf(&b, " (exit status %d)", e.ExitCode)
	}
	return b.String()
}

// Unwrap exposes the cause, the cycle and the exec error to errors.Is and errors.As.
func (e *TerramateError) Unwrap() []error {
	var errs []error
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	if e.Cycle != nil {
		errs = append(errs, e.Cycle)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// maxMessageLine bounds the stderr line quoted in an error message.
const maxMessageLine = 300

// lastLine is the last non-empty stderr line, without terramate's "> " detail prefix, bounded.
func tmLastLine(s string) string {
	l := tmLines([]byte(s))
	if len(l) == 0 {
		return ""
	}
	last := strings.TrimSpace(strings.TrimPrefix(l[len(l)-1], "> "))
	if len(last) > maxMessageLine {
		last = "…" + strings.ToValidUTF8(last[len(last)-maxMessageLine:], "")
	}
	return last
}

// The patterns of terramate's errors, compiled when first needed: most processes (a tick, a
// version) never read one.
var (
	reScriptNotFound = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?m)^Error: script not found: (.*)$`) })
	reCycle          = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`(?m)cycle detected: (?:cycle detected: |Invalid stack configuration: )*(/.*? -> .*?)(?:: checking node id .*)?$`)
	})
	reHCLLocation = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?m)^> (.+?):(\d+),(\d+)(?:-(?:\d+,)?\d+)?: `) })
	reExecFailed  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?m)^> execution failed: .* \(in (/.*?)\): `) })
)

// newError builds the TerramateError of a failed invocation.
func (t *Terramate) newError(ctx context.Context, args []string, stderr string, err error) *TerramateError {
	e := &TerramateError{Args: append([]string(nil), args...), ExitCode: -1, Stderr: stderr, Err: err}
	var coder interface{ ExitCode() int }
	if errors.As(err, &coder) {
		e.ExitCode = coder.ExitCode()
	}
	if ctx.Err() != nil {
		// Stopped by the caller (or a budget): errors.Is(err, context.Canceled) must hold.
		e.Err = fmt.Errorf("%w: %w", err, context.Cause(ctx))
		return e
	}
	var pe *fs.PathError
	if errors.Is(err, exec.ErrNotFound) ||
		(e.ExitCode < 0 && errors.Is(err, fs.ErrNotExist) && !(errors.As(err, &pe) && pe.Op == "chdir")) {
		e.Cause = ErrTerramateNotInstalled
		return e
	}
	e.classify(t.Dir)
	return e
}

// tmDiagnostic returns terramate's own diagnostic: its last line-initial "Error: " line and
// the "> " detail lines after it. Everything before is the scripts' output (a tofu error that
// mentions "unable to parse configuration" must not pass for terramate's own), so causes are
// recognised in this block only. Without such a line the whole text is used.
func tmDiagnostic(s string) string {
	idx := strings.LastIndex(s, "\nError: ")
	switch {
	case idx >= 0:
		s = s[idx+1:]
	case strings.HasPrefix(s, "Error: "):
	default:
		return s
	}
	lines := strings.SplitAfter(s, "\n")
	end := 1
	for end < len(lines) && strings.HasPrefix(lines[end], "> ") {
		end++
	}
	return strings.Join(lines[:end], "")
}

// classify recognises the actionable causes in terramate 0.17's own diagnostic.
func (e *TerramateError) classify(dir string) {
	s := tmDiagnostic(e.Stderr)
	switch {
	case strings.Contains(s, "unable to detect a project root"):
		e.Cause = ErrNotTerramateProject
	case strings.Contains(s, "unable to parse configuration") || strings.Contains(s, "HCL syntax error"):
		e.Cause = ErrTerramateConfig
		if m := reHCLLocation().FindStringSubmatch(s); m != nil {
			file := m[1]
			if dir != "" {
				if abs, err := filepath.Abs(dir); err == nil {
					if rel, err := filepath.Rel(abs, file); err == nil && !strings.HasPrefix(rel, "..") {
						file = rel
					}
				}
			}
			e.Location = file + ":" + m[2]
		}
	case reScriptNotFound().MatchString(s):
		e.Cause = ErrUnknownScript
		e.Script = strings.TrimSpace(reScriptNotFound().FindStringSubmatch(s)[1])
	case reCycle().MatchString(s):
		e.Cause = ErrStackCycle
		e.Cycle = &StackCycleError{Stacks: cyclePath(reCycle().FindStringSubmatch(s)[1])}
	case strings.Contains(s, "repository has untracked files"):
		e.Cause = ErrUntrackedFiles
	case strings.Contains(s, "repository has uncommitted files"):
		e.Cause = ErrUncommittedFiles
	case strings.Contains(s, "one or more commands failed"):
		e.Cause = ErrScriptFailed
		for _, m := range reExecFailed().FindAllStringSubmatch(s, -1) {
			e.FailedStacks = append(e.FailedStacks, m[1])
		}
	}
}

// tmTailBuffer keeps the last limit bytes written to it.
type tmTailBuffer struct {
	limit int
	buf   []byte
}

func newTMTailBuffer(limit int) *tmTailBuffer { return &tmTailBuffer{limit: limit} }

func (t *tmTailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= t.limit {
		t.buf = append(t.buf[:0], p[len(p)-t.limit:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.limit; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

func (t *tmTailBuffer) String() string { return string(t.buf) }
