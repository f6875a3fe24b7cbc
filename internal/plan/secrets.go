package plan

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Masked is what renders show instead of a sensitive value.
const Masked = "(sensitive value)"

// minSecretSubstring is the shortest secret also masked when it appears inside a longer value
// (e.g. a password inside a connection string). Shorter secrets are masked on equality only,
// so that a sensitive "1" does not mask every value containing the digit.
const minSecretSubstring = 4

// minSecretLine is the shortest line of a multi-line secret that is a secret of its own: an
// encoding that breaks the secret into lines (yamlencode's block style indents each) shows
// each line apart from the others. Shorter lines ("-----", "}") are everywhere.
const minSecretLine = 8

// secretSet holds the scalar values found in sensitive positions, as text (strings unquoted,
// numbers in their JSON form), and the lines of the multi-line ones (see minSecretLine).
// Booleans, null and "" are never secrets: masking every true or empty string would hide the
// plan, and they carry no secret.
type secretSet struct {
	values map[string]struct{}
	// match caches the matcher of the values' forms; nil when stale. Classify drops it once
	// the stack is redacted (release).
	match *secretMatcher
}

func newSecretSet() *secretSet { return &secretSet{values: map[string]struct{}{}} }

func (s *secretSet) add(v string) {
	if v == "" {
		return
	}
	if _, ok := s.values[v]; ok {
		return
	}
	s.values[v] = struct{}{}
	s.match = nil
	if !strings.Contains(v, "\n") {
		return
	}
	for _, line := range strings.Split(v, "\n") {
		line = strings.TrimSuffix(line, "\r")
		if line != v && len(strings.TrimSpace(line)) >= minSecretLine {
			s.add(line)
		}
	}
}

func (s *secretSet) merge(o *secretSet) {
	if o == nil {
		return
	}
	for v := range o.values {
		s.add(v)
	}
}

// release drops the matcher, which only the redaction of the stack needed: a render builds
// one for the secrets of all its stacks.
func (s *secretSet) release() { s.match = nil }

// matcher returns the matcher of the secrets' forms (built once, until a value is added).
func (s *secretSet) matcher() *secretMatcher {
	if s.match != nil {
		return s.match
	}
	pats := make([]secretPattern, 0, 2*len(s.values))
	for v := range s.values {
		if len(v) < minSecretSubstring {
			for _, f := range encodedForms(v) {
				pats = append(pats, secretPattern{text: f, kinds: kindExact})
			}
			continue
		}
		forms, plain := secretForms(v)
		pats = appendLongPatterns(pats, forms, plain)
		for _, f := range append(Base64Forms(v), URLForms(v)...) {
			pats = append(pats, secretPattern{text: f, kinds: kindInner | kindText})
		}
	}
	s.match = newSecretMatcher(pats)
	return s.match
}

// appendLongPatterns appends the patterns of the encoded forms of a secret of at least
// minSecretSubstring bytes (forms, from secretForms): each form, and the inside of its Go-quoted
// literal where quoting changes it (never for a plain secret).
func appendLongPatterns(pats []secretPattern, forms []string, plain bool) []secretPattern {
	for _, f := range forms {
		pats = append(pats, secretPattern{text: f, kinds: kindExact | kindInner | kindText})
		if plain {
			continue
		}
		goQuoted := strconv.Quote(f)
		if q := goQuoted[1 : len(goQuoted)-1]; q != f {
			pats = append(pats, secretPattern{text: q, kinds: kindText})
		}
	}
	return pats
}

// MinBase64Form is the shortest text Base64Forms returns: shorter ones would be found in
// unrelated base64 and words (a secret of 5 bytes or more has all three).
const MinBase64Form = 6

// Base64Forms are the texts that stand for secret in the standard base64 encoding (as
// base64encode writes it) of any data holding it, at each of the three byte alignments: as
// GitHub Actions' masker does, for the secret starting 0, 1 or 2 bytes into a 3-byte group,
// the characters of base64(k unknown bytes + secret) that depend on the secret's bytes only
// (not those that also encode the k bytes before it, nor the last one, which also encodes what
// follows). Forms shorter than MinBase64Form are left out.
func Base64Forms(secret string) []string {
	var out []string
	for k := range 3 {
		n := k + len(secret)
		data := make([]byte, n)
		copy(data[k:], secret)
		enc := base64.RawStdEncoding.EncodeToString(data)
		start, end := (8*k+5)/6, 8*n/6 // the first character of the secret's bits alone; past the last whole one
		if end-start >= MinBase64Form {
			out = append(out, enc[start:end])
		}
	}
	return out
}

// sensitive reports whether the leaf text v must be masked: it equals a secret, or contains
// one of at least minSecretSubstring bytes, raw or in one of its encoded forms (a secret
// re-encoded by jsonencode in an unflagged value).
func (s *secretSet) sensitive(v string) bool {
	if v == "" || len(s.values) == 0 {
		return false
	}
	if _, ok := s.values[v]; ok {
		return true
	}
	m := s.matcher()
	return m.equal(v, kindExact) || m.contains(v, kindInner)
}

// URLForms are the forms of secret that URL-encoding writes where they differ from it: query
// escaping (urlencode, a space as +) and path escaping (a space as %20). A form shorter than
// minSecretSubstring is left out.
func URLForms(secret string) []string {
	var out []string
	for _, f := range []string{url.QueryEscape(secret), url.PathEscape(secret)} {
		if f != secret && len(f) >= minSecretSubstring && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// maxEncodings is how many times over encodedForms encodes a secret.
const maxEncodings = 2

// encodedForms are sec as a plan value may carry it: raw, and the inside of its JSON string
// literal, once or maxEncodings times over (jsonencode(jsonencode(...))), each with <, > and &
// escaped as \u003c, \u003e and \u0026 (as OpenTofu's and Terraform's jsonencode write them,
// and Go's encoding/json) or not (as `show -json` writes them).
func encodedForms(sec string) []string {
	forms, _ := secretForms(sec)
	return forms
}

// secretForms is encodedForms(sec), and whether sec is plain (plainSecret).
func secretForms(sec string) (forms []string, plain bool) {
	if plainSecret(sec) {
		return []string{sec}, true
	}
	return encodeAll(sec), false
}

// encodeAll is encodedForms, computed.
func encodeAll(sec string) []string {
	forms := []string{sec}
	seen := map[string]bool{sec: true}
	level := forms
	for range maxEncodings {
		var next []string
		for _, v := range level {
			for _, f := range []string{jsonInner(v, false), jsonInner(v, true)} {
				if !seen[f] {
					seen[f] = true
					next = append(next, f)
				}
			}
		}
		forms = append(forms, next...)
		level = next
	}
	return forms
}

// plainSecret reports whether no encoding of encodedForms or Go quoting changes sec: it is
// printable ASCII without a quote, a backslash, <, > or &. Most secrets (tokens, passwords)
// are; their forms are found without encoding them a dozen times.
func plainSecret(sec string) bool {
	for i := 0; i < len(sec); i++ {
		switch c := sec[i]; {
		case c < 0x20 || c > 0x7e:
			return false
		case c == '"' || c == '\\' || c == '<' || c == '>' || c == '&':
			return false
		}
	}
	return true
}

// jsonInner is v as a JSON string literal without its quotes; html escapes <, > and &.
func jsonInner(v string, html bool) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(html)
	_ = enc.Encode(v)
	q := strings.TrimSuffix(b.String(), "\n")
	return q[1 : len(q)-1]
}

// redactText masks a string that is not a plan value but may hold one (a reason, an error, a
// version): whole when it equals a secret, otherwise every secret of at least
// minSecretSubstring bytes inside it, raw or quoted.
func (s *secretSet) redactText(v string) string {
	if v == "" || len(s.values) == 0 {
		return v
	}
	if _, ok := s.values[v]; ok {
		return Masked
	}
	// Every encoded form of the long secrets, raw or Go-quoted, the longest first.
	return s.matcher().replace(v, kindText)
}

// collectAll adds every scalar leaf of v.
func (s *secretSet) collectAll(v any) {
	switch t := v.(type) {
	case string:
		s.add(t)
	case json.Number:
		s.add(t.String())
	case map[string]any:
		// Not the keys: a sensitive map is shown as one masked value, so its keys are hidden
		// with it, as tofu does; a key ("class", "stack") counted as a secret would mask every
		// value that holds the word.
		for _, e := range t {
			s.collectAll(e)
		}
	case []any:
		for _, e := range t {
			s.collectAll(e)
		}
	}
}

// collect adds the leaves of v that mask marks sensitive. A mask is true (all of v), an object
// of masks per attribute, or a list of masks per element, as in before_sensitive,
// after_sensitive and sensitive_values.
func (s *secretSet) collect(v, mask any) {
	switch m := mask.(type) {
	case bool:
		if m {
			s.collectAll(v)
		}
	case map[string]any:
		obj, ok := v.(map[string]any)
		if !ok {
			return
		}
		for k, sub := range m {
			s.collect(obj[k], sub)
		}
	case []any:
		list, ok := v.([]any)
		if !ok {
			// A set may be shown as a list of masks over a list value; anything else is
			// collected whole, to err on the side of masking.
			s.collectAll(v)
			return
		}
		for i, sub := range m {
			if i < len(list) {
				s.collect(list[i], sub)
			}
		}
	}
}

// collectRaw decodes value and mask and collects the sensitive leaves. It does nothing unless
// the mask marks something sensitive, so that the (often large) value is decoded only then.
func (s *secretSet) collectRaw(value, mask json.RawMessage) error {
	if !maybeTrue(mask) || isNull(value) {
		return nil
	}
	var m, v any
	if err := json.Unmarshal(mask, &m); err != nil {
		return err
	}
	if err := unmarshalNumber(value, &v); err != nil {
		return err
	}
	s.collect(v, m)
	return nil
}

// collectChange collects the sensitive leaves of a change's before and after values.
func (s *secretSet) collectChange(ch *rawChange) error {
	if err := s.collectRaw(ch.Before, ch.BeforeSensitive); err != nil {
		return fmt.Errorf("before: %w", err)
	}
	if err := s.collectRaw(ch.After, ch.AfterSensitive); err != nil {
		return fmt.Errorf("after: %w", err)
	}
	return nil
}

// maskDiffs masks every display value that is or holds a secret (in its lines, for a line
// diff). Paths are names and keys, never rewritten: a sensitive map is one masked value.
func (s *secretSet) maskDiffs(diffs []AttrDiff) {
	for i := range diffs {
		d := &diffs[i]
		if s.sensitive(d.beforeRaw) || slices.ContainsFunc(d.beforeParts, s.sensitive) {
			d.Before, d.Lines = Masked, nil
		}
		if s.sensitive(d.afterRaw) || slices.ContainsFunc(d.afterParts, s.sensitive) {
			d.After, d.Lines = Masked, nil
		}
		d.beforeRaw, d.afterRaw, d.beforeParts, d.afterParts = "", "", nil, nil
	}
}

// redactChanges masks the secrets in the attribute diffs of changes. Addresses, reasons (an
// enumeration of tofu's) and counts are names, never rewritten.
func (s *secretSet) redactChanges(changes []Change) {
	for i := range changes {
		s.maskDiffs(changes[i].Attributes)
	}
}

// redact masks every value the stack holds, and every secret in its free text (the error,
// why, versions, the failed checks' messages). Classify calls it last, with the stack's
// secrets; renders call it again on a copy with the report's.
func (st *Stack) redact() {
	st.redactWith(st.secrets)
}

func (st *Stack) redactWith(s *secretSet) {
	st.redactHead(s)
	s.redactChanges(st.Destructive)
	st.redactDetail(s)
}

// redactHead masks the secrets in the free text a stack's summary shows: its error, versions,
// why, and the messages of its failed checks.
func (st *Stack) redactHead(s *secretSet) {
	st.Error = s.redactText(st.Error)
	st.FormatVersion = s.redactText(st.FormatVersion)
	st.TerraformVersion = s.redactText(st.TerraformVersion)
	for i := range st.Why {
		st.Why[i] = s.redactText(st.Why[i])
	}
	for i := range st.Checks {
		c := &st.Checks[i]
		for j := range c.Problems {
			c.Problems[j] = s.redactText(c.Problems[j])
		}
	}
}

// redactDetail masks the secrets in the values of a stack's changes, outputs and drift.
func (st *Stack) redactDetail(s *secretSet) {
	s.redactChanges(st.Changes)
	s.redactChanges(st.Drift)
	for i := range st.Outputs {
		s.maskDiffs(st.Outputs[i].Attributes)
	}
}

// redacted is a copy of r whose stacks are redacted with the secrets of every stack: a value
// secret in one stack is masked in all. Renders work on it.
func (r *Report) redacted(sec *secretSet) *Report {
	v := newRedactedView(r, sec)
	out := &Report{ExecutionURL: r.ExecutionURL, Stacks: make([]*Stack, len(r.Stacks))}
	for i := range r.Stacks {
		out.Stacks[i] = v.stack(i, viewHead|viewDestructive|viewDetail)
	}
	return out
}

// Parts of a stack a redactedView redacts.
const (
	viewHead        uint8 = 1 << iota // Error, the versions, Why
	viewDestructive                   // Destructive
	viewDetail                        // Changes, Drift, Outputs
)

// redactedView redacts the stacks of a report with the secrets of every stack, a part of a
// stack when a render first needs it: a render cut to a size limit redacts what it shows.
type redactedView struct {
	r      *Report
	sec    *secretSet
	stacks []Stack
	done   []uint8 // the parts of stacks[i] redacted; 0: stacks[i] not copied yet
}

func newRedactedView(r *Report, sec *secretSet) *redactedView {
	return &redactedView{r: r, sec: sec, stacks: make([]Stack, len(r.Stacks)), done: make([]uint8, len(r.Stacks))}
}

// stack returns the copy of the i-th stack with (at least) parts redacted. Its other parts
// are the stack's own, not yet masked with the other stacks' secrets: callers read only the
// parts they asked for (and the names, classes and counts, which redaction leaves alone).
func (v *redactedView) stack(i int, parts uint8) *Stack {
	c := &v.stacks[i]
	if v.done[i] == 0 {
		*c = *v.r.Stacks[i]
	}
	need := parts &^ v.done[i]
	if need&viewHead != 0 {
		c.Why = slices.Clone(c.Why)
		c.Checks = slices.Clone(c.Checks)
		for j := range c.Checks {
			c.Checks[j].Problems = slices.Clone(c.Checks[j].Problems)
		}
		c.redactHead(v.sec)
	}
	if need&viewDestructive != 0 {
		c.Destructive = cloneChanges(c.Destructive)
		v.sec.redactChanges(c.Destructive)
	}
	if need&viewDetail != 0 {
		c.Changes = cloneChanges(c.Changes)
		c.Drift = cloneChanges(c.Drift)
		c.Outputs = slices.Clone(c.Outputs)
		for j := range c.Outputs {
			c.Outputs[j].Attributes = slices.Clone(c.Outputs[j].Attributes)
		}
		c.redactDetail(v.sec)
	}
	v.done[i] |= parts
	return c
}

func cloneChanges(changes []Change) []Change {
	out := slices.Clone(changes)
	for i := range out {
		out[i].Attributes = slices.Clone(out[i].Attributes)
	}
	return out
}
