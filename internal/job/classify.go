package job

// Classification: each stack's status from the script run, and its plan classified (early,
// as it ticks done, or after terramate returns).

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/plan"
)

// classify sets each stack's status from the script run and classifies the plans of the
// stacks that succeeded; report sends each stack's Update.
func (r *run) classify(out scriptOutcome, report bool) {
	r.begin("classify")
	r.classed = map[string]*plan.Stack{}
	r.report = &plan.Report{ExecutionURL: r.res.ExecutionURL}
	var unsent []int
	for i := range r.res.Stacks {
		e := &r.res.Stacks[i]
		if c, ok := r.carried[e.Path]; ok {
			s := r.carry(e.Path, c)
			s.Why = e.Why
			r.classed[e.Path] = s
			r.report.Stacks = append(r.report.Stacks, s)
			e.Status, e.Class, e.Counts, e.PlanHash = StatusSucceeded, s.Class, s.Counts, s.PlanHash
			e.Destructive = append([]string{}, c.Destructive...)
			unsent = append(unsent, i)
			continue
		}
		s := r.early[e.Path]
		// A stack classified early ticked done with its fresh plan: no need to look again.
		file, fresh, ferr := "", true, error(nil)
		if s == nil {
			file, fresh, ferr = r.planFile(e.Path)
		}
		e.Status = out.status(e.Path, fresh)
		if s == nil || e.Status != StatusSucceeded {
			s = r.classifyStack(e, e.Status, file, fresh, ferr)
			unsent = append(unsent, i)
		}
		r.classed[e.Path] = s
		r.report.Stacks = append(r.report.Stacks, s)
		e.Class, e.Counts, e.PlanHash, e.Error = s.Class, s.Counts, s.PlanHash, s.Error
		e.Destructive = s.DestructiveAddresses()
		if e.Status == StatusFailed && e.Error == "" {
			e.Error = stackError(StatusFailed)
		}
	}
	if report && r.reporting() {
		r.sendUpdates(context.Background(), unsent)
	}
}

// planFile resolves a stack's plan JSON inside the repository and tells whether this run
// wrote it.
func (r *run) planFile(path string) (file string, fresh bool, err error) {
	file, fi, err := r.root.StackFileInfo(path, r.o.PlanJSON)
	fresh = err == nil && fi != nil && !fi.ModTime().Before(r.res.StartedAt.Add(-time.Second))
	return file, fresh, err
}

// classifyStack classifies one stack's plan; a stack that did not succeed, or whose plan is
// missing, unreadable or stale, is unclassified with the reason.
func (r *run) classifyStack(e *StackEntry, status, file string, fresh bool, ferr error) *plan.Stack {
	unclassified := func(why string) *plan.Stack {
		return &plan.Stack{Name: e.Path, Class: events.ClassUnclassified, Destructive: []plan.Change{}, Changes: []plan.Change{}, Error: why}
	}
	var s *plan.Stack
	switch {
	case status != StatusSucceeded:
		s = unclassified(stackError(status))
	case ferr != nil:
		s = unclassified(ferr.Error())
	case !fresh:
		s = unclassified(fmt.Sprintf("plan file %s was not written by this run (the script must write `show -json` of its saved plan there)", filepath.Join(e.Path, r.o.PlanJSON)))
	default:
		s, _ = plan.ClassifyFile(e.Path, file)
	}
	// By its repository path, as the policy's gates and the claims name it.
	s.Name = e.Path
	s.Why = e.Why
	return s
}

// classifyEarly classifies a stack of `run plan` as soon as it ticks done (its plan JSON is
// written by then) and returns its update to report, so the server shows each stack's class
// while the others still run and the work after terramate returns is only what is left.
func (r *run) classifyEarly(path string) (events.Update, bool) {
	if !r.planning() || r.early[path] != nil {
		return events.Update{}, false
	}
	i, ok := r.entry[path]
	if !ok {
		return events.Update{}, false
	}
	e := &r.res.Stacks[i]
	file, fresh, ferr := r.planFile(path)
	if ferr != nil || !fresh {
		return events.Update{}, false
	}
	s := r.classifyStack(e, StatusSucceeded, file, fresh, nil)
	if s.Class == events.ClassUnclassified {
		return events.Update{}, false // decided again, with terramate's verdict, after the run
	}
	r.early[path] = s
	return r.update(path, StatusSucceeded, s), true
}
