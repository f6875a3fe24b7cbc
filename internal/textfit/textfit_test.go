package textfit

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSanitize(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"plain ascii", "plain ascii"},
		{"é ok", "é ok"},
		{"a\xffb", "a\uFFFDb"},
		{"a\xff\xfeb", "a\uFFFDb"}, // one replacement per run of invalid bytes
		{"a\x00b\x00", "a\uFFFDb\uFFFD"},
		{"\xc3", "\uFFFD"}, // a character cut in half
	} {
		if got := Sanitize(tc.in); got != tc.want {
			t.Errorf("Sanitize(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestPrefix(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 5, "abc"},
		{"abc", 3, "abc"},
		{"abc", 2, "ab"},
		{"abc", 0, ""},
		{"aé", 2, "a"},  // é is 2 bytes: cutting at 2 would split it
		{"aé", 3, "aé"}, // fits
		{"日本", 4, "日"},
		{"日本", 2, ""},
	} {
		if got := Prefix(tc.in, tc.n); got != tc.want {
			t.Errorf("Prefix(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
	s := strings.Repeat("é日x", 100)
	for n := range len(s) + 2 {
		got := Prefix(s, n)
		if len(got) > n || !utf8.ValidString(got) || !strings.HasPrefix(s, got) || len(got) < min(n, len(s))-3 {
			t.Fatalf("Prefix(s, %d) = %d bytes, valid %v", n, len(got), utf8.ValidString(got))
		}
	}
}

func TestExcerpt(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"", 10, "(empty)"},
		{" \n\t ", 10, "(empty)"},
		{"a  b\n\tc", 10, "a b c"},
		{"abcdef", 3, "abc…"},
		{"aé", 2, "a…"}, // never splits a character
		{"a\xffb\x00", 20, "a\uFFFDb\uFFFD"},
	} {
		if got := Excerpt([]byte(tc.in), tc.n); got != tc.want {
			t.Errorf("Excerpt(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestWrap(t *testing.T) {
	cause := errors.New("a long answer body")
	err := Wrap("short", cause)
	if err.Error() != "short" || !errors.Is(err, cause) {
		t.Fatalf("Wrap = %q, unwraps to the cause: %v", err, errors.Is(err, cause))
	}
}

func TestInert(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"plain é 日本", "plain é 日本"},
		{"a\nb\r\tc", `a\nb\r\tc`},
		{"sha\u202eevil", `sha\u{202E}evil`},
		{"\u2066x\u2069", `\u{2066}x\u{2069}`},
		{"a\u2028b\x1b[31m", `a\u{2028}b\u{001B}[31m`},
		{"zero\u200bwidth", `zero\u{200B}width`},
	} {
		if got := Inert(tc.in); got != tc.want {
			t.Errorf("Inert(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
