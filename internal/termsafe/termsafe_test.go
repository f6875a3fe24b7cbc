package termsafe

import "testing"

func TestLineNeutralisesWhatDrivesATerminal(t *testing.T) {
	for in, want := range map[string]string{
		"plain text, ünïcödé 日本":     "plain text, ünïcödé 日本",
		"abc\x1b[8mhidden":           "abc?[8mhidden",
		"\u009b8m C1 CSI":            "?8m C1 CSI",
		"over\rwrite":                "over?write",
		"tab\tnew\nline\x00\x07\x7f": "tab?new?line???",
		"bidi \u202egnp.exe":         "bidi ?gnp.exe",
		"iso \u2066x\u2069 \u200f":   "iso ?x? ?",
		"sep\u2028para\u2029":        "sep?para?",
		"bad \xff utf8":              "bad \ufffd utf8",
	} {
		if got := Line(in); got != want {
			t.Errorf("Line(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTextKeepsLines(t *testing.T) {
	if got, want := Text("a\tb\nc\x1b[31m\r\u202e"), "a\tb\nc?[31m??"; got != want {
		t.Fatalf("Text = %q, want %q", got, want)
	}
}
