package job

// Discovery: the stacks terramate lists (changed or all), why they changed, and the run
// graph between them, asked at once.

import (
	"context"
	"fmt"
	"path"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/runner"
)

// discovered is what discovery found: the stacks and why they changed. discover fills it; the
// steps that select a part of the stacks (selectShard, selectRerun) narrow it.
type discovered struct {
	listed  []string            // stacks as terramate lists them
	paths   []string            // the same, root-relative
	byPath  map[string]string   // root-relative → listed
	entry   map[string]int      // root-relative → index in res.Stacks
	why     map[string][]string // root-relative → reasons as terramate printed them
	reasons []events.ChangeReason
}

// discover lists the stacks (changed or all), why they changed, and the edges between them.
func (r *run) discover(ctx context.Context) error {
	r.begin("discover")
	// The list, why its stacks changed and the run graph are three terramate calls that read
	// the same files (about 100 ms each with real terramate on a small project): they run at
	// once, and the last two are stopped when the list fails or is empty.
	cctx, stopCalls := context.WithCancel(ctx)
	defer stopCalls()
	graph := goCall(func() (runner.RunGraphResult, error) { return r.tm.RunGraphDetailed(cctx) })
	var why *call[[]string]
	if !r.o.All {
		why = goCall(func() ([]string, error) { return r.tm.WhyLines(cctx, r.o.Base) })
	}
	// abandon stops the other two calls and waits for them; a panic in one is the run's error.
	abandon := func() error {
		stopCalls()
		_, gerr := graph.wait()
		if perr := panicError(r.step, gerr); perr != nil {
			return perr
		}
		if why != nil {
			if _, werr := why.wait(); panicError(r.step, werr) != nil {
				return panicError(r.step, werr)
			}
		}
		return nil
	}
	var listed []string
	var err error
	if r.o.All {
		listed, err = r.tm.List(ctx)
	} else {
		listed, err = r.tm.ChangedStacks(ctx, r.o.Base)
	}
	if err != nil {
		if perr := abandon(); perr != nil {
			return perr
		}
		return r.terramateError(ctx, "discover", err)
	}
	r.byPath = map[string]string{}
	for _, s := range listed {
		p := s
		if r.tierRel != "" {
			p = path.Join(r.tierRel, s)
		}
		p = path.Clean(p)
		if _, err := r.root.StackPath(p); err != nil {
			if perr := abandon(); perr != nil {
				return perr
			}
			return newResultError(KindTerramate, "discover", fmt.Sprintf("terramate listed stack %q, which is not a directory inside the repository: %v", s, err))
		}
		if _, dup := r.byPath[p]; dup {
			continue
		}
		r.byPath[p] = s
		r.listed = append(r.listed, s)
		r.paths = append(r.paths, p)
	}
	r.why = map[string][]string{}
	if len(r.listed) == 0 {
		return abandon()
	}
	if why != nil {
		lines, err := why.wait()
		if perr := panicError(r.step, err); perr != nil {
			return perr
		}
		if err != nil {
			if perr := abandon(); perr != nil {
				return perr
			}
			return r.terramateError(ctx, "discover", err)
		}
		for _, cr := range runner.ParseWhyLines(lines, listed) {
			if p := r.rootPath(cr.Stack); p != "" {
				cr.Stack = p
				r.why[p] = append(r.why[p], cr.Raw)
				r.reasons = append(r.reasons, cr)
			}
		}
	}
	g, err := graph.wait()
	if perr := panicError(r.step, err); perr != nil {
		return perr
	}
	if err != nil {
		return r.terramateError(ctx, "discover", err)
	}
	r.res.Edges = runner.NormalizeEdgesIn(r.tierRel, r.listed, g.Edges)
	r.res.EdgesApproximate = g.Approximate
	r.entry = make(map[string]int, len(r.paths))
	for _, p := range r.paths {
		r.entry[p] = len(r.res.Stacks)
		r.res.Stacks = append(r.res.Stacks, StackEntry{
			Stack: r.byPath[p], Path: p, Status: StatusNotRun, Destructive: []string{}, Why: r.why[p],
		})
	}
	return nil
}

// call is a function running on its own goroutine (goCall).
type call[T any] struct {
	done  chan struct{}
	value T
	err   error
	panic *goPanic
}

// goCall starts f on its own goroutine.
func goCall[T any](f func() (T, error)) *call[T] {
	c := &call[T]{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer catchPanic(&c.panic)
		c.value, c.err = f()
	}()
	return c
}

// wait returns what the call returned once it has; a panic in the call is its error (a
// *goPanic, see panicError).
func (c *call[T]) wait() (T, error) {
	<-c.done
	if c.panic != nil {
		return c.value, c.panic
	}
	return c.value, c.err
}

// rootPath maps a stack as listed to its root-relative path ("" when not selected).
func (r *run) rootPath(listed string) string {
	p := listed
	if r.tierRel != "" {
		p = path.Join(r.tierRel, listed)
	}
	p = path.Clean(p)
	if _, ok := r.byPath[p]; ok {
		return p
	}
	return ""
}
