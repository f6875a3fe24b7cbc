package plan

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
)

// benchDetailStack is a stack at the most detail Classify keeps: MaxChanges updates listed,
// the first MaxDetailed with maxAttrs attribute diffs of maxValueLen-byte values, 100 changed
// outputs and 100 drift entries, and no destructive change (so that a comment ends at the
// stack table, as in a large run of updates). Stacks made from one template share its slices:
// renders never write to their input.
func benchDetailStack(template *Stack, name string) *Stack {
	s := *template
	s.Name = name
	return &s
}

// benchDetailTemplate is the template of benchDetailStack.
func benchDetailTemplate() *Stack {
	s := &Stack{Class: events.ClassMutating, Destructive: []Change{}, Why: []string{"stack changed"}}
	value := strings.Repeat("v", maxValueLen-2)
	for i := range MaxChanges {
		c := Change{Address: fmt.Sprintf("google_compute_instance.vm[%d]", i), Action: ActionUpdate}
		if i < MaxDetailed {
			for j := range maxAttrs {
				c.Attributes = append(c.Attributes, AttrDiff{
					Path:   fmt.Sprintf("metadata.key_%d", j),
					Before: fmt.Sprintf("%q", value[:len(value)-4]+"old"), After: fmt.Sprintf("%q", value[:len(value)-4]+"new"),
				})
			}
			c.AttributesOmitted = 5
		}
		s.Changes = append(s.Changes, c)
		s.Counts.Update++
	}
	for i := range 100 {
		s.Outputs = append(s.Outputs, OutputChange{Name: fmt.Sprintf("out_%d", i), Action: ActionUpdate,
			Attributes: []AttrDiff{{Path: fmt.Sprintf("out_%d", i), Before: `"a"`, After: `"b"`}}})
		s.Drift = append(s.Drift, Change{Address: fmt.Sprintf("google_compute_instance.drift[%d]", i), Action: ActionUpdate})
	}
	s.OutputsChanged, s.DriftCount = len(s.Outputs), len(s.Drift)
	s.secrets = newSecretSet()
	return s
}

// BenchmarkRenderDetailed renders the PR comment and the step summary of N stacks at the
// most detail (benchDetailStack): the cost of fitting them to their size limits.
func BenchmarkRenderDetailed(b *testing.B) {
	template := benchDetailTemplate()
	for _, n := range []int{50, 100, 200} {
		r := &Report{ExecutionURL: planExecutionURL}
		for i := range n {
			r.Stacks = append(r.Stacks, benchDetailStack(template, fmt.Sprintf("stacks/env/app-%03d", i)))
		}
		for _, render := range []struct {
			name string
			f    func(*Report) string
		}{{"Comment", Comment}, {"Markdown", Markdown}} {
			b.Run(fmt.Sprintf("%s/stacks=%d", render.name, n), func(b *testing.B) {
				b.ReportAllocs()
				size := 0
				for b.Loop() {
					size = len(render.f(r))
				}
				b.ReportMetric(float64(size), "out-bytes")
			})
		}
	}
}

// benchSecretReport is n stacks, each with secrets distinct sensitive values of its own and
// detailed changes of 10 attribute diffs, some of whose values hold one of the stack's secrets
// (masked at Classify) and most of which hold none.
func benchSecretReport(n, secrets, detailed int) *Report {
	r := &Report{ExecutionURL: planExecutionURL}
	for i := range n {
		s := &Stack{Name: fmt.Sprintf("stacks/env/app-%04d", i), Class: events.ClassMutating, Destructive: []Change{},
			Why: []string{"stack changed"}, secrets: newSecretSet()}
		for k := range secrets {
			s.secrets.add(fmt.Sprintf("stack-%04d-secret-%03d-%08x", i, k, uint32(i*7919+k*104729)))
		}
		for j := range detailed {
			c := Change{Address: fmt.Sprintf("aws_db_instance.db[%d]", j), Action: ActionUpdate}
			for k := range 10 {
				before, after := fmt.Sprintf(`"postgres://db-%d-%d.internal:5432/app?sslmode=require"`, j, k), `"e2-standard-4"`
				if k == 0 {
					before = Masked
				}
				c.Attributes = append(c.Attributes, AttrDiff{Path: fmt.Sprintf("tags.key_%d", k), Before: before, After: after})
			}
			s.Changes = append(s.Changes, c)
			s.Counts.Update++
		}
		r.Stacks = append(r.Stacks, s)
	}
	return r
}

// BenchmarkRenderSecrets renders the terminal text, the PR comment and the step summary (as
// the runner's writeOutputs does) of N stacks of 20 secrets and 20 detailed changes each: the
// redaction of every stack against the secrets of all.
func BenchmarkRenderSecrets(b *testing.B) {
	for _, n := range []int{400, 800, 1600} {
		r := benchSecretReport(n, 20, 20)
		b.Run(fmt.Sprintf("stacks=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := Text(io.Discard, r, false); err != nil {
					b.Fatal(err)
				}
				_ = Comment(r)
				_ = Markdown(r)
			}
		})
	}
}

// BenchmarkRenderText renders the terminal text of N stacks of 20 secrets and 20 detailed
// changes each.
func BenchmarkRenderText(b *testing.B) {
	for _, n := range []int{400, 800, 1600} {
		r := benchSecretReport(n, 20, 20)
		b.Run(fmt.Sprintf("stacks=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := Text(io.Discard, r, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchToken is a random token of n letters, digits, '-' and '_' (as API tokens are).
func benchToken(rng *rand.Rand, n int) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(b)
}

// benchSecretsPlan is a plan whose sensitive root variable holds n distinct values, with
// MaxDetailed updated resources of 30 attributes each, none of them secret.
func benchSecretsPlan(n int) []byte {
	var b bytes.Buffer
	rng := rand.New(rand.NewPCG(uint64(n), 1))
	b.WriteString(`{"format_version":"1.2","variables":{"tokens":{"value":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + benchToken(rng, 24) + `"`)
	}
	b.WriteString(`]}},"planned_values":{},"resource_changes":[`)
	for i := range MaxDetailed {
		if i > 0 {
			b.WriteByte(',')
		}
		var before, after strings.Builder
		for j := range 30 {
			if j > 0 {
				before.WriteByte(',')
				after.WriteByte(',')
			}
			fmt.Fprintf(&before, `"attr_%d":"value number %d of resource %d, before"`, j, j, i)
			fmt.Fprintf(&after, `"attr_%d":"value number %d of resource %d, after"`, j, j, i)
		}
		fmt.Fprintf(&b, `{"address":"aws_instance.app[\"instance-%d\"]","change":{"actions":["update"],"before":{%s},"after":{%s},"after_unknown":{}}}`,
			i, before.String(), after.String())
	}
	b.WriteString(`],"configuration":{"root_module":{"variables":{"tokens":{"sensitive":true}}}}}`)
	return b.Bytes()
}

// BenchmarkClassifySecrets classifies a plan with N secrets and MaxDetailed detailed changes;
// retained-MB is the heap the classified stack keeps alive.
func BenchmarkClassifySecrets(b *testing.B) {
	for _, n := range []int{10000, 20000, 40000, 80000} {
		data := benchSecretsPlan(n)
		b.Run(fmt.Sprintf("secrets=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			var retained uint64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				s, err := Classify("secrets", "plan.json", bytes.NewReader(data))
				if err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				if after.HeapAlloc > before.HeapAlloc {
					retained = after.HeapAlloc - before.HeapAlloc
				}
				runtime.KeepAlive(s)
			}
			b.ReportMetric(float64(retained)/1e6, "retained-MB")
		})
	}
}

// benchUnknownJSON is an after_unknown of u true leaves in one list.
func benchUnknownJSON(u int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"list":[`)
	for i := range u {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("true")
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// BenchmarkDiffUnknown diffs after={"a":1} against an after_unknown of U true leaves.
func BenchmarkDiffUnknown(b *testing.B) {
	for _, u := range []int{2500, 5000, 10000} {
		unknown := benchUnknownJSON(u)
		b.Run(fmt.Sprintf("unknown=%d", u), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := diffValues("", nil, []byte(`{"a":1}`), unknown, nil, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkClassifyUnknown classifies a plan of MaxDetailed created resources, each with an
// after_unknown list of U true leaves.
func BenchmarkClassifyUnknown(b *testing.B) {
	for _, u := range []int{1000, 3000, 10000} {
		unknown := benchUnknownJSON(u)
		var plan bytes.Buffer
		plan.WriteString(`{"format_version":"1.2","planned_values":{},"resource_changes":[`)
		for i := range MaxDetailed {
			if i > 0 {
				plan.WriteByte(',')
			}
			fmt.Fprintf(&plan, `{"address":"x.a[%d]","change":{"actions":["create"],"before":null,"after":{"a":1},"after_unknown":%s}}`, i, unknown)
		}
		plan.WriteString(`]}`)
		b.Run(fmt.Sprintf("unknown=%d", u), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Classify("unknown", "plan.json", bytes.NewReader(plan.Bytes())); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReportSecrets makes the union of the secrets of 2,000 stacks (20 each: 40,000) and
// its matcher, as a report's first render does; the next renders of the report reuse it.
func BenchmarkReportSecrets(b *testing.B) {
	r := benchSecretReport(2000, 20, 0)
	b.Run("matcher", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r.union = nil
			_ = r.secrets()
		}
	})
}

// BenchmarkRenderPlan3000 renders a classified plan of 3,000 resource changes (generated, with
// a sensitive root variable whose value reaches unflagged attributes) in the four formats, as
// the runner does for one stack: s/op is the seconds of the four renders, alloc-MB/op the
// bytes they allocate; classify-s is the seconds of classifying the plan once.
func BenchmarkRenderPlan3000(b *testing.B) {
	var plan bytes.Buffer
	if _, err := writePlan(&plan, genOptions{Changes: 3000, Seed: 7, Payload: 500, Secret: "bench-secret-value", Outputs: 10, Drift: 20}); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	s, err := Classify("stacks/prod/app", "plan.json", bytes.NewReader(plan.Bytes()))
	if err != nil {
		b.Fatal(err)
	}
	classify := time.Since(start)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start = time.Now()
	n := 0
	for b.Loop() {
		n++
		r := &Report{Stacks: []*Stack{s}, ExecutionURL: planExecutionURL}
		if err := Text(io.Discard, r, false); err != nil {
			b.Fatal(err)
		}
		if err := JSON(io.Discard, r); err != nil {
			b.Fatal(err)
		}
		_, _ = Comment(r), Markdown(r)
	}
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	b.ReportMetric(elapsed.Seconds()/float64(n), "s/op")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(n)/1e6, "alloc-MB/op")
	b.ReportMetric(classify.Seconds(), "classify-s")
	b.ReportMetric(float64(plan.Len())/1e6, "plan-MB")
}
