package plan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
)

// TestDiffAfterUnknownCountsInTheSizeBound: after_unknown is part of what a diff reads (every
// one of its paths is a path of the diff), so an attribute whose after_unknown alone is larger
// than maxDetailBytes is not diffed, like one whose values are too large: a resource change
// shows its other attributes and counts that one as not shown, with its size; an output (one
// value) gets no diff, and its size.
func TestDiffAfterUnknownCountsInTheSizeBound(t *testing.T) {
	small, large := string(benchUnknownJSON(10)), string(benchUnknownJSON(maxDetailBytes/5+1))
	for _, tc := range []struct {
		unknown string
		detail  bool
	}{{small, true}, {large, false}} {
		p := fmt.Sprintf(`{"format_version":"1.2","planned_values":{},
		  "resource_changes":[{"address":"x.a","change":{"actions":["create"],"before":null,"after":{"a":1},"after_unknown":%s}}],
		  "output_changes":{"o":{"actions":["create"],"before":null,"after":{"a":1},"after_unknown":%s}}}`, tc.unknown, tc.unknown)
		s, err := Classify("unknown", "plan.json", strings.NewReader(p))
		if err != nil {
			t.Fatal(err)
		}
		c := s.Changes[0]
		var paths []string
		for _, a := range c.Attributes {
			paths = append(paths, a.Path)
		}
		listed := slices.ContainsFunc(paths, func(p string) bool { return strings.HasPrefix(p, "list") })
		if listed != tc.detail || !slices.Contains(paths, "a") {
			t.Errorf("after_unknown of %d bytes: resource diff paths %q, want a and the list's only when small", len(tc.unknown), paths)
		}
		if wantOmitted := !tc.detail; (c.AttributesOmitted == 1 && c.AttributesOmittedBytes == int64(len(tc.unknown)-len(`{"list":}`))) != wantOmitted {
			t.Errorf("after_unknown of %d bytes: %d attributes omitted, %d bytes", len(tc.unknown), c.AttributesOmitted, c.AttributesOmittedBytes)
		}
		if got := len(s.Outputs[0].Attributes) > 0; got != tc.detail {
			t.Errorf("after_unknown of %d bytes: output diff shown %v, want %v", len(tc.unknown), got, tc.detail)
		}
		if got := s.Outputs[0].ValueOmittedBytes; (got == int64(len(tc.unknown))) == tc.detail {
			t.Errorf("after_unknown of %d bytes: output value omitted %d bytes", len(tc.unknown), got)
		}
	}
}

// TestDiffValuesMatchesScanningLookups holds diffValues to the lookups it had before they were
// made O(depth): every unknown path compared with every path, every leaf with every unknown
// path. Keys include separators ('.', '[') and ones that must be quoted, so that prefixes
// inside quoted keys are tried too.
func TestDiffValuesMatchesScanningLookups(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	keys := []string{"a", "b", "a.b", "a[0]", "x", "", "a_1", "[", ".", `q"`}
	var value func(depth int) any
	value = func(depth int) any {
		switch n := rng.IntN(10); {
		case depth > 3 || n < 3:
			return []any{"s", json.Number("1"), true, nil, ""}[rng.IntN(5)]
		case n < 7:
			m := map[string]any{}
			for range rng.IntN(4) {
				m[keys[rng.IntN(len(keys))]] = value(depth + 1)
			}
			return m
		default:
			l := []any{}
			for range rng.IntN(4) {
				l = append(l, value(depth+1))
			}
			return l
		}
	}
	var mask func(depth int) any
	mask = func(depth int) any {
		switch n := rng.IntN(10); {
		case depth > 3 || n < 4:
			return n%2 == 0
		case n < 7:
			m := map[string]any{}
			for range rng.IntN(4) {
				m[keys[rng.IntN(len(keys))]] = mask(depth + 1)
			}
			return m
		default:
			l := []any{}
			for range rng.IntN(4) {
				l = append(l, mask(depth+1))
			}
			return l
		}
	}
	encode := func(v any) json.RawMessage {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for i := range 3000 {
		root := ""
		if i%3 == 0 {
			root = "out"
		}
		before, after, unknown := encode(value(0)), encode(value(0)), encode(mask(0))
		bs, as := encode(mask(0)), encode(mask(0))
		got, gotOmitted, err := diffValues(root, before, after, unknown, bs, as)
		if err != nil {
			t.Fatal(err)
		}
		want, wantOmitted, err := scanningDiffValues(root, before, after, unknown, bs, as)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) || gotOmitted != wantOmitted {
			t.Fatalf("before %s after %s after_unknown %s:\n got %+v (%d omitted)\nwant %+v (%d omitted)",
				before, after, unknown, got, gotOmitted, want, wantOmitted)
		}
	}
}

// under reports whether path p is prefix itself or lies inside it.
func under(p, prefix string) bool {
	if prefix == "" || p == prefix {
		return true
	}
	return strings.HasPrefix(p, prefix) && (p[len(prefix)] == '.' || p[len(prefix)] == '[')
}

// scanningDiffValues is diffValues as it was before its lookups were made O(depth).
func scanningDiffValues(root string, before, after, afterUnknown, beforeSens, afterSens json.RawMessage) (diffs []AttrDiff, omitted int, err error) {
	var b, a, unk, bs, as any
	for _, d := range []struct {
		raw json.RawMessage
		dst *any
	}{{before, &b}, {after, &a}, {afterUnknown, &unk}, {beforeSens, &bs}, {afterSens, &as}} {
		if !isNull(d.raw) {
			if err := unmarshalNumber(d.raw, d.dst); err != nil {
				return nil, 0, err
			}
		}
	}
	var unknown []string
	truePaths(unk, root, &unknown)
	underAny := func(p string) bool {
		for _, u := range unknown {
			if under(p, u) {
				return true
			}
		}
		return false
	}
	bl, al := flattenBoth(b, a, bs, as, root, underAny)
	hasLeafUnder := func(leaves map[string]leaf, prefix string) bool {
		for p := range leaves {
			if under(p, prefix) {
				return true
			}
		}
		return false
	}
	paths := map[string]bool{}
	for p := range bl {
		paths[p] = true
	}
	for p := range al {
		paths[p] = true
	}
	for _, u := range unknown {
		if !hasLeafUnder(bl, u) && !hasLeafUnder(al, u) {
			paths[u] = true
		}
	}
	var sorted []string
	for p := range paths {
		sorted = append(sorted, p)
	}
	sort.Strings(sorted)
	for _, p := range sorted {
		bv, hasB := bl[p]
		av, hasA := al[p]
		d, changed := attrDiff(p, bv, av, hasB, hasA, underAny(p))
		if !changed {
			continue
		}
		if len(diffs) == maxAttrs {
			omitted++
			continue
		}
		diffs = append(diffs, d)
	}
	return diffs, omitted, nil
}

// FuzzUnmarshalNumber holds unmarshalNumber to what encoding/json's Decoder with UseNumber
// reads, which the rendered values and the collected secrets relied on before it moved to
// json v2's reader: the same value, or an error from both.
func FuzzUnmarshalNumber(f *testing.F) {
	for _, s := range []string{
		`null`, `true`, `[]`, `{}`, `1.50`, `-0`, `1e400`, `12345678901234567890123`,
		`{"a":1,"a":[true,null,"x"],"b":{"c":{}}}`, `["\u0041\ud83d\ude00", "\ud800", "\udc00x"]`,
		"\"\xff\xfe\xc3\"", "{\"\xe2\x82\":\"\xf0\x9f\x98\"}", `{"a":1} trailing`, `{"a":}`, `[1,]`, ``, ` 7 `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var got, want any
		gerr := unmarshalNumber(data, &got)
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		werr := dec.Decode(&want)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("%q: error %v, encoding/json's %v", data, gerr, werr)
		}
		if gerr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: %#v, encoding/json reads %#v", data, got, want)
		}
	})
}

// TestMatchSequencesIsALongestCommonSubsequence: on random short sequences, matchSequences
// visits every element of both once, in order, matches only equal elements, and matches as
// many as the longest common subsequence found by trying every subsequence of the first; past
// maxMatchCells it matches only the common beginning and end.
func TestMatchSequencesIsALongestCommonSubsequence(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 38))
	seq := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = string(rune('a' + rng.IntN(3)))
		}
		return out
	}
	isSubsequence := func(sub, of []string) bool {
		j := 0
		for _, v := range of {
			if j < len(sub) && sub[j] == v {
				j++
			}
		}
		return j == len(sub)
	}
	for range 2000 {
		x, y := seq(rng.IntN(9)), seq(rng.IntN(9))
		steps := matchSequences(x, y)
		i, j, matched := 0, 0, 0
		for _, m := range steps {
			switch {
			case m.i >= 0 && m.j >= 0:
				if m.i != i || m.j != j || x[m.i] != y[m.j] {
					t.Fatalf("%q %q: step %+v at %d, %d", x, y, m, i, j)
				}
				i, j, matched = i+1, j+1, matched+1
			case m.i >= 0:
				if m.i != i {
					t.Fatalf("%q %q: step %+v at %d, %d", x, y, m, i, j)
				}
				i++
			default:
				if m.j != j {
					t.Fatalf("%q %q: step %+v at %d, %d", x, y, m, i, j)
				}
				j++
			}
		}
		if i != len(x) || j != len(y) {
			t.Fatalf("%q %q: steps end at %d, %d", x, y, i, j)
		}
		best := 0
		for mask := range 1 << len(x) {
			var sub []string
			for k := range x {
				if mask&(1<<k) != 0 {
					sub = append(sub, x[k])
				}
			}
			if len(sub) > best && isSubsequence(sub, y) {
				best = len(sub)
			}
		}
		if matched != best {
			t.Fatalf("%q %q: %d matched, the longest common subsequence has %d", x, y, matched, best)
		}
	}
	// Too large to match: the middle is removed, then added.
	n := 1100
	x, y := make([]string, n), make([]string, n)
	for k := range n {
		x[k], y[k] = fmt.Sprint("x", k), fmt.Sprint("y", k)
	}
	x[0], y[0] = "same", "same"
	steps := matchSequences(x, y)
	if len(steps) != 2*n-1 || steps[0] != (seqMatch{0, 0}) || steps[1] != (seqMatch{1, -1}) || steps[n] != (seqMatch{-1, 1}) {
		t.Fatalf("a middle past maxMatchCells: %d steps, first %+v", len(steps), steps[:3])
	}
}
