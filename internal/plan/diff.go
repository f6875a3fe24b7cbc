package plan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

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
		isUnk := underAny(p, unknownSet)
		if hasA && hasB && av.cmp == bv.cmp && !isUnk {
			continue
		}
		d := AttrDiff{Path: p, Before: Null, After: Null}
		if hasB {
			d.Before, d.beforeRaw, d.beforeParts = bv.text, bv.raw, bv.parts
		}
		switch {
		case hasA:
			d.After, d.afterRaw, d.afterParts = av.text, av.raw, av.parts
		case isUnk:
			d.After = Unknown
		}
		if len(diffs) == maxAttrs {
			omitted++
			continue
		}
		diffs = append(diffs, d)
	}
	return diffs, omitted, nil
}

// flattenBoth returns the leaves of before and after (see flatten), where a value changes kind
// (see typeChanges) one leaf with the whole value on each side instead of its elements; an after
// value that unknown says is unknown is left out (it shows as known after apply).
func flattenBoth(before, after, bMask, aMask any, root string, unknown func(string) bool) (bl, al map[string]leaf) {
	bl, al = map[string]leaf{}, map[string]leaf{}
	flatten(before, bMask, root, bl)
	flatten(after, aMask, root, al)
	var changed []typeChange
	typeChanges(before, after, bMask, aMask, root, true, &changed)
	for _, tc := range changed {
		wholeAt(bl, tc.path, tc.before, tc.bMask)
		if unknown(tc.path) {
			wholeAt(al, tc.path, nil, nil)
		} else {
			wholeAt(al, tc.path, tc.after, tc.aMask)
		}
	}
	return bl, al
}

// flatten adds the leaves of v under path to out; a leaf under a true mask shows as Masked.
// Null leaves are left out (they show as absent).
func flatten(v, mask any, path string, out map[string]leaf) {
	if m, ok := mask.(bool); ok && m {
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

// typeChange is a path where a value changes kind (see typeChanges), with the values and
// sensitivity masks there.
type typeChange struct {
	path                        string
	before, after, bMask, aMask any
}

// typeChanges appends the paths where before and after are of different kinds and one of them
// is a non-empty collection: a list or an object that becomes a string or null, a string that
// becomes an object, a list that becomes an object. There the diff shows the whole old and new
// values, as tofu does, not each element going to or coming from null. At the root (a whole
// resource or output) a value that is null on one side is a create or a delete, not a change
// of type: its attributes are listed one by one. bMask and aMask are the sensitivity masks.
func typeChanges(before, after, bMask, aMask any, path string, root bool, out *[]typeChange) {
	switch b := before.(type) {
	case map[string]any:
		if a, ok := after.(map[string]any); ok {
			bm, _ := bMask.(map[string]any)
			am, _ := aMask.(map[string]any)
			for k, bv := range b {
				typeChanges(bv, a[k], maskAt(bMask, bm[k]), maskAt(aMask, am[k]), joinKey(path, k), false, out)
			}
			for k, av := range a {
				if _, ok := b[k]; !ok {
					typeChanges(nil, av, nil, maskAt(aMask, am[k]), joinKey(path, k), false, out)
				}
			}
			return
		}
	case []any:
		if a, ok := after.([]any); ok {
			bl, _ := bMask.([]any)
			al, _ := aMask.([]any)
			for i := range max(len(a), len(b)) {
				typeChanges(index(b, i), index(a, i), maskAt(bMask, index(bl, i)), maskAt(aMask, index(al, i)),
					path+"["+strconv.Itoa(i)+"]", false, out)
			}
			return
		}
	}
	if root && (before == nil || after == nil) {
		return
	}
	if nonEmptyCollection(before) || nonEmptyCollection(after) {
		*out = append(*out, typeChange{path, before, after, bMask, aMask})
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

// wholeAt replaces the leaves of out at or under path p with one leaf showing v, the whole
// value at p (masked where mask says); with none when v is null. A scalar or an empty
// collection is already the one leaf at p.
func wholeAt(out map[string]leaf, p string, v, mask any) {
	if v != nil && !nonEmptyCollection(v) {
		return
	}
	for k := range out {
		if k == p || strings.HasPrefix(k, p+".") || strings.HasPrefix(k, p+"[") {
			delete(out, k)
		}
	}
	if v == nil {
		return
	}
	var text strings.Builder
	var parts []string
	compact(&text, v, mask, &parts)
	cmp, _ := json.Marshal(v)
	out[p] = leaf{text: truncate(text.String()), cmp: "c" + string(cmp), parts: parts}
}

// maskAt is the mask of an element: the element's own, or true when the whole parent is.
func maskAt(parent, own any) any {
	if m, ok := parent.(bool); ok && m {
		return true
	}
	return own
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
