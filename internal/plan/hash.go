package plan

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/big"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// PlanHashVersion is the version of the plan hash (Stack.PlanHash). A plan hash is the string
// PlanHashVersion + ":" + 64 lowercase hex digits of a SHA-256, e.g. "v1:3f0c…"; its exact
// definition below is fixed for the version, any change to it gets a new version.
//
// The plan hash identifies the content of a plan's change set and nothing else: two plans
// (the output of `tofu show -json PLANFILE`, or terraform's) get the same hash when they
// propose the same changes, and (barring SHA-256 collisions) different hashes otherwise. It is
// what the control plane compares between the plan that was approved and the plan made at
// apply time. A plan with no changes gets the hash of the empty change set; a plan that cannot
// be classified gets no hash ("").
//
// Covered, and only this:
//
//   - resource_changes: every entry except a plain no-op (actions exactly ["no-op"] and no
//     importing; a no-op that imports is covered). Per entry: address, previous_address (the
//     address it is moved from, "" when absent), deposed (the deposed object's key, "" when
//     absent), and of its change: actions (in their order), before, after, after_unknown,
//     before_sensitive, after_sensitive and importing (the whole object: id, identity,
//     unknown; null when absent).
//   - output_changes: every output except no-ops. Per output: its name, and of its change:
//     actions, before, after, after_unknown, before_sensitive, after_sensitive.
//   - resource_drift: every entry except a plain no-op, as for resource_changes. Per entry:
//     address, and of its change: actions, before, after.
//
// Every covered entry counts, however many there are (the listing limits MaxChanges,
// MaxDetailed and MaxDestructive do not apply). Sensitive values are covered like any other
// value (hashed, never shown). Everything else is ignored: the stack name and file path,
// format_version, terraform_version, timestamp, variables, planned_values, prior_state,
// configuration, relevant_attributes, checks, deferred changes and the other top-level fields;
// plain no-op resource changes, no-op outputs and no-op drift; and, within an entry,
// action_reason and replace_paths (they explain a change, they are not part of it), mode,
// type, name, index and module_address (the address holds them), provider_name and
// generated_config (configuration). The hash is also independent of the order of the entries
// of each section, of the order of the keys of every object at any depth, of whitespace, of
// how strings are escaped ("A" and "\u0041" are the same string) and of how numbers are
// spelled (1, 1.0, 1e0 and 10E-1 are the same number; numbers are compared exactly, never
// through float64: 1 and 1.0000000000000000001 differ). A missing value (before, after, ...)
// counts as null. An object key that appears twice counts once, with its last value, as
// encoding/json reads it. Strings are read as encoding/json reads them: invalid UTF-8 and
// unpaired surrogates become U+FFFD.
//
// Encoding (v1). Each covered entry becomes a record: a JSON object of the fields above, whose
// values are canonical JSON: no whitespace; object keys sorted bytewise by their canonical
// escaped text (between the quotes); strings in UTF-8 with only `"` and `\` (as \" and \\) and
// the control characters below U+0020 (\b \f \n \r \t, the others as \u00xx, lowercase hex)
// escaped; numbers in the canonical form below. The record keys are, in this order: actions,
// address, after, after_sensitive, after_unknown, before, before_sensitive, deposed,
// importing, previous_address for a resource change; actions, after, after_sensitive,
// after_unknown, before, before_sensitive, name for an output change; actions, address, after,
// before for drift. A record's digest is the SHA-256 of its bytes. The hash is the SHA-256 of
// "tfstackplan-plan-hash/v1\n" followed, for resource_changes, output_changes and
// resource_drift in this order, by the section name, a space, its number of records in
// decimal, "\n" and the 32-byte digests of its records sorted bytewise (a record that appears
// twice counts twice).
//
// Canonical numbers: zero (0, -0, 0.0e5, ...) is "0". Any other number is written as an
// optional "-", then, with d its significant digits (no leading or trailing zero) and e the
// exponent such that its absolute value is d × 10^e:
//
//   - d followed by e zeros when e = 0, or when e > 0 and len(d)+e ≤ 21 ("12", "100", and any
//     integer that does not end in 0);
//   - d with a decimal point inserted when -len(d) < e < 0 ("1.5", "12.25");
//   - "0." followed by -e-len(d) zeros then d when -len(d)-6 < e ≤ -len(d) ("0.5", "0.00125");
//   - otherwise d, "e" and e in decimal ("1e22", "15e-9", "123e-20").
const PlanHashVersion = "v1"

// planHashDomain starts the hashed bytes of a PlanHashVersion hash.
const planHashDomain = "tfstackplan-plan-hash/v1\n"

// planHashSections are the hashed sections, in hash order.
var planHashSections = [...]string{"resource_changes", "output_changes", "resource_drift"}

const (
	sectionResources = iota
	sectionOutputs
	sectionDrift
)

// planHasher computes the plan hash during the classifier's pass: it keeps one 32-byte digest
// per covered entry, never the entries.
type planHasher struct {
	digests [len(planHashSections)][][sha256.Size]byte
	rec     []byte // the record being built, reused
	canon   canonicalizer
}

func newPlanHasher() *planHasher { return &planHasher{} }

// resourceChange adds a covered resource_changes entry.
func (p *planHasher) resourceChange(rc *rawResourceChange) error {
	ch := &rc.Change
	b := append(p.rec[:0], `{"actions":`...)
	b = appendActions(b, ch.Actions)
	b = append(b, `,"address":`...)
	b = appendCanonicalString(b, rc.Address)
	b, err := p.changeValues(b, ch)
	if err != nil {
		return err
	}
	b = append(b, `,"deposed":`...)
	b = appendCanonicalString(b, rc.DeposedKey)
	b = append(b, `,"importing":`...)
	if b, err = p.canon.appendValue(b, ch.Importing); err != nil {
		return err
	}
	b = append(b, `,"previous_address":`...)
	b = appendCanonicalString(b, rc.PreviousAddress)
	p.add(sectionResources, append(b, '}'))
	return nil
}

// outputChange adds a covered output_changes entry.
func (p *planHasher) outputChange(name string, ch *rawChange) error {
	b := append(p.rec[:0], `{"actions":`...)
	b = appendActions(b, ch.Actions)
	b, err := p.changeValues(b, ch)
	if err != nil {
		return err
	}
	b = append(b, `,"name":`...)
	b = appendCanonicalString(b, name)
	p.add(sectionOutputs, append(b, '}'))
	return nil
}

// changeValues appends the after, after_sensitive, after_unknown, before and before_sensitive
// members of a record.
func (p *planHasher) changeValues(b []byte, ch *rawChange) ([]byte, error) {
	var err error
	for _, f := range [...]struct {
		key string
		raw []byte
	}{
		{`,"after":`, ch.After},
		{`,"after_sensitive":`, ch.AfterSensitive},
		{`,"after_unknown":`, ch.AfterUnknown},
		{`,"before":`, ch.Before},
		{`,"before_sensitive":`, ch.BeforeSensitive},
	} {
		b = append(b, f.key...)
		if b, err = p.canon.appendValue(b, f.raw); err != nil {
			return b, err
		}
	}
	return b, nil
}

// drift adds a covered resource_drift entry.
func (p *planHasher) drift(rc *rawResourceChange) error {
	ch := &rc.Change
	b := append(p.rec[:0], `{"actions":`...)
	b = appendActions(b, ch.Actions)
	b = append(b, `,"address":`...)
	b = appendCanonicalString(b, rc.Address)
	b = append(b, `,"after":`...)
	var err error
	if b, err = p.canon.appendValue(b, ch.After); err != nil {
		return err
	}
	b = append(b, `,"before":`...)
	if b, err = p.canon.appendValue(b, ch.Before); err != nil {
		return err
	}
	p.add(sectionDrift, append(b, '}'))
	return nil
}

func (p *planHasher) add(section int, record []byte) {
	p.rec = record
	p.digests[section] = append(p.digests[section], sha256.Sum256(record))
}

// sum is the plan hash of the entries added so far.
func (p *planHasher) sum() string {
	h := sha256.New()
	h.Write([]byte(planHashDomain))
	for i, name := range planHashSections {
		ds := p.digests[i]
		slices.SortFunc(ds, func(a, b [sha256.Size]byte) int { return bytes.Compare(a[:], b[:]) })
		h.Write([]byte(name + " " + strconv.Itoa(len(ds)) + "\n"))
		for j := range ds {
			h.Write(ds[j][:]) // ds[j], not a copy: a copy would escape
		}
	}
	return PlanHashVersion + ":" + hex.EncodeToString(h.Sum(nil))
}

func appendActions(b []byte, a actionList) []byte {
	b = append(b, '[')
	for i, act := range a {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendCanonicalString(b, string(act))
	}
	return append(b, ']')
}

// errCanonical is returned for bytes that are not valid JSON (the decoder has validated every
// value the hasher reads, so this is a safety net).
var errCanonical = errors.New("plan hash: invalid JSON value")

// canonicalizer rewrites JSON values in the canonical form of PlanHashVersion; its buffers
// are reused from one value to the next.
type canonicalizer struct {
	src     []byte
	members []member // the members of the objects being written, innermost last
	scratch []byte
}

// member is one "key":value of an object written to dst: its key is dst[key:keyEnd], without
// the quotes, the whole member dst[key-1:end].
type member struct{ key, keyEnd, end int }

// appendValue appends the canonical form of the JSON value raw to dst; an empty raw (a missing
// value) is null.
func (c *canonicalizer) appendValue(dst, raw []byte) ([]byte, error) {
	c.src = raw
	i := skipSpace(raw, 0)
	if i == len(raw) {
		return append(dst, "null"...), nil
	}
	dst, i, err := c.value(dst, i, 0)
	c.src = nil
	if err != nil {
		return dst, err
	}
	if skipSpace(raw, i) != len(raw) {
		return dst, errCanonical
	}
	return dst, nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\r', '\n':
			i++
		default:
			return i
		}
	}
	return i
}

// maxCanonicalDepth bounds nesting (encoding/json's decoder refuses deeper documents anyway).
const maxCanonicalDepth = 10000

func (c *canonicalizer) value(dst []byte, i, depth int) ([]byte, int, error) {
	src := c.src
	if i >= len(src) || depth > maxCanonicalDepth {
		return dst, i, errCanonical
	}
	switch ch := src[i]; {
	case ch == '{':
		return c.object(dst, i, depth)
	case ch == '[':
		dst = append(dst, '[')
		i = skipSpace(src, i+1)
		if i < len(src) && src[i] == ']' {
			return append(dst, ']'), i + 1, nil
		}
		for {
			var err error
			if dst, i, err = c.value(dst, skipSpace(src, i), depth+1); err != nil {
				return dst, i, err
			}
			i = skipSpace(src, i)
			if i >= len(src) {
				return dst, i, errCanonical
			}
			switch src[i] {
			case ',':
				dst = append(dst, ',')
				i++
			case ']':
				return append(dst, ']'), i + 1, nil
			default:
				return dst, i, errCanonical
			}
		}
	case ch == '"':
		return appendCanonicalJSONString(dst, src, i)
	case ch == '-' || ch >= '0' && ch <= '9':
		j := i + 1
		for j < len(src) && isNumberByte(src[j]) {
			j++
		}
		dst, err := appendCanonicalNumber(dst, src[i:j])
		return dst, j, err
	}
	var lit string
	switch src[i] {
	case 't':
		lit = "true"
	case 'f':
		lit = "false"
	case 'n':
		lit = "null"
	}
	if lit == "" || len(src)-i < len(lit) || string(src[i:i+len(lit)]) != lit {
		return dst, i, errCanonical
	}
	return append(dst, lit...), i + len(lit), nil
}

func isNumberByte(b byte) bool {
	return b >= '0' && b <= '9' || b == '.' || b == 'e' || b == 'E' || b == '+' || b == '-'
}

// object writes the members of an object, then sorts them by key (the last of equal keys
// wins) unless they already are in order.
func (c *canonicalizer) object(dst []byte, i, depth int) ([]byte, int, error) {
	base := len(c.members)
	dst, i, err := c.objectMembers(dst, i, depth, base)
	c.members = c.members[:base]
	return dst, i, err
}

// objectMembers writes the object at src[i], recording its members in c.members[base:].
func (c *canonicalizer) objectMembers(dst []byte, i, depth, base int) ([]byte, int, error) {
	src := c.src
	start := len(dst)
	dst = append(dst, '{')
	i = skipSpace(src, i+1)
	if i < len(src) && src[i] == '}' {
		return append(dst, '}'), i + 1, nil
	}
	sorted := true
	for {
		if i >= len(src) || src[i] != '"' {
			return dst, i, errCanonical
		}
		if len(c.members) > base {
			dst = append(dst, ',')
		}
		k := len(dst) + 1
		var err error
		if dst, i, err = appendCanonicalJSONString(dst, src, i); err != nil {
			return dst, i, err
		}
		keyEnd := len(dst) - 1 // the closing quote
		i = skipSpace(src, i)
		if i >= len(src) || src[i] != ':' {
			return dst, i, errCanonical
		}
		dst = append(dst, ':')
		if dst, i, err = c.value(dst, skipSpace(src, i+1), depth+1); err != nil {
			return dst, i, err
		}
		m := member{key: k, keyEnd: keyEnd, end: len(dst)}
		if n := len(c.members); n > base {
			prev := c.members[n-1]
			if bytes.Compare(dst[prev.key:prev.keyEnd], dst[m.key:m.keyEnd]) >= 0 {
				sorted = false // out of order, or a repeated key
			}
		}
		c.members = append(c.members, m)
		i = skipSpace(src, i)
		if i >= len(src) {
			return dst, i, errCanonical
		}
		if src[i] == '}' {
			i++
			break
		}
		if src[i] != ',' {
			return dst, i, errCanonical
		}
		i = skipSpace(src, i+1)
	}
	if !sorted {
		// Reorder the members from a copy of the object, dropping all but the last of equal keys.
		c.scratch = append(c.scratch[:0], dst[start:]...)
		ms := c.members[base:]
		key := func(m member) []byte { return c.scratch[m.key-start : m.keyEnd-start] }
		slices.SortStableFunc(ms, func(a, b member) int { return bytes.Compare(key(a), key(b)) })
		dst = append(dst[:start], '{')
		for j, m := range ms {
			if j+1 < len(ms) && bytes.Equal(key(m), key(ms[j+1])) {
				continue
			}
			if len(dst) > start+1 {
				dst = append(dst, ',')
			}
			dst = append(dst, c.scratch[m.key-1-start:m.end-start]...)
		}
	}
	return append(dst, '}'), i, nil
}

// appendCanonicalString appends s as a canonical JSON string (invalid UTF-8 as U+FFFD).
func appendCanonicalString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			dst = appendCanonicalByte(dst, b)
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		dst = utf8.AppendRune(dst, r) // RuneError for invalid bytes
		i += size
	}
	return append(dst, '"')
}

// appendCanonicalByte appends the ASCII byte b of a string, escaped if it must be.
func appendCanonicalByte(dst []byte, b byte) []byte {
	switch b {
	case '"':
		return append(dst, '\\', '"')
	case '\\':
		return append(dst, '\\', '\\')
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	}
	if b < 0x20 {
		const hexDigits = "0123456789abcdef"
		return append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xf])
	}
	return append(dst, b)
}

// appendCanonicalJSONString appends the canonical form of the JSON string starting at src[i]
// (its opening quote) and returns the index after its closing quote.
func appendCanonicalJSONString(dst, src []byte, i int) ([]byte, int, error) {
	i++
	// Fast path: printable ASCII without escapes is already canonical.
	j := i
	for j < len(src) && plainASCII[src[j]] {
		j++
	}
	if j < len(src) && src[j] == '"' {
		dst = append(dst, src[i-1:j+1]...)
		return dst, j + 1, nil
	}
	dst = append(dst, '"')
	dst = append(dst, src[i:j]...)
	i = j
	for i < len(src) {
		b := src[i]
		switch {
		case b == '"':
			return append(dst, '"'), i + 1, nil
		case b == '\\':
			if i+1 >= len(src) {
				return dst, i, errCanonical
			}
			switch e := src[i+1]; e {
			case '"', '\\', '/':
				dst = appendCanonicalByte(dst, e)
			case 'b':
				dst = appendCanonicalByte(dst, '\b')
			case 'f':
				dst = appendCanonicalByte(dst, '\f')
			case 'n':
				dst = appendCanonicalByte(dst, '\n')
			case 'r':
				dst = appendCanonicalByte(dst, '\r')
			case 't':
				dst = appendCanonicalByte(dst, '\t')
			case 'u':
				r, ok := hex4(src, i+2)
				if !ok {
					return dst, i, errCanonical
				}
				i += 6
				if utf16.IsSurrogate(r) {
					// A pair makes one rune; an unpaired surrogate is U+FFFD (as encoding/json).
					if r2, ok := hex4(src, i+2); ok && src[i] == '\\' && src[i+1] == 'u' {
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							r = dec
							i += 6
						} else {
							r = utf8.RuneError
						}
					} else {
						r = utf8.RuneError
					}
				}
				if r < utf8.RuneSelf {
					dst = appendCanonicalByte(dst, byte(r))
				} else {
					dst = utf8.AppendRune(dst, r)
				}
				continue
			default:
				return dst, i, errCanonical
			}
			i += 2
		case b < 0x20:
			return dst, i, errCanonical
		case b < utf8.RuneSelf:
			j := i + 1
			for j < len(src) && plainASCII[src[j]] {
				j++
			}
			dst = append(dst, src[i:j]...)
			i = j
		default:
			r, size := utf8.DecodeRune(src[i:])
			dst = utf8.AppendRune(dst, r) // RuneError for invalid bytes
			i += size
		}
	}
	return dst, i, errCanonical
}

// plainASCII marks the bytes a canonical string holds as they are: printable ASCII but " and \.
var plainASCII = func() (t [256]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// hex4 reads the 4 hex digits at src[i:i+4].
func hex4(src []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(src) {
		return 0, false
	}
	var r rune
	for _, c := range src[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// appendCanonicalNumber appends the canonical form (see PlanHashVersion) of the JSON number
// lit: exact, whatever its size or precision.
func appendCanonicalNumber(dst, lit []byte) ([]byte, error) {
	// Fast path: an integer of at most 21 digits is canonical as is (d followed by e zeros).
	n := lit
	neg := len(n) > 0 && n[0] == '-'
	if neg {
		n = n[1:]
	}
	intEnd := 0
	for intEnd < len(n) && n[intEnd] >= '0' && n[intEnd] <= '9' {
		intEnd++
	}
	if intEnd == 0 || n[0] == '0' && intEnd > 1 {
		return dst, errCanonical
	}
	if intEnd == len(n) && intEnd <= 21 {
		if n[0] == '0' {
			return append(dst, '0'), nil
		}
		return append(dst, lit...), nil
	}
	intPart, rest := n[:intEnd], n[intEnd:]
	var frac, exp []byte
	if len(rest) > 0 && rest[0] == '.' {
		j := 1
		for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
			j++
		}
		if j == 1 {
			return dst, errCanonical
		}
		frac, rest = rest[1:j], rest[j:]
	}
	expNeg := false
	if len(rest) > 0 && (rest[0] == 'e' || rest[0] == 'E') {
		rest = rest[1:]
		if len(rest) > 0 && (rest[0] == '+' || rest[0] == '-') {
			expNeg = rest[0] == '-'
			rest = rest[1:]
		}
		j := 0
		for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
			j++
		}
		if j == 0 {
			return dst, errCanonical
		}
		exp, rest = rest[:j], rest[j:]
	}
	if len(rest) > 0 {
		return dst, errCanonical
	}

	// The significant digits d, from intPart and frac without leading or trailing zeros.
	lead := 0
	for lead < len(intPart) && intPart[lead] == '0' {
		lead++
	}
	hi, lo := intPart[lead:], frac // d is hi+lo, trimmed
	if len(hi) == 0 {
		k := 0
		for k < len(lo) && lo[k] == '0' {
			k++
		}
		lo = lo[k:]
	}
	trail := 0 // trailing zeros dropped from d
	if len(lo) > 0 {
		for len(lo) > 0 && lo[len(lo)-1] == '0' {
			lo = lo[:len(lo)-1]
			trail++
		}
	}
	if len(lo) == 0 {
		for len(hi) > 0 && hi[len(hi)-1] == '0' {
			hi = hi[:len(hi)-1]
			trail++
		}
	}
	nd := len(hi) + len(lo)
	if nd == 0 {
		return append(dst, '0'), nil
	}
	// The value is d × 10^e with e = exp - len(frac) + trail.
	e, small := smallExponent(exp, expNeg)
	if small {
		e += int64(trail) - int64(len(frac))
		if e > -1<<60 && e < 1<<60 {
			if neg {
				dst = append(dst, '-')
			}
			ld := int64(nd)
			switch {
			case e == 0 || e > 0 && ld+e <= 21:
				dst = append(append(dst, hi...), lo...)
				for range e {
					dst = append(dst, '0')
				}
			case e < 0 && -ld < e:
				point := nd + int(e)
				dst = appendDigits(dst, hi, lo, 0, point)
				dst = append(dst, '.')
				dst = appendDigits(dst, hi, lo, point, nd)
			case e < 0 && -ld-6 < e:
				dst = append(dst, '0', '.')
				for range -e - ld {
					dst = append(dst, '0')
				}
				dst = append(append(dst, hi...), lo...)
			default:
				dst = append(append(dst, hi...), lo...)
				dst = append(dst, 'e')
				dst = strconv.AppendInt(dst, e, 10)
			}
			return dst, nil
		}
	}
	// A huge exponent: d "e" e, computed exactly.
	be, ok := new(big.Int).SetString(string(exp), 10)
	if !ok {
		return dst, errCanonical
	}
	if expNeg {
		be.Neg(be)
	}
	be.Add(be, big.NewInt(int64(trail)-int64(len(frac))))
	if neg {
		dst = append(dst, '-')
	}
	dst = append(append(dst, hi...), lo...)
	dst = append(dst, 'e')
	return be.Append(dst, 10), nil
}

// smallExponent parses the exponent digits exp; small is false when it does not fit in 15
// digits.
func smallExponent(exp []byte, neg bool) (e int64, small bool) {
	k := 0
	for k < len(exp) && exp[k] == '0' {
		k++
	}
	if len(exp)-k > 15 {
		return 0, false
	}
	for _, c := range exp[k:] {
		e = e*10 + int64(c-'0')
	}
	if neg {
		e = -e
	}
	return e, true
}

// appendDigits appends the digits [from, to) of the concatenation hi+lo.
func appendDigits(dst, hi, lo []byte, from, to int) []byte {
	for k := from; k < to; k++ {
		if k < len(hi) {
			dst = append(dst, hi[k])
		} else {
			dst = append(dst, lo[k-len(hi)])
		}
	}
	return dst
}
