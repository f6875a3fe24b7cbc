package plan

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// secretAlphabet makes secrets and texts that overlap, share prefixes and hold every character
// some form escapes: quotes, backslashes, <>&, |, backticks, newlines, C0 and C1 controls.
var secretAlphabet = []string{"a", "b", "c", "<", ">", "&", `"`, `\`, "|", "`", "\n", "\r", "\x01", "é", "\u0085", "-", " "}

func randomSecret(rng *rand.Rand, long string) string {
	var b strings.Builder
	if rng.IntN(8) == 0 {
		// Longer than matchPrefix, sharing its head with others: found by the head, then
		// compared whole.
		b.WriteString(long)
	}
	for range 1 + rng.IntN(9) {
		b.WriteString(secretAlphabet[rng.IntN(len(secretAlphabet))])
	}
	return b.String()
}

// randomSecretText is text made of secrets, their escaped forms, pieces of them, the mask and
// characters of the alphabet.
func randomSecretText(rng *rand.Rand, secrets []string) string {
	var b strings.Builder
	for range rng.IntN(12) {
		switch n := rng.IntN(10); {
		case n < 3 && len(secrets) > 0:
			b.WriteString(secrets[rng.IntN(len(secrets))])
		case n < 6 && len(secrets) > 0:
			forms := secretTestForms(secrets[rng.IntN(len(secrets))])
			f := forms[rng.IntN(len(forms))]
			if rng.IntN(3) == 0 {
				i, j := rng.IntN(len(f)+1), rng.IntN(len(f)+1)
				f = f[min(i, j):max(i, j)]
			}
			b.WriteString(f)
		case n < 7:
			b.WriteString(Masked)
		case n < 8:
			b.WriteString([]string{".", "[", `["`, `"]`, "]", "[0]"}[rng.IntN(6)])
		default:
			b.WriteString(secretAlphabet[rng.IntN(len(secretAlphabet))])
		}
	}
	return b.String()
}

// secretTestForms are the forms of sec a value may carry: its encoded forms, their Go-quoted
// insides, and its base64 and URL forms.
func secretTestForms(sec string) []string {
	var forms []string
	for _, f := range encodedForms(sec) {
		q := strconv.Quote(f)
		forms = append(forms, f, q[1:len(q)-1])
	}
	return append(append(forms, Base64Forms(sec)...), URLForms(sec)...)
}

// naiveSecrets masks as secretSet does, with strings.Contains and a strings.Replacer over the
// patterns of its matcher: the oracle the automaton is held to.
type naiveSecrets struct {
	values       map[string]struct{}
	exact, inner []string
	replacer     *strings.Replacer
}

func newNaiveSecrets(s *secretSet) *naiveSecrets {
	n := &naiveSecrets{values: s.values}
	var text []string
	for _, p := range s.matcher().pats {
		if p.kinds&kindExact != 0 {
			n.exact = append(n.exact, p.text)
		}
		if p.kinds&kindInner != 0 {
			n.inner = append(n.inner, p.text)
		}
		if p.kinds&kindText != 0 {
			text = append(text, p.text)
		}
	}
	sort.Slice(text, func(i, j int) bool {
		if len(text[i]) != len(text[j]) {
			return len(text[i]) > len(text[j])
		}
		return text[i] < text[j]
	})
	var pairs []string
	for _, t := range text {
		pairs = append(pairs, t, Masked)
	}
	n.replacer = strings.NewReplacer(pairs...)
	return n
}

func (n *naiveSecrets) sensitive(v string) bool {
	if v == "" {
		return false
	}
	if _, ok := n.values[v]; ok {
		return true
	}
	for _, e := range n.exact {
		if v == e {
			return true
		}
	}
	for _, e := range n.inner {
		if strings.Contains(v, e) {
			return true
		}
	}
	return false
}

func (n *naiveSecrets) redactText(v string) string {
	if v == "" || len(n.values) == 0 {
		return v
	}
	if _, ok := n.values[v]; ok {
		return Masked
	}
	return n.replacer.Replace(v)
}

// TestSecretMatcherMatchesReplacers holds the automaton to strings.Contains and a
// strings.Replacer over the same patterns, on random secret sets and texts built to overlap
// them: sensitive and redactText give the same answers, byte for byte.
func TestSecretMatcherMatchesReplacers(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	long := strings.Repeat("-----BEGIN KEY-----\\nMIIE", 4)[:matchPrefix+3]
	for round := range 400 {
		sec := newSecretSet()
		var secrets []string
		for range rng.IntN(12) {
			v := randomSecret(rng, long)
			secrets = append(secrets, v)
			sec.add(v)
		}
		old := newNaiveSecrets(sec)
		for range 40 {
			text := randomSecretText(rng, secrets)
			if got, want := sec.sensitive(text), old.sensitive(text); got != want {
				t.Fatalf("round %d, secrets %q: sensitive(%q) = %v, want %v", round, secrets, text, got, want)
			}
			if got, want := sec.redactText(text), old.redactText(text); got != want {
				t.Fatalf("round %d, secrets %q: redactText(%q) = %q, want %q", round, secrets, text, got, want)
			}
		}
	}
}

// TestSecretMatcherReleasedAfterClassify: the matcher a stack's redaction needs does not stay
// on the stack (with tens of thousands of secrets it is tens of megabytes).
func TestSecretMatcherReleasedAfterClassify(t *testing.T) {
	s, err := Classify("secrets", "plan.json", strings.NewReader(planSecretsJSON))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.secrets.values) == 0 {
		t.Fatal("no secrets collected; the test would prove nothing")
	}
	if s.secrets.match != nil {
		t.Error("the stack keeps its secret matcher after Classify")
	}
	s, err = Classify("bad", "plan.json", strings.NewReader(`{"format_version":"1.2","variables":{"s":{"value":"hunter2"}},"resource_changes":[{"address":"x","change":{"actions":["bogus"]}}]}`))
	if err == nil {
		t.Fatal("a plan with unknown actions was accepted")
	}
	if s.secrets.match != nil {
		t.Error("an unclassified stack keeps its secret matcher")
	}
}

// oracleStacks are the recorded plans, the secret fixtures and generated plans, classified.
func oracleStacks(t *testing.T) []*Stack {
	t.Helper()
	var stacks []*Stack
	paths, _ := filepath.Glob(filepath.Join(planTofuDir, "*", "plan.json"))
	for _, name := range []string{"leak-keys.json", "leak-escaped.json", "escape-output.json", "forget-output.json"} {
		paths = append(paths, filepath.Join("testdata", name))
	}
	for _, p := range paths {
		s, _ := ClassifyFile(filepath.Base(filepath.Dir(p))+"/"+filepath.Base(p), p)
		stacks = append(stacks, s)
	}
	s, err := Classify("secrets", "plan.json", strings.NewReader(planSecretsJSON))
	if err != nil {
		t.Fatal(err)
	}
	stacks = append(stacks, s)
	for i := range 3 {
		var buf bytes.Buffer
		if _, err := writePlan(&buf, genOptions{Changes: 120, Seed: uint64(i), Payload: 300, Secret: fmt.Sprintf("oracle-secret-%d", i), Outputs: 3, Drift: 2}); err != nil {
			t.Fatal(err)
		}
		s, err := Classify(fmt.Sprintf("stacks/gen-%d", i), "plan.json", &buf)
		if err != nil {
			t.Fatal(err)
		}
		stacks = append(stacks, s)
	}
	return stacks
}

// oracleReport is a report of some of stacks, each with its secrets and a few pieces of what
// the other stacks show as secrets of its own: a value secret in one stack is masked in all.
func oracleReport(t *testing.T, rng *rand.Rand, stacks []*Stack) *Report {
	t.Helper()
	r := &Report{ExecutionURL: planExecutionURL}
	var shown []string
	for _, s := range stacks {
		var text strings.Builder
		if err := Text(&text, &Report{Stacks: []*Stack{s}}, false); err != nil {
			t.Fatal(err)
		}
		shown = append(shown, text.String())
	}
	for _, i := range rng.Perm(len(stacks))[:1+rng.IntN(len(stacks))] {
		c := *stacks[i]
		c.secrets = newSecretSet()
		c.secrets.merge(stacks[i].secrets)
		for range rng.IntN(4) {
			other := shown[rng.IntN(len(shown))]
			a := rng.IntN(len(other))
			c.secrets.add(other[a:min(len(other), a+1+rng.IntN(12))])
		}
		r.Stacks = append(r.Stacks, &c)
	}
	return r
}

// planFirstDiff shows where got and want first differ.
func planFirstDiff(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	from := max(0, i-200)
	return fmt.Sprintf("at byte %d of %d (want %d):\n got …%s…\nwant …%s…", i, len(got), len(want),
		got[from:min(len(got), i+200)], want[from:min(len(want), i+200)])
}

// TestRendersShareTheUnionOfSecrets: the runner renders a report three times (Text, Comment,
// Markdown); the union of its stacks' secrets and its matcher are made once for the three, and
// again only when the stacks change. With 20,000 secrets, rendering the three a second time
// allocates a fraction of the first time (before, every render merged the union and built
// its replacers anew).
func TestRendersShareTheUnionOfSecrets(t *testing.T) {
	r := benchSecretReport(20, 1000, 1)
	renders := func() {
		if err := Text(io.Discard, r, false); err != nil {
			t.Fatal(err)
		}
		_ = Comment(r)
		_ = Markdown(r)
	}
	first := planAllocated(renders)
	second := planAllocated(renders)
	if second*4 > first {
		t.Errorf("the second Text+Comment+Markdown allocated %d bytes, the first %d: the union of the secrets is made again", second, first)
	}
	set := r.secrets()
	if set.match == nil || r.secrets() != set {
		t.Fatal("the union of the secrets is not kept with its matcher")
	}
	r.Stacks = r.Stacks[1:]
	if r.secrets() == set {
		t.Error("the union of the secrets is kept after the stacks changed")
	}
}

// planAllocated runs f and returns the bytes it allocated.
func planAllocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestRendersOfOneReportAtOnce: renders share the report's union of secrets; run with -race.
func TestRendersOfOneReportAtOnce(t *testing.T) {
	r := benchSecretReport(30, 50, 3)
	want := Comment(r)
	r.union = nil
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got string
			switch i % 3 {
			case 0:
				got = Comment(r)
			case 1:
				got = Markdown(r)
			default:
				var b strings.Builder
				if err := Text(&b, r, false); err != nil {
					t.Error(err)
				}
				got = b.String()
			}
			if i%3 == 0 && got != want {
				t.Error("a comment rendered alongside other renders differs")
			}
		}()
	}
	wg.Wait()
}

// TestPlainSecretsHaveOneForm: a secret that plainSecret passes is its only encoded form, as
// computing them finds; every byte is tried, alone and inside a secret.
func TestPlainSecretsHaveOneForm(t *testing.T) {
	for c := range 256 {
		for _, sec := range []string{string(rune(c)), "ab" + string([]byte{byte(c)}) + "cd", "x" + string(rune(c)) + "-y"} {
			if !plainSecret(sec) {
				continue
			}
			if got := encodeAll(sec); len(got) != 1 || got[0] != sec {
				t.Errorf("plain secret %q has encoded forms %q", sec, got)
			}
		}
	}
	for _, sec := range []string{`a"b`, `a\b`, "a<b", "a>b", "a&b", "a\nb", "a\x7fb", "é", "a\u0085"} {
		if plainSecret(sec) {
			t.Errorf("%q passes as plain", sec)
		}
	}
}

// FuzzSecretMatcher holds the masking to the naive one on arbitrary secrets (separated by NUL)
// and text.
func FuzzSecretMatcher(f *testing.F) {
	f.Add("hunter2\x00pa<ss|wo\"rd99", `x["hunter2"].pa\u003css\|wo\"rd99 (sensitive value)`)
	f.Add(strings.Repeat("k", 70)+"\x00"+strings.Repeat("k", 66), strings.Repeat("k", 200))
	f.Fuzz(func(t *testing.T, secrets, text string) {
		sec := newSecretSet()
		for _, v := range strings.Split(secrets, "\x00") {
			sec.add(v)
		}
		old := newNaiveSecrets(sec)
		if got, want := sec.sensitive(text), old.sensitive(text); got != want {
			t.Fatalf("sensitive(%q) = %v, want %v", text, got, want)
		}
		if got, want := sec.redactText(text), old.redactText(text); got != want {
			t.Fatalf("redactText(%q) = %q, want %q", text, got, want)
		}
	})
}

// A value added to a stack's set after a render is masked by the next render: the report's
// cached union of secrets notices that a set grew, not only that the sets changed.
func TestRendersSeeASecretAddedAfterARender(t *testing.T) {
	s := &Stack{Name: "stacks/a", Class: "mutating", Destructive: []Change{}, Why: []string{"token tok-SECRET-2 rotated"}, secrets: newSecretSet()}
	s.secrets.add("tok-SECRET-1")
	r := &Report{Stacks: []*Stack{s}}
	_ = Comment(r)
	s.secrets.add("tok-SECRET-2")
	var text strings.Builder
	if err := Text(&text, r, false); err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{"comment": Comment(r), "markdown": Markdown(r), "text": text.String()} {
		if strings.Contains(out, "tok-SECRET-2") {
			t.Fatalf("%s shows a secret added after the first render:\n%s", name, out)
		}
	}
}
