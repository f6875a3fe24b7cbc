package plan

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/events"
)

// FuzzClassify feeds arbitrary bytes to the classifier: it must never panic, must mark what
// it cannot read unclassified, and must render whatever it accepts within the bounds.
func FuzzClassify(f *testing.F) {
	plans, _ := filepath.Glob(filepath.Join(planTofuDir, "*", "plan.json"))
	for _, p := range plans {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(planSecretsJSON))
	for _, name := range []string{"leak-keys.json", "leak-escaped.json", "forget-output.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"format_version":"2.0"}`))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Classify("fuzz", "plan.json", bytes.NewReader(data))
		if err != nil {
			if s.Class != events.ClassUnclassified || s.Error == "" || s.PlanHash != "" {
				t.Fatalf("error %v but class %s, plan hash %q", err, s.Class, s.PlanHash)
			}
			return
		}
		if !planHashRE.MatchString(s.PlanHash) {
			t.Fatalf("plan hash %q", s.PlanHash)
		}
		forgotten := outsideForgets(s)
		if want := events.MaxClass(ClassOfOutputs(s.Counts, s.OutputsChanged, s.OutputsDeleted), classOfRecordedDrift(forgotten, s.DriftRecorded)); s.Class != want {
			t.Fatalf("class %s for counts %+v, %d outputs deleted, %d drift recorded (%d forgotten)", s.Class, s.Counts, s.OutputsDeleted, s.DriftRecorded, forgotten)
		}
		if len(s.Destructive) != s.Counts.Destructive()+forgotten || forgotten > s.DriftRecorded || s.DriftRecorded > s.DriftCount {
			t.Fatalf("%d destructive for counts %+v and %d forgotten of %d drift recorded of %d", len(s.Destructive), s.Counts, forgotten, s.DriftRecorded, s.DriftCount)
		}
		if s.OutputsDeleted > s.OutputsChanged {
			t.Fatalf("%d outputs deleted of %d changed", s.OutputsDeleted, s.OutputsChanged)
		}
		// An import that also changes the object counts twice (import and its action).
		if len(s.Changes)+s.ChangesOmitted != s.Counts.Total()-s.importsAlso {
			t.Fatalf("%d listed + %d omitted changes, counts sum to %d with %d imports that also change", len(s.Changes), s.ChangesOmitted, s.Counts.Total(), s.importsAlso)
		}
		r := &Report{Stacks: []*Stack{s}}
		comment := Comment(r)
		if len(comment) > MaxCommentChars {
			t.Fatalf("comment of %d bytes", len(comment))
		}
		var text strings.Builder
		if err := Text(&text, r, true); err != nil {
			t.Fatal(err)
		}
		var js bytes.Buffer
		if err := JSON(&js, r); err != nil {
			t.Fatal(err)
		}
		if !json.Valid(js.Bytes()) {
			t.Fatalf("JSON render is not valid JSON:\n%s", js.String())
		}
		fuzzNoSecret(t, s.secrets, js.Bytes())
	})
}

// fuzzNoSecret fails if a value the JSON render shows (see shownValues) is a secret or holds
// one of at least minSecretSubstring bytes: names, keys and addresses are not values, and are
// never masked. What a render writes for no value, an unknown or masked one, and booleans
// (never secrets) are left out, and so is the mask text inside values, since a secret may be
// a word of it.
func fuzzNoSecret(t *testing.T, sec *secretSet, jsonRender []byte) {
	t.Helper()
	for _, v := range shownValues(t, jsonRender) {
		switch v {
		case Null, Unknown, Masked, "true", "false":
			continue // what a render writes for no value, an unknown one, a masked one, or a boolean
		}
		if _, ok := sec.values[v]; ok {
			t.Fatalf("the JSON render shows the secret %q as a value", v)
		}
		v = strings.ReplaceAll(v, Masked, "\x00")
		for s := range sec.values {
			if len(s) >= minSecretSubstring && strings.Contains(v, s) {
				t.Fatalf("the JSON render shows the secret %q in the value %q", s, v)
			}
		}
	}
}

// outsideForgets counts the forgets of objects deleted outside in s's destructive list.
func outsideForgets(s *Stack) int {
	n := 0
	for _, c := range s.Destructive {
		if c.Outside {
			n++
		}
	}
	return n
}
