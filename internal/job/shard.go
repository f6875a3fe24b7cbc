package job

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/plan"
)

// A fan-out (`run plan --matrix N`, then `--shard K/N` jobs, then `run merge`): the matrix job
// cuts the stacks into shards, every shard job runs its own stacks into the one execution the
// matrix job announced, and the merge job joins their result documents and finalizes it.

// What a cut's weights are (Matrix.Basis).
const (
	BasisDurations = "durations" // each stack's last known duration, from the server
	BasisCount     = "count"     // every stack weighs the same
)

// Matrix is the cut a `--matrix N` run made, in its result document: the shards with their
// stacks (repository paths, in the run's order), what they were weighed by, and the groups of
// dependent stacks too heavy for one shard's share (each is still one shard's).
type Matrix struct {
	Shards    []MatrixShard `json:"shards"`
	Basis     string        `json:"basis"`
	Oversized [][]string    `json:"oversized,omitempty"`
}

// MatrixShard is one shard of a cut.
type MatrixShard struct {
	// Shard is "K/N".
	Shard  string   `json:"shard"`
	Stacks []string `json:"stacks"`
	// Weight is the shard's expected duration in milliseconds (BasisDurations) or its number
	// of stacks (BasisCount).
	Weight int64 `json:"weight"`
}

// GitHubMatrix is the matrix a GitHub Actions job takes (`strategy.matrix: ${{ fromJSON(...) }}`).
type GitHubMatrix struct {
	Include []GitHubMatrixEntry `json:"include"`
}

// GitHubMatrixEntry is one job of the matrix.
type GitHubMatrixEntry struct {
	Shard string `json:"shard"`
}

// GitHub returns the matrix of the cut's shards.
func (m *Matrix) GitHub() GitHubMatrix {
	g := GitHubMatrix{Include: []GitHubMatrixEntry{}}
	for _, s := range m.Shards {
		g.Include = append(g.Include, GitHubMatrixEntry{Shard: s.Shard})
	}
	return g
}

// Cut splits stacks (repository paths, in the run's order) into at most n shards. Stacks that
// depend on each other, through an edge (from, to: repository paths) or by nesting (terramate
// runs a stack before the stacks below it), are one component, and a component is never split:
// the cut is along the weakly connected components. The components go, heaviest first, to the
// lightest shard so far (ties to the lower shard number). A stack weighs its duration in
// weights when known; one without, the median of the known ones; with none known every stack
// weighs 1 (BasisCount). A component heavier than a shard's share (the total / n, rounded up)
// is listed in Oversized. The same inputs give the same cut.
func Cut(stacks []string, edges []events.Edge, weights map[string]time.Duration, n int) *Matrix {
	m := &Matrix{Shards: []MatrixShard{}, Basis: BasisCount}
	if n < 1 || len(stacks) == 0 {
		return m
	}
	index := make(map[string]int, len(stacks))
	for i, s := range stacks {
		index[s] = i
	}
	parent := make([]int, len(stacks))
	for i := range parent {
		parent[i] = i
	}
	var find func(int) int
	find = func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	union := func(a, b int) {
		if ra, rb := find(a), find(b); ra != rb {
			parent[max(ra, rb)] = min(ra, rb)
		}
	}
	g := newGraph(stacks, edges)
	for i, s := range stacks {
		for _, t := range g.next[s] {
			union(i, index[t])
		}
	}

	weight := stackWeights(stacks, weights, m)
	type component struct {
		first  int
		stacks []int
		weight int64
	}
	byRoot := map[int]*component{}
	var comps []*component
	for i := range stacks {
		r := find(i)
		c := byRoot[r]
		if c == nil {
			c = &component{first: i}
			byRoot[r] = c
			comps = append(comps, c)
		}
		c.stacks = append(c.stacks, i)
		c.weight += weight[i]
	}
	var total int64
	for _, c := range comps {
		total += c.weight
	}
	slices.SortStableFunc(comps, func(a, b *component) int {
		return cmp.Or(cmp.Compare(b.weight, a.weight), cmp.Compare(a.first, b.first))
	})
	k := min(n, len(comps))
	share := (total + int64(n) - 1) / int64(n) // rounded up: 5 stacks in 3 shards leave 2 to some shard
	members := make([][]int, k)
	load := make([]int64, k)
	for _, c := range comps {
		if c.weight > share && len(c.stacks) > 1 {
			group := make([]string, len(c.stacks))
			for j, i := range c.stacks {
				group[j] = stacks[i]
			}
			m.Oversized = append(m.Oversized, group)
		}
		lightest := 0
		for s := 1; s < k; s++ {
			if load[s] < load[lightest] {
				lightest = s
			}
		}
		members[lightest] = append(members[lightest], c.stacks...)
		load[lightest] += c.weight
	}
	for s := range k {
		slices.Sort(members[s])
		names := make([]string, len(members[s]))
		for j, i := range members[s] {
			names[j] = stacks[i]
		}
		m.Shards = append(m.Shards, MatrixShard{Shard: fmt.Sprintf("%d/%d", s+1, k), Stacks: names, Weight: load[s]})
	}
	return m
}

// stackWeights returns each stack's weight (milliseconds, at least 1) and sets m.Basis.
func stackWeights(stacks []string, durations map[string]time.Duration, m *Matrix) []int64 {
	w := make([]int64, len(stacks))
	var known []int64
	for _, s := range stacks {
		if d, ok := durations[s]; ok && d > 0 {
			known = append(known, max(d.Milliseconds(), 1))
		}
	}
	fallback := int64(1)
	if len(known) > 0 {
		m.Basis = BasisDurations
		slices.Sort(known)
		fallback = known[len(known)/2]
	}
	for i, s := range stacks {
		w[i] = fallback
		if d, ok := durations[s]; ok && d > 0 && len(known) > 0 {
			w[i] = max(d.Milliseconds(), 1)
		}
	}
	return w
}

// ReadResult reads a result document, checking that it is one this version writes.
func ReadResult(file string) (*Result, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var res Result
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("%s is not a result document: %w", file, err)
	}
	if res.Version != ResultVersion {
		return nil, fmt.Errorf("%s is a result document of version %d; this tfstackplan reads version %d", file, res.Version, ResultVersion)
	}
	return &res, nil
}

// fanOutUsage checks the fan-out options together ("" : fine).
func fanOutUsage(o *RunOptions) string {
	switch {
	case o.Matrix < 0:
		return fmt.Sprintf("--matrix must be a positive number of shards, got %d", o.Matrix)
	case o.Matrix > MaxShards:
		return fmt.Sprintf("--matrix %d is more shards than a GitHub Actions matrix takes (%d jobs)", o.Matrix, MaxShards)
	case o.Matrix > 0 && o.Shard != "":
		return "--matrix and --shard do not go together: the matrix job cuts, each shard job runs one part"
	case o.MatrixResult != "" && o.Shard == "":
		return "--matrix-result is read by a shard job: pass --shard K/N with it"
	case o.Matrix > 0 && o.DryRun:
		return "--matrix runs nothing already: drop --dry-run"
	}
	if o.Shard != "" {
		if _, _, err := parseShard(o.Shard); err != nil {
			return err.Error()
		}
	}
	return ""
}

// MaxShards is the most shards a cut makes: a GitHub Actions matrix runs at most 256 jobs.
const MaxShards = 256

// rootEdges returns the run graph's edges between repository paths.
func (r *run) rootEdges() []events.Edge {
	edges := make([]events.Edge, 0, len(r.res.Edges))
	for _, e := range r.res.Edges {
		if from, to := r.rootPath(e.From), r.rootPath(e.To); from != "" && to != "" {
			edges = append(edges, events.Edge{From: from, To: to})
		}
	}
	return edges
}

// matrix is a fan-out's matrix job: it cuts the stacks, marks each with its shard, announces
// the execution with all of them and leaves it running for the shards.
func (r *run) matrix(ctx context.Context) error {
	r.begin("matrix")
	var weights map[string]time.Duration
	if r.client.Enabled() {
		var err error
		// Best effort and bounded (HistoryBudget): without them the cut weighs stack counts.
		if weights, err = r.client.LastDurations(ctx, r.o.Repo, r.o.Environment, r.paths); err != nil {
			r.warn("the stacks' last durations could not be read from the server, so the cut weighs only those it got: %v", err)
		}
	}
	m := Cut(r.paths, r.rootEdges(), weights, r.o.Matrix)
	for _, s := range m.Shards {
		for _, p := range s.Stacks {
			r.res.Stacks[r.entry[p]].Shard = s.Shard
		}
	}
	for _, group := range m.Oversized {
		r.warn("%d stacks depend on each other (%s ...) and weigh more than a shard's share: they stay together in one shard, which will take longest", len(group), group[0])
	}
	r.res.Matrix = m
	r.noFinalize = true
	return r.announce(ctx)
}

// selectShard narrows the run to its shard's stacks: the matrix job's cut when its result
// document is given, else the cut made again by stack count.
func (r *run) selectShard(context.Context) error {
	r.begin("shard")
	k, n, _ := parseShard(r.o.Shard)
	fail := func(format string, a ...any) error {
		return newResultError(KindUsage, "shard", fmt.Sprintf(format, a...))
	}
	var m *Matrix
	if r.o.MatrixResult != "" {
		mr, err := ReadResult(r.o.MatrixResult)
		switch {
		case err != nil:
			return fail("--matrix-result: %v", err)
		case mr.Matrix == nil:
			return fail("--matrix-result %s is not a matrix job's result (it has no cut)", r.o.MatrixResult)
		case mr.Environment != r.o.Environment || mr.Op != r.o.Op:
			return fail("--matrix-result %s is of `run %s --environment %s`, not of this `run %s --environment %s`", r.o.MatrixResult, mr.Op, mr.Environment, r.o.Op, r.o.Environment)
		case r.o.ExecutionID != "" && r.execGiven && mr.Execution != r.o.ExecutionID:
			return fail("--execution %s is not the matrix job's execution %s", r.o.ExecutionID, mr.Execution)
		}
		m = mr.Matrix
		r.o.ExecutionID, r.res.Execution = mr.Execution, mr.Execution
		r.res.ExecutionURL = executionURL(r.res.Server, mr.Execution)
	} else {
		if r.client.Enabled() && !r.execGiven {
			return fail("--shard with a server needs the execution the matrix job announced: pass --execution (its `execution` output) or --matrix-result")
		}
		m = Cut(r.paths, r.rootEdges(), nil, n)
	}
	if len(m.Shards) != n {
		return fail("shard %s: the cut has %d shards, not %d (the matrix job saw other stacks or another --matrix)", r.o.Shard, len(m.Shards), n)
	}
	mine := map[string]bool{}
	for _, p := range m.Shards[k-1].Stacks {
		if _, ok := r.entry[p]; !ok {
			return fail("shard %s: stack %s of the matrix job's cut is not among the stacks found here (the checkout or --base differ from the matrix job's)", r.o.Shard, p)
		}
		mine[p] = true
	}
	r.keepOnly(mine)
	for i := range r.res.Stacks {
		r.res.Stacks[i].Shard = r.o.Shard
	}
	r.res.Shard = r.o.Shard
	r.subset = true
	r.noFinalize = true
	return nil
}

// keepOnly narrows the run's stacks to keep (repository paths).
func (r *run) keepOnly(keep map[string]bool) {
	var listed, paths []string
	var stacks []StackEntry
	entry := map[string]int{}
	for i, p := range r.paths {
		if !keep[p] {
			delete(r.byPath, p)
			delete(r.why, p)
			continue
		}
		listed, paths = append(listed, r.listed[i]), append(paths, p)
		entry[p] = len(stacks)
		stacks = append(stacks, r.res.Stacks[r.entry[p]])
	}
	r.listed, r.paths, r.entry, r.res.Stacks = listed, paths, entry, stacks
	r.reasons = slices.DeleteFunc(r.reasons, func(cr events.ChangeReason) bool { return !keep[cr.Stack] })
	r.res.Edges = slices.DeleteFunc(r.res.Edges, func(e events.Edge) bool {
		return r.rootPath(e.From) == "" || r.rootPath(e.To) == ""
	})
}

// after returns, per stack as listed, the stacks it runs after: its run-graph predecessors and
// the stack it is nested in (the nearest one among the run's).
func (r *run) after() map[string][]string {
	after := map[string][]string{}
	for p, before := range newGraph(r.paths, r.rootEdges()).prev {
		for _, b := range before {
			after[r.byPath[p]] = append(after[r.byPath[p]], r.byPath[b])
		}
	}
	return after
}

// keepShardPlans puts a shard's classified plans in its result, for the merge.
func (r *run) keepShardPlans() {
	if r.o.Shard == "" || r.report == nil {
		return
	}
	var b strings.Builder
	if err := plan.JSON(&b, r.report); err != nil {
		r.warn("the shard's plans could not be kept for the merge: %v", err)
		return
	}
	r.res.Plans = json.RawMessage(b.String())
}

// executionURL is the execution's page on server ("" without a server).
func executionURL(server, id string) string {
	if server == "" {
		return ""
	}
	return strings.TrimSuffix(server, "/") + "/ui/executions/" + id
}

// parseShard reads "K/N" (1 <= K <= N).
func parseShard(s string) (k, n int, err error) {
	ks, ns, ok := strings.Cut(s, "/")
	if ok {
		k, err = strconv.Atoi(ks)
		if err == nil {
			n, err = strconv.Atoi(ns)
		}
	}
	if !ok || err != nil || n < 1 || k < 1 || k > n {
		return 0, 0, fmt.Errorf("--shard %q must be K/N with 1 <= K <= N, e.g. 2/8", s)
	}
	return k, n, nil
}
