package plan

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
)

// genOptions describe a generated `show -json` plan for property tests and the benchmark.
type genOptions struct {
	Changes   int    // resource changes
	Seed      uint64 // of the action mix and values
	Payload   int    // approximate bytes of one resource's values
	Secret    string // value of the sensitive root variable; "" for none
	Drift     int    // resource_drift entries
	Outputs   int    // changed root outputs
	OnlyOf    Action // when set, every change has this action
	NoOpEvery int    // every NoOpEvery-th change is a no-op (0: never), when OnlyOf is set
}

// genResult is what the generator knows it wrote, computed independently of the classifier.
type genResult struct {
	Counts  Counts
	Changes int // changes that are not no-ops
}

// genActions are the action mix of a generated plan, weighted towards updates as real plans
// are.
var genActions = []struct {
	action  Action
	actions []string
	import_ bool
	weight  int
}{
	{ActionUpdate, []string{"update"}, false, 55},
	{ActionCreate, []string{"create"}, false, 14},
	{ActionNoOp, []string{"no-op"}, false, 10},
	{ActionReplace, []string{"delete", "create"}, false, 4},
	{ActionReplace, []string{"create", "delete"}, false, 2},
	{ActionDelete, []string{"delete"}, false, 6},
	{ActionRead, []string{"read"}, false, 4},
	{ActionForget, []string{"forget"}, false, 2},
	{ActionImport, []string{"no-op"}, true, 3},
}

type genState struct {
	o   genOptions
	rng *rand.Rand
	w   *bufio.Writer
	err error
}

func (g *genState) raw(s string) {
	if g.err == nil {
		_, g.err = g.w.WriteString(s)
	}
}

func (g *genState) value(v any) {
	b, err := json.Marshal(v)
	if err != nil && g.err == nil {
		g.err = err
	}
	g.raw(string(b))
}

// genValues are realistic compute-instance-like attributes (a struct, not a map, so that
// generating 100 MB stays quick).
type genValues struct {
	ID                    string            `json:"id"`
	Name                  string            `json:"name"`
	MachineType           string            `json:"machine_type"`
	Zone                  string            `json:"zone"`
	Description           string            `json:"description,omitempty"`
	Labels                map[string]string `json:"labels"`
	Tags                  []string          `json:"tags"`
	NetworkInterface      []genNIC          `json:"network_interface"`
	BootDisk              []genDisk         `json:"boot_disk"`
	DeletionProtection    bool              `json:"deletion_protection"`
	Metadata              map[string]string `json:"metadata"`
	MetadataStartupScript string            `json:"metadata_startup_script,omitempty"`
}

type genNIC struct {
	Network      string `json:"network"`
	NetworkIP    string `json:"network_ip"`
	AccessConfig []struct {
		NatIP       *string `json:"nat_ip"`
		NetworkTier string  `json:"network_tier"`
	} `json:"access_config"`
}

type genDisk struct {
	AutoDelete bool   `json:"auto_delete"`
	DeviceName string `json:"device_name"`
	Size       int    `json:"size"`
}

// resourceValues are the attributes of resource i, of about o.Payload bytes.
func (g *genState) resourceValues(i int, version string) *genValues {
	nic := genNIC{Network: "default", NetworkIP: fmt.Sprintf("10.0.%d.%d", i/250%250, i%250)}
	nic.AccessConfig = make([]struct {
		NatIP       *string `json:"nat_ip"`
		NetworkTier string  `json:"network_tier"`
	}, 1)
	nic.AccessConfig[0].NetworkTier = "PREMIUM"
	return &genValues{
		ID:                    fmt.Sprintf("projects/p/zones/europe-west1-b/instances/vm-%d", i),
		Name:                  fmt.Sprintf("vm-%d", i),
		MachineType:           "e2-standard-" + version,
		Zone:                  "europe-west1-b",
		Labels:                map[string]string{"team": fmt.Sprintf("team-%d", i%7), "env": "prod"},
		Tags:                  []string{"web", "ssh", fmt.Sprintf("tier-%d", i%5)},
		NetworkInterface:      []genNIC{nic},
		BootDisk:              []genDisk{{AutoDelete: true, DeviceName: "persistent-disk-0", Size: 10 + i%90}},
		Metadata:              map[string]string{"db_password": "not-secret-" + version},
		MetadataStartupScript: strings.Repeat(fmt.Sprintf("echo step %d; ", i%13), max(0, (g.o.Payload-450)/14)),
	}
}

func (g *genState) pick(i int) (Action, []string, bool) {
	if g.o.OnlyOf != "" {
		if g.o.NoOpEvery > 0 && i%g.o.NoOpEvery == 0 {
			return ActionNoOp, []string{"no-op"}, false
		}
		for _, a := range genActions {
			if a.action == g.o.OnlyOf {
				return a.action, a.actions, a.import_
			}
		}
	}
	total := 0
	for _, a := range genActions {
		total += a.weight
	}
	n := g.rng.IntN(total)
	for _, a := range genActions {
		if n < a.weight {
			return a.action, a.actions, a.import_
		}
		n -= a.weight
	}
	panic("unreachable")
}

// writePlan writes a generated plan to w: variables, planned_values, resource_drift,
// resource_changes, output_changes, prior_state and configuration, like `tofu show -json`.
// Every 50th resource puts the secret in a flagged attribute of after and in an unflagged
// attribute of before (as OpenTofu does in fixtures/tofu/sensitive).
func writePlan(out io.Writer, o genOptions) (genResult, error) {
	g := &genState{o: o, rng: rand.New(rand.NewPCG(o.Seed, 7)), w: bufio.NewWriterSize(out, 1<<20)}
	var res genResult
	type rc struct {
		action        Action
		actions       []string
		importing     bool
		before, after *genValues
		sensitive     bool
	}
	changes := make([]rc, o.Changes)
	for i := range changes {
		a, acts, imp := g.pick(i)
		c := rc{action: a, actions: acts, importing: imp, sensitive: o.Secret != "" && i%50 == 0}
		if a != ActionCreate && a != ActionRead {
			c.before = g.resourceValues(i, "2")
		}
		if a != ActionDelete && a != ActionForget {
			c.after = g.resourceValues(i, "2")
			if a == ActionUpdate || a == ActionReplace {
				c.after.MachineType = "e2-standard-4"
			}
		}
		if c.sensitive {
			if c.after != nil {
				c.after.Metadata = map[string]string{"db_password": o.Secret}
			}
			if c.before != nil {
				c.before.Metadata = map[string]string{"db_password": o.Secret + "-old"}
				c.before.Description = "rotated from " + o.Secret + "-old"
			}
		}
		changes[i] = c
		if a != ActionNoOp {
			res.Changes++
		}
		res.Counts.inc(a)
	}
	sensMask := func(c rc, v *genValues) any {
		if !c.sensitive || v == nil {
			return map[string]any{}
		}
		return map[string]any{"metadata": map[string]any{"db_password": true}}
	}

	g.raw(`{"format_version":"1.2","terraform_version":"1.12.6",`)
	if o.Secret != "" {
		g.raw(`"variables":{"db_password":{"value":`)
		g.value(o.Secret)
		g.raw(`},"region":{"value":"europe-west1"}},`)
	}
	g.raw(`"planned_values":{"outputs":{"dsn":{"sensitive":true}},"root_module":{"resources":[`)
	first := true
	for i, c := range changes {
		if c.after == nil {
			continue
		}
		if !first {
			g.raw(",")
		}
		first = false
		g.value(map[string]any{
			"address": fmt.Sprintf("google_compute_instance.vm[%d]", i), "mode": "managed",
			"type": "google_compute_instance", "name": "vm", "index": i, "provider_name": "registry.opentofu.org/hashicorp/google",
			"schema_version": 6, "values": c.after, "sensitive_values": sensMask(c, c.after),
		})
	}
	g.raw(`]}},"resource_drift":[`)
	for i := range o.Drift {
		if i > 0 {
			g.raw(",")
		}
		v := g.resourceValues(i, "2")
		g.value(map[string]any{
			"address": fmt.Sprintf("google_compute_instance.vm[%d]", i), "mode": "managed", "type": "google_compute_instance",
			"name": "vm", "index": i, "provider_name": "registry.opentofu.org/hashicorp/google",
			"change": map[string]any{"actions": []string{"update"}, "before": v, "after": v, "after_unknown": map[string]any{},
				"before_sensitive": map[string]any{}, "after_sensitive": map[string]any{}},
		})
	}
	g.raw(`],"resource_changes":[`)
	for i, c := range changes {
		if i > 0 {
			g.raw(",")
		}
		change := map[string]any{
			"actions": c.actions, "before": c.before, "after": c.after,
			"after_unknown":    map[string]any{},
			"before_sensitive": sensMask(c, c.before), "after_sensitive": sensMask(c, c.after),
		}
		if c.action == ActionCreate || c.action == ActionReplace {
			change["after_unknown"] = map[string]any{"id": true}
		}
		if c.importing {
			change["importing"] = map[string]any{"id": fmt.Sprintf("vm-%d", i)}
		}
		rcv := map[string]any{
			"address": fmt.Sprintf("google_compute_instance.vm[%d]", i), "mode": "managed", "type": "google_compute_instance",
			"name": "vm", "index": i, "provider_name": "registry.opentofu.org/hashicorp/google", "change": change,
		}
		if c.action == ActionReplace {
			rcv["action_reason"] = "replace_because_cannot_update"
		}
		g.value(rcv)
	}
	g.raw(`],"output_changes":{`)
	for i := range o.Outputs {
		if i > 0 {
			g.raw(",")
		}
		g.value(fmt.Sprintf("out_%d", i))
		g.raw(":")
		g.value(map[string]any{"actions": []string{"update"}, "before": fmt.Sprintf("v%d", i), "after": fmt.Sprintf("w%d", i),
			"after_unknown": false, "before_sensitive": false, "after_sensitive": false})
	}
	if o.Secret != "" {
		if o.Outputs > 0 {
			g.raw(",")
		}
		g.raw(`"dsn":{"actions":["update"],"before":`)
		g.value("postgres://app:" + o.Secret + "-old@db:5432/app")
		g.raw(`,"after_unknown":true,"before_sensitive":true,"after_sensitive":true}`)
	}
	g.raw(`},"prior_state":{"format_version":"1.0","terraform_version":"1.12.6","values":{"outputs":{`)
	if o.Secret != "" {
		g.raw(`"dsn":{"sensitive":true,"type":"string","value":`)
		g.value("postgres://app:" + o.Secret + "-old@db:5432/app")
		g.raw(`}`)
	}
	g.raw(`},"root_module":{"resources":[`)
	first = true
	for i, c := range changes {
		if c.before == nil {
			continue
		}
		if !first {
			g.raw(",")
		}
		first = false
		g.value(map[string]any{
			"address": fmt.Sprintf("google_compute_instance.vm[%d]", i), "mode": "managed", "type": "google_compute_instance",
			"name": "vm", "index": i, "provider_name": "registry.opentofu.org/hashicorp/google", "schema_version": 6,
			"values": c.before, "sensitive_values": sensMask(c, c.before),
		})
	}
	g.raw(`]}}},"configuration":{"root_module":{"variables":{"db_password":{"sensitive":true},"region":{}}}},`)
	g.raw(`"timestamp":"2026-11-30T00:00:00Z","errored":false}` + "\n")
	if g.err == nil {
		g.err = g.w.Flush()
	}
	return res, g.err
}
