// Package termsafe is the one sanitizer of text that came from elsewhere (a server's answer, a
// plan's values) before it reaches a terminal: it neutralises every character that could drive
// the terminal or reorder what is shown around it, so that such text can neither hide nor
// forge the lines printed after it.
package termsafe

import "strings"

// Replacement stands in for each neutralised character.
const Replacement = '?'

// Line returns s fit for one line or one table cell: every control character (C0 including
// tab and newline, DEL, C1 and so every escape sequence's introducer), every bidirectional
// control (embeddings, overrides, isolates and marks) and the line and paragraph separators
// become Replacement, and invalid UTF-8 becomes U+FFFD.
func Line(s string) string { return neutralise(s, false) }

// Text is Line for multi-line text: it keeps newlines and tabs.
func Text(s string) string { return neutralise(s, true) }

func neutralise(s string, keepLines bool) string {
	return strings.Map(func(r rune) rune {
		if keepLines && (r == '\n' || r == '\t') {
			return r
		}
		if unsafe(r) {
			return Replacement
		}
		return r
	}, s)
}

// unsafe reports whether r drives a terminal or reorders text.
func unsafe(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, r >= 0x80 && r < 0xa0:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f: // Arabic letter mark, left-to-right and right-to-left marks
		return true
	case r >= 0x202a && r <= 0x202e: // embeddings and overrides
		return true
	case r >= 0x2066 && r <= 0x2069: // isolates
		return true
	case r == 0x2028, r == 0x2029: // line and paragraph separators
		return true
	}
	return false
}
