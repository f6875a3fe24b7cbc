package runner

import (
	"slices"
	"strings"

	"github.com/tfstackplan/tfstackplan/events"
)

// NormalizeEdges maps run-graph edge endpoints onto the listed stack namespace and drops edges
// touching stacks outside the set. The two commands live in different namespaces: `terramate
// list` in a tier directory yields tier-relative paths (cluster/a) while `experimental
// run-graph -l stack.dir` labels nodes project-root-relative with a leading slash
// (/stacks/nonprod/cluster/a). An exact match wins (with or without the leading slash);
// otherwise an endpoint matches the unique listed stack it path-suffixes ("…/"+stack). An
// endpoint that suffixes several listed stacks is ambiguous and, like an unknown one, drops its
// edges. The result has no duplicates or self-edges, is sorted by (From, To), and is never nil.
func NormalizeEdges(stacks []string, edges []events.Edge) []events.Edge {
	listed := listedSet(stacks)
	memo := make(map[string]string, 2*len(stacks))
	resolve := func(e string) string {
		if s, ok := memo[e]; ok {
			return s
		}
		s := matchStack(listed, e)
		memo[e] = s
		return s
	}
	return mapEdges(edges, resolve)
}

// matchStack resolves one endpoint: "" when it is unknown or ambiguous.
func matchStack(listed map[string]bool, e string) string {
	if listed[e] {
		return e
	}
	trimmed := strings.TrimPrefix(e, "/")
	if listed[trimmed] {
		return trimmed
	}
	match := ""
	for i := 0; i < len(trimmed); i++ {
		if trimmed[i] != '/' {
			continue
		}
		if cand := trimmed[i+1:]; listed[cand] {
			if match != "" {
				return ""
			}
			match = cand
		}
	}
	return match
}

func compareEdges(a, b events.Edge) int {
	if c := strings.Compare(a.From, b.From); c != 0 {
		return c
	}
	return strings.Compare(a.To, b.To)
}

// cycleStacks returns the stacks that lie on a dependency cycle (members of a strongly
// connected component with more than one node, or with a self-edge), sorted; nil when the
// edges are acyclic.
func cycleStacks(edges []events.Edge) []string {
	ids := make(map[string]int, len(edges))
	names := make([]string, 0, len(edges))
	id := func(s string) int {
		if i, ok := ids[s]; ok {
			return i
		}
		ids[s] = len(names)
		names = append(names, s)
		return len(names) - 1
	}
	from := make([]int, len(edges))
	to := make([]int, len(edges))
	for i, e := range edges {
		from[i], to[i] = id(e.From), id(e.To)
	}
	cyc := cycleNodes(len(names), from, to)
	if len(cyc) == 0 {
		return nil
	}
	res := make([]string, len(cyc))
	for i, v := range cyc {
		res[i] = names[v]
	}
	slices.Sort(res)
	return res
}

// cycleNodes returns the nodes (0..n-1) on a cycle of the graph with edges from[i]->to[i].
// Iterative Tarjan, so deep graphs cannot overflow the stack.
func cycleNodes(n int, from, to []int) []int {
	// Adjacency in compressed rows: adj[start[v]:start[v+1]] are v's successors.
	start := make([]int, n+1)
	for _, f := range from {
		start[f+1]++
	}
	for v := range n {
		start[v+1] += start[v]
	}
	adj := make([]int, len(from))
	fill := slices.Clone(start[:n])
	selfLoop := map[int]bool{}
	for i, f := range from {
		adj[fill[f]] = to[i]
		fill[f]++
		if f == to[i] {
			selfLoop[f] = true
		}
	}
	index := make([]int, n)
	low := make([]int, n)
	onStack := make([]bool, n)
	for i := range index {
		index[i] = -1
	}
	var stack, out []int
	next := 0
	type frame struct{ v, child int }
	for root := range n {
		if index[root] >= 0 {
			continue
		}
		call := []frame{{root, 0}}
		index[root], low[root] = next, next
		next++
		stack = append(stack, root)
		onStack[root] = true
		for len(call) > 0 {
			f := &call[len(call)-1]
			if succ := adj[start[f.v]:start[f.v+1]]; f.child < len(succ) {
				w := succ[f.child]
				f.child++
				if index[w] < 0 {
					index[w], low[w] = next, next
					next++
					stack = append(stack, w)
					onStack[w] = true
					call = append(call, frame{w, 0})
				} else if onStack[w] {
					low[f.v] = min(low[f.v], index[w])
				}
				continue
			}
			v := f.v
			call = call[:len(call)-1]
			if len(call) > 0 {
				p := call[len(call)-1].v
				low[p] = min(low[p], low[v])
			}
			if low[v] != index[v] {
				continue
			}
			start := len(stack) - 1
			for stack[start] != v {
				start--
			}
			members := stack[start:]
			if len(members) > 1 || selfLoop[v] {
				out = append(out, members...)
			}
			for _, m := range members {
				onStack[m] = false
			}
			stack = stack[:start]
		}
	}
	return out
}

// NormalizeEdgesIn is NormalizeEdges for stacks listed in the terramate directory tier (root-
// relative, "" for the project root): an endpoint is matched exactly on the tier's
// root-relative prefix ("/"+tier+"/"+stack), so no edge is lost when two listed stacks are both
// suffixes of one endpoint (a and cluster/a for /stacks/nonprod/cluster/a), and no stack of
// another tier is taken for a listed one. Endpoints outside the tier drop their edges.
func NormalizeEdgesIn(tier string, stacks []string, edges []events.Edge) []events.Edge {
	tier = strings.Trim(tier, "/")
	if tier == "." {
		tier = ""
	}
	listed := listedSet(stacks)
	resolve := func(e string) string {
		p := strings.TrimPrefix(e, "/")
		if tier != "" {
			rest, ok := strings.CutPrefix(p, tier+"/")
			if !ok {
				if p == tier && listed["."] {
					return "."
				}
				return ""
			}
			p = rest
		}
		if listed[p] {
			return p
		}
		return ""
	}
	return mapEdges(edges, resolve)
}

func listedSet(stacks []string) map[string]bool {
	listed := make(map[string]bool, len(stacks))
	for _, s := range stacks {
		if s != "" {
			listed[s] = true
		}
	}
	return listed
}

// mapEdges maps both ends of each edge with resolve, drops edges with an unresolved end and
// self-edges, and returns them sorted without duplicates (never nil).
func mapEdges(edges []events.Edge, resolve func(string) string) []events.Edge {
	out := make([]events.Edge, 0, len(edges))
	for _, e := range edges {
		from, to := resolve(e.From), resolve(e.To)
		if from == "" || to == "" || from == to {
			continue
		}
		out = append(out, events.Edge{From: from, To: to})
	}
	slices.SortFunc(out, compareEdges)
	return slices.Compact(out)
}
