package plan

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
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
	f.Add([]byte(`{"format_version":"2.0"}`))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Classify("fuzz", "plan.json", bytes.NewReader(data))
		if err != nil {
			if s.Class != events.ClassUnclassified || s.Error == "" {
				t.Fatalf("error %v but class %s", err, s.Class)
			}
			return
		}
		if s.Class != ClassOf(s.Counts, s.OutputsChanged) {
			t.Fatalf("class %s for counts %+v", s.Class, s.Counts)
		}
		if len(s.Changes)+s.ChangesOmitted != s.Counts.Total() {
			t.Fatalf("%d listed + %d omitted changes, counts sum to %d", len(s.Changes), s.ChangesOmitted, s.Counts.Total())
		}
		r := &Report{Stacks: []*Stack{s}}
		if c := Comment(r); len(c) > MaxCommentChars {
			t.Fatalf("comment of %d bytes", len(c))
		}
		var js bytes.Buffer
		if err := JSON(&js, r); err != nil {
			t.Fatal(err)
		}
		if !json.Valid(js.Bytes()) {
			t.Fatalf("JSON render is not valid JSON:\n%s", js.String())
		}
	})
}
