// Package textfit makes text fit where it is stored or sent: valid UTF-8 without NUL bytes (as
// PostgreSQL's text and the server's checks want), and cut to a byte length without splitting a
// character. The server repairs free text with it, the driver fits change reasons to the
// server's bounds before sending them, and plan rendering cuts long values.
package textfit

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Sanitize returns s with each run of bytes that is not valid UTF-8, and each NUL byte,
// replaced by U+FFFD; s itself when there is nothing to replace.
func Sanitize(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// Inert returns s with each character that could forge or reorder the lines it is shown in
// written out instead: \n, \r and \t for those, \u{XXXX} for the other control characters,
// the format characters (the bidirectional overrides and isolates U+202A..U+202E and
// U+2066..U+2069 among them) and the line and paragraph separators. It is s itself when s has
// none.
func Inert(s string) string {
	if !strings.ContainsFunc(s, unsafeRune) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u{%04X}`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func unsafeRune(r rune) bool {
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp)
}

// Prefix returns the longest prefix of s of at most n bytes that does not end inside a
// character (s itself when it is no longer than n).
func Prefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Excerpt renders b, an answer body or a library's message, for an error message: invalid
// UTF-8 and NUL bytes replaced, each run of white space made one space, and cut to at most n
// bytes with "…" marking the cut; "(empty)" when nothing is left.
func Excerpt(b []byte, n int) string {
	s := strings.Join(strings.Fields(Sanitize(string(b))), " ")
	switch {
	case s == "":
		return "(empty)"
	case len(s) > n:
		return Prefix(s, n) + "…"
	}
	return s
}

// Wrap returns an error whose message is msg (already fitted, e.g. with Excerpt) and which
// unwraps to cause: for a library error whose own message may quote a whole answer body.
func Wrap(msg string, cause error) error { return &wrapped{msg: msg, cause: cause} }

type wrapped struct {
	msg   string
	cause error
}

func (e *wrapped) Error() string { return e.msg }
func (e *wrapped) Unwrap() error { return e.cause }
