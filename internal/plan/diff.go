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
// shown, and cmp (the whole value, typed) tells whether before and after differ.
type leaf struct{ raw, text, cmp string }

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
	bl, al := map[string]leaf{}, map[string]leaf{}
	flatten(b, bs, root, bl)
	flatten(a, as, root, al)
	var unknown []string
	truePaths(unk, root, &unknown)
	unknownSet := make(map[string]struct{}, len(unknown))
	for _, u := range unknown {
		unknownSet[u] = struct{}{}
	}

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
			d.Before, d.beforeRaw = bv.text, bv.raw
		}
		switch {
		case hasA:
			d.After, d.afterRaw = av.text, av.raw
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
