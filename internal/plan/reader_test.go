package plan

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/events"
)

// What a reader of a plan sees: the recordings of real OpenTofu 1.12.6 in testdata/tofu that
// scripts/capture/tofu.sh made for each of these (their renders are golden files too).

func recordedStack(t *testing.T, name string) *Stack {
	t.Helper()
	s, err := ClassifyFile(name, filepath.Join(planTofuDir, name, "plan.json"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPlanPipeKeyNoStrayBackslash: a `|` in a resource key is escaped only inside table cells,
// where GitHub needs it; in the destructive list it shows as it is.
func TestPlanPipeKeyNoStrayBackslash(t *testing.T) {
	s := recordedStack(t, "pipe-key")
	const addr = `terraform_data.p["a|b"]`
	if len(s.Destructive) != 1 || s.Destructive[0].Address != addr {
		t.Fatalf("destructive %+v, want %s", s.Destructive, addr)
	}
	for name, md := range map[string]string{"summary": Markdown(&Report{Stacks: []*Stack{s}}), "comment": Comment(&Report{Stacks: []*Stack{s}})} {
		if !strings.Contains(md, "- `"+addr+"`") || strings.Contains(md, `a\|b`) {
			t.Errorf("%s: the address is not shown as it is:\n%s", name, md)
		}
	}
	// A stack whose name has a `|` is in the table: escaped there, not in the list above it.
	s.Name = "stacks/a|b"
	md := Markdown(&Report{Stacks: []*Stack{s}})
	if !strings.Contains(md, "| `stacks/a\\|b` |") || !strings.Contains(md, "> - `stacks/a|b`: ") {
		t.Errorf("the table cell or the list line is escaped wrong:\n%s", md)
	}
}

// TestPlanDeposedObjectNamed: the deposed object a failed create_before_destroy replace left
// is named by its deposed key in every render, next to the replace of the current object.
func TestPlanDeposedObjectNamed(t *testing.T) {
	s := recordedStack(t, "deposed")
	if len(s.Destructive) != 2 {
		t.Fatalf("destructive %+v, want the replace and the deposed delete", s.Destructive)
	}
	dep := s.Destructive[1]
	if dep.Address != "terraform_data.a" || dep.Action != ActionDelete || len(dep.Deposed) != 8 || s.Destructive[0].Deposed != "" {
		t.Fatalf("destructive %+v, want the second the delete of a deposed object", s.Destructive)
	}
	want := "terraform_data.a (deposed object " + dep.Deposed + ")"
	if got := s.DestructiveAddresses(); got[0] != "terraform_data.a" || got[1] != want {
		t.Errorf("destructive addresses %q, want the second %q", got, want)
	}
	if ev := s.Event(); ev.Destructive[1] != want {
		t.Errorf("event destructive %q", ev.Destructive)
	}
	for ext, out := range planRenders(t, &Report{Stacks: []*Stack{s}}) {
		if ext == ".json" {
			if !strings.Contains(out, `"deposed": "`+dep.Deposed+`"`) {
				t.Errorf("the JSON render has no deposed key:\n%s", out)
			}
			continue
		}
		if !strings.Contains(out, "terraform_data.a (deposed object "+dep.Deposed+", delete)") &&
			!strings.Contains(out, "`terraform_data.a` (deposed object "+dep.Deposed+", delete)") {
			t.Errorf("render %s does not name the deposed object:\n%s", ext, out)
		}
	}
	// The one-line-per-stack list of a comment cut to its smallest form names it too.
	v := newRedactedView(&Report{Stacks: []*Stack{s}}, newSecretSet())
	out, _ := markdown(v, mdNoTable, -1, 1<<20)
	if !strings.Contains(out, "- `terraform_data.a` (deposed object "+dep.Deposed+")") {
		t.Errorf("the compact list does not name the deposed object:\n%s", out)
	}
}

// TestPlanTypeChangeShowsBothValues: an attribute whose type changes shows its old and new
// values whole, not a change of each element to or from null.
func TestPlanTypeChangeShowsBothValues(t *testing.T) {
	s := recordedStack(t, "type-change")
	got := map[string]string{}
	for _, c := range s.Changes {
		for _, a := range c.Attributes {
			got[c.Address+" "+a.Path] = a.Before + " -> " + a.After
		}
	}
	for k, want := range map[string]string{
		"terraform_data.list_to_null input":      `["a", "b"] -> null`,
		"terraform_data.list_to_null output":     `["a", "b"] -> (known after apply)`,
		"terraform_data.object_to_string input":  `{ k = "v", n = 1 } -> "v1"`,
		"terraform_data.string_to_object input":  `"s" -> { k = "v", l = ["x"] }`,
		"terraform_data.string_to_object output": `"s" -> (known after apply)`,
	} {
		if got[k] != want {
			t.Errorf("%s: %q, want %q", k, got[k], want)
		}
	}
	for k := range got {
		if strings.ContainsAny(strings.TrimPrefix(k, strings.Fields(k)[0]), "[.") {
			t.Errorf("an element is listed on its own: %s = %s", k, got[k])
		}
	}
}

// TestTypeChangeMasksSecrets: a whole value shown for a change of type is masked when one of
// its elements is sensitive or is a secret.
func TestTypeChangeMasksSecrets(t *testing.T) {
	diffs, _, err := diffValues("", json.RawMessage(`{"x":["a","hunter2-x"]}`), json.RawMessage(`{"x":"s"}`), nil,
		json.RawMessage(`{"x":[false,true]}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(diffs) != 1 || diffs[0].Before != `["a", (sensitive value)]` {
		t.Fatalf("diffs %+v", diffs)
	}
	sec := newSecretSet()
	sec.add("k")
	diffs, _, err = diffValues("", json.RawMessage(`{"x":{"k":"v"}}`), json.RawMessage(`{"x":"s"}`), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	sec.maskDiffs(diffs)
	if len(diffs) != 1 || diffs[0].Before != Masked || diffs[0].After != `"s"` {
		t.Fatalf("a key equal to a short secret is not masked: %+v", diffs)
	}
}

// TestPlanDestructiveUncapped: past MaxDestructive destructive changes, the model and the JSON
// render name every address; the text and markdown renders list MaxDestructive per stack and
// count the rest; the server event carries MaxDestructive.
func TestPlanDestructiveUncapped(t *testing.T) {
	const n = MaxDestructive + 500
	s, res := planGenerated(t, "stacks/big", genOptions{Changes: n, Seed: 9, Payload: 50, OnlyOf: ActionDelete})
	if res.Counts.Delete != n || len(s.Destructive) != n || len(s.DestructiveAddresses()) != n {
		t.Fatalf("%d deletes generated, %d destructive kept", res.Counts.Delete, len(s.Destructive))
	}
	r := &Report{Stacks: []*Stack{s}, ExecutionURL: planExecutionURL}
	var js bytes.Buffer
	if err := JSON(&js, r); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Stacks []struct {
			Destructive []Change `json:"destructive"`
		} `json:"stacks"`
	}
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Stacks) != 1 || len(doc.Stacks[0].Destructive) != n {
		t.Fatalf("the JSON render names %d destructive addresses, want %d", len(doc.Stacks[0].Destructive), n)
	}
	last := s.Destructive[n-1].Address
	if doc.Stacks[0].Destructive[n-1].Address != last {
		t.Errorf("the JSON render's last address %q, want %q", doc.Stacks[0].Destructive[n-1].Address, last)
	}
	var text bytes.Buffer
	if err := Text(&text, r, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), fmt.Sprintf("… and %d more", n-MaxDestructive)) {
		t.Errorf("the text render does not count the addresses past %d", MaxDestructive)
	}
	if shown, more := planCommentDestructive(t, Comment(r)); shown+more != n {
		t.Errorf("the comment shows %d and %d more, want %d in all", shown, more, n)
	}
	if ev := s.Event(); len(ev.Destructive) != MaxDestructive {
		t.Errorf("the event carries %d addresses, want %d", len(ev.Destructive), MaxDestructive)
	}
}

// TestPlanBase64OfSecretMasked: the base64 of a sensitive variable, made nonsensitive in a
// resource input and in two outputs where the secret starts 0, 1 and 2 bytes into the encoded
// text, is masked in every render, as tofu's own output would need.
func TestPlanBase64OfSecretMasked(t *testing.T) {
	const secret = "correct-horse-battery"
	encoded := []string{
		base64.StdEncoding.EncodeToString([]byte(secret)),
		base64.StdEncoding.EncodeToString([]byte(":" + secret)),
		base64.StdEncoding.EncodeToString([]byte("u:" + secret)),
	}
	raw, err := os.ReadFile(filepath.Join(planTofuDir, "base64-secret", "plan.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range encoded {
		if !bytes.Contains(raw, []byte(e)) {
			t.Fatalf("the recording no longer carries %s; the test would prove nothing", e)
		}
	}
	s := recordedStack(t, "base64-secret")
	for ext, out := range planRenders(t, &Report{Stacks: []*Stack{s}}) {
		for _, e := range append(encoded, Base64Forms(secret)...) {
			if strings.Contains(out, e) {
				t.Errorf("render %s shows %s", ext, e)
			}
		}
	}
	for _, o := range s.Outputs {
		if len(o.Attributes) != 1 || o.Attributes[0].After != Masked {
			t.Errorf("output %s: %+v, want it masked", o.Name, o.Attributes)
		}
	}
}

// TestBase64FormsAtEveryAlignment: whatever comes before and after a secret, the standard
// base64 of the whole holds the secret's form for its alignment; short secrets have no forms.
func TestBase64FormsAtEveryAlignment(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 2000 {
		secret := make([]byte, 5+rng.IntN(20))
		for i := range secret {
			secret[i] = byte(rng.IntN(256))
		}
		forms := Base64Forms(string(secret))
		if len(forms) != 3 {
			t.Fatalf("%d forms of a %d-byte secret", len(forms), len(secret))
		}
		prefix, suffix := make([]byte, rng.IntN(7)), make([]byte, rng.IntN(4))
		for i := range prefix {
			prefix[i] = byte(rng.IntN(256))
		}
		data := append(append(append([]byte{}, prefix...), secret...), suffix...)
		enc := base64.StdEncoding.EncodeToString(data)
		if f := forms[len(prefix)%3]; !strings.Contains(enc, f) {
			t.Fatalf("base64 of %x+%x+%x = %s does not hold %s", prefix, secret, suffix, enc, f)
		}
	}
	if f := Base64Forms("abcd"); len(f) != 0 {
		t.Errorf("a 4-byte secret has forms %q: too short, they would mask unrelated text", f)
	}
}

// TestPlanRefreshOnlyDrift: a refresh-only plan (recorded with OpenTofu's test provider, whose
// objects were deleted and changed outside) forgets one object and rewrites another in the
// state when applied: destructive, with the forget listed and the drift shown in detail.
func TestPlanRefreshOnlyDrift(t *testing.T) {
	s := recordedStack(t, "refresh-drift")
	if s.Class != events.ClassDestructive || s.DriftCount != 2 || s.DriftRecorded != 2 || s.Counts.Total() != 0 {
		t.Fatalf("class %s drift %d recorded %d counts %+v", s.Class, s.DriftCount, s.DriftRecorded, s.Counts)
	}
	if len(s.Destructive) != 1 || !reflect.DeepEqual(s.Destructive[0], Change{Address: "simple_resource.deleted", Action: ActionForget, Outside: true}) {
		t.Errorf("destructive %+v, want the forget of simple_resource.deleted", s.Destructive)
	}
	if got := s.Event(); got.Class != events.ClassDestructive || len(got.Destructive) != 1 {
		t.Errorf("event %+v", got)
	}
	var text bytes.Buffer
	if err := Text(&text, &Report{Stacks: []*Stack{s}}, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"~ simple_resource.changed (changed outside)", `value: "changed-outside" -> "changed-by-hand"`,
		"- simple_resource.deleted (deleted outside)", "the apply records 2 in the state",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("the text render does not show %q:\n%s", want, text.String())
		}
	}
}

// TestDriftCoveredByAChange: drift that a resource change of the same object covers is the
// change's business (the apply acts on the object as planned), whichever of resource_drift and
// resource_changes comes first; only uncovered drift counts in the class.
func TestDriftCoveredByAChange(t *testing.T) {
	const drift = `"resource_drift":[{"address":"x.a","change":{"actions":["delete"],"before":{"v":"1"},"after":null}},` +
		`{"address":"x.b","change":{"actions":["update"],"before":{"v":"1"},"after":{"v":"2"}}}]`
	for name, c := range map[string]struct {
		changes string
		class   events.Class
		record  int
	}{
		"recreated and no-op": {`{"address":"x.a","change":{"actions":["create"],"before":null,"after":{"v":"1"}}},` +
			`{"address":"x.b","change":{"actions":["no-op"],"before":{"v":"2"},"after":{"v":"2"}}}`, events.ClassAdditive, 0},
		"only b covered": {`{"address":"x.b","change":{"actions":["no-op"],"before":{"v":"2"},"after":{"v":"2"}}}`, events.ClassDestructive, 1},
		"only a covered": {`{"address":"x.a","change":{"actions":["create"],"before":null,"after":{"v":"1"}}}`, events.ClassMutating, 1},
		"none":           {``, events.ClassDestructive, 2},
	} {
		for _, order := range []string{"drift first", "changes first"} {
			parts := []string{drift, `"resource_changes":[` + c.changes + `]`}
			if order == "changes first" {
				parts[0], parts[1] = parts[1], parts[0]
			}
			doc := `{"format_version":"1.2","planned_values":{},` + parts[0] + "," + parts[1] + `}`
			s, err := Classify("s", "p.json", strings.NewReader(doc))
			if err != nil {
				t.Fatal(err)
			}
			if s.Class != c.class || s.DriftRecorded != c.record || s.DriftCount != 2 {
				t.Errorf("%s, %s: class %s, %d drift recorded of %d; want %s, %d", name, order, s.Class, s.DriftRecorded, s.DriftCount, c.class, c.record)
			}
		}
	}
}
