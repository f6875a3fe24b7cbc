package job

import (
	"context"
	"time"

	"github.com/tfstackplan/tfstackplan/runner"
)

// Test helpers the job's tests share with runner's (there in client_config_test.go, why_test.go,
// tick.go and terramate_fixture_test.go).

func mapEnv(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func firstN(s string, n int) string { return s[:min(n, len(s))] }

// tickFile is the file in EnvTickDir that runner.Tick appends ticks to (runner's tickFile).
const tickFile = "ticks.jsonl"

// recordTick appends one tick as `run tick` does under the driver: through runner.Tick, with
// the driver's tick directory in its environment.
func recordTick(dir string, r runner.TickRecord) {
	env := mapEnv(map[string]string{runner.EnvTickDir: dir})
	at := func() time.Time { return time.Unix(0, r.At) }
	if _, err := runner.Tick(context.Background(), runner.TickOptions{Phase: r.Phase, Stack: r.Stack, Status: r.Status, Message: r.Message, Getenv: env, Now: at}); err != nil {
		panic("recordTick: " + err.Error())
	}
}

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
