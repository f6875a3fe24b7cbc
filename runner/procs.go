package runner

import (
	"context"
	"errors"
	"os"
	"sync"
	"syscall"
)

// SignalCause is the cause a run's context is cancelled with when the driver received a
// signal (context.WithCancelCause): terramate's process group gets the same signal.
type SignalCause struct{ Signal os.Signal }

// Error names the signal.
func (s SignalCause) Error() string { return "received " + s.Signal.String() }

// signalOf returns the signal ctx was cancelled with; SIGINT when it was cancelled otherwise.
func signalOf(ctx context.Context) syscall.Signal {
	var sc SignalCause
	if errors.As(context.Cause(ctx), &sc) {
		if s, ok := sc.Signal.(syscall.Signal); ok {
			return s
		}
	}
	return syscall.SIGINT
}

// ProcessGroups tracks the process groups of the terramate invocations that are running, so
// that a second interrupt can kill them at once. The zero value is ready to use.
type ProcessGroups struct {
	mu    sync.Mutex
	pgids map[int]struct{}
}

func (g *ProcessGroups) add(pgid int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pgids == nil {
		g.pgids = map[int]struct{}{}
	}
	g.pgids[pgid] = struct{}{}
}

func (g *ProcessGroups) remove(pgid int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.pgids, pgid)
}

// Kill sends SIGKILL to every tracked process group.
func (g *ProcessGroups) Kill() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for pgid := range g.pgids {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
}
