package acauto

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// prefixes returns the distinct prefixes of keys (the empty one included), sorted: what the
// nodes of their trie must be, in preorder.
func prefixes(keys []string) []string {
	set := map[string]bool{"": true}
	for _, k := range keys {
		for i := 1; i <= len(k); i++ {
			set[k[:i]] = true
		}
	}
	var out []string
	for p := range set {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// check tests everything Build and the Automaton tell about keys (sorted) against what it must
// be by definition, and Step over text against a naive search.
func check(t *testing.T, keys []string, text string) {
	t.Helper()
	var a Automaton
	shape := Build[uint16](&a, keys)
	want := prefixes(keys)
	if a.Nodes() != len(want) {
		t.Fatalf("keys %q: %d nodes, want %d", keys, a.Nodes(), len(want))
	}
	// Preorder: node n is the nth prefix in sorted order.
	node := map[string]int32{}
	for n, p := range want {
		node[p] = int32(n)
	}
	if len(shape.Depth) != len(want) {
		t.Fatalf("keys %q: %d depths, want %d", keys, len(shape.Depth), len(want))
	}
	isPrefix := func(s string) bool { _, ok := node[s]; return ok }
	for n, p := range want {
		n := int32(n)
		if int(shape.Depth[n]) != len(p) {
			t.Fatalf("keys %q: depth of %q (node %d) %d", keys, p, n, shape.Depth[n])
		}
		for b := range 256 {
			c := node[p+string([]byte{byte(b)})] // 0 when it is not a node
			if got := a.Child(n, byte(b)); got != c {
				t.Fatalf("keys %q: Child(%q, %q) = %d, want %d", keys, p, byte(b), got, c)
			}
		}
		hasChildren := false
		for _, q := range want {
			hasChildren = hasChildren || (len(q) > len(p) && strings.HasPrefix(q, p))
		}
		if a.HasChildren(n) != hasChildren {
			t.Fatalf("keys %q: HasChildren(%q) = %v", keys, p, !hasChildren)
		}
		// The failure target: the longest proper suffix that is a node.
		f := ""
		for i := 1; i < len(p); i++ {
			if isPrefix(p[i:]) {
				f = p[i:]
				break
			}
		}
		if got := a.Fail(n); got != node[f] {
			t.Fatalf("keys %q: Fail(%q) = %q, want %q", keys, p, want[got], f)
		}
	}
	if len(shape.End) != len(keys) {
		t.Fatalf("keys %q: %d ends", keys, len(shape.End))
	}
	for i, k := range keys {
		if shape.End[i] != node[k] {
			t.Fatalf("keys %q: End[%d] = %d, want %d (%q)", keys, i, shape.End[i], node[k], k)
		}
	}
	// Order: every node once, by depth, each after its parent and its failure target.
	if len(shape.Order) != len(want) || shape.Order[0] != 0 {
		t.Fatalf("keys %q: order %v", keys, shape.Order)
	}
	pos := make([]int, len(want))
	for i := range pos {
		pos[i] = -1
	}
	for i, n := range shape.Order {
		if pos[n] >= 0 {
			t.Fatalf("keys %q: node %d twice in order %v", keys, n, shape.Order)
		}
		pos[n] = i
		if i > 0 && shape.Depth[n] < shape.Depth[shape.Order[i-1]] {
			t.Fatalf("keys %q: order %v is not breadth first", keys, shape.Order)
		}
	}
	for n, p := range want[1:] {
		n := int32(n + 1)
		if pos[node[p[:len(p)-1]]] >= pos[n] || pos[a.Fail(n)] >= pos[n] {
			t.Fatalf("keys %q: order %v puts %q before its parent or failure target", keys, shape.Order, p)
		}
	}
	// Step: after text[:i+1], the node of the longest suffix of it that is a node; the keys on
	// its failure chain are the keys that end there.
	n := int32(0)
	for i := range len(text) {
		n = a.Step(n, text[i])
		w := ""
		for s := 0; s <= i; s++ {
			if isPrefix(text[s : i+1]) {
				w = text[s : i+1]
				break
			}
		}
		if n != node[w] {
			t.Fatalf("keys %q, text %q: after %d bytes at %q, want %q", keys, text, i+1, want[n], w)
		}
		var got, wantEnds []string
		for m := n; m != 0; m = a.Fail(m) {
			if _, found := slices.BinarySearch(shape.End, m); found {
				got = append(got, want[m])
			}
		}
		for s := 0; s <= i; s++ { // the longest first, as the chain goes
			if _, found := slices.BinarySearch(keys, text[s:i+1]); found {
				wantEnds = append(wantEnds, text[s:i+1])
			}
		}
		if !slices.Equal(got, wantEnds) {
			t.Fatalf("keys %q, text %q: keys ending after %d bytes %q, want %q", keys, text, i+1, got, wantEnds)
		}
	}
}

func randomKeys(r *rand.Rand, alphabet string, count, maxLen int) []string {
	keys := make([]string, count)
	for i := range keys {
		b := make([]byte, 1+r.IntN(maxLen))
		for j := range b {
			b[j] = alphabet[r.IntN(len(alphabet))]
		}
		keys[i] = string(b)
	}
	slices.Sort(keys)
	return keys
}

func TestBuildAgainstNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 400 {
		// A small alphabet for deep failure chains; a large one for nodes of more than eight
		// children (the binary search).
		alphabet := "ab"
		switch iter % 3 {
		case 1:
			alphabet = "abcd"
		case 2:
			alphabet = "abcdefghijklmnopqrstuvwxyz\x00\xff"
		}
		keys := randomKeys(r, alphabet, 1+r.IntN(40), 1+r.IntN(8))
		if iter%3 == 2 {
			// Under two first bytes: nodes below the root with many children.
			for i := range keys {
				keys[i] = alphabet[i%2:i%2+1] + keys[i]
			}
			slices.Sort(keys)
		}
		if iter%4 == 0 {
			keys = slices.Compact(keys)
		}
		text := randomKeys(r, alphabet, 1, 200)[0]
		check(t, keys, text)
	}
}

func TestBuildEmpty(t *testing.T) {
	check(t, nil, "abc")
	check(t, []string{}, "")
	var a Automaton
	shape := Build[uint16](&a, [][]byte(nil))
	if a.Nodes() != 1 || len(shape.End) != 0 || !slices.Equal(shape.Order, []int32{0}) || !slices.Equal(shape.Depth, []uint16{0}) {
		t.Fatalf("empty set: %d nodes, shape %+v", a.Nodes(), shape)
	}
	for b := range 256 {
		if a.Step(0, byte(b)) != 0 || a.Child(0, byte(b)) != 0 {
			t.Fatalf("empty set: a step on %q leaves the root", byte(b))
		}
	}
	if a.Fail(0) != 0 || a.HasChildren(0) {
		t.Fatal("empty set: the root has a failure target or children")
	}
}

func TestBuildEqualAndEmptyKeys(t *testing.T) {
	keys := []string{"", "", "ab", "ab", "abc", "b", "b"}
	check(t, keys, "xabcbab")
	var a Automaton
	shape := Build[uint16](&a, keys)
	if !slices.Equal(shape.End, []int32{0, 0, 2, 2, 3, 4, 4}) {
		t.Fatalf("ends %v", shape.End)
	}
}

func TestBuildFailureLinks(t *testing.T) {
	// The classic example: he, she, his, hers.
	keys := []string{"he", "hers", "his", "she"}
	check(t, keys, "ushershishe")
	var a Automaton
	Build[uint16](&a, keys)
	walk := func(s string) int32 {
		n := int32(0)
		for i := range len(s) {
			if n = a.Child(n, s[i]); n == 0 {
				t.Fatalf("%q is not a node", s)
			}
		}
		return n
	}
	for _, c := range [][2]string{{"she", "he"}, {"sh", "h"}, {"hers", "s"}, {"his", "s"}, {"her", ""}, {"h", ""}} {
		want := int32(0)
		if c[1] != "" {
			want = walk(c[1])
		}
		if got := a.Fail(walk(c[0])); got != want {
			t.Errorf("Fail(%q) = %d, want %d (%q)", c[0], got, want, c[1])
		}
	}
}

func TestBuildReplaces(t *testing.T) {
	var a Automaton
	Build[uint16](&a, []string{"x", "y"})
	Build[uint16](&a, []string{"ab"})
	if a.Child(0, 'x') != 0 || a.Child(0, 'y') != 0 || a.Nodes() != 3 {
		t.Fatal("a second Build kept the first one's root")
	}
}

func TestBuildBytesAsStrings(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		keys := slices.Compact(randomKeys(r, "abc\x00", 30, 6))
		var bkeys [][]byte
		for _, k := range keys {
			bkeys = append(bkeys, []byte(k))
		}
		var s, b Automaton
		ss, bs := Build[uint16](&s, keys), Build[uint16](&b, bkeys)
		if !slices.Equal(ss.End, bs.End) || !slices.Equal(ss.Depth, bs.Depth) || !slices.Equal(ss.Order, bs.Order) ||
			s.root != b.root || !slices.Equal(s.edgeLo, b.edgeLo) || !bytes.Equal(s.edgeB, b.edgeB) ||
			!slices.Equal(s.edgeTo, b.edgeTo) || !slices.Equal(s.fail, b.fail) {
			t.Fatalf("keys %q: strings and bytes make different automata", keys)
		}
	}
}

func TestBuildPanics(t *testing.T) {
	for name, keys := range map[string][]string{
		"unsorted":     {"b", "a"},
		"unsorted-sub": {"ab", "a"},
		"unsorted-mid": {"a", "ac", "ab"},
		"too long":     {strings.Repeat("x", 1<<16)},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatalf("Build(%.20q) did not panic", keys)
				}
			}()
			var a Automaton
			Build[uint16](&a, keys)
		})
	}
	var a Automaton
	Build[uint16](&a, []string{strings.Repeat("x", 1<<16-1)}) // the longest key is taken
	Build[uint8](&a, []string{strings.Repeat("x", 255)})
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Build[uint8] of a key of 256 bytes did not panic")
			}
		}()
		Build[uint8](&a, []string{strings.Repeat("x", 256)})
	}()
}

// Depths of one type or the other describe the same automaton.
func TestBuildDepthTypes(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 50 {
		keys := randomKeys(r, "abc", 30, 10)
		var a, b Automaton
		wide, narrow := Build[uint16](&a, keys), Build[uint8](&b, keys)
		if len(wide.Depth) != len(narrow.Depth) || !slices.Equal(wide.End, narrow.End) || !slices.Equal(wide.Order, narrow.Order) {
			t.Fatalf("keys %q: uint8 and uint16 depths make different shapes", keys)
		}
		for n := range wide.Depth {
			if uint16(narrow.Depth[n]) != wide.Depth[n] {
				t.Fatalf("keys %q: depth of node %d: %d and %d", keys, n, narrow.Depth[n], wide.Depth[n])
			}
		}
	}
}

// FuzzBuild: keys are the lines of the first input, sorted; the second is the text.
func FuzzBuild(f *testing.F) {
	f.Add("he\nshe\nhis\nhers", "ushers")
	f.Add("a\naa\naaa", "aaaa")
	f.Add("", "x")
	f.Fuzz(func(t *testing.T, lines, text string) {
		if len(lines) > 200 || len(text) > 200 {
			return
		}
		keys := strings.Split(lines, "\n")
		slices.Sort(keys)
		check(t, keys, text)
	})
}
