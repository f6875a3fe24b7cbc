package runner

import (
	"context"
	"errors"
	"io"
	"time"
)

// This file holds what the runner offers the CI job (internal/job) beyond the reference's
// names. Each says why the job needs it.

// ErrSilenced is wrapped by the job's log posts once the server refused the execution's Init:
// the LogPump takes it as a permanent error and stops at once instead of retrying.
var ErrSilenced = errors.New("nothing is sent for this execution")

// errSilenced is the pump's name for ErrSilenced (PumpOptions.Permanent).
var errSilenced = ErrSilenced

// ParseAddMask reads a `::add-mask::VALUE` workflow command: the job masks a failed stack's log
// tail with the values its script masked.
func ParseAddMask(line []byte) (string, bool) { return parseAddMask(line) }

// TickRecord is one tick a script recorded in the driver's tick file (see Tick).
type TickRecord = tickRecord

// TickStatus is what a stack's ticks say of it: whether it ticked phase done, and whether it
// ticked a failed status.
type TickStatus struct {
	Done, Failed bool
}

// Add folds one tick into s.
func (s TickStatus) Add(r TickRecord) TickStatus {
	var t tickSummary
	t.add(r)
	return TickStatus{Done: s.Done || t.done, Failed: s.Failed || t.failed}
}

// TickReader reads the ticks one script run's scripts recorded: the job relays them to the
// server and takes each stack's status from them.
type TickReader struct {
	r *tickReader
}

// NewTickReader reads the tick file in dir (the script run's EnvTickDir), summing up the ticks
// of the stacks keep accepts.
func NewTickReader(dir string, keep func(stack string) bool) *TickReader {
	return &TickReader{r: newTickReader(dir, keep)}
}

// Next returns the ticks recorded since the last call.
func (t *TickReader) Next() []TickRecord { return t.r.next() }

// Stacks returns what the ticks read so far say of each accepted stack.
func (t *TickReader) Stacks() map[string]TickStatus {
	out := make(map[string]TickStatus, len(t.r.stacks))
	for stack, s := range t.r.stacks {
		out[stack] = TickStatus{Done: s.done, Failed: s.failed}
	}
	return out
}

// RealExec runs a process as a Terramate with a nil Exec does (tmRealExec): a caller that
// substitutes Exec to watch the calls (the job's discovery benchmark counts them) still runs
// them for real through it.
func RealExec(ctx context.Context, procs *ProcessGroups, grace time.Duration, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
	return tmRealExec(ctx, procs, grace, name, args, dir, env, stdout, stderr)
}
