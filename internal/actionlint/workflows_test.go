package actionlint

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// projectWorkflow is the part of one of the project's own workflows these checks read.
type projectWorkflow struct {
	On   map[string]yaml.Node `yaml:"on"`
	Jobs map[string]struct {
		Uses           string    `yaml:"uses"`
		Needs          yaml.Node `yaml:"needs"`
		TimeoutMinutes int       `yaml:"timeout-minutes"`
		Container      struct {
			Image string `yaml:"image"`
		} `yaml:"container"`
		Steps []step `yaml:"steps"`
	} `yaml:"jobs"`
}

func readProjectWorkflow(t *testing.T, name string) projectWorkflow {
	t.Helper()
	b, err := os.ReadFile("../../.github/workflows/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var w projectWorkflow
	if err := yaml.Unmarshal(b, &w); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return w
}

// TestCIWorkflow: CI runs .ci/run, the README's test command, within CI's 90 minutes, on
// pushes, pull requests and for the release; in a Go image of go.mod's version. Every job has
// a time limit (GitHub's default is six hours).
func TestCIWorkflow(t *testing.T) {
	w := readProjectWorkflow(t, "ci.yml")
	for _, on := range []string{"push", "pull_request", "workflow_call"} {
		if _, ok := w.On[on]; !ok {
			t.Errorf("ci.yml does not run on %s", on)
		}
	}
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	runs := 0
	for name, j := range w.Jobs {
		if j.TimeoutMinutes <= 0 {
			t.Errorf("ci.yml: job %s has no timeout-minutes", name)
		}
		if !slices.ContainsFunc(j.Steps, func(s step) bool { return strings.TrimSpace(s.Run) == "./.ci/run" }) {
			continue
		}
		runs++
		if j.TimeoutMinutes > 90 {
			t.Errorf("ci.yml: job %s may run %d minutes, CI has 90", name, j.TimeoutMinutes)
		}
		if goVersion == nil || j.Container.Image != "golang:"+string(goVersion[1]) {
			t.Errorf("ci.yml: job %s runs in %q, want golang:%s (go.mod's go)", name, j.Container.Image, goVersion[1])
		}
	}
	if runs != 1 {
		t.Errorf("ci.yml: %d jobs run ./.ci/run, want one", runs)
	}
}

// TestReleaseWorkflow: a tag starts it; CI runs first (ci.yml, called); the release job then
// builds with scripts/release.sh from the tag and publishes exactly what it built.
func TestReleaseWorkflow(t *testing.T) {
	w := readProjectWorkflow(t, "release.yml")
	push, ok := w.On["push"]
	var trigger struct {
		Tags     []string `yaml:"tags"`
		Branches []string `yaml:"branches"`
	}
	if !ok || push.Decode(&trigger) != nil || len(trigger.Tags) == 0 || len(trigger.Branches) > 0 || len(w.On) != 1 {
		t.Fatalf("release.yml must run on pushed tags only, runs on %v", slices.Sorted(maps.Keys(w.On)))
	}
	var ci string
	for name, j := range w.Jobs {
		if j.Uses == "./.github/workflows/ci.yml" {
			ci = name
		}
	}
	if ci == "" {
		t.Fatal("release.yml does not run ci.yml")
	}
	built := false
	for name, j := range w.Jobs {
		var run []string
		for _, s := range j.Steps {
			run = append(run, s.Run)
		}
		all := strings.Join(run, "\n")
		if !strings.Contains(all, "./scripts/release.sh") {
			continue
		}
		built = true
		var needs []string
		if j.Needs.Kind == yaml.ScalarNode {
			needs = []string{j.Needs.Value}
		} else {
			_ = j.Needs.Decode(&needs)
		}
		if !slices.Contains(needs, ci) {
			t.Errorf("release.yml: job %s needs %q, not the CI job %s", name, needs, ci)
		}
		if j.TimeoutMinutes <= 0 {
			t.Errorf("release.yml: job %s has no timeout-minutes", name)
		}
		for _, want := range []string{`./scripts/release.sh "$TAG"`, `gh release create "$TAG"`, `"dist/$TAG"/*`} {
			if !strings.Contains(all, want) {
				t.Errorf("release.yml: job %s does not run %s", name, want)
			}
		}
		for _, s := range j.Steps {
			if strings.Contains(s.Run, "$TAG") && s.Env["TAG"] != "${{ github.ref_name }}" {
				t.Errorf("release.yml: step %q uses $TAG, set to %q, not the tag", s.Name, s.Env["TAG"])
			}
		}
	}
	if !built {
		t.Error("no job of release.yml runs ./scripts/release.sh")
	}
}
