package plan

// The implementation of the secret masking and of the size-fitted renders as they were before
// the secrets were searched with secretMatcher and the markdown renders were fitted against a
// byte budget: the oracle that the current implementation's output is held to, byte for byte.

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/tfstackplan/tfstackplan/events"
)

// legacyUnion is the union of the secrets of r's stacks, as a legacySecrets.
func legacyUnion(r *Report) *legacySecrets {
	all := newLegacySecrets()
	for _, s := range r.Stacks {
		if s.secrets != nil {
			for v := range s.secrets.values {
				all.add(v)
			}
		}
	}
	return all
}

// legacyDestructiveList is destructiveList as it was (listing at most MaxDestructive per
// stack, as Classify kept then).
func legacyDestructiveList(r *Report) (list []destructiveEntry, omitted int) {
	for _, s := range r.Stacks {
		n := min(len(s.Destructive), MaxDestructive)
		for _, c := range s.Destructive[:n] {
			list = append(list, destructiveEntry{s.Name, c})
		}
		omitted += len(s.Destructive) - n + s.DestructiveOmitted
	}
	return list, omitted
}

// legacySecrets holds the scalar values found in sensitive positions, as text (strings unquoted,
// numbers in their JSON form). Booleans, null and "" are never secrets: masking every true or
// empty string would hide the plan, and they carry no secret.
type legacySecrets struct {
	values map[string]struct{}
	// long caches the values of at least minSecretSubstring bytes, longest first; forms the
	// encoded forms (encodedForms) of every value, longForms those of the long values, longest
	// first; long, forms, longForms, replacer (scrub) and inner (redactText) are nil when stale.
	long      []string
	forms     map[string]struct{}
	longForms []string
	replacer  *strings.Replacer
	inner     *strings.Replacer
}

func newLegacySecrets() *legacySecrets { return &legacySecrets{values: map[string]struct{}{}} }

func (s *legacySecrets) add(v string) {
	if v == "" {
		return
	}
	if _, ok := s.values[v]; !ok {
		s.values[v] = struct{}{}
		s.long, s.forms, s.longForms, s.replacer, s.inner = nil, nil, nil, nil, nil
	}
}

func (s *legacySecrets) merge(o *legacySecrets) {
	if o == nil {
		return
	}
	for v := range o.values {
		s.add(v)
	}
}

func (s *legacySecrets) longValues() []string {
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

// encoded fills the caches of the encoded forms of the secrets (forms, longForms).
func (s *legacySecrets) encoded() {
	if s.forms != nil {
		return
	}
	s.forms = map[string]struct{}{}
	long := map[string]bool{}
	for v := range s.values {
		for _, f := range encodedForms(v) {
			s.forms[f] = struct{}{}
			if len(v) >= minSecretSubstring {
				long[f] = true
			}
		}
	}
	s.longForms = make([]string, 0, len(long))
	for f := range long {
		s.longForms = append(s.longForms, f)
	}
	sortLongestFirst(s.longForms)
}

// sensitive reports whether the leaf text v must be masked: it equals a secret, or contains
// one of at least minSecretSubstring bytes, raw or in one of its encoded forms (a secret
// re-encoded by jsonencode in an unflagged value).
func (s *legacySecrets) sensitive(v string) bool {
	if v == "" || len(s.values) == 0 {
		return false
	}
	if _, ok := s.values[v]; ok {
		return true
	}
	s.encoded()
	if _, ok := s.forms[v]; ok {
		return true
	}
	for _, sec := range s.longForms {
		if len(sec) <= len(v) && strings.Contains(v, sec) {
			return true
		}
	}
	return false
}

// scrub replaces every occurrence of a secret of at least minScrub bytes in rendered text, raw
// or in any escaped form a render produces: a last line of defence behind the redaction of the
// model (Stack.redact, Report.redacted).
func (s *legacySecrets) scrub(text string) string {
	if len(s.values) == 0 {
		return text
	}
	if s.replacer == nil {
		var pairs []string
		seen := map[string]bool{}
		for _, sec := range s.longValues() {
			if len(sec) < minScrub {
				continue
			}
			for _, v := range escapedForms(sec) {
				if len(v) >= minScrub && !seen[v] {
					seen[v] = true
					pairs = append(pairs, v, Masked)
				}
			}
		}
		s.replacer = strings.NewReplacer(pairs...)
	}
	return s.replacer.Replace(text)
}

// redactText masks a string that is not a plan value but may hold one (a reason, an error, a
// version): whole when it equals a secret, otherwise every secret of at least
// minSecretSubstring bytes inside it, raw or quoted.
func (s *legacySecrets) redactText(v string) string {
	if v == "" || len(s.values) == 0 {
		return v
	}
	if _, ok := s.values[v]; ok {
		return Masked
	}
	if s.inner == nil {
		// Every encoded form of the long secrets, raw or Go-quoted, longest first.
		s.encoded()
		var all []string
		seen := map[string]bool{}
		for _, f := range s.longForms {
			goQuoted := strconv.Quote(f)
			for _, v := range []string{f, goQuoted[1 : len(goQuoted)-1]} {
				if !seen[v] {
					seen[v] = true
					all = append(all, v)
				}
			}
		}
		sortLongestFirst(all)
		pairs := make([]string, 0, 2*len(all))
		for _, v := range all {
			pairs = append(pairs, v, Masked)
		}
		s.inner = strings.NewReplacer(pairs...)
	}
	return s.inner.Replace(v)
}

// redactPath masks the secrets in a resource address (names: false; only index keys are
// values there) or an attribute path (names: true; every step is a key): a step equal to a
// secret is masked whatever its length, then redactText masks the longer secrets inside.
func (s *legacySecrets) redactPath(p string, names bool) string {
	if p == "" || len(s.values) == 0 {
		return p
	}
	var b strings.Builder
	for rest := p; rest != ""; {
		if strings.HasPrefix(rest, "[\"") {
			if q, err := strconv.QuotedPrefix(rest[1:]); err == nil {
				rest = rest[1+len(q):]
				if key, err := strconv.Unquote(q); err == nil && s.sensitive(key) {
					q = strconv.Quote(Masked)
				}
				b.WriteString("[" + q)
				continue
			}
		}
		// A name (or a numeric index, a position, not a value) up to the next step.
		n := strings.IndexAny(rest[1:], ".[")
		if n < 0 {
			n = len(rest)
		} else {
			n++
		}
		step := rest[:n]
		name := strings.TrimPrefix(step, ".")
		if names && !strings.HasPrefix(step, "[") && s.sensitive(name) {
			step = strings.TrimSuffix(step, name) + Masked
		}
		b.WriteString(step)
		rest = rest[n:]
	}
	return s.redactText(b.String())
}

// maskDiffs replaces every display value that is or contains a secret, and masks the secrets
// in the attribute paths (map keys).
func (s *legacySecrets) maskDiffs(diffs []AttrDiff) {
	for i := range diffs {
		d := &diffs[i]
		if s.sensitive(d.beforeRaw) {
			d.Before = Masked
		}
		if s.sensitive(d.afterRaw) {
			d.After = Masked
		}
		d.beforeRaw, d.afterRaw = "", ""
		d.Path = s.redactPath(d.Path, true)
		d.Before, d.After = s.redactText(d.Before), s.redactText(d.After)
	}
}

// redactChanges masks the secrets in the addresses, reasons and attribute diffs of changes.
func (s *legacySecrets) redactChanges(changes []Change) {
	for i := range changes {
		c := &changes[i]
		c.Address = s.redactPath(c.Address, false)
		c.PreviousAddress = s.redactPath(c.PreviousAddress, false)
		c.Reason = s.redactText(c.Reason)
		s.maskDiffs(c.Attributes)
	}
}

// redact masks every value the stack holds, and every secret in the strings taken from the
// plan (addresses, reasons, paths, output names, versions, the error). Classify calls it last,
// with the stack's secrets; renders call it again on a copy with the report's.

func legacyRedactWith(st *Stack, s *legacySecrets) {
	s.redactChanges(st.Changes)
	s.redactChanges(st.Destructive)
	s.redactChanges(st.Drift)
	for i := range st.Outputs {
		o := &st.Outputs[i]
		name := s.redactPath(o.Name, true)
		s.maskDiffs(o.Attributes)
		o.Name = name
	}
	st.Error = s.redactText(st.Error)
	st.FormatVersion = s.redactText(st.FormatVersion)
	st.TerraformVersion = s.redactText(st.TerraformVersion)
	for i := range st.Why {
		st.Why[i] = s.redactText(st.Why[i])
	}
}

// redacted is a copy of r whose stacks are redacted with the secrets of every stack: a value
// secret in one stack is masked in all. Renders work on it.
func legacyRedacted(r *Report, sec *legacySecrets) *Report {
	out := &Report{ExecutionURL: r.ExecutionURL, Stacks: make([]*Stack, len(r.Stacks))}
	for i, s := range r.Stacks {
		c := *s
		c.Changes = legacyCloneChanges(s.Changes)
		c.Destructive = legacyCloneChanges(s.Destructive)
		c.Drift = legacyCloneChanges(s.Drift)
		c.Outputs = slices.Clone(s.Outputs)
		for j := range c.Outputs {
			c.Outputs[j].Attributes = slices.Clone(c.Outputs[j].Attributes)
		}
		c.Why = slices.Clone(s.Why)
		legacyRedactWith(&c, sec)
		out.Stacks[i] = &c
	}
	return out
}

func legacyCloneChanges(changes []Change) []Change {
	out := slices.Clone(changes)
	for i := range out {
		out[i].Attributes = slices.Clone(out[i].Attributes)
	}
	return out
}

func legacyFitMarkdown(r *Report, limit int) string {
	sec := legacyUnion(r)
	r = legacyRedacted(r, sec)
	for level := mdFull; level < mdTrimDestroy; level++ {
		if out := sec.scrub(legacyMarkdown(r, level, -1)); len(out) <= limit {
			return out
		}
	}
	// Keep as many destructive entries as fit: binary search on the count.
	list, _ := legacyDestructiveList(r)
	lo, hi := 0, len(list)
	best := sec.scrub(legacyMarkdown(r, mdTrimDestroy, 0))
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if out := sec.scrub(legacyMarkdown(r, mdTrimDestroy, mid)); len(out) <= limit {
			best, lo = out, mid
		} else {
			hi = mid - 1
		}
	}
	if len(best) > limit {
		// Only pathological stack names or errors get here; cut on a line boundary, and keep
		// the link to the execution page after the cut.
		link := sec.scrub(executionLink(r))
		if len(link)+len(cutNote) > limit {
			link = ""
		}
		keep := max(0, limit-len(cutNote)-len(link))
		best = best[:strings.LastIndexByte(best[:keep], '\n')+1] + cutNote + link
	}
	return best
}

// markdown renders r at level; keepDestructive < 0 keeps the whole destructive list.
func legacyMarkdown(r *Report, level mdLevel, keepDestructive int) string {
	var b strings.Builder
	b.WriteString(mdHeading(r))
	fmt.Fprintf(&b, "**Totals:** %s\n\n", totalsLine(r, " · "))
	b.WriteString(mdNotes(r))

	list, omitted := legacyDestructiveList(r)
	if len(list) > 0 || omitted > 0 {
		fmt.Fprintf(&b, "> [!CAUTION]\n> **%s** — these delete, replace or forget existing resources:\n>\n",
			plural(len(list)+omitted, "destructive change", "destructive changes"))
		if keepDestructive >= 0 && keepDestructive < len(list) {
			omitted += len(list) - keepDestructive
			list = list[:keepDestructive]
		}
		if level < mdNoTable {
			for _, e := range list {
				fmt.Fprintf(&b, "> - %s: %s\n", code(e.stack), mdChange(e.change))
			}
		} else {
			legacyCompactDestructive(&b, list)
		}
		if omitted > 0 {
			fmt.Fprintf(&b, "> - … and %d more (see the execution page)\n", omitted)
		}
		b.WriteString("\n")
	}
	unc := legacyUnclassified(r)
	shown := unc
	if level >= mdNoTable && len(unc) > maxCollapsedWarnings {
		shown = unc[:maxCollapsedWarnings]
	}
	for _, s := range shown {
		fmt.Fprintf(&b, "> [!WARNING]\n> %s could not be classified (treated as unclassified): %s\n\n", code(s.Name), cell(s.Error))
	}
	if n := len(unc) - len(shown); n > 0 {
		fmt.Fprintf(&b, "> [!WARNING]\n> … and %s could not be classified (treated as unclassified)", plural(n, "more stack", "more stacks"))
		if r.ExecutionURL != "" {
			b.WriteString("; see the execution page")
		}
		b.WriteString(".\n\n")
	}

	if level <= mdChangedTable && len(r.Stacks) > 0 {
		// The move column only when some stack moves something.
		moves := r.Totals().Move > 0
		moveHead, moveAlign := "", ""
		if moves {
			moveHead, moveAlign = " →move |", "--:|"
		}
		b.WriteString("| Stack | Class | +create | ~update | ±replace | -delete | forget | import | read |" + moveHead + " outputs | why |\n")
		b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|" + moveAlign + "--:|---|\n")
		hidden := 0
		for _, s := range r.Stacks {
			if level == mdChangedTable && s.Counts.Total() == 0 && s.OutputsChanged == 0 && s.Error == "" {
				hidden++
				continue
			}
			c := s.Counts
			move := ""
			if moves {
				move = fmt.Sprintf(" %d |", c.Move)
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %d | %d |%s %d | %s |\n",
				code(s.Name), classBadge(s.Class), c.Create, c.Update, c.Replace, c.Delete, c.Forget, c.Import, c.Read, move,
				s.OutputsChanged, cell(strings.Join(s.Why, "; ")))
		}
		if hidden > 0 {
			fmt.Fprintf(&b, "\n_%s without changes not listed._\n", plural(hidden, "stack", "stacks"))
		}
		b.WriteString("\n")
	}

	if level <= mdNoAttributes {
		for _, s := range r.Stacks {
			lines := detailLines(s, level == mdFull)
			if len(lines) == 0 {
				continue
			}
			fmt.Fprintf(&b, "<details><summary>%s: %s (%s)</summary>\n\n", htmlCode(s.Name), s.Class, shortCounts(s.Counts))
			for i := range lines {
				lines[i] = Printable(lines[i])
			}
			b.WriteString(fence(strings.Join(lines, "\n"), "diff"))
			b.WriteString("\n</details>\n\n")
		}
	} else if level <= mdNoTable {
		b.WriteString("_Per-stack detail left out to fit the size limit")
		if r.ExecutionURL != "" {
			b.WriteString("; it is on the execution page")
		}
		b.WriteString("._\n\n")
	}

	b.WriteString(executionLink(r))
	return b.String()
}

// Text renders r for a terminal; color adds ANSI colours (pass true only for a TTY).
func legacyText(w io.Writer, r *Report, color bool) error {
	p := painter(color)
	sec := legacyUnion(r)
	r = legacyRedacted(r, sec)
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", p.paint(ansiBold, "tfstackplan:"), p.paint(classStyle(r.Class()), string(r.Class())))
	fmt.Fprintf(&b, "Totals: %s\n", totalsLine(r, ", "))
	if list, omitted := legacyDestructiveList(r); len(list)+omitted > 0 {
		fmt.Fprintf(&b, "\n%s\n", p.paint(ansiBold+ansiRed, fmt.Sprintf("WARNING: %s",
			plural(len(list)+omitted, "destructive change", "destructive changes"))))
		for _, e := range list {
			fmt.Fprintf(&b, "  %s: %s\n", Printable(e.stack), p.paint(ansiRed, e.change.Head()))
		}
		if omitted > 0 {
			fmt.Fprintf(&b, "  … and %d more\n", omitted)
		}
	}
	for _, s := range r.Stacks {
		fmt.Fprintf(&b, "\n%s  %s  %s\n", p.paint(ansiBold, Printable(s.Name)), p.paint(classStyle(s.Class), string(s.Class)), shortCounts(s.Counts))
		if s.Error != "" {
			fmt.Fprintf(&b, "  %s %s\n", p.paint(ansiBold+ansiMagent, "error:"), Printable(s.Error))
		}
		if len(s.Why) > 0 {
			fmt.Fprintf(&b, "  why: %s\n", Printable(strings.Join(s.Why, "; ")))
		}
		for _, line := range detailLines(s, true) {
			if line == "" {
				b.WriteString("\n")
				continue
			}
			// Attribute paths and output names come from the plan: no control characters.
			line = Printable(line)
			fmt.Fprintf(&b, "  %s\n", p.paint(actionStyle(line), line))
		}
	}
	if r.ExecutionURL != "" {
		fmt.Fprintf(&b, "\nExecution: %s\n", Printable(r.ExecutionURL))
	}
	_, err := io.WriteString(w, sec.scrub(b.String()))
	return err
}

// JSON renders r as an indented JSON document: the execution's class and totals, and every stack with its class and counts (all seven actions always present, and
// move when there are moves).
func legacyJSON(w io.Writer, r *Report) error {
	sec := legacyUnion(r)
	r = legacyRedacted(r, sec)
	doc := jsonReport{
		Class: r.Class(), Totals: r.Totals(),
		OutputsChanged: r.OutputsChanged(), Drift: r.DriftCount(), ExecutionURL: r.ExecutionURL,
		Stacks: r.Stacks,
	}
	if doc.Stacks == nil {
		doc.Stacks = []*Stack{}
	}
	// Without HTML escaping, so that the scrub sees the text as the model holds it.
	var buf strings.Builder
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return err
	}
	out := sec.scrub(buf.String())
	if !json.Valid([]byte(out)) {
		// A secret equal to JSON punctuation (`": "`) was scrubbed out of the structure, not
		// out of a string; the redacted model holds no secret, so its encoding is safe as is.
		out = buf.String()
	}
	_, err := io.WriteString(w, out)
	return err
}

// legacyCompactDestructive writes the destructive list one line per stack, addresses only.
func legacyCompactDestructive(b *strings.Builder, list []destructiveEntry) {
	for i, e := range list {
		switch {
		case i == 0:
			fmt.Fprintf(b, "> - %s: ", code(e.stack))
		case e.stack != list[i-1].stack:
			fmt.Fprintf(b, "\n> - %s: ", code(e.stack))
		default:
			b.WriteString(", ")
		}
		fmt.Fprintf(b, "%s %s", e.change.Action.Symbol(), code(e.change.Address))
		if e.change.Deposed != "" {
			fmt.Fprintf(b, " (deposed object %s)", cell(e.change.Deposed))
		}
	}
	if len(list) > 0 {
		b.WriteString("\n")
	}
}

// legacyUnclassified is unclassified as it was.
func legacyUnclassified(r *Report) []*Stack {
	var out []*Stack
	for _, s := range r.Stacks {
		if s.Class == events.ClassUnclassified {
			out = append(out, s)
		}
	}
	return out
}
