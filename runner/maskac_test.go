package runner

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

// naiveSet is the secretSet of values searched one value at a time (find and partialSuffix),
// the oracle the automaton is held to.
func naiveSet(values [][]byte) *secretSet {
	return &secretSet{values: values}
}

// randomSecrets returns k distinct non-empty values of at most maxLen bytes over alphabet.
func randomSecrets(r *rand.Rand, k, maxLen int, alphabet string) [][]byte {
	var out [][]byte
	for tries := 0; len(out) < k && tries < 100*k; tries++ {
		v := make([]byte, 1+r.IntN(maxLen))
		for i := range v {
			v[i] = alphabet[r.IntN(len(alphabet))]
		}
		if !slices.ContainsFunc(out, func(o []byte) bool { return bytes.Equal(o, v) }) {
			out = append(out, v)
		}
	}
	return out
}

// The automaton finds what searching for each value in turn finds, occurrence for occurrence,
// and holds back the same partial suffix: small alphabets make values overlap, nest and share
// prefixes; long values and windows make the scan's ring of pending starts wrap.
func TestSecretAutomatonMatchesNaiveSearch(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	shapes := []struct {
		k, maxLen, window int
		alphabet          string
	}{
		{1, 3, 40, "ab"},
		{5, 4, 60, "ab"},
		{20, 6, 200, "abc"},
		{40, 8, 300, "ab\n"},
		{30, 70, 2000, "ab"},
		{200, 12, 3000, "abcd"},
	}
	for _, sh := range shapes {
		for run := 0; run < 300; run++ {
			values := randomSecrets(r, 1+r.IntN(sh.k), sh.maxLen, sh.alphabet)
			w := make([]byte, r.IntN(sh.window+1))
			for i := range w {
				w[i] = sh.alphabet[r.IntN(len(sh.alphabet))]
			}
			if len(w) > 0 && r.IntN(3) == 0 { // end inside a value now and then
				v := values[r.IntN(len(values))]
				copy(w[max(0, len(w)-len(v)+1):], v)
			}
			set := naiveSet(values)
			wantM, wantP := set.find(w), set.partialSuffix(w)
			gotM, gotP := newSecretAutomaton(values).scan(w, nil)
			if !slices.Equal(gotM, wantM) || gotP != wantP {
				t.Fatalf("values %q window %q:\n got %v partial %d\nwant %v partial %d", values, w, gotM, gotP, wantM, wantP)
			}
		}
	}
}

// An automaton over the first values and a one-at-a-time search of the others (values
// announced since it was built) find together what searching all of them finds.
func TestSecretAutomatonWithUncoveredValuesMatchesNaiveSearch(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for run := 0; run < 2000; run++ {
		values := randomSecrets(r, naiveSecrets+1+r.IntN(30), 1+r.IntN(9), "abc")
		covered := 1 + r.IntN(len(values))
		w := make([]byte, r.IntN(300))
		for i := range w {
			w[i] = "abc"[r.IntN(3)]
		}
		set := naiveSet(values)
		set.builds = new(atomic.Int64)
		set.size = 1 << 40 // never worth a rebuild here
		set.auto.Store(newSecretAutomaton(values[:covered]))
		wantM, wantP := set.find(w), set.partialSuffix(w)
		gotM, gotP := set.scan(w)
		if !slices.Equal(gotM, wantM) || gotP != wantP {
			t.Fatalf("values %q (first %d in the automaton) window %q:\n got %v partial %d\nwant %v partial %d", values, covered, w, gotM, gotP, wantM, wantP)
		}
		if set.builds.Load() != 0 {
			t.Fatal("rebuilt although the search stayed cheap")
		}
	}
}

// Values announced one read at a time, each read also carrying some log: the automaton is
// rebuilt a few times in all, not once per announcing read (4,000 reads rebuilt it 4,000
// times: 74 s), and every value is masked from its announcement on.
func TestMaskTrickledAnnouncementsRebuildRarely(t *testing.T) {
	m := NewMasker()
	s := maskStream{m: m, lineStart: true}
	var out []byte
	const n = 2000
	for j := range n {
		read := fmt.Appendf(nil, "::add-mask::value-%05d-%x\nrefreshing resource value-%05d-%x done\n", j, j*7919, j/2, (j/2)*7919)
		w := s.window(len(read))
		copy(w[len(s.hold):], read)
		_, o := s.cut(w, false)
		out = append(out, o...)
	}
	_, o := s.cut(s.window(0), true)
	out = append(out, o...)
	if bytes.Contains(out, []byte("value-")) {
		i := bytes.Index(out, []byte("value-"))
		t.Fatalf("a value survives: %q", out[max(0, i-60):min(len(out), i+60)])
	}
	if got := bytes.Count(out, []byte("refreshing resource *** done\n")); got != n {
		t.Fatalf("%d masked lines, want %d", got, n)
	}
	if b := m.set.Load().builds.Load(); b > 40 {
		t.Fatalf("the automaton was built %d times for %d announcing reads", b, n)
	}
}

// A masker with more values than naiveSecrets (so the automaton masks) emits, however the log
// is cut into reads, what masking the whole log emits, and no value survives it.
func TestMaskManySecretsStreamEqualsWhole(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for run := 0; run < 300; run++ {
		values := randomSecrets(r, naiveSecrets+1+r.IntN(40), 9, "abc")
		var names []string
		for _, v := range values {
			names = append(names, string(v))
		}
		m := NewMasker(names...)
		data := make([]byte, r.IntN(400))
		for i := range data {
			data[i] = "abc\n"[r.IntN(4)]
		}
		var pieces []int
		for range r.IntN(10) {
			pieces = append(pieces, r.IntN(60))
		}
		want := m.Mask(data)
		if got := maskStreamAll(t, m, data, pieces); !bytes.Equal(got, want) {
			t.Fatalf("run %d values %q data %q pieces %v:\n got %q\nwant %q", run, values, data, pieces, got, want)
		}
		for _, v := range values {
			if bytes.Contains(want, v) {
				t.Fatalf("run %d: %q survives in %q", run, v, want)
			}
		}
	}
}

// Thousands of values announced by `::add-mask::` lines, then a log that quotes some of them:
// each is masked, and the announcements are registered once per read, not once per line.
func TestMaskManyAnnouncedSecrets(t *testing.T) {
	var log strings.Builder
	for i := range 3000 {
		fmt.Fprintf(&log, "::add-mask::token-%05d-x\n", i)
	}
	for i := 0; i < 3000; i += 7 {
		fmt.Fprintf(&log, "using token-%05d-x now\n", i)
	}
	m := NewMasker()
	got := maskStreamAll(t, m, []byte(log.String()), []int{64 << 10, 100, 64 << 10})
	if m.Len() != 3000 {
		t.Fatalf("%d values registered, want 3000", m.Len())
	}
	if bytes.Contains(got, []byte("token-")) {
		i := bytes.Index(got, []byte("token-"))
		t.Fatalf("a value survives: %q", got[max(0, i-40):min(len(got), i+40)])
	}
	if n := bytes.Count(got, []byte("using *** now\n")); n != 429 {
		t.Fatalf("%d masked uses, want 429", n)
	}
}

// BenchmarkMaskSecrets: masking a 4 MiB log in 256 KiB reads (the pump's chunk) with k values
// announced, searched one at a time (naive) and with the automaton; MB/s is the figure. The
// crossover sets naiveSecrets.
func BenchmarkMaskSecrets(b *testing.B) {
	var log bytes.Buffer
	for log.Len() < 4<<20 {
		fmt.Fprintf(&log, "aws_instance.web[%d]: Refreshing state... [id=i-%012x] token-%05d-x\n", log.Len()%977, log.Len(), log.Len()%100000)
	}
	data := log.Bytes()
	for _, k := range []int{1, 4, 8, 16, 64, 1000} {
		var values [][]byte
		for i := range k {
			values = append(values, fmt.Appendf(nil, "token-%05d-x", i*37))
		}
		set := naiveSet(values)
		auto := newSecretAutomaton(values)
		for _, side := range []string{"naive", "automaton"} {
			b.Run(fmt.Sprintf("%s/k=%d", side, k), func(b *testing.B) {
				b.SetBytes(int64(len(data)))
				for b.Loop() {
					for off := 0; off < len(data); off += 256 << 10 {
						w := data[off:min(len(data), off+256<<10)]
						if side == "naive" {
							_, _ = set.find(w), set.partialSuffix(w)
						} else {
							_, _ = auto.scan(w, nil)
						}
					}
				}
			})
		}
	}
}
