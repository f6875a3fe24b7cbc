package plan

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/events"
)

// renderScenarioDir holds the render scenarios of issue 38: plans recorded with a real
// OpenTofu by `scripts/capture/tofu.sh TOFU --render` from each case's v1.tf and v2.tf.
const renderScenarioDir = "testdata/render"

// renderScenario classifies the recorded scenario name and renders it in the four formats
// (terminal text, step summary, PR comment, JSON), each held to its golden file
// testdata/render/NAME/render.{txt,md,comment.md,json} (go test -update rewrites them).
func renderScenario(t *testing.T, name string) (*Stack, map[string]string) {
	t.Helper()
	path := filepath.Join(renderScenarioDir, name, "plan.json")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%v: record the scenario with scripts/capture/tofu.sh TOFU --render %s", err, name)
	}
	s, err := ClassifyFile(name, filepath.ToSlash(path))
	if err != nil {
		t.Fatal(err)
	}
	renders := planRenders(t, &Report{Stacks: []*Stack{s}, ExecutionURL: planExecutionURL})
	delete(renders, ".color.txt")
	for ext, got := range renders {
		planGolden(t, filepath.Join("render", name, "render"+ext), got)
	}
	return s, renders
}

// recorded returns the named file of a recorded scenario.
func recorded(t *testing.T, name, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(renderScenarioDir, name, file))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// noneShows fails if a render shows one of leaks.
func noneShows(t *testing.T, renders map[string]string, leaks ...string) {
	t.Helper()
	for ext, out := range renders {
		for _, l := range leaks {
			if strings.Contains(out, l) {
				t.Errorf("render %s shows %q:\n%s", ext, l, out)
			}
		}
	}
}

// allShow fails unless every render shows each of want.
func allShow(t *testing.T, renders map[string]string, want ...string) {
	t.Helper()
	for ext, out := range renders {
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("render %s does not show %q:\n%s", ext, w, out)
			}
		}
	}
}

// change returns the change of s at address.
func change(t *testing.T, s *Stack, address string) Change {
	t.Helper()
	for _, c := range s.Changes {
		if c.Address == address {
			return c
		}
	}
	t.Fatalf("no change of %s in %+v", address, s.Changes)
	return Change{}
}

// Item 1: secrets equal to common words (a sensitive map with keys class and stack and values
// data and port; a sensitive list of import, prod, delete, code, details) mask the values that
// hold them, and nothing else: the JSON render's keys, the totals, the addresses and the
// markup are as they would be without them.
func TestScenarioCommonWordSecrets(t *testing.T) {
	s, renders := renderScenario(t, "common-words")
	if !strings.Contains(recorded(t, "common-words", "plan.json"), `"class":"data"`) {
		t.Fatal("the recording does not carry the sensitive map; the test would prove nothing")
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal([]byte(renders[".json"]), &doc); err != nil {
		t.Fatal(err)
	}
	var shape jsonShape
	if err := json.Unmarshal([]byte(renders[".json"]), &shape); err != nil {
		t.Fatal(err)
	}
	if shape.Class != events.ClassDestructive || shape.Totals.Delete != 1 || shape.Totals.Create != 1 || shape.Totals.Update != 1 {
		t.Errorf("the JSON render reads class %q, totals %+v; want destructive, 1 create, 1 update, 1 delete", shape.Class, shape.Totals)
	}
	for _, key := range []string{"class", "totals", "stacks"} {
		if _, ok := doc[key]; !ok {
			t.Errorf("the JSON render has no key %q", key)
		}
	}
	var addresses []string
	for _, c := range s.Changes {
		addresses = append(addresses, c.Address)
	}
	want := []string{"terraform_data.old_data_volume", "terraform_data.production_cache", "terraform_data.settings"}
	if !slices.Equal(addresses, want) {
		t.Errorf("addresses %q, want %q", addresses, want)
	}
	allShow(t, renders, "terraform_data.old_data_volume", "terraform_data.production_cache")
	for _, ext := range []string{".md", ".comment.md"} {
		if !strings.Contains(renders[ext], "<details><summary>") || !strings.Contains(renders[ext], "0 import") {
			t.Errorf("render %s lost its markup or its totals:\n%s", ext, renders[ext])
		}
	}
	noneShows(t, renders, "<"+Masked, "im"+Masked, "terraform_"+Masked)
	// The sensitive values themselves are masked: the map whole, the list whole.
	for _, path := range []string{"input"} {
		for _, addr := range []string{"terraform_data.production_cache", "terraform_data.settings"} {
			for _, a := range change(t, s, addr).Attributes {
				if a.Path == path && a.After != Masked {
					t.Errorf("%s.%s = %s, want %s", addr, path, a.After, Masked)
				}
			}
		}
	}
	var js bytes.Buffer
	if err := JSON(&js, &Report{Stacks: []*Stack{s}}); err != nil {
		t.Fatal(err)
	}
	fuzzNoSecret(t, s.secrets, js.Bytes())
}

// Item 2: a secret through urlencode, let out with nonsensitive(), is masked in every format.
func TestScenarioURLEncodedSecret(t *testing.T) {
	s, renders := renderScenario(t, "urlencode-secret")
	if !strings.Contains(recorded(t, "urlencode-secret", "plan.json"), "p%40ss%2Fw0rd%231") {
		t.Fatal("the recording does not carry the URL-encoded secret; the test would prove nothing")
	}
	noneShows(t, renders, "p%40ss%2Fw0rd%231", "p@ss/w0rd#1", "p@ss%2Fw0rd%231")
	for _, a := range change(t, s, "terraform_data.login").Attributes {
		if a.Path == "input" && a.After != Masked {
			t.Errorf("login input = %s, want %s", a.After, Masked)
		}
	}
}

// Item 3: a multi-line secret through yamlencode (block style: each line indented) is masked:
// no line of it shows in any format.
func TestScenarioYAMLEncodedMultiLineSecret(t *testing.T) {
	_, renders := renderScenario(t, "yamlencode-secret")
	lines := []string{"MIIEvQIBADANBgkqhkiG9w0BAQEFAASC", "BKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj", "MsW4d1k2vT9pQ0aXc3Lr5eNf8yZ6hJ1u"}
	plan := recorded(t, "yamlencode-secret", "plan.json")
	for _, l := range lines {
		if !strings.Contains(plan, "  "+l) {
			t.Fatalf("the recording does not carry the line %s indented; the test would prove nothing", l)
		}
	}
	noneShows(t, renders, lines...)
	allShow(t, renders, "terraform_data.cfg")
}

// Item 4: a literal passed to a sensitive variable of a module, which the module lets out with
// nonsensitive(), is masked.
func TestScenarioLiteralToSensitiveModuleVariable(t *testing.T) {
	s, renders := renderScenario(t, "module-literal")
	if !strings.Contains(recorded(t, "module-literal", "plan.json"), `"constant_value":"ak-live-7f3e9c2b1d"`) {
		t.Fatal("the recording does not carry the literal; the test would prove nothing")
	}
	noneShows(t, renders, "7f3e9c2b1d")
	allShow(t, renders, "module.m.terraform_data.client")
	if s.Counts.Create != 1 {
		t.Errorf("counts %+v, want 1 create", s.Counts)
	}
}

// Item 5: a heredoc whose line 12 changes shows that line removed and added (a line diff),
// and a long single-line value that changes past the cut shows where it changes.
func TestScenarioChangedLinePastTheCut(t *testing.T) {
	s, renders := renderScenario(t, "long-values")
	allShow(t, renders, "allow 10.0.0.0/8", "allow 0.0.0.0/0")
	fw := change(t, s, "terraform_data.firewall")
	var input AttrDiff
	for _, a := range fw.Attributes {
		if a.Path == "input" {
			input = a
		}
	}
	var removed, added []string
	for _, l := range input.Lines {
		switch l.Op {
		case LineRemoved:
			removed = append(removed, strings.TrimSpace(l.Text))
		case LineAdded:
			added = append(added, strings.TrimSpace(l.Text))
		}
	}
	if !slices.Equal(removed, []string{"allow 10.0.0.0/8"}) || !slices.Equal(added, []string{"allow 0.0.0.0/0"}) {
		t.Errorf("firewall input lines %+v: want exactly line 12 removed and added", input.Lines)
	}
	for _, a := range change(t, s, "terraform_data.hosts").Attributes {
		if a.Path != "input" {
			continue
		}
		if a.Before == a.After || !strings.Contains(a.Before, "host55") || !strings.Contains(a.After, "hostX") {
			t.Errorf("hosts input shown as %s -> %s: want where it changes, host55 -> hostX", a.Before, a.After)
		}
	}
}

// Item 6: an update far over the detail bound says what it leaves out, and how large, with a
// link to the execution page: its input (an object holding a 100 KB string) and its output
// (the same value, known after apply) are each too large to show.
func TestScenarioHugeChangeSaysSo(t *testing.T) {
	s, renders := renderScenario(t, "huge-change")
	c := change(t, s, "terraform_data.blob")
	if c.AttributesOmitted != 2 || c.AttributesOmittedBytes < 200000 {
		t.Errorf("%d attributes omitted, %d bytes; want 2 of over 100 KB each", c.AttributesOmitted, c.AttributesOmittedBytes)
	}
	for _, ext := range []string{".txt", ".md", ".comment.md"} {
		if !strings.Contains(renders[ext], "2 attributes not shown: 200.") || !strings.Contains(renders[ext], "(see "+planExecutionURL+")") {
			t.Errorf("render %s does not say what it leaves out:\n%s", ext, renders[ext])
		}
	}
}

// Item 7: collections as tofu shows them: a list emptied and one filled from their real old
// values, a set element replaced as one removal and one addition, a list element removed and
// one added, a map by key.
func TestScenarioCollections(t *testing.T) {
	s, renders := renderScenario(t, "collections")
	type row struct{ path, before, after, elem string }
	rows := func(addr string) []row {
		var out []row
		for _, a := range change(t, s, addr).Attributes {
			if a.Path != "output" {
				out = append(out, row{a.Path, a.Before, a.After, a.Element})
			}
		}
		return out
	}
	for addr, want := range map[string][]row{
		"terraform_data.emptied": {{"input", `["a", "b"]`, `[]`, ""}},
		"terraform_data.filled":  {{"input", `[]`, `["x", "y"]`, ""}},
		"terraform_data.set":     {{"input[1]", `"b"`, Null, "removed"}, {"input[3]", Null, `"e"`, "added"}},
		"terraform_data.list":    {{"input[1]", `"two"`, Null, "removed"}, {"input[2]", Null, `"four"`, "added"}},
		"terraform_data.map":     {{"input.b", `"2"`, `"22"`, ""}, {"input.c", Null, `"3"`, ""}, {"input.d", `"4"`, Null, ""}},
	} {
		if got := rows(addr); !slices.Equal(got, want) {
			t.Errorf("%s: %+v, want %+v", addr, got, want)
		}
	}
	for _, ext := range []string{".txt", ".md", ".comment.md"} {
		if !strings.Contains(renders[ext], `- input[1] = "b"`) || !strings.Contains(renders[ext], `+ input[3] = "e"`) {
			t.Errorf("render %s does not show the set element removed and added:\n%s", ext, renders[ext])
		}
	}
}

// Item 8: a failed check block is listed with its message masked, in every format.
func TestScenarioFailedCheck(t *testing.T) {
	s, renders := renderScenario(t, "failed-check")
	plan := recorded(t, "failed-check", "plan.json")
	if !strings.Contains(plan, "tok-9f8e7d6c5b") || !strings.Contains(plan, `"status":"fail"`) {
		t.Fatal("the recording carries no failed check with the secret; the test would prove nothing")
	}
	if len(s.Checks) != 1 || s.Checks[0].Address != "check.health" || s.Checks[0].Status != "fail" ||
		len(s.Checks[0].Problems) != 1 || s.Checks[0].Problems[0] != "a is a2, token "+Masked {
		t.Fatalf("failed checks %+v, want check.health with its message masked", s.Checks)
	}
	if s.Partial {
		t.Error("a plan of every object is marked partial")
	}
	noneShows(t, renders, "tok-9f8e7d6c5b", "partial")
	allShow(t, renders, "check.health", "a is a2, token "+Masked)
}

// Item 8: a -target plan is marked partial, with how many objects it leaves out, in every
// format.
func TestScenarioTargetPlanIsPartial(t *testing.T) {
	s, renders := renderScenario(t, "target-partial")
	if !strings.Contains(recorded(t, "target-partial", "plan.txt"), "Resource targeting is in effect") {
		t.Fatal("the recording is not of a -target plan; the test would prove nothing")
	}
	if !s.Partial || s.Unplanned != 1 {
		t.Errorf("partial %v, %d unplanned; want partial, 1 (terraform_data.b)", s.Partial, s.Unplanned)
	}
	allShow(t, renders, "partial")
	for _, ext := range []string{".txt", ".md", ".comment.md"} {
		if !strings.Contains(renders[ext], "(partial plan)") || !strings.Contains(renders[ext], "1 object of the state not planned") {
			t.Errorf("render %s does not say the plan is partial:\n%s", ext, renders[ext])
		}
	}
	if !strings.Contains(renders[".json"], `"partial": true`) || !strings.Contains(renders[".json"], `"unplanned": 1`) {
		t.Errorf("the JSON render does not say the plan is partial:\n%s", renders[".json"])
	}
}
