package plan

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// planSecretsJSON is a hand-written plan with secrets in every kind of sensitive position,
// each also reaching an attribute the plan does not flag.
const planSecretsJSON = `{
  "format_version": "1.2",
  "variables": {"token": {"value": "root-var-secret"}, "region": {"value": "europe-west1"}},
  "planned_values": {"outputs": {"dsn": {"sensitive": true, "value": "planned-output-secret"}}, "root_module": {}},
  "resource_changes": [
    {"address": "x.a", "change": {"actions": ["update"],
      "before": {"hint": "module-default-secret", "copy": "prior-state-secret", "region": "europe-west1", "n": 1},
      "after": {"hint": "root-var-secret", "copy": "a prefix planned-output-secret suffix", "region": "europe-west4", "n": 2},
      "after_unknown": {}, "before_sensitive": {}, "after_sensitive": {}}},
    {"address": "x.b", "change": {"actions": ["create"], "before": null,
      "after": {"password": "flagged-after-secret", "list": ["flagged-list-secret", "visible"]},
      "after_unknown": {}, "before_sensitive": false, "after_sensitive": {"password": true, "list": [true, false]}}},
    {"address": "x.c", "change": {"actions": ["update"],
      "before": {"echo": "flagged-after-secret", "other": "flagged-list-secret"},
      "after": {"echo": "flagged-after-secret-2", "other": "ok"},
      "after_unknown": {}, "before_sensitive": {}, "after_sensitive": {}}}
  ],
  "output_changes": {"out": {"actions": ["update"], "before": "output-before-secret", "after": "output-before-secret!", "before_sensitive": true, "after_sensitive": false}},
  "prior_state": {"values": {"root_module": {"resources": [
    {"address": "x.a", "values": {"key": "prior-state-secret"}, "sensitive_values": {"key": true}}],
    "child_modules": [{"resources": [{"address": "module.m.x.d", "values": {"k": ["deep-child-secret"]}, "sensitive_values": {"k": [true]}}]}]}}},
  "configuration": {"root_module": {
    "variables": {"token": {"sensitive": true}, "region": {}},
    "module_calls": {"db": {"module": {"variables": {"pw": {"sensitive": true, "default": "module-default-secret"}}}}}}}
}`

func TestPlanSecretsInEveryPosition(t *testing.T) {
	s, err := Classify("secrets", "plan.json", strings.NewReader(planSecretsJSON))
	if err != nil {
		t.Fatal(err)
	}
	secrets := []string{"root-var-secret", "planned-output-secret", "flagged-after-secret", "flagged-list-secret",
		"module-default-secret", "prior-state-secret", "output-before-secret", "deep-child-secret"}
	for ext, out := range planRenders(t, &Report{Stacks: []*Stack{s}}) {
		for _, sec := range secrets {
			if strings.Contains(out, sec) {
				t.Errorf("render %s shows %q:\n%s", ext, sec, out)
			}
		}
		// Values that are not secrets stay visible: masking must not hide the plan.
		for _, visible := range []string{`"europe-west1"`, `"visible"`, `"ok"`} {
			if ext != ".json" && !strings.Contains(out, visible) && !strings.Contains(out, strings.Trim(visible, `"`)) {
				t.Errorf("render %s hides the non-secret %s", ext, visible)
			}
		}
	}
	if s.Class != "mutating" || s.Counts.Update != 2 || s.Counts.Create != 1 {
		t.Errorf("class %s counts %+v", s.Class, s.Counts)
	}
}

func TestPlanTextHasNoControlCharactersFromThePlan(t *testing.T) {
	const p = `{"format_version":"1.2","planned_values":{},"resource_changes":[
	  {"address":"x.a[\"\u001b]0;pwned\u0007\"]","change":{"actions":["create"],"after":{"v":"\u001b[2J"}},"action_reason":"\u001b[31m"}],
	  "output_changes":{"o\u001bx":{"actions":["create"],"after":"\u001b[1m"}}}`
	s, err := Classify("stacks/\u001b[5mblink", "plan.json", strings.NewReader(p))
	if err != nil {
		t.Fatal(err)
	}
	s.Why = []string{"changed\u001b[0m"}
	var out strings.Builder
	if err := Text(&out, &Report{Stacks: []*Stack{s}}, false); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out.String(), "\x1b\x07") {
		t.Errorf("plan text drives the terminal: %q", out.String())
	}
	if !strings.Contains(out.String(), "x.a[") {
		t.Errorf("the change is not shown: %q", out.String())
	}
	// An output with an object value is shown attribute by attribute, under its name.
	s, err = ClassifyFile("escout", filepath.Join("testdata", "escape-output.json"))
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := Text(&out, &Report{Stacks: []*Stack{s}}, true); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "\x1b]") || strings.Contains(out.String(), "\x1b[2J") || strings.ContainsRune(out.String(), '\a') {
		t.Errorf("an output name drives the terminal: %q", out.String())
	}
	if !strings.Contains(out.String(), "output.o?]0;pwned") {
		t.Errorf("the output is not shown: %q", out.String())
	}
}

// TestPlanSecretsOutsideValues: secrets that reach names (the index keys of addresses, the keys
// of a map that is not sensitive, an action reason) are names there, shown as the plan writes
// them: no render rewrites an address or a key. Secrets in free text (the error of an
// unreadable plan that quotes an address) are masked there.
func TestPlanSecretsOutsideValues(t *testing.T) {
	var stacks []*Stack
	for _, name := range []string{"leak-keys.json", "leak-escaped.json"} {
		s, err := ClassifyFile(name, filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		stacks = append(stacks, s)
	}
	const bad = `{"format_version":"1.2","variables":{"s":{"value":"hunter2"}},
	  "resource_changes":[{"address":"x.a[\"hunter2\"]","change":{"actions":["bogus"]}}]}`
	s, err := Classify("bad", "plan.json", strings.NewReader(bad))
	if err == nil {
		t.Fatal("a plan with unknown actions was accepted")
	}
	if strings.Contains(err.Error(), "hunter2") || strings.Contains(s.Error, "hunter2") {
		t.Errorf("the error shows the secret: %v", err)
	}
	stacks = append(stacks, s)
	r := &Report{Stacks: stacks}
	var js bytes.Buffer
	if err := JSON(&js, r); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Stacks []struct {
			Changes []Change `json:"changes"`
			Error   string   `json:"error"`
		} `json:"stacks"`
	}
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{`null_resource.a["hunter2"]`, `null_resource.b["pa<ss|wo\"rd99"]`},
		{`null_resource.b["pa<ss|word99&x"]`},
		nil,
	}
	for i, st := range doc.Stacks {
		var got []string
		for _, c := range st.Changes {
			got = append(got, c.Address)
		}
		if !slices.Equal(got, want[i]) {
			t.Errorf("stack %d: addresses %q, want %q as the plan writes them", i, got, want[i])
		}
	}
	if doc.Stacks[0].Changes[1].Reason != "delete_because_hunter2" {
		t.Errorf("the action reason was rewritten: %q", doc.Stacks[0].Changes[1].Reason)
	}
	if strings.Contains(doc.Stacks[2].Error, "hunter2") || !strings.Contains(doc.Stacks[2].Error, Masked) {
		t.Errorf("the error is not masked: %q", doc.Stacks[2].Error)
	}
	var text strings.Builder
	if err := Text(&text, r, false); err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{"text": text.String(), "markdown": Markdown(r), "comment": Comment(r)} {
		if !strings.Contains(out, `null_resource.a["hunter2"]`) || !strings.Contains(out, "tags.hunter2") {
			t.Errorf("%s render rewrote an address or a key:\n%s", name, out)
		}
	}
}

// TestPlanMarkdownHasNoLineBreaksFromThePlan: a CR in an address, a reason or an output name
// would end the markdown line and let the plan add blocks (a fake all-clear heading).
func TestPlanMarkdownHasNoLineBreaksFromThePlan(t *testing.T) {
	const p = `{"format_version":"1.2","planned_values":{},"resource_changes":[
	  {"address":"x.a[\"k\r# All clear\"]","change":{"actions":["delete"],"before":{"v":"1"}},"action_reason":"r\r# fine"}],
	  "output_changes":{"o\r# ok":{"actions":["create"],"after":"v"}}}`
	s, err := Classify("stacks/a\rb", "plan.json", strings.NewReader(p))
	if err != nil {
		t.Fatal(err)
	}
	r := &Report{Stacks: []*Stack{s}}
	for name, out := range map[string]string{"markdown": Markdown(r), "comment": Comment(r)} {
		if strings.ContainsRune(out, '\r') {
			t.Errorf("%s render holds a CR: %q", name, out)
		}
		if !strings.Contains(out, "All clear") {
			t.Errorf("%s render lost the address: %q", name, out)
		}
	}
}

// TestPlanSensitiveJSONEncoded: a secret passed through jsonencode (which writes <, > and & as
// \u003c, \u003e and \u0026) into a nonsensitive() output, once and twice over, recorded with
// OpenTofu 1.12.6, is masked in every render in every form.
func TestPlanSensitiveJSONEncoded(t *testing.T) {
	const dir = planTofuDir + "/sensitive-jsonencode"
	raw, err := os.ReadFile(filepath.Join(dir, "plan.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, []byte(`hunter\\u003c2\\u003e\\u0026v2`)) || !bytes.Contains(raw, []byte(`hunter\\\\u003c2`)) {
		t.Fatal("the fixture no longer carries the re-encoded secret; the test would prove nothing")
	}
	s, err := ClassifyFile("sensitive-jsonencode", filepath.Join(dir, "plan.json"))
	if err != nil {
		t.Fatal(err)
	}
	if s.OutputsChanged != 2 {
		t.Fatalf("outputs changed %d, want 2", s.OutputsChanged)
	}
	for ext, out := range planRenders(t, &Report{Stacks: []*Stack{s}, ExecutionURL: planExecutionURL}) {
		for _, sec := range []string{"hunter<2>&v1", "hunter<2>&v2"} {
			for _, form := range renderedForms(sec) {
				if strings.Contains(out, form) {
					t.Errorf("render %s shows %q (secret %q):\n%s", ext, form, sec, out)
				}
			}
		}
		for _, leak := range []string{"hunter", "u003c2"} {
			if strings.Contains(out, leak) {
				t.Errorf("render %s shows %q:\n%s", ext, leak, out)
			}
		}
		if !strings.Contains(out, "output.doc") && !strings.Contains(out, `"doc"`) {
			t.Errorf("render %s does not show the output", ext)
		}
	}
	// Every form of the secret the plan can carry is masked in a value, and none is shorter
	// than the raw secret's.
	set := newSecretSet()
	set.add("a<b>&c")
	for _, v := range []string{`{"p":"a\u003cb\u003e\u0026c"}`, `"\"a\\u003cb\\u003e\\u0026c\""`, `x a<b>&c`, `["a\u003cb\u003e\u0026c"]`} {
		if !set.sensitive(v) {
			t.Errorf("%q is not masked", v)
		}
	}
}

// shownValues are the values a JSON render shows: every attribute's before and after (and the
// lines of a line diff) of every change, destructive change, drift entry and output, the
// failed checks' messages, the errors and the reasons why a stack runs: what masking covers.
func shownValues(t *testing.T, jsonRender []byte) []string {
	t.Helper()
	var doc struct {
		Stacks []struct {
			Changes, Destructive []struct {
				Attributes []AttrDiff `json:"attributes"`
			}
			DriftChanges []struct {
				Attributes []AttrDiff `json:"attributes"`
			} `json:"drift_changes"`
			Outputs []struct {
				Attributes []AttrDiff `json:"attributes"`
			} `json:"outputs"`
			Checks []CheckResult `json:"failed_checks"`
			Error  string        `json:"error"`
			Why    []string      `json:"why"`
		} `json:"stacks"`
	}
	if err := json.Unmarshal(jsonRender, &doc); err != nil {
		t.Fatalf("the JSON render does not parse: %v", err)
	}
	var out []string
	attrs := func(diffs []AttrDiff) {
		for _, d := range diffs {
			out = append(out, d.Before, d.After)
			for _, l := range d.Lines {
				if l.Op != LineHidden { // "3 unchanged lines": a count, not a value
					out = append(out, l.Text)
				}
			}
		}
	}
	for _, s := range doc.Stacks {
		for _, list := range [][]struct {
			Attributes []AttrDiff `json:"attributes"`
		}{s.Changes, s.Destructive, s.DriftChanges} {
			for _, c := range list {
				attrs(c.Attributes)
			}
		}
		for _, o := range s.Outputs {
			attrs(o.Attributes)
		}
		for _, c := range s.Checks {
			out = append(out, c.Problems...)
		}
		out = append(append(out, s.Error), s.Why...)
	}
	return out
}

// renderedForms are the texts a render could show sec as: its forms (secretTestForms), each
// also escaped for markdown (a table cell, HTML) and made printable.
func renderedForms(sec string) []string {
	var out []string
	for _, f := range secretTestForms(sec) {
		out = append(out, f, cellEscaper.Replace(f), htmlEscaper.Replace(f), Printable(f))
	}
	return out
}
