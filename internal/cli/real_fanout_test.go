package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/job"
)

// TestRealToolsFanOut is a fan-out with the REAL terramate and OpenTofu, opt-in like
// TestRealToolsPlanApply: six changed stacks (a chain, a stack nested in another, three alone)
// planned as one job, then as a 3-shard matrix with its shards and merge against a real
// `serve`. The merged result must equal the single job's: the same stacks, statuses, classes
// and content hashes, and the execution on the server must be finalized with them.
func TestRealToolsFanOut(t *testing.T) {
	rt := newRealTools(t)
	work := rt.work
	stacks := map[string]string{
		"stacks/prod/network":        "name = \"network\"\n  id   = \"network\"",
		"stacks/prod/app":            "name  = \"app\"\n  id    = \"app\"\n  after = [\"/stacks/prod/network\"]",
		"stacks/prod/data/db":        "name = \"db\"\n  id   = \"db\"",
		"stacks/prod/data/db/backup": "name = \"backup\"\n  id   = \"backup\"",
		"stacks/prod/monitor":        "name = \"monitor\"\n  id   = \"monitor\"",
		"stacks/prod/cache":          "name = \"cache\"\n  id   = \"cache\"",
	}
	v1 := map[string]string{}
	for dir := range stacks {
		v1[dir] = fmt.Sprintf("resource \"terraform_data\" \"x\" { input = %q }\nresource \"terraform_data\" \"old\" { input = \"v1\" }\n", dir)
	}
	proj, write := rt.project(stacks, v1)
	rt.mustRun(proj, "git", "checkout", "-qb", "feature")
	for dir := range stacks {
		// An update, a delete and a create in every stack.
		write(dir+"/main.tf", fmt.Sprintf("resource \"terraform_data\" \"x\" { input = %q }\nresource \"terraform_data\" \"new\" { input = 1 }\n", dir+" v2"))
	}
	rt.mustRun(proj, "git", "add", "-A")
	rt.mustRun(proj, "git", "commit", "-qm", "v2")
	server := rt.serve(realTokens, realPolicy)
	rt.env = append(rt.env, "TFSTACKPLAN_SERVER="+server, "TFSTACKPLAN_TOKEN=real-e2e-runner-secret", "GITHUB_REPOSITORY=acme/infra")
	read := func(name string) *job.Result {
		t.Helper()
		r, err := job.ReadResult(filepath.Join(work, name))
		must(t, err)
		return r
	}

	rt.mustRun(proj, "tfstackplan", "run", "plan", "-e", "prod", "--pr", "5", "--parallel", "2", "--result", filepath.Join(work, "single.json"))
	single := read("single.json")

	var stdout, stderr bytes.Buffer
	cmd := rt.command(&stdout, proj, "tfstackplan", "run", "plan", "-e", "prod", "--pr", "5", "--matrix", "3", "--result", filepath.Join(work, "matrix.json"))
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil || stdout.String() != `{"include":[{"shard":"1/3"},{"shard":"2/3"},{"shard":"3/3"}]}`+"\n" {
		t.Fatalf("matrix job: %v; stdout %q, stderr %q", err, stdout.String(), stderr.String())
	}
	m := read("matrix.json")
	var cut [][]string
	for _, s := range m.Matrix.Shards {
		cut = append(cut, s.Stacks)
	}
	t.Logf("the cut: %q", cut)
	together := func(a, b string) bool {
		for _, s := range cut {
			if slices.Contains(s, a) {
				return slices.Contains(s, b)
			}
		}
		return false
	}
	if !together("stacks/prod/network", "stacks/prod/app") || !together("stacks/prod/data/db", "stacks/prod/data/db/backup") {
		t.Errorf("the cut %q splits the chain network → app or the nested db/backup", cut)
	}
	var shards []string
	for k := 1; k <= 3; k++ {
		file := filepath.Join(work, fmt.Sprintf("shard-%d.json", k))
		rt.mustRun(proj, "tfstackplan", "run", "plan", "-e", "prod", "--pr", "5", "--parallel", "2",
			"--shard", fmt.Sprintf("%d/3", k), "--matrix-result", filepath.Join(work, "matrix.json"), "--result", file)
		shards = append(shards, file)
	}
	rt.mustRun(proj, "tfstackplan", append([]string{"run", "merge", "--matrix", filepath.Join(work, "matrix.json"), "--result", filepath.Join(work, "merged.json")}, shards...)...)
	merged := read("merged.json")

	if merged.Status != "succeeded" || merged.Class != single.Class || merged.Counts != single.Counts || len(merged.Stacks) != len(single.Stacks) || len(single.Stacks) != len(stacks) {
		t.Fatalf("merged: %s %s %+v, %d stacks; single: %s %s %+v, %d stacks", merged.Status, merged.Class, merged.Counts, len(merged.Stacks), single.Status, single.Class, single.Counts, len(single.Stacks))
	}
	for i, s := range single.Stacks {
		g := merged.Stacks[i]
		if g.Path != s.Path || g.Status != s.Status || g.Class != s.Class || g.PlanHash != s.PlanHash || g.PlanHash == "" || !slices.Equal(g.Destructive, s.Destructive) {
			t.Errorf("stack %d: merged %s %s %s %s %v, single %s %s %s %s %v", i, g.Path, g.Status, g.Class, g.PlanHash, g.Destructive, s.Path, s.Status, s.Class, s.PlanHash, s.Destructive)
		}
	}
	// The server has the fan-out's execution finalized with the same hashes.
	x := serverExecution(t, server, "real-e2e-admin-secret", merged.Execution)
	if x.Status != "succeeded" || len(x.Stacks) != len(stacks) {
		t.Fatalf("server: execution %s is %s with %d stacks", merged.Execution, x.Status, len(x.Stacks))
	}
	for i, s := range x.Stacks {
		if s.Stack != merged.Stacks[i].Path || s.PlanHash != merged.Stacks[i].PlanHash {
			t.Errorf("server stack %d: %s %s, merged %s %s", i, s.Stack, s.PlanHash, merged.Stacks[i].Path, merged.Stacks[i].PlanHash)
		}
	}
}

// serverExecution reads an execution from the server with a static token.
func serverExecution(t *testing.T, server, token, id string) *api.Execution {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, server+"/api/v1/executions/"+id, nil)
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET execution %s: %s", id, resp.Status)
	}
	var x api.Execution
	must(t, json.NewDecoder(resp.Body).Decode(&x))
	return &x
}
