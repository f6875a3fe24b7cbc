package plan

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
)

// planHashRE is the form of every plan hash.
var planHashRE = regexp.MustCompile(`^` + PlanHashVersion + `:[0-9a-f]{64}$`)

// planEmptyHash is the v1 hash of the empty change set: pinned, it may never change.
const planEmptyHash = "v1:83458ae5a2c1f7582f2584d474710776ccd33a7e17cfaffa6d30926c0eb87dc7"

// planHashOf classifies data and returns its plan hash.
func planHashOf(t *testing.T, data []byte) string {
	t.Helper()
	s, err := Classify("hash", "plan.json", bytes.NewReader(data))
	if err != nil {
		t.Fatalf("classify: %v\n%s", err, data)
	}
	if !planHashRE.MatchString(s.PlanHash) {
		t.Fatalf("plan hash %q is not %s: and 64 hex digits", s.PlanHash, PlanHashVersion)
	}
	return s.PlanHash
}

// planDecode decodes a plan keeping numbers as written.
func planDecode(t *testing.T, data []byte) map[string]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v map[string]any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func planMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// planReencode writes v with the keys of every object in reverse order, indented, with every
// number respelled (1 → 1.0e0, 1.5 → 1.50e0) and, with escapeAll, every character of every
// string and key escaped as \uXXXX.
func planReencode(v any, escapeAll bool) []byte {
	var b bytes.Buffer
	var write func(v any, indent string)
	str := func(s string) {
		if !escapeAll {
			enc, _ := json.Marshal(s) // escapes <, > and & as \u003c...
			b.Write(enc)
			return
		}
		b.WriteByte('"')
		for _, r := range s {
			if r > 0xffff {
				r1, r2 := utf16.EncodeRune(r)
				fmt.Fprintf(&b, `\u%04X\u%04X`, r1, r2)
				continue
			}
			fmt.Fprintf(&b, `\u%04X`, r)
		}
		b.WriteByte('"')
	}
	write = func(v any, indent string) {
		in := indent + "\t"
		switch v := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			slices.Reverse(keys)
			b.WriteString("{\n")
			for i, k := range keys {
				if i > 0 {
					b.WriteString(",\n")
				}
				b.WriteString(in)
				str(k)
				b.WriteString(" :  ")
				write(v[k], in)
			}
			b.WriteString("\n" + indent + "}")
		case []any:
			b.WriteString("[ ")
			for i, e := range v {
				if i > 0 {
					b.WriteString(" ,\r\n" + in)
				}
				write(e, in)
			}
			b.WriteString(" ]")
		case json.Number:
			n := string(v)
			mant, exp, hasExp := strings.Cut(strings.ToLower(n), "e")
			if !strings.Contains(mant, ".") {
				mant += ".0"
			} else {
				mant += "0"
			}
			if !hasExp {
				exp = "0"
			}
			b.WriteString(mant + "E" + exp)
		case string:
			str(v)
		default:
			enc, _ := json.Marshal(v)
			b.Write(enc)
		}
	}
	write(v, "  ")
	return b.Bytes()
}

// planRC is resource_changes[i] of p; planChange its change.
func planRC(p map[string]any, section string, i int) map[string]any {
	return p[section].([]any)[i].(map[string]any)
}

func planChange(p map[string]any, section string, i int) map[string]any {
	return planRC(p, section, i)["change"].(map[string]any)
}

// planHashBase is the mixed recorded plan (update, replace, delete, create, an output update)
// with a plain no-op, an importing no-op, numbers and escapes in values, and two drift entries.
func planHashBase(t *testing.T) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(planTofuDir, "mixed", "plan.json"))
	if err != nil {
		t.Fatal(err)
	}
	p := planDecode(t, raw)
	extra := planDecode(t, []byte(`{"resource_changes": [
	  {"address": "terraform_data.n", "mode": "managed", "type": "terraform_data", "name": "n",
	   "provider_name": "terraform.io/builtin/terraform",
	   "change": {"actions": ["no-op"], "before": {"input": "n"}, "after": {"input": "n"},
	              "after_unknown": {}, "before_sensitive": {}, "after_sensitive": {}}},
	  {"address": "terraform_data.i", "mode": "managed", "type": "terraform_data", "name": "i",
	   "provider_name": "terraform.io/builtin/terraform",
	   "change": {"actions": ["no-op"], "before": {"input": "i"}, "after": {"input": "i"},
	              "after_unknown": {}, "before_sensitive": {}, "after_sensitive": {},
	              "importing": {"id": "i-123"}}},
	  {"address": "terraform_data.num", "mode": "managed", "type": "terraform_data", "name": "num",
	   "provider_name": "terraform.io/builtin/terraform",
	   "change": {"actions": ["create"], "before": null,
	              "after": {"input": {"n": 1, "f": 1.5, "big": 12345678901234567890123, "tiny": 0.000001,
	                                  "s": "<a&b> \"quoted\" é 😀 \u0001"}},
	              "after_unknown": {"output": true}, "before_sensitive": false, "after_sensitive": {}}}
	],
	"resource_drift": [
	  {"address": "terraform_data.a", "mode": "managed", "type": "terraform_data", "name": "a",
	   "provider_name": "terraform.io/builtin/terraform",
	   "change": {"actions": ["update"], "before": {"input": "one"}, "after": {"input": "one-edited"},
	              "after_unknown": {}, "before_sensitive": {}, "after_sensitive": {}}},
	  {"address": "terraform_data.gone", "mode": "managed", "type": "terraform_data", "name": "gone",
	   "provider_name": "terraform.io/builtin/terraform",
	   "change": {"actions": ["delete"], "before": {"input": "x"}, "after": null,
	              "after_unknown": {}, "before_sensitive": {}, "after_sensitive": false}}
	]}`))
	p["resource_changes"] = append(p["resource_changes"].([]any), extra["resource_changes"].([]any)...)
	p["resource_drift"] = extra["resource_drift"]
	return planMarshal(t, p)
}

// planMutate decodes base, applies f and encodes the result.
func planMutate(t *testing.T, base []byte, f func(p map[string]any)) []byte {
	t.Helper()
	p := planDecode(t, base)
	f(p)
	return planMarshal(t, p)
}

// planAt finds the resource_changes (or resource_drift) entry with address addr.
func planAt(t *testing.T, p map[string]any, section, addr string) map[string]any {
	t.Helper()
	for _, e := range p[section].([]any) {
		if e.(map[string]any)["address"] == addr {
			return e.(map[string]any)
		}
	}
	t.Fatalf("no %s entry %s", section, addr)
	return nil
}

func TestPlanHashIgnores(t *testing.T) {
	base := planHashBase(t)
	want := planHashOf(t, base)
	set := func(path ...any) func(p map[string]any) {
		return func(p map[string]any) {
			var cur any = p
			for _, k := range path[:len(path)-2] {
				switch k := k.(type) {
				case string:
					cur = cur.(map[string]any)[k]
				case int:
					cur = cur.([]any)[k]
				}
			}
			cur.(map[string]any)[path[len(path)-2].(string)] = path[len(path)-1]
		}
	}
	change := func(addr string, f func(ch map[string]any)) func(p map[string]any) {
		return func(p map[string]any) { f(planAt(t, p, "resource_changes", addr)["change"].(map[string]any)) }
	}
	cases := []struct {
		name string
		plan []byte
	}{
		{"same bytes", base},
		{"timestamp and terraform_version", planMutate(t, base, func(p map[string]any) {
			p["timestamp"] = "2031-01-02T03:04:05Z"
			p["terraform_version"] = "1.99.0"
		})},
		{"format_version", planMutate(t, base, set("format_version", "1.0"))},
		{"keys reversed at every depth, whitespace, numbers respelled", planReencode(planDecode(t, base), false)},
		{"every string and key escaped", planReencode(planDecode(t, base), true)},
		{"resource_changes and drift reordered", planMutate(t, base, func(p map[string]any) {
			slices.Reverse(p["resource_changes"].([]any))
			slices.Reverse(p["resource_drift"].([]any))
			rc := p["resource_changes"].([]any)
			rc[0], rc[2] = rc[2], rc[0]
		})},
		{"prior_state", planMutate(t, base, func(p map[string]any) {
			r := p["prior_state"].(map[string]any)["values"].(map[string]any)["root_module"].(map[string]any)["resources"].([]any)
			r[0].(map[string]any)["values"].(map[string]any)["input"] = "changed"
			p["prior_state"].(map[string]any)["terraform_version"] = "0.1.0"
		})},
		{"planned_values", planMutate(t, base, func(p map[string]any) {
			r := p["planned_values"].(map[string]any)["root_module"].(map[string]any)["resources"].([]any)
			r[0].(map[string]any)["values"].(map[string]any)["input"] = "changed"
			p["planned_values"].(map[string]any)["outputs"] = map[string]any{}
		})},
		{"configuration", planMutate(t, base, func(p map[string]any) {
			p["configuration"] = map[string]any{"root_module": map[string]any{"resources": []any{}}}
		})},
		{"variables", planMutate(t, base, set("variables", map[string]any{"region": map[string]any{"value": "eu-west-1"}}))},
		{"relevant_attributes and checks", planMutate(t, base, func(p map[string]any) {
			delete(p, "relevant_attributes")
			p["checks"] = []any{map[string]any{"address": map[string]any{"kind": "check", "name": "c"}, "status": "pass"}}
			p["applyable"] = true
			p["complete"] = true
		})},
		{"action_reason, replace_paths, provider_name, index", planMutate(t, base, func(p map[string]any) {
			b := planAt(t, p, "resource_changes", "terraform_data.b")
			b["action_reason"] = "replace_because_tainted"
			b["change"].(map[string]any)["replace_paths"] = []any{[]any{"input"}}
			b["provider_name"] = "registry.opentofu.org/example/terraform"
			b["index"] = json.Number("0")
			planAt(t, p, "resource_drift", "terraform_data.gone")["action_reason"] = "delete_because_no_resource_config"
		})},
		{"a plain no-op's values", planMutate(t, base, change("terraform_data.n", func(ch map[string]any) {
			ch["before"] = map[string]any{"input": "other"}
			ch["after"] = map[string]any{"input": "other"}
		}))},
		{"a plain no-op added", planMutate(t, base, func(p map[string]any) {
			p["resource_changes"] = append(p["resource_changes"].([]any), map[string]any{
				"address": "terraform_data.z", "change": map[string]any{"actions": []any{"no-op"}, "before": nil, "after": nil},
			})
		})},
		{"a no-op output added", planMutate(t, base, func(p map[string]any) {
			p["output_changes"].(map[string]any)["unchanged"] = map[string]any{"actions": []any{"no-op"}, "before": "x", "after": "x"}
		})},
		{"a no-op drift added", planMutate(t, base, func(p map[string]any) {
			p["resource_drift"] = append(p["resource_drift"].([]any), map[string]any{
				"address": "terraform_data.q", "change": map[string]any{"actions": []any{"no-op"}, "before": "x", "after": "x"},
			})
		})},
		{"drift's after_unknown and sensitivity", planMutate(t, base, func(p map[string]any) {
			ch := planAt(t, p, "resource_drift", "terraform_data.gone")["change"].(map[string]any)
			ch["after_unknown"] = map[string]any{"input": true}
			ch["before_sensitive"] = map[string]any{"input": true}
		})},
		{"a missing before is null", planMutate(t, base, change("terraform_data.e", func(ch map[string]any) {
			if ch["before"] != nil {
				t.Fatal("the create's before is not null")
			}
			delete(ch, "before")
		}))},
		{"importing null", planMutate(t, base, change("terraform_data.a", func(ch map[string]any) { ch["importing"] = nil }))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := planHashOf(t, tc.plan); got != want {
				t.Errorf("hash %s, want %s (unchanged)", got, want)
			}
		})
	}
}

func TestPlanHashCovers(t *testing.T) {
	base := planHashBase(t)
	baseHash := planHashOf(t, base)
	change := func(section, addr string, f func(ch map[string]any)) []byte {
		return planMutate(t, base, func(p map[string]any) {
			f(planAt(t, p, section, addr)["change"].(map[string]any))
		})
	}
	entry := func(section, addr string, f func(e map[string]any)) []byte {
		return planMutate(t, base, func(p map[string]any) { f(planAt(t, p, section, addr)) })
	}
	output := func(f func(o map[string]any)) []byte {
		return planMutate(t, base, func(p map[string]any) { f(p["output_changes"].(map[string]any)) })
	}
	attr := func(key string, v any) func(ch map[string]any) {
		return func(ch map[string]any) { ch[key].(map[string]any)["input"] = v }
	}
	num := func(f func(n map[string]any)) []byte {
		return change("resource_changes", "terraform_data.num", func(ch map[string]any) {
			f(ch["after"].(map[string]any)["input"].(map[string]any))
		})
	}
	cases := []struct {
		name string
		plan []byte
	}{
		{"before attribute", change("resource_changes", "terraform_data.a", attr("before", "two"))},
		{"after attribute", change("resource_changes", "terraform_data.a", attr("after", "dos"))},
		{"after attribute type", change("resource_changes", "terraform_data.a", attr("after", []any{"uno"}))},
		{"after_unknown", change("resource_changes", "terraform_data.a", attr("after_unknown", true))},
		{"before_sensitive", change("resource_changes", "terraform_data.a", attr("before_sensitive", true))},
		{"after_sensitive", change("resource_changes", "terraform_data.a", attr("after_sensitive", true))},
		{"before_sensitive false vs {}", change("resource_changes", "terraform_data.a", func(ch map[string]any) { ch["before_sensitive"] = false })},
		{"actions", change("resource_changes", "terraform_data.b", func(ch map[string]any) { ch["actions"] = []any{"create", "delete"} })},
		{"actions of an update", change("resource_changes", "terraform_data.a", func(ch map[string]any) { ch["actions"] = []any{"delete", "create"} })},
		{"address", entry("resource_changes", "terraform_data.c", func(e map[string]any) { e["address"] = "terraform_data.c2" })},
		{"previous_address (a move)", entry("resource_changes", "terraform_data.a", func(e map[string]any) { e["previous_address"] = "terraform_data.old" })},
		{"deposed", entry("resource_changes", "terraform_data.c", func(e map[string]any) { e["deposed"] = "00000001" })},
		{"importing id", change("resource_changes", "terraform_data.i", func(ch map[string]any) { ch["importing"] = map[string]any{"id": "i-456"} })},
		{"importing identity", change("resource_changes", "terraform_data.i", func(ch map[string]any) {
			ch["importing"] = map[string]any{"id": "i-123", "identity": map[string]any{"id": "i-123"}}
		})},
		{"importing added to an update", change("resource_changes", "terraform_data.a", func(ch map[string]any) { ch["importing"] = map[string]any{"id": "a"} })},
		{"importing removed from a no-op", change("resource_changes", "terraform_data.i", func(ch map[string]any) { delete(ch, "importing") })},
		{"a plain no-op becomes an update", change("resource_changes", "terraform_data.n", func(ch map[string]any) { ch["actions"] = []any{"update"} })},
		{"resource change removed", planMutate(t, base, func(p map[string]any) {
			rc := p["resource_changes"].([]any)
			p["resource_changes"] = rc[1:]
		})},
		{"resource change duplicated", planMutate(t, base, func(p map[string]any) {
			rc := p["resource_changes"].([]any)
			p["resource_changes"] = append(rc, rc[0])
		})},
		{"values swapped between two changes", planMutate(t, base, func(p map[string]any) {
			a := planAt(t, p, "resource_changes", "terraform_data.a")["change"].(map[string]any)
			e := planAt(t, p, "resource_changes", "terraform_data.e")["change"].(map[string]any)
			a["after"], e["after"] = e["after"], a["after"]
		})},
		{"output before", output(func(o map[string]any) { o["a"].(map[string]any)["before"] = "two" })},
		{"output after", output(func(o map[string]any) { o["a"].(map[string]any)["after"] = "uno" })},
		{"output after_unknown", output(func(o map[string]any) { o["a"].(map[string]any)["after_unknown"] = false })},
		{"output sensitivity", output(func(o map[string]any) { o["a"].(map[string]any)["after_sensitive"] = true })},
		{"output actions", output(func(o map[string]any) { o["a"].(map[string]any)["actions"] = []any{"create"} })},
		{"output name", output(func(o map[string]any) { o["b"] = o["a"]; delete(o, "a") })},
		{"output added", output(func(o map[string]any) {
			o["new"] = map[string]any{"actions": []any{"create"}, "before": nil, "after": "x", "after_unknown": false}
		})},
		{"drift before", change("resource_drift", "terraform_data.a", attr("before", "uno"))},
		{"drift after", change("resource_drift", "terraform_data.a", attr("after", "one-edited-again"))},
		{"drift address", entry("resource_drift", "terraform_data.gone", func(e map[string]any) { e["address"] = "terraform_data.went" })},
		{"drift actions", change("resource_drift", "terraform_data.gone", func(ch map[string]any) { ch["actions"] = []any{"update"} })},
		{"drift removed", planMutate(t, base, func(p map[string]any) { p["resource_drift"] = p["resource_drift"].([]any)[1:] })},
		{"drift moved to resource_changes", planMutate(t, base, func(p map[string]any) {
			d := p["resource_drift"].([]any)
			p["resource_changes"] = append(p["resource_changes"].([]any), d[1])
			p["resource_drift"] = d[:1]
		})},
		{"number 1 → 1.5", num(func(n map[string]any) { n["n"] = json.Number("1.5") })},
		{"number 1 → 1.0000000000000000000001", num(func(n map[string]any) { n["n"] = json.Number("1.0000000000000000000001") })},
		{"number 1 → 10", num(func(n map[string]any) { n["n"] = json.Number("10") })},
		{"number 1 → -1", num(func(n map[string]any) { n["n"] = json.Number("-1") })},
		{"number 1 → \"1\"", num(func(n map[string]any) { n["n"] = "1" })},
		{"big number, last digit", num(func(n map[string]any) { n["big"] = json.Number("12345678901234567890124") })},
		{"string escape content", num(func(n map[string]any) { n["s"] = "<a&b> \"quoted\" e 😀 \u0001" })},
		{"key renamed", num(func(n map[string]any) { n["g"] = n["f"]; delete(n, "f") })},
	}
	seen := map[string]string{baseHash: "base"}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := planHashOf(t, tc.plan)
			if prev, ok := seen[got]; ok {
				t.Errorf("hash %s, the same as %q", got, prev)
			}
			seen[got] = tc.name
		})
	}
}

// TestPlanHashText covers what a map re-encoding cannot show: a repeated key counts once
// with its last value, absent and null are the same, number spellings.
func TestPlanHashText(t *testing.T) {
	plan := func(after string) []byte {
		return []byte(`{"format_version":"1.2","planned_values":{},"resource_changes":[{"address":"x.a","change":{"actions":["create"],"before":null,"after":` +
			after + `,"after_unknown":{},"before_sensitive":false,"after_sensitive":{}}}]}`)
	}
	groups := [][]string{
		{`{"v":1}`, `{"v":1.0}`, `{"v":1e0}`, `{"v":10E-1}`, `{"v":0.1e+1}`, `{"v":1.000}`, `{"v":"x","v":1}`, `{ "v" : 1 }`},
		{`{"v":-0}`, `{"v":0}`, `{"v":0.0e10}`, `{"v":-0.0}`},
		{`{"v":100}`, `{"v":1e2}`, `{"v":1.00e+2}`, `{"v":100.0}`},
		{`{"v":0.5}`, `{"v":5e-1}`, `{"v":50E-2}`},
		{`{"v":"A/é"}`, `{"v":"\u0041\/\u00e9"}`, `{"v":"\u0041\/\u00E9"}`},
		{`{"v":"😀"}`, `{"v":"\ud83d\ude00"}`},
		{`{"v":1.0000000000000000000001}`, `{"v":10000000000000000000001e-22}`},
		{`{"v":{"a":1,"b":[true,null]}}`, `{"v":{"b":[true,null],"a":1}}`},
		{`{"v":1e400}`, `{"v":10e399}`},
	}
	seen := map[string]string{}
	for _, g := range groups {
		want := planHashOf(t, plan(g[0]))
		for _, v := range g[1:] {
			if got := planHashOf(t, plan(v)); got != want {
				t.Errorf("after %s: hash %s, want the hash of %s, %s", v, got, g[0], want)
			}
		}
		if prev, ok := seen[want]; ok {
			t.Errorf("after %s has the hash of %s", g[0], prev)
		}
		seen[want] = g[0]
	}
	// A missing before is null; a missing importing is null (and no import).
	withNull := planHashOf(t, plan(`{"v":1}`))
	missing := bytes.Replace(plan(`{"v":1}`), []byte(`"before":null,`), nil, 1)
	if got := planHashOf(t, missing); got != withNull {
		t.Errorf("missing before: hash %s, want %s (as null)", got, withNull)
	}
}

// TestPlanHashRecordedPlans: the recorded plans all have different hashes, the plan without
// changes has the hash of the empty change set, the failed plan none.
func TestPlanHashRecordedPlans(t *testing.T) {
	seen := map[string]string{}
	for _, sc := range planScenarios(t) {
		s, err := classifyScenario(t, sc)
		if sc.rc != 0 {
			if err == nil || s.PlanHash != "" {
				t.Errorf("%s: failed plan has hash %q (err %v), want none", sc.name, s.PlanHash, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if !planHashRE.MatchString(s.PlanHash) {
			t.Errorf("%s: hash %q", sc.name, s.PlanHash)
		}
		if prev, ok := seen[s.PlanHash]; ok {
			t.Errorf("%s has the hash of %s", sc.name, prev)
		}
		seen[s.PlanHash] = sc.name
		if (sc.name == "no-changes") != (s.PlanHash == planEmptyHash) {
			t.Errorf("%s: hash %s, the empty change set's is %s", sc.name, s.PlanHash, planEmptyHash)
		}
		// A re-plan of the same change: new timestamp, new tofu version.
		raw, err := os.ReadFile(sc.file)
		if err != nil {
			t.Fatal(err)
		}
		replan := regexp.MustCompile(`"timestamp":"[^"]*"`).ReplaceAll(raw, []byte(`"timestamp":"2030-01-01T00:00:00Z"`))
		replan = regexp.MustCompile(`"terraform_version":"[^"]*"`).ReplaceAll(replan, []byte(`"terraform_version":"9.9.9"`))
		if bytes.Equal(replan, raw) {
			t.Fatalf("%s: no timestamp or terraform_version to change", sc.name)
		}
		if got := planHashOf(t, replan); got != s.PlanHash {
			t.Errorf("%s: re-plan hash %s, want %s", sc.name, got, s.PlanHash)
		}
	}
	if got := planHashOf(t, []byte(`{"format_version":"1.2","planned_values":{}}`)); got != planEmptyHash {
		t.Errorf("empty plan: hash %s, want %s", got, planEmptyHash)
	}
	for _, data := range []string{
		`{"format_version":"1.2","planned_values":{},"resource_changes":[],"output_changes":{},"resource_drift":[]}`,
		`{"format_version":"1.2","planned_values":{},"resource_changes":null,"output_changes":{},"resource_drift":null}`,
		`{"format_version":"1.2","planned_values":{},"resource_changes":[{"address":"a.b","change":{"actions":["no-op"]}}],
		  "output_changes":{"o":{"actions":["no-op"]}},"resource_drift":[{"address":"a.b","change":{"actions":["no-op"]}}]}`,
	} {
		if got := planHashOf(t, []byte(data)); got != planEmptyHash {
			t.Errorf("%s: hash %s, want the empty change set's %s", data, got, planEmptyHash)
		}
	}
}

// TestPlanHashSpec recomputes a hash from the definition in PlanHashVersion's doc, with the
// records written out by hand.
func TestPlanHashSpec(t *testing.T) {
	data := `{"format_version":"1.2","terraform_version":"1.12.6","timestamp":"2025-01-01T00:00:00Z","planned_values":{},
	  "resource_changes":[
	    {"address":"x.b","previous_address":"x.old","action_reason":"ignored","change":{"actions":["delete","create"],
	     "before":{"z":1.50,"a":"\u0041"},"after":{"a":"A","z":2e0},"after_unknown":{"id":true},
	     "before_sensitive":{},"after_sensitive":{"z":true},"replace_paths":[["z"]]}},
	    {"address":"x.a","deposed":"d1","change":{"actions":["delete"],"before":{"n":100},"after":null,
	     "after_unknown":{},"before_sensitive":false,"after_sensitive":false}},
	    {"address":"x.i","change":{"actions":["no-op"],"before":{},"after":{},"importing":{"id":"i-1"}}},
	    {"address":"x.skip","change":{"actions":["no-op"],"before":{"n":1},"after":{"n":1}}}],
	  "output_changes":{"o":{"actions":["create"],"before":null,"after":"v","after_unknown":false,
	     "before_sensitive":false,"after_sensitive":true},"same":{"actions":["no-op"],"before":1,"after":1}},
	  "resource_drift":[{"address":"x.a","change":{"actions":["update"],"before":{"n":1},"after":{"n":1e2},"after_unknown":{}}}]}`
	records := [][]string{
		{
			`{"actions":["delete","create"],"address":"x.b","after":{"a":"A","z":2},"after_sensitive":{"z":true},"after_unknown":{"id":true},"before":{"a":"A","z":1.5},"before_sensitive":{},"deposed":"","importing":null,"previous_address":"x.old"}`,
			`{"actions":["delete"],"address":"x.a","after":null,"after_sensitive":false,"after_unknown":{},"before":{"n":100},"before_sensitive":false,"deposed":"d1","importing":null,"previous_address":""}`,
			`{"actions":["no-op"],"address":"x.i","after":{},"after_sensitive":null,"after_unknown":null,"before":{},"before_sensitive":null,"deposed":"","importing":{"id":"i-1"},"previous_address":""}`,
		},
		{`{"actions":["create"],"after":"v","after_sensitive":true,"after_unknown":false,"before":null,"before_sensitive":false,"name":"o"}`},
		{`{"actions":["update"],"address":"x.a","after":{"n":100},"before":{"n":1}}`},
	}
	h := sha256.New()
	h.Write([]byte("tfstackplan-plan-hash/v1\n"))
	for i, name := range []string{"resource_changes", "output_changes", "resource_drift"} {
		var digests [][]byte
		for _, r := range records[i] {
			d := sha256.Sum256([]byte(r))
			digests = append(digests, d[:])
		}
		slices.SortFunc(digests, bytes.Compare)
		fmt.Fprintf(h, "%s %d\n", name, len(digests))
		for _, d := range digests {
			h.Write(d)
		}
	}
	want := "v1:" + hex.EncodeToString(h.Sum(nil))
	if got := planHashOf(t, []byte(data)); got != want {
		t.Errorf("hash %s, want %s from the documented encoding", got, want)
	}
}

func TestPlanHashCanonicalNumber(t *testing.T) {
	cases := []struct{ in, want string }{
		{"0", "0"}, {"-0", "0"}, {"0.000", "0"}, {"0e-5", "0"}, {"-0.0E+10", "0"},
		{"1", "1"}, {"1.0", "1"}, {"1e0", "1"}, {"10E-1", "1"}, {"0.1e1", "1"}, {"1.000e+0", "1"},
		{"-1", "-1"}, {"-1.50", "-1.5"}, {"12.25", "12.25"},
		{"100", "100"}, {"1e2", "100"}, {"100.00", "100"}, {"0.01e4", "100"},
		{"0.5", "0.5"}, {"5e-1", "0.5"}, {"0.00125", "0.00125"}, {"0.000001", "0.000001"},
		{"0.0000001", "1e-7"}, {"1.25e-7", "125e-9"},
		{"123456789012345678901", "123456789012345678901"},
		{"1234567890123456789012", "1234567890123456789012"},
		{"1234567890123456789012.0", "1234567890123456789012"},
		{"1000000000000000000000", "1e21"}, {"100000000000000000000", "100000000000000000000"},
		{"1e21", "1e21"}, {"1e22", "1e22"}, {"123e30", "123e30"},
		{"1.0000000000000000000001", "1.0000000000000000000001"},
		{"1e400", "1e400"}, {"-1e-400", "-1e-400"},
		{"123e1000000000000000000000", "123e1000000000000000000000"},
		{"1.5e-1000000000000000000000", "15e-1000000000000000000001"},
		{"1e0000000000000000000000000001", "10"},
		{"0.00e1000000000000000000000", "0"},
	}
	for _, tc := range cases {
		got, err := appendCanonicalNumber(nil, []byte(tc.in))
		if err != nil || string(got) != tc.want {
			t.Errorf("canonical %s = %s %v, want %s", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "-", "01", "1.", ".5", "1e", "1e+", "+1", "1x", "--1", "1.2.3"} {
		if got, err := appendCanonicalNumber(nil, []byte(bad)); err == nil {
			t.Errorf("canonical %q = %s, want an error", bad, got)
		}
	}
	// Random numbers: the canonical form has the same exact value, and is a fixed point.
	rng := rand.New(rand.NewPCG(7, 7))
	digits := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteByte(byte('0' + rng.IntN(10)))
		}
		return b.String()
	}
	for range 5000 {
		in := digits(1 + rng.IntN(25))
		in = strings.TrimLeft(in, "0")
		if in == "" {
			in = "0"
		}
		if rng.IntN(2) == 0 {
			in += "." + digits(1+rng.IntN(25))
		}
		if rng.IntN(2) == 0 {
			in += []string{"e", "E", "e+", "e-", "E-"}[rng.IntN(5)] + strconv.Itoa(rng.IntN(60))
		}
		if rng.IntN(3) == 0 {
			in = "-" + in
		}
		got, err := appendCanonicalNumber(nil, []byte(in))
		if err != nil {
			t.Fatalf("canonical %s: %v", in, err)
		}
		a, _ := new(big.Rat).SetString(in)
		b, ok := new(big.Rat).SetString(string(got))
		if !ok || a.Cmp(b) != 0 {
			t.Fatalf("canonical %s = %s, a different value", in, got)
		}
		again, _ := appendCanonicalNumber(nil, got)
		if !bytes.Equal(again, got) {
			t.Fatalf("canonical %s = %s, but canonical %s = %s", in, got, got, again)
		}
		if !json.Valid(got) {
			t.Fatalf("canonical %s = %s, not a JSON number", in, got)
		}
	}
}

func TestPlanHashCanonicalValue(t *testing.T) {
	cases := []struct{ in, want string }{
		{``, `null`},
		{" \n null ", `null`},
		{`{"b":1,"a":{"d":[1.0,"\u0041"],"c":null}}`, `{"a":{"c":null,"d":[1,"A"]},"b":1}`},
		{`{"a":1,"a":2}`, `{"a":2}`},
		{`{"b":{"x":1},"a":0,"b":{"y":2}}`, `{"a":0,"b":{"y":2}}`},
		{`{"a!":1,"a":2,"":3}`, `{"":3,"a":2,"a!":1}`},
		{`{"\u0061":1,"a":2}`, `{"a":2}`},
		{`["\/","\b\f\n\r\t","\u0001\u001F\u007f","\"\\"]`, `["/","\b\f\n\r\t","\u0001\u001f` + "\x7f" + `","\"\\"]`},
		{`"\u00e9\ud83d\ude00<>&\u2028"`, "\"é😀<>&\u2028\""},
		{`"\ud800"`, "\"\ufffd\""}, {`"\ud800\u0041"`, "\"\ufffdA\""}, {`"\udc00\ud800"`, "\"\ufffd\ufffd\""},
		{"\"a\xffb\"", "\"a\ufffdb\""},
		{`[ 1 , [ ] , { } , true , false ]`, `[1,[],{},true,false]`},
	}
	var c canonicalizer
	for _, tc := range cases {
		got, err := c.appendValue(nil, []byte(tc.in))
		if err != nil || string(got) != tc.want {
			t.Errorf("canonical %s = %s %v, want %s", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{`{`, `[1,]`, `{"a"}`, `{"a":1,}`, `tru`, `nul`, `"abc`, `"\x"`, `"\u12"`, `1 2`, `{1:2}`, "\"\x01\""} {
		if got, err := c.appendValue(nil, []byte(bad)); err == nil {
			t.Errorf("canonical %q = %s, want an error", bad, got)
		}
	}
}

// FuzzPlanHashCanonical: any valid JSON value has a canonical form that is valid JSON, reads
// back as the same value (as encoding/json reads both) and is its own canonical form.
func FuzzPlanHashCanonical(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":{"d":[1.0,"\u0041"],"c":null}}`, `{"a":1,"a":2}`, `"\ud800\u0041"`, "\"a\xffb\"",
		`[1e400, -0.0, 12345678901234567890123, 1.5e-7]`, `{"\u0061":1,"a":2}`, `["\/\b\f\n\r\t\u0001"]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !json.Valid(data) {
			return
		}
		var c canonicalizer
		got, err := c.appendValue(nil, data)
		if err != nil {
			t.Fatalf("canonical %q: %v", data, err)
		}
		if !json.Valid(got) {
			t.Fatalf("canonical %q = %q, not valid JSON", data, got)
		}
		again, err := c.appendValue(nil, got)
		if err != nil || !bytes.Equal(again, got) {
			t.Fatalf("canonical %q = %q, but canonical of that = %q %v", data, got, again, err)
		}
		var a, b any
		errA, errB := json.Unmarshal(data, &a), json.Unmarshal(got, &b)
		if (errA == nil) != (errB == nil) {
			t.Fatalf("unmarshal %q: %v, of its canonical %q: %v", data, errA, got, errB)
		}
		if errA == nil && !reflect.DeepEqual(a, b) {
			t.Fatalf("canonical %q = %q reads as %v, not %v", data, got, b, a)
		}
	})
}

// BenchmarkPlanHashCanonical measures the canonicalization of a change's values.
func BenchmarkPlanHashCanonical(b *testing.B) {
	raw, err := os.ReadFile(filepath.Join(planTofuDir, "mixed", "plan.json"))
	if err != nil {
		b.Fatal(err)
	}
	var c canonicalizer
	var dst []byte
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if dst, err = c.appendValue(dst[:0], raw); err != nil {
			b.Fatal(err)
		}
	}
}
