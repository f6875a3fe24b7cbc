package job

import (
	"github.com/tfstackplan/tfstackplan/internal/tickfile"
	"github.com/tfstackplan/tfstackplan/internal/tickline"
	"github.com/tfstackplan/tfstackplan/runner"
)

// Test helpers the job's tests share with runner's (there in client_config_test.go, why_test.go,
// tick.go and terramate_fixture_test.go).

func mapEnv(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func firstN(s string, n int) string { return s[:min(n, len(s))] }

// tickFile is the file in EnvTickDir that ticks are appended to.
const tickFile = tickline.Name

// recordTick appends one tick as `run tick` does under the driver.
func recordTick(dir string, r runner.TickRecord) { _ = tickfile.Append(dir, r) }

// tmScenario mirrors the fake terramate's scenario file (testdata/faketerramate), as far as
// the job's tests write it.
type tmScenario struct {
	Stacks  []tmStack  `json:"stacks"`
	Changed []tmChange `json:"changed,omitempty"`
}

type tmStack struct {
	Path  string   `json:"path"`
	Name  string   `json:"name,omitempty"`
	ID    string   `json:"id,omitempty"`
	After []string `json:"after,omitempty"`
}

type tmChange struct {
	Stack string `json:"stack"`
	Why   string `json:"why"`
}

func tmStackHCL(name string, extra string) string {
	return "stack {\n  name = \"" + name + "\"\n  id   = \"" + name + "\"\n" + extra + "}\n"
}
