package job

// What the run reports: the Init it announces the execution with, the stacks' updates and
// the Finalize; the reporter (reporter.go) sends them.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/plan"
)

// The contract's bounds on one Init (api/openapi.yaml: maxItems, and the server's 12 MiB body
// limit): a run past them announces what fits, says so in a warning, and marks the edges
// approximate. Its stacks are never cut: a run of more than 10,000 stacks is refused by the
// server, and runs unreported.
const (
	maxInitEdges   = 50_000
	maxInitReasons = 10_000
	maxInitBytes   = 12<<20 - 64<<10 // the server's body limit for an Init, with room to spare
)

// fitInit makes in fit limit bytes of JSON when long paths make it larger: it halves the
// edges (marking them approximate), then the reasons, until it fits or none are left. It
// returns in's JSON as it ends up, and whether it cut anything. The stacks are never cut.
func fitInit(in *events.Init, limit int) ([]byte, bool, error) {
	b, err := json.Marshal(in)
	cut := false
	for err == nil && len(b) > limit && (len(in.Edges) > 0 || len(in.Reasons) > 0) {
		if len(in.Edges) > 0 {
			in.Edges, in.EdgesApproximate = in.Edges[:len(in.Edges)/2], true
		} else {
			in.Reasons = in.Reasons[:len(in.Reasons)/2]
		}
		cut = true
		b, err = json.Marshal(in)
	}
	return b, cut, err
}

// announce sends the execution's Init and starts the log pump (r.pump; none without a server or
// stacks). Init is not waited for: the scripts start while it is in flight (a slow server
// costs the build no time here), and everything sent for the execution waits for its answer
// (see refusal and cancellingPoster). initError, on the flow's goroutine, says what the answer
// was.
func (r *run) announce(ctx context.Context) error {
	r.begin("init")
	if !r.client.Enabled() {
		return nil
	}
	named := r.separateUnnamed()
	edges := make([]events.Edge, 0, min(len(r.res.Edges), maxInitEdges))
	approximate := r.res.EdgesApproximate
	for _, e := range r.res.Edges[:min(len(r.res.Edges), maxInitEdges)] {
		if from, to := r.rootPath(e.From), r.rootPath(e.To); r.named(from) && r.named(to) {
			edges = append(edges, events.Edge{From: from, To: to})
		} else {
			approximate = true // an edge left out: a → odd → b says nothing of a and b
		}
	}
	if len(r.res.Edges) > maxInitEdges {
		approximate = true
		r.warn("Init: the run graph's %d edges are more than the server takes; the first %d are sent", len(r.res.Edges), maxInitEdges)
	}
	reasons := r.reasons
	if len(r.unnamed) > 0 {
		reasons = slices.DeleteFunc(slices.Clone(reasons), func(cr events.ChangeReason) bool { return !r.named(cr.Stack) })
	}
	if len(reasons) > maxInitReasons {
		r.warn("Init: the %d change reasons are more than the server takes; the first %d are sent", len(reasons), maxInitReasons)
		reasons = reasons[:maxInitReasons]
	}
	reasons, fitted := fitReasons(reasons)
	if fitted > 0 {
		r.warn("Init: %d change reasons had texts the server does not take (over %d bytes, not UTF-8, a NUL byte) or more than %d steps; they are sent clipped", fitted, events.MaxReasonText, events.MaxReasonChain)
	}
	in := events.Init{
		ExecutionID: r.o.ExecutionID, Op: api.InitOp(r.o.Op), Environment: r.o.Environment,
		Repo: r.o.Repo, PR: r.o.PR, SHA: r.o.SHA, Base: r.o.Base, Actor: r.o.Actor, RunURL: r.o.RunURL,
		Stacks: named, Edges: edges, EdgesApproximate: approximate,
		Reasons: reasons, StartedAt: r.res.StartedAt,
	}
	body, cut, encErr := fitInit(&in, maxInitBytes)
	if cut {
		r.warn("Init: the announcement was too large for one request; %d of the run graph's edges and %d of the change reasons are sent", len(in.Edges), len(in.Reasons))
	}
	r.execID = r.o.ExecutionID
	announced := r.sendInit(ctx, body, encErr)
	r.pump = r.startPump(ctx, announced)
	return nil
}

// separateUnnamed finds the stacks whose paths the server does not take as names (r.unnamed),
// says which they are, and returns the others' paths.
func (r *run) separateUnnamed() (named []string) {
	r.unnamed = map[string]string{}
	var odd []string
	for _, p := range r.paths {
		if problem := events.NameProblem(p); problem != "" {
			r.unnamed[p] = problem
			if len(odd) < maxListedUnnamed {
				odd = append(odd, fmt.Sprintf("%q %s", truncate(p, 80), problem))
			}
			continue
		}
		named = append(named, p)
	}
	if len(r.unnamed) > 0 {
		more := ""
		if n := len(r.unnamed) - len(odd); n > 0 {
			more = fmt.Sprintf(" and %d more", n)
		}
		r.warn("%d stacks are left out of what is reported, their paths being names the server does not take: %s%s", len(r.unnamed), strings.Join(odd, ", "), more)
	}
	return named
}

// maxListedUnnamed is how many of the stacks left out of the reports their warning names.
const maxListedUnnamed = 10

// named reports whether the server takes path as a stack's name: whether the stack is
// reported.
func (r *run) named(path string) bool {
	_, odd := r.unnamed[path]
	return !odd
}

// sendUpdates reports the status and classification of the stacks at idx (best-effort), in
// as few requests as the client allows.
func (r *run) sendUpdates(ctx context.Context, idx []int) {
	if !r.reporting() {
		return
	}
	updates := make([]events.Update, 0, len(idx))
	for _, i := range idx {
		if e := r.res.Stacks[i]; r.named(e.Path) {
			updates = append(updates, r.update(e.Path, e.Status, r.classed[e.Path]))
		}
	}
	r.event("Update", r.client.Updates(ctx, updates))
}

// sendAllUpdates reports every stack's status and classification (best-effort).
func (r *run) sendAllUpdates(ctx context.Context) {
	idx := make([]int, len(r.res.Stacks))
	for i := range idx {
		idx[i] = i
	}
	r.sendUpdates(ctx, idx)
}

// update is a stack's Update event, next in the run's seq order.
func (r *run) update(path, status string, s *plan.Stack) events.Update {
	u := s.Event()
	u.ExecutionID, u.Stack, u.Status, u.Seq, u.At = r.o.ExecutionID, path, wireStatus(status), r.seqNext(), r.now().UTC()
	if c, ok := r.carried[path]; ok {
		u.Destructive = c.Destructive[:min(len(c.Destructive), plan.MaxDestructive)]
	}
	return u
}

// wireStatus maps a result status onto the wire's stack status.
func wireStatus(s string) events.StackStatus {
	switch s {
	case StatusSucceeded:
		return events.StackSucceeded
	case StatusFailed:
		return events.StackFailed
	case StatusCancelled:
		return events.StackCancelled
	}
	return events.StackSkipped
}

// finalize ends the execution on the server, whatever happened.
func (r *run) finalize(ctx context.Context) {
	r.stopHeartbeat()
	if r.noFinalize || !r.finalizes() {
		return
	}
	res := r.res
	status := events.ExecutionSucceeded
	switch res.Status {
	case StatusCancelled:
		status = events.ExecutionCancelled
	case StatusSucceeded:
	default:
		status = events.ExecutionFailed
	}
	f := events.Finalize{ExecutionID: r.o.ExecutionID, Status: status, Class: res.Class, Counts: res.Counts.Events(), FinishedAt: r.now().UTC()}
	if res.Error != nil {
		f.Error = res.Error.Kind + " (" + res.Error.Step + "): " + tailOf(res.Error.Tail, 1024)
	}
	for _, e := range res.Stacks {
		if !r.named(e.Path) {
			continue
		}
		f.Stacks = append(f.Stacks, events.StackResult{Stack: e.Path, Status: wireStatus(e.Status), Class: e.Class, Counts: e.Counts.Events(), PlanHash: e.PlanHash,
			Drifted: e.Drifted != nil && *e.Drifted})
	}
	r.sendFinalize(ctx, f)
}
