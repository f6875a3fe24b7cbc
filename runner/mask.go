package runner

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tfstackplan/tfstackplan/internal/plan"
)

// MaskReplacement is what a secret value is replaced with before log bytes leave the machine.
const MaskReplacement = "***"

// MaxSecretLength bounds one masked value (each line of a multi-line value counts alone). A
// stream holds back at most this many bytes minus one while it waits to see whether a secret
// continues, so the bound is also the pump's per-stack hold-back.
const MaxSecretLength = 4096

// addMaskCommand is the GitHub Actions workflow command that announces a value to mask.
const addMaskCommand = "::add-mask"

// Masker replaces secret values with "***". It is safe for concurrent use; one Masker is shared
// by every stack of a LogPump, so a value announced in one stack's log (GitHub Actions
// `::add-mask::VALUE`) is masked in every stack's log from then on, as on GitHub.
type Masker struct {
	mu    sync.Mutex
	known map[string]bool // the values of set, to skip repeats in O(1); guarded by mu
	set   atomic.Pointer[secretSet]
}

// secretSet is a snapshot of the values a Masker replaces. Snapshots share values' backing
// array: a new one only appends beyond the previous one's length.
type secretSet struct {
	values [][]byte
	size   int64 // the values' bytes
	forms  int   // how many of values are base64 or URL forms of the others

	// For sets of more than naiveSecrets values: an automaton over values[:auto.covered], carried
	// over from the previous snapshot; the values after those are searched one at a time until
	// that work (naive, in bytes compared) outgrows rebuildWork times the set's size, and the
	// automaton is rebuilt over all of them. Values announced a few at a time, each by its own
	// read, then cost a bounded share of the searching instead of one rebuild per read.
	auto   atomic.Pointer[secretAutomaton]
	naive  atomic.Int64
	build  sync.Mutex    // one rebuild at a time
	builds *atomic.Int64 // automata built for the Masker's sets (for tests)
}

// rebuildWork is how many bytes of one-value-at-a-time search per byte of values make a
// rebuild of the automaton worth it (it costs a few hundred nanoseconds per byte of values).
const rebuildWork = 256

// NewMasker returns a Masker that replaces the given values (see Add).
func NewMasker(values ...string) *Masker {
	m := &Masker{known: map[string]bool{}}
	m.set.Store(&secretSet{builds: new(atomic.Int64)})
	_ = m.add(values)
	return m
}

// Add registers value as a secret. A multi-line value is registered line by line (a trailing
// carriage return is dropped from each line), because logs break it the same way; empty and
// all-whitespace lines are ignored since masking them would destroy the log, not protect it. A
// line longer than MaxSecretLength is refused with an error and not masked. The base64 forms
// of the value and of each line (plan.Base64Forms: at each byte alignment, at least
// plan.MinBase64Form characters) and their URL-encoded forms (plan.URLForms: query and path
// escaping) are masked too.
func (m *Masker) Add(value string) error { return m.add([]string{value}) }

// add is Add for several values at once: one new snapshot for all of them.
func (m *Masker) add(values []string) error {
	var tooLong int
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := m.set.Load()
	next := &secretSet{values: cur.values, size: cur.size, forms: cur.forms, builds: cur.builds}
	next.auto.Store(cur.auto.Load())
	next.naive.Store(cur.naive.Load())
	changed := false
	for _, value := range values {
		// The base64 forms (of the whole value and of each line) as GitHub Actions' masker
		// adds them: a secret base64-encoded with what precedes it shows in none of its own
		// bytes; and the URL-encoded forms (a password in a query string or a path). A form
		// longer than MaxSecretLength is left out (the value itself still counts).
		var forms []string
		if strings.TrimSpace(value) != "" {
			forms = append(plan.Base64Forms(value), plan.URLForms(value)...)
		}
		for _, line := range strings.Split(value, "\n") {
			if line = strings.TrimSuffix(line, "\r"); line != value && strings.TrimSpace(line) != "" {
				forms = append(append(forms, plan.Base64Forms(line)...), plan.URLForms(line)...)
			}
		}
		for _, f := range forms {
			if len(f) <= MaxSecretLength && !m.known[f] {
				m.known[f] = true
				next.values = append(next.values, []byte(f))
				next.size += int64(len(f))
				next.forms++
				changed = true
			}
		}
		for _, line := range bytes.Split([]byte(value), []byte("\n")) {
			line = bytes.TrimSuffix(line, []byte("\r"))
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			if len(line) > MaxSecretLength {
				tooLong++
				continue
			}
			if m.known[string(line)] {
				continue
			}
			m.known[string(line)] = true
			next.values = append(next.values, bytes.Clone(line))
			next.size += int64(len(line))
			changed = true
		}
	}
	if changed {
		m.set.Store(next)
	}
	if tooLong > 0 {
		return fmt.Errorf("secret value has %d line(s) longer than %d bytes; they are not masked", tooLong, MaxSecretLength)
	}
	return nil
}

// Len returns how many distinct values are masked, not counting their base64 and URL forms.
func (m *Masker) Len() int {
	s := m.set.Load()
	return len(s.values) - s.forms
}

// Mask returns b with every secret (including values announced by `::add-mask::` lines in b)
// replaced, treating b as a whole stream.
func (m *Masker) Mask(b []byte) []byte {
	s := maskStream{m: m, lineStart: true}
	_, out := s.cut(bytes.Clone(b), true)
	return out
}

// maskStream masks one generation of one log as it is read. Bytes that might be the beginning
// of a secret (or of an `::add-mask::` line not yet complete) are held back until the next read
// decides, or until the stream is flushed.
type maskStream struct {
	m         *Masker
	hold      []byte // raw bytes held back; they begin at the stream's emit offset
	lineStart bool   // whether hold[0] (or the next byte when hold is empty) starts a line
}

// reset starts a new generation.
func (s *maskStream) reset() { s.hold, s.lineStart = nil, true }

// window returns a buffer of len(hold)+n bytes whose first bytes are the held-back ones; the
// caller fills the rest and passes (a prefix of) it to cut.
func (s *maskStream) window(n int) []byte {
	w := make([]byte, len(s.hold)+n)
	copy(w, s.hold)
	return w
}

// cut decides how much of w (held bytes followed by new ones) can leave now: it returns the
// number of raw bytes consumed and their masked rendition, and keeps the rest as the new hold.
// With final set everything is consumed. The masked rendition of consumed bytes never depends
// on bytes after them, so a chunk boundary never splits a secret.
func (s *maskStream) cut(w []byte, final bool) (int, []byte) {
	s.scanAddMask(w, final)
	set := s.m.set.Load()
	if len(set.values) == 0 && (final || !s.pendingCommand(w)) {
		s.hold = nil
		if len(w) > 0 {
			s.lineStart = w[len(w)-1] == '\n'
		}
		return len(w), w
	}
	matches, partial := set.scan(w)
	b := len(w)
	if !final {
		b = min(partial, s.commandHold(w))
		for _, mt := range matches {
			if mt[0] < b && mt[1] > b {
				b = mt[0]
				break
			}
		}
	}
	out := w[:b]
	if len(matches) > 0 {
		var buf bytes.Buffer
		buf.Grow(b)
		last := 0
		for _, mt := range matches {
			if mt[1] > b {
				break
			}
			buf.Write(w[last:mt[0]])
			buf.WriteString(MaskReplacement)
			last = mt[1]
		}
		buf.Write(w[last:b])
		out = buf.Bytes()
	}
	if b > 0 {
		s.lineStart = w[b-1] == '\n'
	}
	s.hold = bytes.Clone(w[b:])
	return b, out
}

// scanAddMask registers the values of complete `::add-mask::` lines in w (and of the last,
// unterminated line when final).
func (s *maskStream) scanAddMask(w []byte, final bool) {
	var values []string
	defer func() {
		if len(values) > 0 {
			_ = s.m.add(values) // an over-long value cannot be masked; its line is still sent masked as far as possible
		}
	}()
	// The line of each occurrence is found by looking back only as far as the previous one,
	// and its first non-blank byte once per line: a window full of occurrences on one line
	// costs its length, not its length times theirs.
	ls, seen := 0, 0         // the start of the line around seen, the position looked back from last
	lineOf, command := -1, 0 // the line whose first non-blank byte is at command
	for from := 0; ; {
		i := bytes.Index(w[from:], []byte(addMaskCommand))
		if i < 0 {
			return
		}
		i += from
		from = i + len(addMaskCommand)
		if nl := bytes.LastIndexByte(w[seen:i], '\n'); nl >= 0 {
			ls = seen + nl + 1
		}
		seen = i
		if ls == 0 && !s.lineStart {
			continue
		}
		if lineOf != ls {
			lineOf, command = ls, len(w)-len(bytes.TrimLeft(w[ls:], " \t"))
		}
		if i != command {
			continue
		}
		end := bytes.IndexByte(w[i:], '\n')
		if end < 0 {
			if !final {
				return
			}
			end = len(w) - i
		}
		if v, ok := parseAddMask(w[i : i+end]); ok {
			values = append(values, v)
		}
	}
}

// pendingCommand reports whether the unterminated last line of w may still become an
// `::add-mask::` command.
func (s *maskStream) pendingCommand(w []byte) bool { return s.commandHold(w) < len(w) }

// commandHold returns where the unterminated last line of w starts when that line may still
// become an `::add-mask::` command (so it must be held back), else len(w). A candidate longer
// than MaxSecretLength plus the command is not held: its value could not be masked anyway.
func (s *maskStream) commandHold(w []byte) int {
	ls := bytes.LastIndexByte(w, '\n') + 1
	if ls == 0 && !s.lineStart {
		return len(w)
	}
	line := bytes.TrimLeft(w[ls:], " \t")
	if len(w)-ls > MaxSecretLength+64 {
		return len(w)
	}
	if len(line) == 0 && ls == len(w) {
		return len(w)
	}
	if bytes.HasPrefix(line, []byte(addMaskCommand)) || bytes.HasPrefix([]byte(addMaskCommand), line) {
		return ls
	}
	return len(w)
}

// parseAddMask parses one line (without its newline) as `::add-mask[ props]::VALUE`, the way
// the GitHub Actions runner does: leading blanks are ignored and the value is unescaped.
func parseAddMask(line []byte) (string, bool) {
	line = bytes.TrimSuffix(bytes.TrimLeft(line, " \t"), []byte("\r"))
	rest, ok := bytes.CutPrefix(line, []byte(addMaskCommand))
	if !ok {
		return "", false
	}
	switch {
	case bytes.HasPrefix(rest, []byte("::")):
		rest = rest[2:]
	case len(rest) > 0 && rest[0] == ' ':
		i := bytes.Index(rest, []byte("::"))
		if i < 0 {
			return "", false
		}
		rest = rest[i+2:]
	default:
		return "", false
	}
	v := bytes.ReplaceAll(rest, []byte("%0D"), []byte("\r"))
	v = bytes.ReplaceAll(v, []byte("%0A"), []byte("\n"))
	v = bytes.ReplaceAll(v, []byte("%25"), []byte("%"))
	return string(v), true
}

// scan returns find(w) and partialSuffix(w): for more than naiveSecrets values, with the set's
// secretAutomaton and a search of the values it does not cover yet.
func (set *secretSet) scan(w []byte) ([][2]int, int) {
	if len(set.values) <= naiveSecrets {
		return set.find(w), set.partialSuffix(w)
	}
	a := set.auto.Load()
	if a == nil || (a.covered < len(set.values) &&
		set.naive.Add(int64(len(set.values)-a.covered)*int64(len(w)+64)) > rebuildWork*set.size) {
		a = set.rebuild()
	}
	tail := set.values[a.covered:]
	if len(tail) == 0 {
		return a.scan(w, nil)
	}
	picked, partial := a.scan(w, occurrences(tail, w))
	return picked, min(partial, partialSuffixOf(tail, w))
}

// rebuild builds the automaton over all the set's values, unless another caller just did.
func (set *secretSet) rebuild() *secretAutomaton {
	set.build.Lock()
	defer set.build.Unlock()
	if a := set.auto.Load(); a != nil && a.covered == len(set.values) {
		return a
	}
	a := newSecretAutomaton(set.values)
	set.builds.Add(1)
	set.auto.Store(a)
	set.naive.Store(0)
	return a
}

// find returns the leftmost-longest non-overlapping occurrences of the secrets in w, as
// [start, end) pairs in increasing order.
func (set *secretSet) find(w []byte) [][2]int {
	all := occurrences(set.values, w)
	if len(all) == 0 {
		return nil
	}
	picked := all[:0]
	end := 0
	for _, m := range all {
		if m[0] >= end {
			picked = append(picked, m)
			end = m[1]
		}
	}
	return picked
}

// occurrences returns every occurrence of values in w, overlapping ones included, ordered by
// start and, at one start, longest first.
func occurrences(values [][]byte, w []byte) [][2]int {
	var all [][2]int
	for _, v := range values {
		for from := 0; ; {
			i := bytes.Index(w[from:], v)
			if i < 0 {
				break
			}
			all = append(all, [2]int{from + i, from + i + len(v)})
			from += i + 1
		}
	}
	slices.SortFunc(all, func(a, b [2]int) int {
		if a[0] != b[0] {
			return a[0] - b[0]
		}
		return b[1] - a[1]
	})
	return all
}

// partialSuffixOf is partialSuffix for values.
func partialSuffixOf(values [][]byte, w []byte) int {
	longest := 0
	for _, v := range values {
		longest = max(longest, len(v))
	}
	for i := max(0, len(w)-longest+1); i < len(w); i++ {
		tail := w[i:]
		for _, v := range values {
			if len(v) > len(tail) && bytes.HasPrefix(v, tail) {
				return i
			}
		}
	}
	return len(w)
}

// partialSuffix returns where the longest suffix of w that is a proper prefix of a secret
// starts (len(w) when there is none): those bytes must wait for the next read.
func (set *secretSet) partialSuffix(w []byte) int { return partialSuffixOf(set.values, w) }
