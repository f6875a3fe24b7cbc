package job

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// fakeTerramateBin is the path of the fake terramate (testdata/faketerramate) built once per
// test run by TestMain; "" when the build failed (fakeTerramateBuildErr says why). Tests use it
// through fakeTerramate(t).
var (
	fakeTerramateBin      string
	fakeTerramateBuildErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tfstackplan-faketm-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "TestMain:", err)
		os.Exit(1)
	}
	bin := filepath.Join(dir, "terramate")
	out, err := exec.Command("go", "build", "-o", bin, "../../testdata/faketerramate").CombinedOutput()
	if err != nil {
		fakeTerramateBuildErr = fmt.Errorf("building the fake terramate: %v\n%s", err, out)
	} else {
		fakeTerramateBin = bin
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fakeTerramate returns the fake terramate binary, failing the test when it could not be built.
func fakeTerramate(t testing.TB) string {
	t.Helper()
	if fakeTerramateBin == "" {
		t.Fatal(fakeTerramateBuildErr)
	}
	return fakeTerramateBin
}
