package runner

import (
	"bytes"
	"slices"

	"github.com/tfstackplan/tfstackplan/internal/acauto"
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
// The trie, its edges and failure links are an acauto.Automaton; the nodes are the values'
// prefixes, the root 0.
type secretAutomaton struct {
	ac      acauto.Automaton
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
	longest := 0
	for _, v := range sorted {
		longest = max(longest, len(v))
	}
	a := &secretAutomaton{ring: 1, covered: len(values)}
	for a.ring < longest {
		a.ring <<= 1
	}
	shape := acauto.Build[uint16](&a.ac, sorted)
	a.depth = shape.Depth
	a.out = make([]int32, a.ac.Nodes())
	for _, n := range shape.End {
		a.out[n] = n
	}
	// Breadth first: a node's failure target is shallower, so its out is done first.
	for _, n := range shape.Order[1:] {
		if a.out[n] == 0 {
			a.out[n] = a.out[a.ac.Fail(n)]
		}
	}
	return a
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
		n = a.ac.Step(n, b)
		for o := a.out[n]; o != 0; o = a.out[a.ac.Fail(o)] {
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
	for ; n != 0; n = a.ac.Fail(n) {
		if a.ac.HasChildren(n) {
			return picked, len(w) - int(a.depth[n])
		}
	}
	return picked, len(w)
}
