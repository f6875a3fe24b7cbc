package policy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// planShape describes a generated `show -json` plan for the large-plan test and benchmarks.
type planShape struct {
	Changes    int // resource changes
	Payload    int // approximate bytes of one resource's values
	DeleteOnly bool
}

// genAttrs are a compute-instance-like resource's values.
type genAttrs struct {
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	MachineType string            `json:"machine_type"`
	Zone        string            `json:"zone"`
	Labels      map[string]string `json:"labels"`
	Tags        []string          `json:"tags"`
	DiskSizeGB  int               `json:"disk_size_gb"`
	Public      bool              `json:"public"`
	Startup     string            `json:"metadata_startup_script"`
}

func genResource(s planShape, i int, machine string) genAttrs {
	return genAttrs{
		ID:          fmt.Sprintf("projects/p/zones/europe-west1-b/instances/vm-%d", i),
		Name:        fmt.Sprintf("vm-%d", i),
		MachineType: machine,
		Zone:        "europe-west1-b",
		Labels:      map[string]string{"team": fmt.Sprintf("team-%d", i%7), "env": "prod"},
		Tags:        []string{"web", fmt.Sprintf("tier-%d", i%5)},
		DiskSizeGB:  10 + i%90,
		Public:      i%1000 == 0,
		Startup:     strings.Repeat(fmt.Sprintf("echo %d;", i%13), max(0, s.Payload-300)/8),
	}
}

// writeGenPlan writes the plan s describes: planned_values, resource_changes and
// prior_state, as OpenTofu lays them out. Without DeleteOnly, changes cycle through update,
// create, delete and replace.
func writeGenPlan(w io.Writer, s planShape) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	enc := json.NewEncoder(bw)
	actionsOf := func(i int) []string {
		if s.DeleteOnly {
			return []string{"delete"}
		}
		return [][]string{{"update"}, {"create"}, {"delete"}, {"delete", "create"}}[i%4]
	}
	resource := func(i int, v genAttrs) map[string]any {
		return map[string]any{"address": fmt.Sprintf("google_compute_instance.vm[%d]", i), "mode": "managed",
			"type": "google_compute_instance", "name": "vm", "index": i,
			"provider_name": "registry.opentofu.org/hashicorp/google", "schema_version": 6, "values": v, "sensitive_values": map[string]any{}}
	}
	list := func(key string, include func(acts []string) bool, machine string) {
		fmt.Fprintf(bw, `%q:[`, key)
		first := true
		for i := range s.Changes {
			if !include(actionsOf(i)) {
				continue
			}
			if !first {
				bw.WriteByte(',')
			}
			first = false
			_ = enc.Encode(resource(i, genResource(s, i, machine)))
		}
		bw.WriteString("]")
	}
	bw.WriteString(`{"format_version":"1.2","terraform_version":"1.12.6","planned_values":{"root_module":{`)
	list("resources", func(a []string) bool { return a[len(a)-1] != "delete" || len(a) == 2 }, "e2-standard-4")
	bw.WriteString(`}},"resource_changes":[`)
	for i := range s.Changes {
		if i > 0 {
			bw.WriteByte(',')
		}
		acts := actionsOf(i)
		var before, after any
		if acts[0] != "create" || len(acts) == 2 {
			before = genResource(s, i, "e2-standard-2")
		}
		if acts[len(acts)-1] != "delete" || len(acts) == 2 {
			after = genResource(s, i, "e2-standard-4")
		}
		_ = enc.Encode(map[string]any{"address": fmt.Sprintf("google_compute_instance.vm[%d]", i), "mode": "managed",
			"type": "google_compute_instance", "name": "vm", "index": i, "provider_name": "registry.opentofu.org/hashicorp/google",
			"change": map[string]any{"actions": acts, "before": before, "after": after, "after_unknown": map[string]any{},
				"before_sensitive": map[string]any{}, "after_sensitive": map[string]any{}}})
	}
	bw.WriteString(`],"prior_state":{"format_version":"1.0","values":{"root_module":{`)
	list("resources", func(a []string) bool { return a[0] != "create" || len(a) == 2 }, "e2-standard-2")
	bw.WriteString(`}}},"timestamp":"2026-12-01T00:00:00Z","errored":false}` + "\n")
	return bw.Flush()
}

// genPlanFile writes the plan s describes into dir and returns its path and size.
func genPlanFile(tb testing.TB, dir string, s planShape) (string, int64) {
	tb.Helper()
	path := filepath.Join(dir, fmt.Sprintf("plan-%d-%d-%t.json", s.Changes, s.Payload, s.DeleteOnly))
	if fi, err := os.Stat(path); err == nil {
		return path, fi.Size()
	}
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	if err := writeGenPlan(f, s); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		tb.Fatal(err)
	}
	return path, fi.Size()
}
