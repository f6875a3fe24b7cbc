package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
// driver parses from both: listings, changed stacks and their reasons, run-graph edges and the
// metadata fallback, tier namespaces, script runs and the error causes the driver classifies
// (cycle, untracked files, parse error, unknown script, not a project). The fake's scenario is
// derived from the project each case builds (tmApplyCase, tmDeriveChanged). Nothing reaches the
// network: terramate's update check and telemetry are disabled by its CLI configuration file.
func TestTerramateContract(t *testing.T) {
	realBin := os.Getenv("TFSTACKPLAN_TERRAMATE")
	if realBin == "" {
		t.Skip("TFSTACKPLAN_TERRAMATE is not set: no real terramate to hold the fake to (set it to a terramate 0.17 binary)")
	}
	fake := fakeTerramate(t)
	env := tmContractEnv(t)
	for _, variant := range []string{
		"02-list", "19-script-run-fail", "18-script-run-unknown", "21-script-run-untracked",
		"22-cycle-list-run-order", "25-ordering-run-graph", "28-space-list", "30-parse-error-list",
		"31-not-a-project", "32-trigger-list-changed-why",
	} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			realTmp, realProj := tmMakeProject(t)
			tmApplyCase(t, realProj, variant, tmBaseScenario(t))
			fakeTmp, fakeProj := tmFixture(t, variant, nil)
			probe := tmContractProbe
			if variant == "31-not-a-project" {
				probe = tmContractProbeOutside
			}
			got := probe(t, fake, fakeTmp, fakeProj, env)
			want := probe(t, realBin, realTmp, realProj, env)
			for k, w := range want {
				if g := got[k]; g != w {
					t.Errorf("%s differs\nfake: %s\nreal: %s", k, g, w)
				}
			}
		})
	}
}

// tmContractEnv is the environment both terramates run with: a CLI configuration that turns
// off the update check and telemetry (as in TestScriptLibRealTools), and no user git
// configuration.
func tmContractEnv(t *testing.T) []string {
	t.Helper()
	home := t.TempDir()
	rc := filepath.Join(home, "terramate.rc")
	if err := os.WriteFile(rc, []byte(fmt.Sprintf(
		"disable_checkpoint = true\ndisable_checkpoint_signature = true\ndisable_telemetry = true\nuser_terramate_dir = %q\n", home)), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"CHECKPOINT_DISABLE=1", "TM_CLI_CONFIG_FILE=" + rc, "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1"}
}

// tmContractProbe runs the driver's calls with bin on proj and renders each result (or the
// cause of its error) as JSON, with the temporary directory written <tmp>.
func tmContractProbe(t *testing.T, bin, tmp, proj string, env []string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := map[string]string{}
	put := func(key string, v any, err error) {
		if err != nil {
			v = tmErrorClass(err)
		}
		b, _ := json.Marshal(v)
		out[key] = strings.ReplaceAll(string(b), tmp, "<tmp>")
	}
	root := &Terramate{Bin: bin, Dir: proj, Env: env}
	tier := &Terramate{Bin: bin, Dir: filepath.Join(proj, "stacks", "nonprod"), Env: env}
	fallback := &Terramate{Bin: bin, Dir: proj, Env: env, RunGraphBudget: time.Nanosecond}

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
		// Compare the output as a sorted multiset of lines. Parallel runs interleave, and
		// terramate writes a command's "/stack (script:0 job:0.N)> " prefix and its argv
		// separately, so another stack's line can land between the two: compare those as a
		// sorted multiset of words.
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if o.Parallel > 1 {
			lines = strings.Fields(buf.String())
		}
		slices.Sort(lines)
		key, _ := json.Marshal(o)
		put("script run "+string(key)+" output", lines, nil)
		put("script run "+string(key)+" error", tmErrorClass(err), nil)
	}
	return out
}

// tmContractProbeOutside runs the driver's calls from a directory outside any project (the
// "elsewhere" beside the project that 31-not-a-project lays out).
func tmContractProbeOutside(t *testing.T, bin, tmp, proj string, env []string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := map[string]string{}
	put := func(key string, err error) {
		b, _ := json.Marshal(tmErrorClass(err))
		out[key] = strings.ReplaceAll(string(b), tmp, "<tmp>")
	}
	tm := &Terramate{Bin: bin, Dir: filepath.Join(tmp, "elsewhere"), Env: env}
	_, err := tm.List(ctx)
	put("list", err)
	_, err = tm.ChangedStacks(ctx, "")
	put("changed", err)
	_, err = tm.WhyChanged(ctx, "")
	put("why", err)
	_, err = tm.RunGraph(ctx)
	put("run-graph", err)
	put("script run", tm.ScriptRun(ctx, io.Discard, ScriptRunOptions{Script: "plan", Changed: true}))
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
