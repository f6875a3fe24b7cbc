package job

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/runner"
)

// deletePlan is a plan JSON of n deletes of terraform_data.d[0..n-1].
func deletePlan(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"format_version":"1.2","terraform_version":"1.12.6","planned_values":{"root_module":{}},"resource_changes":[`)
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"address":"terraform_data.d[%d]","mode":"managed","type":"terraform_data","name":"d","index":%d,`+
			`"change":{"actions":["delete"],"before":{"id":"x%d"},"after":null}}`, i, i, i)
	}
	b.WriteString(`],"errored":false}`)
	return []byte(b.String())
}

// TestResultNamesEveryDestructiveAddress: the result document of a plan with more deletes than
// the renders list names every one of them.
func TestResultNamesEveryDestructiveAddress(t *testing.T) {
	const n = 1500
	c, err := runner.NewClient("")
	if err != nil {
		t.Fatal(err)
	}
	stacks := []string{"a"}
	root := runRepo(t, stacks)
	res := runPlanScripted(t, c, root, stacks, "", func(tickDir string, stdout io.Writer) error {
		fmt.Fprintln(stdout, "/stacks/prod/a (script:0 job:0.0)> plan")
		if err := os.WriteFile(filepath.Join(root, "stacks/prod/a", runner.DefaultPlanJSONFile), deletePlan(n), 0o644); err != nil {
			return err
		}
		recordTick(tickDir, runner.TickRecord{Stack: "stacks/prod/a", Phase: "done", Status: "succeeded", At: time.Now().UnixNano()})
		return nil
	})
	if len(res.Stacks) != 1 || res.Stacks[0].Counts.Delete != n {
		t.Fatalf("stacks %+v", res.Stacks)
	}
	got := res.Stacks[0].Destructive
	if len(got) != n || got[n-1] != fmt.Sprintf("terraform_data.d[%d]", n-1) {
		t.Fatalf("the result names %d destructive addresses (last %q), want all %d", len(got), got[len(got)-1], n)
	}
}
