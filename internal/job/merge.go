package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/runner"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/plan"
)

// MergeOptions are the inputs of `run merge`: the matrix job's result document and the shard
// jobs' result documents, to join into the fan-out's one result, summary, comment, outputs and
// Finalize. The rest is as RunOptions says (the environment, the execution, the pull request
// and the repository come from the matrix job's result).
type MergeOptions struct {
	// Matrix is the matrix job's result document (`run plan --matrix N --result FILE`).
	Matrix string
	// Shards are the shard jobs' result documents, in any order; a file that does not exist
	// counts as a missing shard.
	Shards []string

	WorkDir     string
	ResultPath  string
	CommentFile string
	// IssueFile receives a drift fan-out's issue body (RunOptions.IssueFile).
	IssueFile string
	Client    *runner.Client
	Getenv    func(string) string
	Stdout    io.Writer
	Stderr    io.Writer
	Color     bool
	Now       func() time.Time
}

// Merge joins a fan-out's shards. Every stack of the cut takes its outcome from its shard's
// result; the stacks of a shard whose result is missing (the job died or was cancelled) are
// not-run and the merge fails. It then ends as a single `run plan|apply` over the same stacks
// does: the execution is finalized (never left running), the server is asked what the plan
// needs, and the summary, comment, outputs and result document are written.
func Merge(ctx context.Context, o MergeOptions) *Result {
	m, merr := ReadResult(o.Matrix)
	ro := RunOptions{
		Op: OpPlan, WorkDir: o.WorkDir, ResultPath: o.ResultPath, CommentFile: o.CommentFile, IssueFile: o.IssueFile,
		Client: o.Client, Getenv: o.Getenv, Stdout: o.Stdout, Stderr: o.Stderr, Color: o.Color, Now: o.Now,
	}
	if merr == nil && m.Matrix == nil {
		merr = fmt.Errorf("%s is not a matrix job's result document (it has no cut)", o.Matrix)
	}
	if merr == nil {
		ro.Op, ro.Environment, ro.ExecutionID = m.Op, m.Environment, m.Execution
		ro.PR, ro.SHA, ro.Repo = m.PR, m.SHA, m.Repo
	}
	r := newRun(ro)
	r.begin("merge")
	if merr != nil {
		r.finish(ctx, newResultError(KindUsage, "merge", "--matrix: "+merr.Error()))
		return r.res
	}
	if m.Status != StatusSucceeded {
		r.finish(ctx, newResultError(KindUsage, "merge", fmt.Sprintf("the matrix job's result %s is %s, not succeeded: there is nothing to merge", o.Matrix, m.Status)))
		return r.res
	}
	ctx, r.cancelRun = context.WithCancelCause(ctx)
	defer r.cancelRun(nil)
	if err := r.setup(ctx); err != nil {
		r.finish(ctx, err)
		return r.res
	}
	r.res.Execution, r.res.Edges, r.res.EdgesApproximate = m.Execution, m.Edges, m.EdgesApproximate
	r.res.ExecutionURL = executionURL(r.res.Server, m.Execution)
	r.res.Stacks = slices.Clone(m.Stacks)
	r.entry = map[string]int{}
	for i, e := range r.res.Stacks {
		r.entry[e.Path] = i
		r.paths = append(r.paths, e.Path)
	}
	r.unnamed = map[string]string{}
	for _, p := range r.paths {
		if problem := events.NameProblem(p); problem != "" {
			r.unnamed[p] = problem
		}
	}
	// The matrix job announced the execution: it is finalized here whatever happens.
	r.inited = true
	r.classed = map[string]*plan.Stack{}
	// The merge's error: the first of the shards' documents that do not fit the cut, the
	// shards' own errors, and the shards missing.
	var mergeErr error
	keep := func(err error) {
		if mergeErr == nil {
			mergeErr = err
		}
	}
	got := map[string]bool{}
	var gate *GateResult // the merged verdict: a denial wins, then the first allowance
	for _, file := range o.Shards {
		shard, shardErr, err := r.mergeShard(m, file, got, &gate)
		if errors.Is(err, fs.ErrNotExist) {
			r.warn("shard result %s does not exist: its shard counts as missing", file)
			continue
		}
		if err != nil {
			keep(newResultError(KindUsage, "merge", err.Error()))
			continue
		}
		if shardErr != nil {
			keep(shardErr)
		}
		got[shard] = true
	}
	var missing []string
	for _, s := range m.Matrix.Shards {
		if !got[s.Shard] {
			missing = append(missing, fmt.Sprintf("%s (%d stacks)", s.Shard, len(s.Stacks)))
		}
	}
	if len(missing) > 0 {
		keep(newResultError(KindScript, "merge", fmt.Sprintf("no result from shard %s: the job died, was cancelled or its result was not passed to the merge; its stacks were not run", strings.Join(missing, ", "))))
	}
	r.report = &plan.Report{ExecutionURL: r.res.ExecutionURL}
	for i := range r.res.Stacks {
		e := &r.res.Stacks[i]
		s := r.classed[e.Path]
		if s == nil {
			s = &plan.Stack{Name: e.Path, Class: events.ClassUnclassified, Destructive: []plan.Change{}, Changes: []plan.Change{}, Error: stackError(e.Status)}
			e.Class, e.Error = s.Class, s.Error
			r.classed[e.Path] = s
		}
		s.Why = e.Why
		r.report.Stacks = append(r.report.Stacks, s)
	}
	if m.Op == OpApply {
		// The shards left the execution's lease to the merge (see run.apply): finish revokes it.
		r.res.Gate = gate
		if r.client.Enabled() {
			r.lease = &lease{}
			if gate != nil {
				r.lease.requester = gate.Requester
			}
		}
	}
	r.finish(ctx, mergeErr)
	return r.res
}

// mergeShard takes one shard job's result into the merge (its gate verdict into *gate) and
// returns its shard and the shard job's own error (nil: it succeeded); err says why its
// document does not fit the cut.
func (r *run) mergeShard(m *Result, file string, got map[string]bool, gate **GateResult) (shard string, shardErr, err error) {
	s, err := ReadResult(file)
	if err != nil {
		return "", nil, err
	}
	var cut *MatrixShard
	for i := range m.Matrix.Shards {
		if m.Matrix.Shards[i].Shard == s.Shard {
			cut = &m.Matrix.Shards[i]
		}
	}
	switch {
	case s.Shard == "":
		return "", nil, fmt.Errorf("%s is not a shard job's result (it names no shard)", file)
	case s.Environment != m.Environment || s.Op != m.Op:
		return "", nil, fmt.Errorf("%s is of `run %s --environment %s`, not of the matrix job's `run %s --environment %s`", file, s.Op, s.Environment, m.Op, m.Environment)
	case m.Execution != "" && s.Execution != m.Execution:
		return "", nil, fmt.Errorf("%s reported into execution %s, not the matrix job's %s", file, s.Execution, m.Execution)
	case cut == nil:
		return "", nil, fmt.Errorf("%s is shard %s, which the matrix job's cut does not have", file, s.Shard)
	case got[s.Shard]:
		return "", nil, fmt.Errorf("%s is shard %s again: pass each shard's result once", file, s.Shard)
	}
	var ran []string
	for _, e := range s.Stacks {
		ran = append(ran, e.Path)
	}
	if !slices.Equal(ran, cut.Stacks) {
		return "", nil, fmt.Errorf("%s ran the stacks %s, but the matrix job's shard %s has %s: the shard cut again from other inputs (pass it --matrix-result)", file, someNames(ran, plainName), s.Shard, someNames(cut.Stacks, plainName))
	}
	var plans struct {
		Stacks []*plan.Stack `json:"stacks"`
	}
	if len(s.Plans) > 0 {
		if err := json.Unmarshal(s.Plans, &plans); err != nil {
			return "", nil, fmt.Errorf("%s: its plans do not read: %v", file, err)
		}
	}
	for _, p := range plans.Stacks {
		if p == nil {
			continue
		}
		if i, ok := r.entry[p.Name]; ok && slices.Contains(cut.Stacks, p.Name) {
			r.classed[r.res.Stacks[i].Path] = p
		}
	}
	for _, e := range s.Stacks {
		e.Shard = s.Shard
		r.res.Stacks[r.entry[e.Path]] = e
	}
	for _, w := range s.Warnings {
		r.res.Warnings = append(r.res.Warnings, "shard "+s.Shard+": "+w)
	}
	if s.Error != nil {
		shardErr = &ResultError{Kind: s.Error.Kind, Step: "shard " + s.Shard + " " + s.Error.Step, Tail: s.Error.Tail}
	}
	// The merged verdict: a denial wins, then the first allowance.
	if g := s.Gate; g != nil && (*gate == nil || (*gate).Allowed && !g.Allowed) {
		*gate = g
	}
	return s.Shard, shardErr, nil
}

// plainName shows a name as it is.
func plainName(s string) string { return s }
