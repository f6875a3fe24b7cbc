package plan

import (
	"slices"
	"strings"

	"github.com/tfstackplan/tfstackplan/internal/acauto"
)

// Kinds of secret pattern, as bit flags: one text may be a pattern of several kinds.
const (
	// kindExact: an encoded form of a secret; a value equal to it is sensitive.
	kindExact uint8 = 1 << iota
	// kindInner: an encoded form of a secret of at least minSecretSubstring bytes; a value
	// containing it is sensitive.
	kindInner
	// kindText: a kindInner form, or its Go-quoted form; masked inside free text by
	// redactText, the longest first.
	kindText
)

// matchPrefix is how many bytes of a pattern the automaton holds: a pattern longer than that
// is found by its first matchPrefix bytes, then compared whole. A secret can be a certificate
// or a key of kilobytes, in a dozen escaped forms; one node per byte of each would take more
// memory than the strings.
const matchPrefix = 64

// A head's length must fit the matcher's depths.
const _ = uint8(matchPrefix)

// secretPattern is one text to find, of the kinds in kinds.
type secretPattern struct {
	text  string
	kinds uint8
}

// secretMatcher is an Aho-Corasick automaton over the first matchPrefix bytes of a set of
// secret patterns. One pass over a text finds every place where one starts, however many
// there are: testing each pattern in turn (strings.Contains) cost the text's length once per
// pattern, for every value and key of every stack, against the secrets of every stack.
//
// The trie, its edges and failure links are an acauto.Automaton over the patterns' heads (their
// first matchPrefix bytes); the nodes are the heads' prefixes numbered in preorder, the root
// 0. Preorder is the patterns' sorted order, so the patterns that a node ends (the patterns
// whose first matchPrefix bytes are its prefix) are one run of pats, found with term and
// termLo.
type secretMatcher struct {
	ac     acauto.Automaton
	depth  []uint8 // the length of n's prefix
	ends   []uint8 // the kinds of the patterns n ends
	chain  []uint8 // the kinds of the patterns n or a node on its failure chain ends
	pats   []secretPattern
	term   []int32 // the nodes that end patterns, increasing
	termLo []int32 // term[i] ends pats[termLo[i]:termLo[i+1]]
}

// newSecretMatcher builds the matcher of pats; a text given more than once is one pattern of
// all its kinds.
func newSecretMatcher(pats []secretPattern) *secretMatcher {
	slices.SortFunc(pats, func(a, b secretPattern) int { return strings.Compare(a.text, b.text) })
	merged := pats[:0]
	for _, p := range pats {
		if p.text == "" {
			continue
		}
		if n := len(merged); n > 0 && merged[n-1].text == p.text {
			merged[n-1].kinds |= p.kinds
			continue
		}
		merged = append(merged, p)
	}
	pats = slices.Clip(merged)
	m := &secretMatcher{pats: pats}

	// The trie of the patterns' heads: the heads of sorted patterns are sorted, and patterns
	// with one head are next to each other and end at one node.
	heads := make([]string, len(pats))
	for i, p := range pats {
		heads[i] = p.text[:min(len(p.text), matchPrefix)]
	}
	shape := acauto.Build[uint8](&m.ac, heads)
	m.depth = shape.Depth
	nodes := m.ac.Nodes()
	m.ends = make([]uint8, nodes)
	for i, n := range shape.End {
		if len(m.term) == 0 || m.term[len(m.term)-1] != n {
			m.term = append(m.term, n)
			m.termLo = append(m.termLo, int32(i))
		}
		m.ends[n] |= pats[i].kinds
	}
	m.termLo = append(m.termLo, int32(len(pats)))
	// Breadth first: a node's failure target is shallower, so its chain is done first.
	m.chain = make([]uint8, nodes)
	for _, n := range shape.Order[1:] {
		m.chain[n] = m.ends[n] | m.chain[m.ac.Fail(n)]
	}
	return m
}

// ended returns the patterns that node n ends.
func (m *secretMatcher) ended(n int32) []secretPattern {
	i, found := slices.BinarySearch(m.term, n)
	if !found {
		return nil
	}
	return m.pats[m.termLo[i]:m.termLo[i+1]]
}

// equal reports whether v is a pattern of kind.
func (m *secretMatcher) equal(v string, kind uint8) bool {
	n := int32(0)
	for i := 0; i < len(v) && i < matchPrefix; i++ {
		if n = m.ac.Child(n, v[i]); n == 0 {
			return false
		}
	}
	if m.ends[n]&kind == 0 {
		return false
	}
	for _, p := range m.ended(n) {
		if p.kinds&kind != 0 && p.text == v {
			return true
		}
	}
	return false
}

// contains reports whether a pattern of kind occurs in v.
func (m *secretMatcher) contains(v string, kind uint8) bool {
	n := int32(0)
	for i := 0; i < len(v); i++ {
		n = m.ac.Step(n, v[i])
		if m.chain[n]&kind == 0 {
			continue
		}
		for t := n; t != 0; t = m.ac.Fail(t) {
			if m.ends[t]&kind != 0 && m.at(v, i+1-int(m.depth[t]), t, kind) {
				return true
			}
		}
	}
	return false
}

// at reports whether a pattern of kind among those node t ends starts at s in text.
func (m *secretMatcher) at(text string, s int, t int32, kind uint8) bool {
	rest := text[s:]
	for _, p := range m.ended(t) {
		if p.kinds&kind != 0 && strings.HasPrefix(rest, p.text) {
			return true
		}
	}
	return false
}

// next finds the leftmost place at or after from where a pattern of kind starts, and there the
// longest pattern of kind (as a strings.Replacer given the patterns longest first does); ok is
// false when there is none.
func (m *secretMatcher) next(text string, from int, kind uint8) (start, end int, ok bool) {
	best := -1
	n := int32(0)
	for i := from; i < len(text); i++ {
		n = m.ac.Step(n, text[i])
		if m.chain[n]&kind != 0 {
			// Deepest first: the starts only grow along the chain.
			for t := n; t != 0; t = m.ac.Fail(t) {
				if m.ends[t]&kind == 0 {
					continue
				}
				s := i + 1 - int(m.depth[t])
				if best >= 0 && s >= best {
					break
				}
				if m.at(text, s, t, kind) {
					best = s
				}
			}
		}
		// A pattern starting before i+1-depth would have a prefix longer than n's.
		if best >= 0 && i+1-int(m.depth[n]) >= best {
			break
		}
	}
	if best < 0 {
		return 0, 0, false
	}
	// Every pattern starting at best has its head on the trie path of text[best:].
	end = -1
	t := int32(0)
	for j := best; j < len(text) && j-best < matchPrefix; j++ {
		if t = m.ac.Child(t, text[j]); t == 0 {
			break
		}
		if m.ends[t]&kind == 0 {
			continue
		}
		for _, p := range m.ended(t) {
			if p.kinds&kind != 0 && best+len(p.text) > end && strings.HasPrefix(text[best:], p.text) {
				end = best + len(p.text)
			}
		}
	}
	return best, end, true
}

// replace masks the patterns of kind in text, left to right, each where it starts with the
// one next picks. It returns text itself when there is nothing to mask.
func (m *secretMatcher) replace(text string, kind uint8) string {
	var b strings.Builder
	pos := 0
	for {
		start, end, ok := m.next(text, pos, kind)
		if !ok {
			if pos == 0 {
				return text
			}
			b.WriteString(text[pos:])
			return b.String()
		}
		if pos == 0 {
			b.Grow(len(text))
		}
		b.WriteString(text[pos:start])
		b.WriteString(Masked)
		pos = end
	}
}
