package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTerramateContract checks the fake terramate against a real one: with
// TFSTACKPLAN_TERRAMATE naming a terramate 0.17 binary, it builds the fixture project
// (testdata/terramate/make-project.sh) twice per scenario, once for each, and compares what the
// driver parses from both: listings, change reasons, run-graph edges and the metadata fallback,
// tier namespaces, script runs and error causes.
func TestTerramateContract(t *testing.T) {
	realBin := os.Getenv("TFSTACKPLAN_TERRAMATE")
	if realBin == "" {
		t.Skip("TFSTACKPLAN_TERRAMATE is not set: no real terramate to hold the fake to (set it to a terramate 0.17 binary)")
	}
	fake := fakeTerramate(t)
	for _, variant := range []string{
		"02-list", "19-script-run-fail", "18-script-run-unknown", "21-script-run-untracked",
		"22-cycle-list-run-order", "25-ordering-run-graph", "28-space-list", "30-parse-error-list",
		"32-trigger-list-changed-why",
	} {
		t.Run(variant, func(t *testing.T) {
			_, realProj := tmMakeProject(t)
			tmApplyCase(t, realProj, variant, tmBaseScenario(t))
			_, fakeProj := tmFixture(t, variant, nil)
			got := tmContractProbe(t, fake, fakeProj)
			want := tmContractProbe(t, realBin, realProj)
			for k, w := range want {
				if g := got[k]; g != w {
					t.Errorf("%s differs\nfake: %s\nreal: %s", k, g, w)
				}
			}
		})
	}
}

// tmContractProbe runs the driver's calls with bin on proj and renders each result (or the
// cause of its error) as JSON.
func tmContractProbe(t *testing.T, bin, proj string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := map[string]string{}
	put := func(key string, v any, err error) {
		if err != nil {
			v = tmErrorClass(err)
		}
		b, _ := json.Marshal(v)
		out[key] = string(b)
	}
	root := &Terramate{Bin: bin, Dir: proj}
	tier := &Terramate{Bin: bin, Dir: filepath.Join(proj, "stacks", "nonprod")}
	fallback := &Terramate{Bin: bin, Dir: proj, RunGraphBudget: time.Nanosecond}

	list, err := root.List(ctx)
	put("list", list, err)
	v, err := root.ChangedStacks(ctx, "")
	put("changed", v, err)
	v, err = root.ChangedStacks(ctx, "main")
	put("changed -B main", v, err)
	why, err := root.WhyChanged(ctx, "")
	put("why", why, err)
	edges, err := root.RunGraph(ctx)
	put("run-graph", NormalizeEdges(list, edges), err)
	r, err := fallback.RunGraphDetailed(ctx)
	put("metadata edges", NormalizeEdges(list, r.Edges), err)
	tierList, err := tier.List(ctx)
	put("tier list", tierList, err)
	edges, err = tier.RunGraph(ctx)
	put("tier run-graph", NormalizeEdges(tierList, edges), err)
	why, err = tier.WhyChanged(ctx, "")
	put("tier why", why, err)

	for _, o := range []ScriptRunOptions{
		{Script: "plan", Changed: true},
		{Script: "plan", Changed: true, Parallel: 2, ContinueOnError: true},
		{Script: "nosuch"},
	} {
		var buf bytes.Buffer
		err := root.ScriptRun(ctx, &buf, o)
		// Parallel runs interleave: compare the output as a sorted multiset of lines.
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		slices.Sort(lines)
		key, _ := json.Marshal(o)
		put("script run "+string(key)+" output", lines, nil)
		put("script run "+string(key)+" error", tmErrorClass(err), nil)
	}
	return out
}

// tmErrorClass is what the contract compares of an error: its actionable cause and the
// structured details the driver acts on.
func tmErrorClass(err error) map[string]any {
	if err == nil {
		return nil
	}
	c := map[string]any{"error": "unclassified"}
	var te *TerramateError
	if errors.As(err, &te) {
		if te.Cause != nil {
			c["error"] = te.Cause.Error()
		}
		c["exit"] = te.ExitCode
		c["location"] = te.Location
		c["script"] = te.Script
		c["failed"] = te.FailedStacks
	}
	var ce *StackCycleError
	if errors.As(err, &ce) {
		c["error"] = ErrStackCycle.Error()
		c["cycle"] = slices.Sorted(slices.Values(ce.Stacks))
	}
	return c
}
