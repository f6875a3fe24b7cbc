package plan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/tfstackplan/tfstackplan/internal/textfit"
)

// Display values for attributes that have no printable value.
const (
	Unknown = "(known after apply)"
	Null    = "null"
)

const (
	maxAttrs    = 30  // attribute differences kept per change
	maxValueLen = 200 // bytes of one displayed value
)

// leaf is one scalar (or empty collection) at a path: raw is compared with secrets, text is
// shown, and cmp (the whole value, typed) tells whether before and after differ. A whole
// collection shown as one value (a change of type, see typeChanges) has the raws of its
// scalars in parts instead of raw.
type leaf struct {
	raw, text, cmp string
	parts          []string
	elem           string // "removed" or "added" for a list element only one side holds
}

// diffValues returns the attribute-level differences between before and after, masking what
// beforeSens/afterSens flag and showing what afterUnknown flags as known after apply. root
// prefixes every path (an output's name; "" for a resource).
func diffValues(root string, before, after, afterUnknown, beforeSens, afterSens json.RawMessage) (diffs []AttrDiff, omitted int, err error) {
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
	unknownSet := make(map[string]struct{}, len(unknown))
	for _, u := range unknown {
		unknownSet[u] = struct{}{}
	}
	bl, al := flattenBoth(b, a, bs, as, root, func(p string) bool { return underAny(p, unknownSet) })

	// The paths of the leaves, sorted; then, merged in only when there are any, the unknown
	// paths that no leaf is at or under (Compact drops an unknown path flagged twice).
	sorted := make([]string, 0, len(bl)+len(al)+len(unknown))
	for p := range bl {
		sorted = append(sorted, p)
	}
	for p := range al {
		if _, ok := bl[p]; !ok {
			sorted = append(sorted, p)
		}
	}
	sort.Strings(sorted)
	leaves := sorted
	for _, u := range unknown {
		if !hasLeafUnder(leaves, u) {
			sorted = append(sorted, u) // after leaves, in the room made for them
		}
	}
	if len(sorted) > len(leaves) {
		sort.Strings(sorted)
		sorted = slices.Compact(sorted)
	}

	for _, p := range sorted {
		bv, hasB := bl[p]
		av, hasA := al[p]
		d, changed := attrDiff(p, bv, av, hasB, hasA, underAny(p, unknownSet))
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

// attrDiff is the difference at path p (a key of the leaves) between the leaf bv of before
// (hasB: there is one) and av of after (hasA), where isUnk says whether after is unknown
// there; changed is false when there is none.
func attrDiff(p string, bv, av leaf, hasB, hasA, isUnk bool) (d AttrDiff, changed bool) {
	if hasA && hasB && av.cmp == bv.cmp && !isUnk {
		return d, false
	}
	path, _, _ := strings.Cut(p, "\x00")
	d = AttrDiff{Path: path, Before: Null, After: Null}
	if hasB {
		d.Before, d.beforeRaw, d.beforeParts, d.Element = bv.text, bv.raw, bv.parts, bv.elem
	}
	switch {
	case hasA:
		d.After, d.afterRaw, d.afterParts = av.text, av.raw, av.parts
		if !hasB {
			d.Element = av.elem
		}
	case isUnk:
		d.After = Unknown
	}
	if hasA && hasB && strings.HasPrefix(bv.cmp, "s") && strings.HasPrefix(av.cmp, "s") {
		if strings.Contains(bv.raw, "\n") || strings.Contains(av.raw, "\n") {
			d.Lines = lineDiff(bv.raw, av.raw)
		}
		if d.Before == d.After {
			d.Before, d.After = cutAtChange(strconv.Quote(bv.raw), strconv.Quote(av.raw))
		}
	}
	return d, true
}

// flattenBoth returns the leaves of before and after (see flatten), paired as tofu shows a
// change (see pairLeaves); an after value that unknown says is unknown is left out (it shows
// as known after apply).
func flattenBoth(before, after, bMask, aMask any, root string, unknown func(string) bool) (bl, al map[string]leaf) {
	bl, al = map[string]leaf{}, map[string]leaf{}
	pairLeaves(before, after, bMask, aMask, root, true, unknown, bl, al)
	return bl, al
}

// pairLeaves adds the leaves of before to bl and those of after to al, at path: maps key by
// key, lists and sets element by element matched by value (pairLists), and where a value
// changes kind, or a collection is emptied or filled, the whole old and new values, as tofu
// shows them (not each element going to or coming from null). At the root (a whole resource or
// output) a value that is null on one side is a create or a delete, not a change of kind: its
// attributes are listed one by one. bMask and aMask are the sensitivity masks.
func pairLeaves(before, after, bMask, aMask any, path string, root bool, unknown func(string) bool, bl, al map[string]leaf) {
	if isTrue(bMask) || isTrue(aMask) {
		flatten(before, bMask, path, bl)
		flatten(after, aMask, path, al)
		return
	}
	switch b := before.(type) {
	case map[string]any:
		if a, ok := after.(map[string]any); ok && len(b) > 0 && len(a) > 0 {
			bm, _ := bMask.(map[string]any)
			am, _ := aMask.(map[string]any)
			for k, bv := range b {
				pairLeaves(bv, a[k], bm[k], am[k], joinKey(path, k), false, unknown, bl, al)
			}
			for k, av := range a {
				if _, ok := b[k]; !ok {
					pairLeaves(nil, av, nil, am[k], joinKey(path, k), false, unknown, bl, al)
				}
			}
			return
		}
	case []any:
		if a, ok := after.([]any); ok && len(b) > 0 && len(a) > 0 {
			pairLists(b, a, bMask, aMask, path, unknown, bl, al)
			return
		}
	}
	if (!root || (before != nil && after != nil)) && (nonEmptyCollection(before) || nonEmptyCollection(after)) {
		wholeAt(bl, path, before, bMask, "")
		if !unknown(path) {
			wholeAt(al, path, after, aMask, "")
		}
		return
	}
	flatten(before, bMask, path, bl)
	flatten(after, aMask, path, al)
}

// isTrue reports whether a sensitivity mask marks its whole value.
func isTrue(mask any) bool {
	m, ok := mask.(bool)
	return ok && m
}

// maxMatchCells bounds the table of a longest-common-subsequence match (of list elements or of
// lines): past it, the middle is shown removed and added whole.
const maxMatchCells = 1 << 20

// pairLists pairs the elements of two non-empty lists (or sets: the plan writes both as
// arrays): the elements both hold in order (a longest common subsequence) are compared in
// place, an element of before only is "removed" and one of after only "added", each shown
// whole under its own index (keyed by elemKey); between two matched elements, removed and
// added elements are paired in order and compared (a collection attribute by attribute), as
// an element that changed in place: ["v1"] to ["v2"] is "[0]: "v1" -> "v2"".
func pairLists(b, a []any, bMask, aMask any, path string, unknown func(string) bool, bl, al map[string]leaf) {
	bml, _ := bMask.([]any)
	aml, _ := aMask.([]any)
	bk, ak := make([]string, len(b)), make([]string, len(a))
	for i, v := range b {
		bk[i] = valueKey(v)
	}
	for j, v := range a {
		ak[j] = valueKey(v)
	}
	var removed, added []int
	flush := func() {
		n := 0
		for n < len(removed) && n < len(added) {
			j := added[n]
			pairLeaves(b[removed[n]], a[j], index(bml, removed[n]), index(aml, j), indexPath(path, j), false, unknown, bl, al)
			n++
		}
		for _, i := range removed[n:] {
			wholeAt(bl, indexPath(path, i), b[i], index(bml, i), "removed")
		}
		for _, j := range added[n:] {
			p := indexPath(path, j)
			if !unknown(p) {
				wholeAt(al, p, a[j], index(aml, j), "added")
			}
		}
		removed, added = removed[:0], added[:0]
	}
	for _, m := range matchSequences(bk, ak) {
		switch {
		case m.i < 0:
			added = append(added, m.j)
		case m.j < 0:
			removed = append(removed, m.i)
		default:
			flush()
			pairLeaves(b[m.i], a[m.j], index(bml, m.i), index(aml, m.j), indexPath(path, m.j), false, unknown, bl, al)
		}
	}
	flush()
}

// indexPath is the path of element i of the list at path.
func indexPath(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// valueKey is v's JSON (maps with sorted keys): equal values have equal keys.
func valueKey(v any) string {
	k, _ := json.Marshal(v)
	return string(k)
}

// seqMatch is one step of matchSequences: i and j both >= 0 for an element of both sequences,
// i < 0 for one of the second only, j < 0 for one of the first only.
type seqMatch struct{ i, j int }

// matchSequences aligns x and y on a longest common subsequence (after their common beginning
// and end), in order; a middle whose table would exceed maxMatchCells is all removed, then all
// added.
func matchSequences(x, y []string) []seqMatch {
	var out []seqMatch
	pre := 0
	for pre < len(x) && pre < len(y) && x[pre] == y[pre] {
		out = append(out, seqMatch{pre, pre})
		pre++
	}
	suf := 0
	for suf < len(x)-pre && suf < len(y)-pre && x[len(x)-1-suf] == y[len(y)-1-suf] {
		suf++
	}
	xm, ym := x[pre:len(x)-suf], y[pre:len(y)-suf]
	n, m := len(xm), len(ym)
	if n > 0 && m > 0 && n*m <= maxMatchCells {
		// lcs[i][j]: the length of the longest common subsequence of xm[i:] and ym[j:].
		lcs := make([][]int32, n+1)
		for i := range lcs {
			lcs[i] = make([]int32, m+1)
		}
		for i := n - 1; i >= 0; i-- {
			for j := m - 1; j >= 0; j-- {
				if xm[i] == ym[j] {
					lcs[i][j] = lcs[i+1][j+1] + 1
				} else {
					lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
				}
			}
		}
		i, j := 0, 0
		for i < n && j < m {
			switch {
			case xm[i] == ym[j]:
				out = append(out, seqMatch{pre + i, pre + j})
				i, j = i+1, j+1
			case lcs[i+1][j] >= lcs[i][j+1]:
				out = append(out, seqMatch{pre + i, -1})
				i++
			default:
				out = append(out, seqMatch{-1, pre + j})
				j++
			}
		}
		for ; i < n; i++ {
			out = append(out, seqMatch{pre + i, -1})
		}
		for ; j < m; j++ {
			out = append(out, seqMatch{-1, pre + j})
		}
	} else {
		for i := range n {
			out = append(out, seqMatch{pre + i, -1})
		}
		for j := range m {
			out = append(out, seqMatch{-1, pre + j})
		}
	}
	for k := range suf {
		out = append(out, seqMatch{len(x) - suf + k, len(y) - suf + k})
	}
	return out
}

// flatten adds the leaves of v under path to out; a leaf under a true mask shows as Masked.
// Null leaves are left out (they show as absent).
func flatten(v, mask any, path string, out map[string]leaf) {
	if isTrue(mask) {
		if v != nil {
			cmp, _ := json.Marshal(v)
			out[path] = leaf{text: Masked, cmp: string(cmp)}
		}
		return
	}
	switch t := v.(type) {
	case nil:
	case map[string]any:
		if len(t) == 0 {
			out[path] = leaf{text: "{}", cmp: "{}"}
			return
		}
		mm, _ := mask.(map[string]any)
		for k, e := range t {
			flatten(e, mm[k], joinKey(path, k), out)
		}
	case []any:
		if len(t) == 0 {
			out[path] = leaf{text: "[]", cmp: "[]"}
			return
		}
		ml, _ := mask.([]any)
		for i, e := range t {
			var sub any
			if i < len(ml) {
				sub = ml[i]
			}
			flatten(e, sub, path+"["+strconv.Itoa(i)+"]", out)
		}
	case string:
		out[path] = leaf{raw: t, text: truncate(strconv.Quote(t)), cmp: "s" + t}
	case json.Number:
		out[path] = leaf{raw: t.String(), text: truncate(t.String()), cmp: "n" + t.String()}
	case bool:
		out[path] = leaf{text: strconv.FormatBool(t), cmp: strconv.FormatBool(t)}
	}
}

// index is l[i], nil past its end.
func index(l []any, i int) any {
	if i < len(l) {
		return l[i]
	}
	return nil
}

func nonEmptyCollection(v any) bool {
	switch t := v.(type) {
	case map[string]any:
		return len(t) > 0
	case []any:
		return len(t) > 0
	}
	return false
}

// wholeAt sets the one leaf at path p of out showing v whole (masked where mask says; none
// when v is null), marked as element elem ("removed", "added" or "") and keyed by elemKey.
func wholeAt(out map[string]leaf, p string, v, mask any, elem string) {
	if v == nil {
		return
	}
	key := elemKey(p, elem)
	if !nonEmptyCollection(v) || isTrue(mask) {
		tmp := map[string]leaf{}
		flatten(v, mask, p, tmp)
		l := tmp[p]
		l.elem = elem
		out[key] = l
		return
	}
	var text strings.Builder
	var parts []string
	compact(&text, v, mask, &parts)
	cmp, _ := json.Marshal(v)
	out[key] = leaf{text: truncate(text.String()), cmp: "c" + string(cmp), parts: parts, elem: elem}
}

// elemKey is the key of the leaf at path p of a list element marked elem: a removed element's
// index is of the old list, which a kept or added element of the new list may have too, so
// removed and added elements are keyed apart, each after the kept one at their index and the
// removed one first.
func elemKey(p, elem string) string {
	switch elem {
	case "removed":
		return p + "\x00-"
	case "added":
		return p + "\x00~"
	}
	return p
}

// compact writes v on one line as tofu shows values: strings quoted, lists in brackets,
// objects as { key = value, ... } with sorted keys; what mask flags sensitive is Masked. The
// raw scalars are appended to parts, to be compared with the secrets.
func compact(b *strings.Builder, v, mask any, parts *[]string) {
	if m, ok := mask.(bool); ok && m {
		b.WriteString(Masked)
		return
	}
	switch t := v.(type) {
	case nil:
		b.WriteString(Null)
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		mm, _ := mask.(map[string]any)
		if len(keys) == 0 {
			b.WriteString("{}")
			return
		}
		b.WriteString("{")
		for i, k := range keys {
			if i > 0 {
				b.WriteString(",")
			}
			name := k
			if !isIdent(k) {
				name = strconv.Quote(k)
			}
			*parts = append(*parts, k)
			b.WriteString(" " + name + " = ")
			compact(b, t[k], mm[k], parts)
		}
		b.WriteString(" }")
	case []any:
		ml, _ := mask.([]any)
		b.WriteString("[")
		for i, e := range t {
			if i > 0 {
				b.WriteString(", ")
			}
			compact(b, e, index(ml, i), parts)
		}
		b.WriteString("]")
	case string:
		*parts = append(*parts, t)
		b.WriteString(strconv.Quote(t))
	case json.Number:
		*parts = append(*parts, t.String())
		b.WriteString(t.String())
	case bool:
		b.WriteString(strconv.FormatBool(t))
	}
}

// truePaths appends the paths where mask is true (after_unknown's shape).
func truePaths(mask any, path string, out *[]string) {
	switch m := mask.(type) {
	case bool:
		if m {
			*out = append(*out, path)
		}
	case map[string]any:
		for k, e := range m {
			truePaths(e, joinKey(path, k), out)
		}
	case []any:
		for i, e := range m {
			truePaths(e, path+"["+strconv.Itoa(i)+"]", out)
		}
	}
}

func joinKey(path, key string) string {
	if !isIdent(key) {
		return path + "[" + strconv.Quote(key) + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if r != '_' && r != '-' && !(r >= 'a' && r <= 'z') && !(r >= 'A' && r <= 'Z') && !(i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// underAny reports whether p is one of the paths of set or lies inside one ("" holds every
// path). It looks up the prefixes p can be under, not every path of the set: a change may flag
// thousands of paths unknown, and every path of the change is looked up.
func underAny(p string, set map[string]struct{}) bool {
	if len(set) == 0 {
		return false
	}
	if _, ok := set[""]; ok {
		return true
	}
	if _, ok := set[p]; ok {
		return true
	}
	for i := 1; i < len(p); i++ {
		if p[i] == '.' || p[i] == '[' {
			if _, ok := set[p[:i]]; ok {
				return true
			}
		}
	}
	return false
}

// hasLeafUnder reports whether one of the sorted leaf paths is prefix or lies inside it.
func hasLeafUnder(sorted []string, prefix string) bool {
	if prefix == "" {
		return len(sorted) > 0
	}
	if _, found := slices.BinarySearch(sorted, prefix); found {
		return true
	}
	// The paths inside prefix start with prefix and '.' or '[': each kind is one run of the
	// sorted paths, starting where that string would be.
	for _, sep := range []string{".", "["} {
		start := prefix + sep
		if i, _ := slices.BinarySearch(sorted, start); i < len(sorted) && strings.HasPrefix(sorted[i], start) {
			return true
		}
	}
	return false
}

// lineContext is how many unchanged lines a line diff shows around each changed one.
const lineContext = 2

// lineDiff is the diff of two multi-line strings, line by line (matched on a longest common
// subsequence, as tofu shows a changed heredoc): every removed and added line, lineContext
// unchanged lines around them, and a LineHidden entry for each run of unchanged lines left out.
// Each line is cut to maxValueLen bytes.
func lineDiff(before, after string) []LineDiff {
	x, y := strings.Split(before, "\n"), strings.Split(after, "\n")
	steps := matchSequences(x, y)
	// keep[k]: step k is a change, or within lineContext steps of one.
	keep := make([]bool, len(steps))
	for k, m := range steps {
		if m.i >= 0 && m.j >= 0 {
			continue
		}
		for c := max(0, k-lineContext); c <= min(len(steps)-1, k+lineContext); c++ {
			keep[c] = true
		}
	}
	var out []LineDiff
	hidden := 0
	for k, m := range steps {
		if !keep[k] {
			hidden++
			continue
		}
		if hidden > 0 {
			out = append(out, LineDiff{Op: LineHidden, Text: plural(hidden, "unchanged line", "unchanged lines")})
			hidden = 0
		}
		switch {
		case m.j < 0:
			out = append(out, LineDiff{Op: LineRemoved, Text: truncate(x[m.i])})
		case m.i < 0:
			out = append(out, LineDiff{Op: LineAdded, Text: truncate(y[m.j])})
		default:
			out = append(out, LineDiff{Op: LineSame, Text: truncate(y[m.j])})
		}
	}
	if hidden > 0 {
		out = append(out, LineDiff{Op: LineHidden, Text: plural(hidden, "unchanged line", "unchanged lines")})
	}
	return out
}

// cutAtChange shows two long values that differ past the cut of truncate (which would show the
// same beginning on both sides) from shortly before the first byte where they differ.
func cutAtChange(before, after string) (string, string) {
	k := 0
	for k < len(before) && k < len(after) && before[k] == after[k] {
		k++
	}
	start := max(0, k-maxValueLen/4)
	for start < k && !utf8.RuneStart(before[start]) {
		start++
	}
	from := func(v string) string {
		if start == 0 {
			return truncate(v)
		}
		return "…" + truncate(v[start:])
	}
	return from(before), from(after)
}

func truncate(s string) string {
	if len(s) <= maxValueLen {
		return s
	}
	return textfit.Prefix(s, maxValueLen) + "…"
}

// unmarshalNumber decodes raw as encoding/json's Decoder with UseNumber does (numbers as
// json.Number, so they print as written; objects as map[string]any, arrays as []any; see
// readAsV1), with json v2's reader, which reads each byte once.
func unmarshalNumber(raw json.RawMessage, v *any) error {
	x, err := readAny(jsontext.NewDecoder(bytes.NewReader(raw), readAsV1...))
	if err != nil {
		return err
	}
	*v = x
	return nil
}

// readAny reads the next value from dec.
func readAny(dec *jsontext.Decoder) (any, error) {
	tok, err := dec.ReadToken()
	if err != nil {
		return nil, err
	}
	switch tok.Kind() {
	case 'n':
		return nil, nil
	case 't':
		return true, nil
	case 'f':
		return false, nil
	case '"':
		return tok.String(), nil
	case '0':
		return json.Number(tok.String()), nil
	case '{':
		m := map[string]any{}
		err := eachMember(dec, func(name string) error {
			v, err := readAny(dec)
			m[name] = v
			return err
		})
		return m, err
	case '[':
		a := []any{}
		err := eachElement(dec, func() error {
			v, err := readAny(dec)
			a = append(a, v)
			return err
		})
		return a, err
	}
	return nil, fmt.Errorf("unexpected %s", tok)
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// maybeTrue reports whether a sensitivity mask may mark something sensitive: it contains true.
func maybeTrue(mask json.RawMessage) bool {
	return bytes.Contains(mask, []byte("true"))
}
