package plan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/events"
)

// planGenerated classifies a generated plan and returns what the generator wrote.
func planGenerated(t testing.TB, name string, o genOptions) (*Stack, genResult) {
	t.Helper()
	var buf bytes.Buffer
	res, err := writePlan(&buf, o)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Classify(name, name+".json", &buf)
	if err != nil {
		t.Fatal(err)
	}
	return s, res
}

func TestPlanPropertyCountsSumToChanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 1))
	for i := range 25 {
		o := genOptions{Changes: rng.IntN(400), Seed: uint64(i), Payload: 500, Drift: rng.IntN(3), Outputs: rng.IntN(3)}
		if i%3 == 0 {
			o.Secret = "generated-secret-" + strconv.Itoa(i)
		}
		s, res := planGenerated(t, fmt.Sprintf("gen-%d", i), o)
		if s.Counts != res.Counts {
			t.Errorf("seed %d: counts %+v, generator wrote %+v", i, s.Counts, res.Counts)
		}
		if s.Counts.Total() != res.Changes {
			t.Errorf("seed %d: counts sum to %d, the plan has %d changes", i, s.Counts.Total(), res.Changes)
		}
		if got := len(s.Changes) + s.ChangesOmitted; got != res.Changes {
			t.Errorf("seed %d: %d listed+omitted changes, want %d", i, got, res.Changes)
		}
		if got := len(s.Destructive) + s.DestructiveOmitted; got != s.Counts.Destructive() {
			t.Errorf("seed %d: %d destructive entries, want %d", i, got, s.Counts.Destructive())
		}
		if s.DriftCount != o.Drift || s.OutputsChanged != o.Outputs+min(1, len(o.Secret)) {
			t.Errorf("seed %d: drift %d outputs %d, want %d and %d", i, s.DriftCount, s.OutputsChanged, o.Drift, o.Outputs)
		}
	}
}

var planAddrRE = regexp.MustCompile("`google_compute_instance\\.vm\\[\\d+\\]`")

// planCommentDestructive counts the destructive addresses shown in a comment's caution block
// and the "… and N more" it admits to.
func planCommentDestructive(t *testing.T, comment string) (shown, more int) {
	t.Helper()
	for _, line := range strings.Split(comment, "\n") {
		if !strings.HasPrefix(line, "> ") {
			continue
		}
		shown += len(planAddrRE.FindAllString(line, -1))
		if m := regexp.MustCompile(`… and (\d+) more`).FindStringSubmatch(line); m != nil {
			more, _ = strconv.Atoi(m[1])
		}
	}
	return shown, more
}

func TestPlanPropertyCommentBound(t *testing.T) {
	cases := []struct {
		name   string
		stacks int
		o      genOptions
	}{
		{"mixed 10000", 1, genOptions{Changes: 10000, Seed: 1, Payload: 500, Outputs: 5, Drift: 20}},
		{"deletes 10000", 1, genOptions{Changes: 10000, Seed: 2, Payload: 200, OnlyOf: ActionDelete}},
		{"10 stacks x 1000 replaces", 10, genOptions{Changes: 1000, Seed: 3, Payload: 200, OnlyOf: ActionReplace, NoOpEvery: 7}},
		{"100 stacks x 30 updates", 100, genOptions{Changes: 30, Seed: 4, Payload: 200, OnlyOf: ActionUpdate}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &Report{ExecutionURL: planExecutionURL}
			changes := 0
			for i := range tc.stacks {
				o := tc.o
				o.Seed += uint64(i)
				s, res := planGenerated(t, fmt.Sprintf("stacks/env/app-%03d", i), o)
				r.Stacks = append(r.Stacks, s)
				changes += res.Changes
			}
			if r.Totals().Total() != changes {
				t.Fatalf("totals %d, want %d", r.Totals().Total(), changes)
			}
			comment := Comment(r)
			if n := len([]rune(comment)); n > MaxCommentChars {
				t.Fatalf("comment has %d characters, limit %d", n, MaxCommentChars)
			}
			if !strings.Contains(comment, totalsLine(r, " · ")) {
				t.Error("comment lost the totals")
			}
			if !strings.Contains(comment, "("+planExecutionURL+")") {
				t.Error("comment lost the execution link")
			}
			destructive := r.Totals().Destructive()
			if destructive > 0 {
				if !strings.Contains(comment, plural(destructive, "destructive change", "destructive changes")) {
					t.Errorf("comment does not announce %d destructive changes", destructive)
				}
				shown, more := planCommentDestructive(t, comment)
				if shown+more != destructive {
					t.Errorf("comment shows %d destructive addresses and %d more, want %d in all", shown, more, destructive)
				}
				kept := 0
				for _, s := range r.Stacks {
					kept += min(len(s.Destructive), MaxDestructive)
				}
				if len(comment) < MaxCommentChars-2000 && shown != kept {
					t.Errorf("comment has room but shows %d of %d destructive addresses", shown, kept)
				}
			}
			if summary := Markdown(r); len(summary) > MaxSummaryBytes {
				t.Errorf("step summary has %d bytes, limit %d", len(summary), MaxSummaryBytes)
			}
			if r.Class() == events.ClassNoChanges {
				t.Error("a generated plan with changes classified as no-changes")
			}
		})
	}
}

// TestPlanMarkdownDegradesInOrder checks that the size bound drops attribute detail first,
// then per-stack detail, then the stack table, and cuts the destructive list last.
func TestPlanMarkdownDegradesInOrder(t *testing.T) {
	r := &Report{ExecutionURL: planExecutionURL}
	for i := range 3 {
		s, _ := planGenerated(t, fmt.Sprintf("stacks/app-%d", i), genOptions{Changes: 150, Seed: uint64(10 + i), Payload: 200, Secret: "degrade-secret"})
		r.Stacks = append(r.Stacks, s)
	}
	sec := r.secrets()
	at := func(level mdLevel) string {
		out, _ := markdown(newRedactedView(r, sec), level, -1, math.MaxInt)
		return out
	}
	prev := len(at(mdFull)) + 1
	for level := mdFull; level < mdTrimDestroy; level++ {
		want := at(level)
		if len(want) > prev || (level <= mdNoDetail && len(want) == prev) {
			t.Fatalf("level %d does not drop detail (%d bytes, %d before)", level, len(want), prev)
		}
		prev = len(want)
		if got := fitMarkdown(r, len(want)); got != want {
			t.Errorf("limit %d: fitMarkdown did not pick detail level %d", len(want), level)
		}
	}
	limit := prev - 500
	got := fitMarkdown(r, limit)
	if len(got) > limit || !strings.Contains(got, totalsLine(r, " · ")) || !strings.Contains(got, planExecutionURL) {
		t.Fatalf("trimmed render (%d bytes, limit %d) lost its bound, totals or link:\n%s", len(got), limit, got)
	}
	shown, more := planCommentDestructive(t, got)
	if more == 0 || shown+more != r.Totals().Destructive() {
		t.Errorf("trimmed destructive list shows %d and %d more, want %d in all with some cut", shown, more, r.Totals().Destructive())
	}
	if strings.Contains(got, "degrade-secret") {
		t.Error("render leaks the secret")
	}
}

// TestPlanPropertyCommentUnclassified: thousands of unreadable stacks, or a few with huge
// names, still give a comment within the bound that keeps the totals and the link.
func TestPlanPropertyCommentUnclassified(t *testing.T) {
	cases := []struct {
		name    string
		stacks  int
		nameLen int
	}{
		{"3000 stacks", 3000, 0},
		{"3 stacks with 40000-byte names", 3, 40000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &Report{ExecutionURL: planExecutionURL}
			for i := range tc.stacks {
				name := fmt.Sprintf("stacks/env/app-%04d", i) + strings.Repeat("x", tc.nameLen)
				s, err := Classify(name, "plan.json", strings.NewReader(`{"format_version":"1.2","resource_changes":[`))
				if err == nil {
					t.Fatal("a truncated plan was accepted")
				}
				r.Stacks = append(r.Stacks, s)
			}
			comment := Comment(r)
			if n := len([]rune(comment)); n > MaxCommentChars {
				t.Fatalf("comment has %d characters, limit %d", n, MaxCommentChars)
			}
			for _, want := range []string{totalsLine(r, " · "), "(" + planExecutionURL + ")", "⛔ unclassified"} {
				if !strings.Contains(comment, want) {
					t.Errorf("comment lost %q:\n%.3000s", want, comment)
				}
			}
			if tc.stacks > maxCollapsedWarnings && !strings.Contains(comment, fmt.Sprintf("… and %d more stacks could not be classified", tc.stacks-maxCollapsedWarnings)) {
				t.Errorf("comment does not count the unclassified stacks it does not name:\n%.3000s", comment)
			}
		})
	}
}

// secretWords are sensitive values a property test draws: words a render is made of (keys of
// the JSON render, counts, markup, addresses' parts) and short tokens, JSON punctuation among
// them.
var secretWords = []string{
	"class", "stack", "stacks", "data", "port", "import", "prod", "delete", "code", "details",
	"create", "update", "replace", "forget", "read", "totals", "counts", "changes", "address",
	"action", "terraform", "terraform_data", "summary", "destructive", "mutating", "additive",
	"input", "output", "null", "true", "false", "drift", "plan", "1.2", "v1", "sensitive",
	"a", "b", "x", "1", "0", "id", "->", ":", "\"", "{", "}", "[", "]", ",", " ", "\n", "  ",
	"(known after apply)", "(sensitive value)", "<", ">", "|", "`", "#", "-", "+", "~", "±",
}

// withSecrets is the plan JSON plan with sensitive root variables holding values.
func withSecrets(t *testing.T, plan []byte, values []string) []byte {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(plan, &doc); err != nil {
		t.Fatal(err)
	}
	// object is the object at key of m, made when absent.
	object := func(m map[string]any, key string) map[string]any {
		o, ok := m[key].(map[string]any)
		if !ok {
			o = map[string]any{}
			m[key] = o
		}
		return o
	}
	vars := object(doc, "variables")
	decl := object(object(object(doc, "configuration"), "root_module"), "variables")
	for i, v := range values {
		name := fmt.Sprintf("property_secret_%d", i)
		vars[name] = map[string]any{"value": v}
		decl[name] = map[string]any{"sensitive": true}
	}
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// jsonShape is what a CI step reads of the JSON render: the class, the totals, and each
// stack's class, counts and the addresses of its changes and destructive changes.
type jsonShape struct {
	Class  events.Class `json:"class"`
	Totals Counts       `json:"totals"`
	Stacks []struct {
		Class       events.Class `json:"class"`
		Counts      Counts       `json:"counts"`
		Changes     []Change     `json:"changes"`
		Destructive []Change     `json:"destructive"`
	} `json:"stacks"`
}

// renderShape classifies plan and returns the shape of its JSON render, which must parse.
func renderShape(t *testing.T, name string, plan []byte) (jsonShape, *Stack) {
	t.Helper()
	s, err := Classify(name, "plan.json", bytes.NewReader(plan))
	if err != nil {
		t.Fatal(err)
	}
	var js bytes.Buffer
	if err := JSON(&js, &Report{Stacks: []*Stack{s}, ExecutionURL: planExecutionURL}); err != nil {
		t.Fatal(err)
	}
	var shape jsonShape
	if err := json.Unmarshal(js.Bytes(), &shape); err != nil {
		t.Fatalf("%s: the JSON render does not parse: %v\n%s", name, err, js.String())
	}
	for i := range shape.Stacks {
		for _, list := range [][]Change{shape.Stacks[i].Changes, shape.Stacks[i].Destructive} {
			for j := range list {
				list[j].Attributes = nil // values: masked with secrets, as they should be
			}
		}
	}
	return shape, s
}

// TestPlanPropertySecretsNeverCorruptTheRender: for random sensitive values drawn from the
// words a render is made of and short tokens, the JSON render of every recorded plan still
// parses to the same class, totals, counts and addresses as with no secret, and no value it
// shows holds one of them; the markdown keeps its markup.
func TestPlanPropertySecretsNeverCorruptTheRender(t *testing.T) {
	paths, _ := filepath.Glob(filepath.Join(planTofuDir, "*", "plan.json"))
	more, _ := filepath.Glob(filepath.Join("testdata", "render", "*", "plan.json"))
	paths = append(paths, more...)
	if len(paths) < 10 {
		t.Fatalf("only %d recorded plans; the test would prove little", len(paths))
	}
	rng := rand.New(rand.NewPCG(38, 1))
	for _, p := range paths {
		plan, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(filepath.Dir(p))
		want, clean := renderShape(t, name, plan)
		for round := range 8 {
			var values []string
			for range 1 + rng.IntN(6) {
				values = append(values, secretWords[rng.IntN(len(secretWords))])
			}
			got, s := renderShape(t, name, withSecrets(t, plan, values))
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s round %d, secrets %q: the JSON render reads\n%+v\nwithout them\n%+v", name, round, values, got, want)
			}
			r := &Report{Stacks: []*Stack{s}}
			if got, want := strings.Count(Markdown(r), "<details>"), strings.Count(Markdown(&Report{Stacks: []*Stack{clean}}), "<details>"); got != want {
				t.Fatalf("%s round %d, secrets %q: %d <details> tags, %d without them", name, round, values, got, want)
			}
			var js bytes.Buffer
			if err := JSON(&js, r); err != nil {
				t.Fatal(err)
			}
			fuzzNoSecret(t, s.secrets, js.Bytes())
		}
	}
}
