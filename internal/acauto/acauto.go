// Package acauto is the shared core of the repository's Aho-Corasick automata: the trie of a
// sorted set of byte strings (keys), its edges in compressed sparse rows, a table for the
// root's children, and the failure links. It finds nothing by itself: each user (the log
// masker in runner, the secret matcher in internal/plan) keeps its own per-node annotations,
// made from what Build reports (the node each key ends at, each node's depth, the nodes in
// breadth-first order), and its own search loop over Step.
//
// Nodes are the keys' prefixes, numbered in preorder (the keys' sorted order) with the root 0;
// a node's children are kept in increasing byte order.
package acauto

import "slices"

// Automaton is the trie of a set of keys with its failure links. Step drives a search, Fail
// follows a node's failure chain (to the keys that end at a position), and Child and
// HasChildren walk the trie.
type Automaton struct {
	root   [256]int32 // the root's child for each byte, 0 when none
	edgeLo []int32    // node n's children are edgeTo[edgeLo[n]:edgeLo[n+1]]
	edgeB  []byte     // edgeB[i] labels edgeTo[i]; increasing within a node
	edgeTo []int32
	fail   []int32 // the node of the longest proper suffix of n's prefix that is a node
}

// Shape is what Build reports about the nodes it made, for callers to annotate them; D is the
// type of a depth. Nothing in the Automaton refers to it: a caller keeps what it needs (as its
// own array of depths, with no copy) and drops the rest.
type Shape[D ~uint8 | ~uint16] struct {
	// End[i] is the node whose prefix is keys[i]. It does not decrease with i (the keys are
	// sorted and the nodes numbered in preorder); equal keys share their node.
	End []int32
	// Depth[n] is the length of node n's prefix.
	Depth []D
	// Order is every node once, breadth first, the root first: a node comes after its parent
	// and after its failure target, so an annotation along failure links can be filled in
	// this order.
	Order []int32
}

// Build makes a the automaton of keys, which must be sorted in increasing byte order (as by
// bytes.Compare or strings.Compare), each no longer than the largest D (the depth of its end
// node); equal keys are allowed and share a node, and an empty key ends at the root. It panics
// on unsorted or too long keys. Whatever a held before is replaced. An Automaton is built in
// place so that its user can hold it as a field, not behind one more pointer to load on every
// step.
func Build[D ~uint8 | ~uint16, K ~string | ~[]byte](a *Automaton, keys []K) Shape[D] {
	total := 0
	for _, k := range keys {
		total += len(k)
	}
	// The trie, from the sorted keys: the prefix a key shares with the previous one is there
	// already, and a node's children are made in increasing byte order.
	parent := make([]int32, 1, total+1)
	label := make([]byte, 1, total+1)
	depth := make([]D, 1, total+1)
	end := make([]int32, len(keys))
	var path []int32 // path[d] is the node of the previous key's prefix of length d+1
	var prev K
	for i, k := range keys {
		if len(k) > int(^D(0)) {
			panic("acauto: key too long for its depth")
		}
		common := 0
		for common < len(k) && common < len(prev) && k[common] == prev[common] {
			common++
		}
		if common < len(prev) && (common == len(k) || k[common] < prev[common]) {
			panic("acauto: keys not sorted")
		}
		path = path[:common]
		n := int32(0)
		if common > 0 {
			n = path[common-1]
		}
		for d := common; d < len(k); d++ {
			c := int32(len(label))
			parent = append(parent, n)
			label = append(label, k[d])
			depth = append(depth, D(d+1))
			path = append(path, c)
			n = c
		}
		end[i] = n
		prev = k
	}
	// The edges grouped by parent: the nodes were made in increasing byte order under each
	// parent, so taking them in order keeps each group sorted.
	nodes := len(label)
	*a = Automaton{
		edgeLo: make([]int32, nodes+1),
		edgeB:  make([]byte, nodes-1),
		edgeTo: make([]int32, nodes-1),
		fail:   make([]int32, nodes),
	}
	for c := 1; c < nodes; c++ {
		a.edgeLo[parent[c]+1]++
	}
	for n := range nodes {
		a.edgeLo[n+1] += a.edgeLo[n]
	}
	next := slices.Clone(a.edgeLo[:nodes])
	for c := 1; c < nodes; c++ {
		p := parent[c]
		a.edgeB[next[p]], a.edgeTo[next[p]] = label[c], int32(c)
		next[p]++
	}
	for i := a.edgeLo[0]; i < a.edgeLo[1]; i++ {
		a.root[a.edgeB[i]] = a.edgeTo[i]
	}
	// Failure links breadth first: a node's failure target is shallower, so it is done first.
	order := make([]int32, 1, nodes)
	for q := 0; q < len(order); q++ {
		n := order[q]
		for i := a.edgeLo[n]; i < a.edgeLo[n+1]; i++ {
			c, b := a.edgeTo[i], a.edgeB[i]
			if n != 0 {
				a.fail[c] = a.Step(a.fail[n], b)
			}
			order = append(order, c)
		}
	}
	return Shape[D]{End: end, Depth: depth, Order: order}
}

// Nodes returns how many nodes a has, the root included: nodes are 0 to Nodes()-1.
func (a *Automaton) Nodes() int { return len(a.fail) }

// Child returns n's child for byte b, 0 when there is none.
func (a *Automaton) Child(n int32, b byte) int32 {
	if n == 0 {
		return a.root[b]
	}
	return a.child(n, b)
}

// child is Child for n other than the root.
func (a *Automaton) child(n int32, b byte) int32 {
	lo, hi := a.edgeLo[n], a.edgeLo[n+1]
	if hi-lo > 8 {
		i, found := slices.BinarySearch(a.edgeB[lo:hi], b)
		if !found {
			return 0
		}
		return a.edgeTo[lo+int32(i)]
	}
	for i := lo; i < hi; i++ {
		if a.edgeB[i] == b {
			return a.edgeTo[i]
		}
	}
	return 0
}

// Step returns the node reached from n by reading b: the deepest node whose prefix is a suffix
// of n's prefix followed by b (the root when there is none).
func (a *Automaton) Step(n int32, b byte) int32 {
	for n != 0 {
		if c := a.child(n, b); c != 0 {
			return c
		}
		n = a.fail[n]
	}
	return a.root[b]
}

// Fail returns n's failure target: the node of the longest proper suffix of n's prefix that is
// a node (the root for the root).
func (a *Automaton) Fail(n int32) int32 { return a.fail[n] }

// HasChildren reports whether n's prefix is a proper prefix of a key.
func (a *Automaton) HasChildren(n int32) bool { return a.edgeLo[n+1] > a.edgeLo[n] }
