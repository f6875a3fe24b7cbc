package cli

import (
	"os"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
)

// TestMain lets testscript run this package's test binary as the `tfstackplan` command, so the
// .txtar end-to-end scripts exercise the real process: arguments, streams and exit codes.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"tfstackplan": func() { os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) },
	})
}

// TestScripts runs every testdata/script/*.txtar file. Other commands add their own scripts.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir: "testdata/script",
		Setup: func(env *testscript.Env) error {
			// Offline by default: no server, no ambient credentials probing.
			env.Setenv("TFSTACKPLAN_SERVER", "")
			env.Setenv("TFSTACKPLAN_AUDIENCE", "")
			env.Setenv("TFSTACKPLAN_AUTH", "")
			env.Setenv("GCE_METADATA_HOST", "127.0.0.1:1")
			return nil
		},
	})
}
