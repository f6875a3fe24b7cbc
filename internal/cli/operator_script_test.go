package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
)

// TestOperatorScripts runs testdata/operator/*.txtar: the operator commands (claims, admin,
// executions, logs, completion) end to end as processes, against a real control plane that
// `serve` starts and that `run plan|apply` (the fake terramate and tofu on PATH) feed.
func TestOperatorScripts(t *testing.T) {
	bin := buildFakes(t)
	fixtures, err := filepath.Abs("../../testdata/tofu")
	if err != nil {
		t.Fatal(err)
	}
	lib, err := filepath.Abs("../../scripts/terramate")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"FAKETOFU_FIXTURES": fixtures, "TFSTACKPLAN_LIB": lib, "ADMIN_TOKEN": testAdminToken,
		"GCE_METADATA_HOST": "127.0.0.1:1", "NO_COLOR": "1", "GIT_CONFIG_NOSYSTEM": "1",
	}
	// Nothing from the environment the tests run in may point the commands elsewhere.
	for _, k := range []string{"TFSTACKPLAN_SERVER", "TFSTACKPLAN_AUDIENCE", "TFSTACKPLAN_AUTH", "TFSTACKPLAN_TOKEN", "GITHUB_ACTIONS",
		"GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY", "GITHUB_EVENT_PATH", "GITHUB_SHA", "GITHUB_REF", "GITHUB_REPOSITORY", "RUNNER_TEMP"} {
		env[k] = ""
	}
	// The projects' origin is a local path, which names no repository.
	env["GITHUB_REPOSITORY"] = "acme/infra"
	testscript.Run(t, testscript.Params{
		Dir: "testdata/operator",
		Setup: func(e *testscript.Env) error {
			e.Setenv("PATH", bin+string(os.PathListSeparator)+e.Getenv("PATH"))
			for k, v := range env {
				e.Setenv(k, v)
			}
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"gitproject": cmdGitProject,
			"installlib": cmdInstallLib,
			"serve":      cmdServe,
			"json":       cmdJSON,
			"jsonenv":    cmdJSONEnv,
			"exitcode":   cmdExitCode,
			"errserver":  cmdErrServer,
		},
	})
}
