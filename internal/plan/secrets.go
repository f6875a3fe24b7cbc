package plan

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Masked is what renders show instead of a sensitive value.
const Masked = "(sensitive value)"

// minSecretSubstring is the shortest secret also masked when it appears inside a longer value
// (e.g. a password inside a connection string). Shorter secrets are masked on equality only,
// so that a sensitive "1" does not mask every value containing the digit.
const minSecretSubstring = 4

// secretSet holds the scalar values found in sensitive positions, as text (strings unquoted,
// numbers in their JSON form). Booleans, null and "" are never secrets: masking every true or
// empty string would hide the plan, and they carry no secret.
type secretSet struct {
	values map[string]struct{}
	// long caches the values of at least minSecretSubstring bytes, longest first; nil when stale.
	long []string
}

func newSecretSet() *secretSet { return &secretSet{values: map[string]struct{}{}} }

func (s *secretSet) add(v string) {
	if v == "" {
		return
	}
	if _, ok := s.values[v]; !ok {
		s.values[v] = struct{}{}
		s.long = nil
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

func (s *secretSet) longValues() []string {
	if s.long == nil {
		s.long = []string{}
		for v := range s.values {
			if len(v) >= minSecretSubstring {
				s.long = append(s.long, v)
			}
		}
		sort.Slice(s.long, func(i, j int) bool {
			if len(s.long[i]) != len(s.long[j]) {
				return len(s.long[i]) > len(s.long[j])
			}
			return s.long[i] < s.long[j]
		})
	}
	return s.long
}

// sensitive reports whether the leaf text v must be masked: it equals a secret, or contains
// one of at least minSecretSubstring bytes.
func (s *secretSet) sensitive(v string) bool {
	if v == "" || len(s.values) == 0 {
		return false
	}
	if _, ok := s.values[v]; ok {
		return true
	}
	for _, sec := range s.longValues() {
		if len(sec) <= len(v) && strings.Contains(v, sec) {
			return true
		}
	}
	return false
}

// scrub replaces every occurrence of a secret of at least minScrub bytes in rendered text: a
// last line of defence behind the structural masking, for text that is not a plan value
// (addresses, reasons, errors).
func (s *secretSet) scrub(text string) string {
	var pairs []string
	for _, sec := range s.longValues() {
		if len(sec) >= minScrub {
			pairs = append(pairs, sec, Masked)
		}
	}
	if len(pairs) == 0 {
		return text
	}
	return strings.NewReplacer(pairs...).Replace(text)
}

// collectAll adds every scalar leaf of v.
func (s *secretSet) collectAll(v any) {
	switch t := v.(type) {
	case string:
		s.add(t)
	case json.Number:
		s.add(t.String())
	case map[string]any:
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

// maskDiffs replaces every display value that is or contains a secret.
func (s *secretSet) maskDiffs(diffs []AttrDiff) {
	for i := range diffs {
		d := &diffs[i]
		if s.sensitive(d.beforeRaw) {
			d.Before = Masked
		}
		if s.sensitive(d.afterRaw) {
			d.After = Masked
		}
		d.beforeRaw, d.afterRaw = "", ""
	}
}

// redact masks every value the stack holds. Classify calls it last.
func (st *Stack) redact() {
	s := st.secrets
	for i := range st.Changes {
		s.maskDiffs(st.Changes[i].Attributes)
	}
	for i := range st.Drift {
		s.maskDiffs(st.Drift[i].Attributes)
	}
	for i := range st.Outputs {
		s.maskDiffs(st.Outputs[i].Attributes)
	}
}
