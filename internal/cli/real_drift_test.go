package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/job"
)

// TestRealToolsDrift is `run drift` with the REAL terramate and OpenTofu, opt-in (see
// TestRealToolsPlanApply): three applied stacks, one of them changed on main and never applied.
// Every stack is planned, only that one drifted, the issue body names it, and
// --fail-on-drift exits 4.
func TestRealToolsDrift(t *testing.T) {
	rt := newRealTools(t)
	proj, write := rt.project(map[string]string{
		"stacks/prod/network": "name = \"network\"\n  id   = \"network\"",
		"stacks/prod/app":     "name  = \"app\"\n  id    = \"app\"\n  after = [\"/stacks/prod/network\"]",
		"stacks/prod/data/db": "name  = \"db\"\n  id    = \"db\"",
	}, map[string]string{
		"stacks/prod/network": `resource "terraform_data" "net" { input = "v1" }` + "\n",
		"stacks/prod/app":     `resource "terraform_data" "app" { input = "v1" }` + "\n",
		"stacks/prod/data/db": `resource "terraform_data" "db" { input = "v1" }` + "\n",
	})
	// Merged on main, never applied: the infrastructure no longer matches the configuration.
	write("stacks/prod/app/main.tf", `resource "terraform_data" "app" { input = "v2" }`+"\n")
	rt.mustRun(proj, "git", "commit", "-qam", "app v2, not applied")

	result, issue := filepath.Join(rt.work, "drift.json"), filepath.Join(rt.work, "issue.md")
	out := rt.mustRun(proj, "tfstackplan", "run", "drift", "-e", "prod", "--parallel", "2", "--result", result, "--issue-file", issue)
	t.Logf("run drift:\n%s", out)
	b, err := os.ReadFile(result)
	must(t, err)
	var res job.Result
	must(t, json.Unmarshal(b, &res))
	if res.Status != "succeeded" || len(res.Stacks) != 3 || res.Drift == nil || res.Drift.Checked != 3 {
		t.Fatalf("drift: status %s, stacks %+v, drift %+v, error %+v", res.Status, res.Stacks, res.Drift, res.Error)
	}
	if !slices.Equal(res.Drift.Drifted, []string{"stacks/prod/app"}) {
		t.Fatalf("drifted %q, want only stacks/prod/app", res.Drift.Drifted)
	}
	for _, s := range res.Stacks {
		if s.Drifted == nil || *s.Drifted != (s.Path == "stacks/prod/app") {
			t.Errorf("stack %s: drifted %v (class %s)", s.Path, s.Drifted, s.Class)
		}
	}
	body, err := os.ReadFile(issue)
	must(t, err)
	for _, want := range []string{"1 of 3 stacks drifted", "stacks/prod/app", "terraform_data.app"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("the issue body lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(string(body), "stacks/prod/network") {
		t.Errorf("the issue body names a stack that did not drift:\n%s", body)
	}
	_, err = rt.run(proj, "tfstackplan", "run", "drift", "-e", "prod", "--fail-on-drift", "--result", filepath.Join(rt.work, "again.json"))
	if code := exitCodeOf(err); code != ExitDrift {
		t.Fatalf("--fail-on-drift exited %d, want %d", code, ExitDrift)
	}
}
