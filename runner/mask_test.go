package runner

import (
	"bytes"
	"encoding/base64"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// maskStreamAll feeds data through a stream in the given piece sizes and returns the masked
// output, checking that consumed raw lengths add up.
func maskStreamAll(t *testing.T, m *Masker, data []byte, pieces []int) []byte {
	t.Helper()
	s := maskStream{m: m, lineStart: true}
	var out []byte
	consumed := 0
	pos := 0
	for _, n := range pieces {
		n = min(n, len(data)-pos)
		w := s.window(n)
		copy(w[len(w)-n:], data[pos:pos+n])
		pos += n
		c, o := s.cut(w, false)
		consumed += c
		out = append(out, o...)
	}
	w := s.window(len(data) - pos)
	copy(w[len(w)-(len(data)-pos):], data[pos:])
	c, o := s.cut(w, true)
	consumed += c
	out = append(out, o...)
	if consumed != len(data) {
		t.Fatalf("stream consumed %d raw bytes of %d", consumed, len(data))
	}
	return out
}

func TestMaskReplacesSecretsAcrossEveryBoundary(t *testing.T) {
	m := NewMasker("hunter2-v1", "hunter2", "abc", "bcd", "x")
	data := []byte("pw=hunter2-v1; pw=hunter2; abcd bcd xx hunter")
	want := m.Mask(data)
	if bytes.Contains(want, []byte("hunter2")) || bytes.Contains(want, []byte("bcd")) || bytes.Contains(want, []byte("x")) {
		t.Fatalf("whole masking leaked: %q", want)
	}
	if string(want) != "pw=***; pw=***; ***d *** ****** hunter" {
		t.Fatalf("whole masking = %q", want)
	}
	// Every split point, and every pair of split points, yields the same output.
	for i := 0; i <= len(data); i++ {
		for j := i; j <= len(data); j++ {
			got := maskStreamAll(t, m, data, []int{i, j - i})
			if !bytes.Equal(got, want) {
				t.Fatalf("split at %d,%d: %q, want %q", i, j, got, want)
			}
		}
	}
}

func TestMaskRandomizedStreamsEqualWholeMasking(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for run := 0; run < 2000; run++ {
		alphabet := []byte("ab\n:")
		var secrets []string
		for range 1 + r.IntN(4) {
			s := make([]byte, 1+r.IntN(6))
			for i := range s {
				s[i] = alphabet[r.IntN(2)]
			}
			secrets = append(secrets, string(s))
		}
		m := NewMasker(secrets...)
		data := make([]byte, r.IntN(200))
		for i := range data {
			data[i] = alphabet[r.IntN(len(alphabet))]
		}
		var pieces []int
		for range r.IntN(10) {
			pieces = append(pieces, r.IntN(40))
		}
		want := m.Mask(data)
		got := maskStreamAll(t, m, data, pieces)
		if !bytes.Equal(got, want) {
			t.Fatalf("run %d secrets %q data %q pieces %v:\n got %q\nwant %q", run, secrets, data, pieces, got, want)
		}
	}
}

func TestMaskAddMaskCommand(t *testing.T) {
	data := []byte("before s3cr3t\n  ::add-mask::s3cr3t\n::add-mask key=v::multi%0Aline%25\nnow s3cr3t and line% and multi\n::add-masks::nope\nnope\n")
	for cut := 0; cut <= len(data); cut++ {
		m := NewMasker()
		got := string(maskStreamAll(t, m, data, []int{cut}))
		// The value is masked from its announcement on; an earlier occurrence read in the same
		// window may be masked too (over-masking is harmless). The announcement of the
		// multi-line value is its URL-encoded form, masked whole.
		want := "::add-mask::***\n::add-mask key=v::***\nnow *** and *** and ***\n::add-masks::nope\nnope\n"
		if got != "before s3cr3t\n  "+want && got != "before ***\n  "+want {
			t.Fatalf("cut at %d:\n got %q\nwant ...%q", cut, got, want)
		}
	}
}

func TestMaskTofuSensitiveFixture(t *testing.T) {
	plan, err := os.ReadFile(filepath.Join("testdata", "pump", "sensitive-plan.txt"))
	if err != nil {
		t.Fatal(err)
	}
	m := NewMasker("hunter2-v1")
	got := maskStreamAll(t, m, plan, []int{7, 100, 3, 250})
	if bytes.Contains(got, []byte("hunter2")) {
		t.Fatalf("sensitive value leaked:\n%s", got)
	}
	if !bytes.Contains(got, []byte(`~ output = "***" -> (known after apply)`)) {
		t.Fatalf("masked plan lost its structure:\n%s", got)
	}
}

func TestMaskAddRefusesOverlongAndIgnoresBlank(t *testing.T) {
	m := NewMasker()
	if err := m.Add(string(bytes.Repeat([]byte("z"), MaxSecretLength+1))); err == nil {
		t.Error("an over-long secret was accepted silently")
	}
	if err := m.Add("  \n\t\r\n"); err != nil || m.Len() != 0 {
		t.Errorf("blank lines registered: len %d err %v", m.Len(), err)
	}
	if err := m.Add("one\r\ntwo\none"); err != nil || m.Len() != 2 {
		t.Errorf("multi-line secret: len %d err %v", m.Len(), err)
	}
}

// FuzzMaskStreamMatchesWhole: however a log is cut into reads, streaming masking emits exactly
// what masking the whole log emits, and never a configured secret.
func FuzzMaskStreamMatchesWhole(f *testing.F) {
	f.Add([]byte("pw=hunter2-v1\nhunter2"), "hunter2", "hunter2-v1", uint64(1))
	f.Add([]byte("abcabcab"), "abc", "cab", uint64(7))
	f.Fuzz(func(t *testing.T, data []byte, s1, s2 string, seed uint64) {
		if bytes.Contains(data, []byte(addMaskCommand)) {
			t.Skip("announced secrets apply from their announcement on, not to the whole log")
		}
		m := NewMasker(s1, s2)
		rng := rand.New(rand.NewPCG(seed, seed))
		var pieces []int
		for range rng.IntN(8) {
			pieces = append(pieces, rng.IntN(len(data)+1))
		}
		want := m.Mask(data)
		if got := maskStreamAll(t, m, data, pieces); !bytes.Equal(got, want) {
			t.Fatalf("pieces %v: got %q want %q", pieces, got, want)
		}
		for _, s := range []string{s1, s2} {
			if v := []byte(s); len(bytes.TrimSpace(v)) > 0 && !bytes.ContainsAny(v, "\r\n") && len(v) >= len(MaskReplacement) && !bytes.Contains([]byte(MaskReplacement), v) && bytes.Contains(want, v) {
				// Replacements can only recreate a secret made of '*' and neighbouring bytes.
				if !bytes.Contains(v, []byte("*")) {
					t.Fatalf("secret %q survives in %q", v, want)
				}
			}
		}
	})
}

// scanAddMaskByLine is scanAddMask as it was, looking back to each occurrence's line start
// and over its blanks again for every occurrence (the oracle of TestScanAddMaskFindsEachLine).
func scanAddMaskByLine(w []byte, lineStart, final bool) []string {
	var values []string
	for from := 0; ; {
		i := bytes.Index(w[from:], []byte(addMaskCommand))
		if i < 0 {
			return values
		}
		i += from
		from = i + len(addMaskCommand)
		ls := bytes.LastIndexByte(w[:i], '\n') + 1
		if ls == 0 && !lineStart {
			continue
		}
		if len(bytes.TrimLeft(w[ls:i], " \t")) != 0 {
			continue
		}
		end := bytes.IndexByte(w[i:], '\n')
		if end < 0 {
			if !final {
				return values
			}
			end = len(w) - i
		}
		if v, ok := parseAddMask(w[i : i+end]); ok {
			values = append(values, v)
		}
	}
}

// Announcements are found where they were before on random windows of commands, blanks,
// newlines and values.
func TestScanAddMaskFindsEachLine(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	tokens := []string{"::add-mask::", "::add-mask ", "p=1::", " ", "\t", "\n", "x", "v1", "%0A"}
	for run := 0; run < 3000; run++ {
		var w []byte
		for range r.IntN(40) {
			w = append(w, tokens[r.IntN(len(tokens))]...)
		}
		lineStart, final := r.IntN(2) == 0, r.IntN(2) == 0
		want := scanAddMaskByLine(w, lineStart, final)
		m := NewMasker()
		s := maskStream{m: m, lineStart: lineStart}
		s.scanAddMask(w, final)
		var got []string
		for _, v := range m.set.Load().values {
			got = append(got, string(v))
		}
		wantSet := NewMasker(want...) // the same values, split into lines and without blanks or repeats
		var wantValues []string
		for _, v := range wantSet.set.Load().values {
			wantValues = append(wantValues, string(v))
		}
		if !slices.Equal(got, wantValues) {
			t.Fatalf("window %q lineStart %v final %v: registered %q, want %q", w, lineStart, final, got, wantValues)
		}
	}
}

// BenchmarkScanAddMaskOneLine: a 256 KiB read that is one line of `x::add-mask::`, and one of
// 128 KiB of blanks, a letter, then `::add-mask` repeated: every occurrence looked back to the
// line's start, or over its blanks, again.
func BenchmarkScanAddMaskOneLine(b *testing.B) {
	for _, c := range []struct{ name, prefix, unit string }{
		{"x-commands", "", "x::add-mask::"},
		{"blanks-then-commands", string(bytes.Repeat([]byte(" "), 128<<10)) + "y", "::add-mask"},
	} {
		w := []byte(c.prefix)
		for len(w) < 256<<10 {
			w = append(w, c.unit...)
		}
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(w)))
			for b.Loop() {
				s := maskStream{m: NewMasker(), lineStart: true}
				s.scanAddMask(w, false)
			}
		})
	}
}

// TestMaskBase64OfSecret: tofu's own output of a plan that base64-encodes a secret (recorded
// with real OpenTofu) shows none of its base64 forms once masked, at any of the three byte
// alignments; a secret too short for base64 forms masks only itself.
func TestMaskBase64OfSecret(t *testing.T) {
	out, err := os.ReadFile(filepath.Join("..", "testdata", "tofu", "base64-secret", "plan-out.stdout"))
	if err != nil {
		t.Fatal(err)
	}
	const secret = "correct-horse-battery"
	encoded := []string{
		base64.StdEncoding.EncodeToString([]byte(secret)),
		base64.StdEncoding.EncodeToString([]byte(":" + secret)),
		base64.StdEncoding.EncodeToString([]byte("u:" + secret)),
	}
	for _, e := range encoded {
		if !bytes.Contains(out, []byte(e)) {
			t.Fatalf("the recording does not show %s; the test would prove nothing", e)
		}
	}
	m := NewMasker(secret)
	got := maskStreamAll(t, m, out, []int{5, 300, 17})
	for _, e := range encoded {
		if bytes.Contains(got, []byte(strings.TrimRight(e, "=")[4:len(e)-4])) {
			t.Errorf("the middle of %s survives:\n%s", e, got)
		}
	}
	// What is left is what the bytes before and after the secret decide.
	if !bytes.Contains(got, []byte(`+ basic_auth = "Om***Q=="`)) || !bytes.Contains(got, []byte(`+ user_auth  = "dTp***k="`)) || m.Len() != 1 {
		t.Errorf("len %d; masked output:\n%s", m.Len(), got)
	}
	short := NewMasker("abcd")
	if got := short.Mask([]byte("YWJjZA== abcd")); string(got) != "YWJjZA== ***" {
		t.Errorf("a 4-byte secret masked %q", got)
	}
}

// TestMaskURLAndLinesOfSecret: tofu's own output of plans recorded with real OpenTofu that let
// a secret out URL-encoded (urlencode) and a multi-line secret out YAML-encoded (each line
// indented) shows neither once masked; the path-escaped form is masked too.
func TestMaskURLAndLinesOfSecret(t *testing.T) {
	dir := filepath.Join("..", "internal", "plan", "testdata", "render")
	out, err := os.ReadFile(filepath.Join(dir, "urlencode-secret", "plan.txt"))
	if err != nil {
		t.Fatal(err)
	}
	const pw, query = "p@ss/w0rd#1", "p%40ss%2Fw0rd%231"
	if !bytes.Contains(out, []byte(query)) {
		t.Fatalf("the recording does not show %s; the test would prove nothing", query)
	}
	m := NewMasker(pw)
	got := maskStreamAll(t, m, append(out, "\npath: https://svc/u/p@ss%2Fw0rd%231/x\n"...), []int{7, 300, 13})
	for _, leak := range []string{query, "p@ss%2Fw0rd%231"} {
		if bytes.Contains(got, []byte(leak)) {
			t.Errorf("the masked output shows %s:\n%s", leak, got)
		}
	}
	if !bytes.Contains(got, []byte("https://svc/login?pw=***")) || m.Len() != 1 {
		t.Errorf("len %d; masked output:\n%s", m.Len(), got)
	}

	out, err = os.ReadFile(filepath.Join(dir, "yamlencode-secret", "plan.txt"))
	if err != nil {
		t.Fatal(err)
	}
	const pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\nMsW4d1k2vT9pQ0aXc3Lr5eNf8yZ6hJ1u\n-----END PRIVATE KEY-----\n"
	lines := strings.Split(strings.TrimSpace(pem), "\n")[1:4]
	for _, l := range lines {
		if !bytes.Contains(out, []byte(l)) {
			t.Fatalf("the recording does not show the line %s; the test would prove nothing", l)
		}
	}
	got = maskStreamAll(t, NewMasker(pem), out, []int{5, 300, 17})
	for _, l := range lines {
		if bytes.Contains(got, []byte(l)) {
			t.Errorf("the masked output shows the line %s:\n%s", l, got)
		}
	}
}
