package runner

import (
	"bytes"
	"slices"
)

// naiveSecrets is how many values a secretSet searches for one at a time (bytes.Index, fast
// for a few values); a larger set is searched with a secretAutomaton, in one pass whatever
// its size. BenchmarkMaskSecrets measures both sides of this line.
const naiveSecrets = 8

// secretAutomaton is an Aho-Corasick automaton over the values of one secretSet. One pass over
// a window finds every occurrence of every value, and where the longest suffix that may still
// grow into a value starts, in time linear in the window plus the occurrences. Searching for
// each value in turn costs the window's length once per value: with a thousand values
// announced by `::add-mask::`, that was seconds of CPU per megabyte of log.
//
// Nodes are the values' prefixes, numbered depth-first with the root 0; a node's children
// are edgeTo[edgeLo[n]:edgeLo[n+1]], labelled by the bytes edgeB[...] in increasing order.
type secretAutomaton struct {
	root    [256]int32 // the root's child for each byte, 0 when none
	edgeLo  []int32
	edgeB   []byte
	edgeTo  []int32
	fail    []int32  // the node of the longest proper suffix of n's prefix that is a node
	out     []int32  // the first node on n's failure chain, n included, that ends a value; 0 when none
	depth   []uint16 // the length of n's prefix (MaxSecretLength fits)
	ring    int      // a power of two >= the longest value: the scan's window of pending starts
	covered int      // how many values it was built over (the first ones of its set)
}

// A value's length must fit the automaton's depths.
const _ = uint16(MaxSecretLength)

// newSecretAutomaton builds the automaton of values (distinct, non-empty, at most
// MaxSecretLength bytes each).
func newSecretAutomaton(values [][]byte) *secretAutomaton {
	sorted := slices.Clone(values)
	slices.SortFunc(sorted, bytes.Compare)
	total, longest := 0, 0
	for _, v := range sorted {
		total += len(v)
		longest = max(longest, len(v))
	}
	// The trie, built from the sorted values: the prefix a value shares with the previous one
	// is already there, and a node's children are added in increasing byte order, so the
	// child to follow is always the last one added.
	nodes := 1
	firstChild := make([]int32, 1, total+1)
	nextSibling := make([]int32, 1, total+1)
	lastChild := make([]int32, 1, total+1)
	label := make([]byte, 1, total+1)
	depth := make([]uint16, 1, total+1)
	ends := make([]bool, 1, total+1)
	var path []int32 // path[d] is the node of the previous value's prefix of length d+1
	var prev []byte
	for _, v := range sorted {
		common := 0
		for common < len(v) && common < len(prev) && v[common] == prev[common] {
			common++
		}
		path = path[:common]
		n := int32(0)
		if common > 0 {
			n = path[common-1]
		}
		for d := common; d < len(v); d++ {
			c := int32(nodes)
			nodes++
			firstChild = append(firstChild, 0)
			nextSibling = append(nextSibling, 0)
			lastChild = append(lastChild, 0)
			label = append(label, v[d])
			depth = append(depth, uint16(d+1))
			ends = append(ends, false)
			if lastChild[n] == 0 {
				firstChild[n] = c
			} else {
				nextSibling[lastChild[n]] = c
			}
			lastChild[n] = c
			path = append(path, c)
			n = c
		}
		ends[n] = true
		prev = v
	}
	a := &secretAutomaton{
		edgeLo:  make([]int32, nodes+1),
		edgeB:   make([]byte, 0, nodes-1),
		edgeTo:  make([]int32, 0, nodes-1),
		fail:    make([]int32, nodes),
		out:     make([]int32, nodes),
		depth:   depth,
		ring:    1,
		covered: len(values),
	}
	for a.ring < longest {
		a.ring <<= 1
	}
	for n := range nodes {
		a.edgeLo[n] = int32(len(a.edgeTo))
		for c := firstChild[n]; c != 0; c = nextSibling[c] {
			a.edgeB = append(a.edgeB, label[c])
			a.edgeTo = append(a.edgeTo, c)
		}
	}
	a.edgeLo[nodes] = int32(len(a.edgeTo))
	for i := a.edgeLo[0]; i < a.edgeLo[1]; i++ {
		a.root[a.edgeB[i]] = a.edgeTo[i]
	}
	// Failure links breadth first: a node's failure target is shallower, so it is done first.
	queue := make([]int32, 0, nodes)
	queue = append(queue, 0)
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		for i := a.edgeLo[n]; i < a.edgeLo[n+1]; i++ {
			c, b := a.edgeTo[i], a.edgeB[i]
			if n != 0 {
				a.fail[c] = a.step(a.fail[n], b)
			}
			if ends[c] {
				a.out[c] = c
			} else {
				a.out[c] = a.out[a.fail[c]]
			}
			queue = append(queue, c)
		}
	}
	return a
}

// child returns n's child for byte b, 0 when there is none.
func (a *secretAutomaton) child(n int32, b byte) int32 {
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

// step returns the node reached from n by reading b.
func (a *secretAutomaton) step(n int32, b byte) int32 {
	for n != 0 {
		if c := a.child(n, b); c != 0 {
			return c
		}
		n = a.fail[n]
	}
	return a.root[b]
}

// scan returns what secretSet's find and partialSuffix return for w, in one pass: the
// leftmost-longest non-overlapping occurrences of the values, and where the longest suffix of
// w that is a proper prefix of a value starts (len(w) when there is none). Occurrences in
// extra (of other values, ordered by start; see occurrences) compete with the automaton's own.
//
// An occurrence is known when its last byte is read; one starting at s ends before
// s+a.ring, so once the scan is that far, the longest occurrence starting at s is final
// and is taken when no taken one covers s. longest[s%ring] holds it until then.
func (a *secretAutomaton) scan(w []byte, extra [][2]int) (picked [][2]int, partial int) {
	var longest []uint16
	if len(extra) > 0 {
		longest = make([]uint16, a.ring)
	}
	mask := a.ring - 1
	free := 0     // where the last taken occurrence ends: later ones may start here
	pending := -1 // the last start with an occurrence not yet decided
	if len(extra) > 0 {
		pending = extra[len(extra)-1][0]
	}
	decide := func(s int) {
		l := int(longest[s&mask])
		longest[s&mask] = 0
		for len(extra) > 0 && extra[0][0] == s {
			l = max(l, extra[0][1]-s)
			extra = extra[1:]
		}
		if l > 0 && s >= free {
			picked = append(picked, [2]int{s, s + l})
			free = s + l
		}
	}
	n := int32(0)
	for i, b := range w {
		if s := i - a.ring; s >= 0 && s <= pending {
			decide(s)
		}
		n = a.step(n, b)
		for o := a.out[n]; o != 0; o = a.out[a.fail[o]] {
			if longest == nil {
				longest = make([]uint16, a.ring)
			}
			l := a.depth[o]
			s := i + 1 - int(l)
			longest[s&mask] = max(longest[s&mask], l)
			pending = max(pending, s)
		}
	}
	for s := max(0, len(w)-a.ring); s <= pending; s++ {
		decide(s)
	}
	for ; n != 0; n = a.fail[n] {
		if a.edgeLo[n+1] > a.edgeLo[n] {
			return picked, len(w) - int(a.depth[n])
		}
	}
	return picked, len(w)
}
