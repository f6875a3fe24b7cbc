// Command tfstackplan runs Terramate stacks in CI, classifies their plans, gates applies and
// serves the control plane. All behaviour lives in internal/cli; main only maps it to a process.
package main

import (
	"os"

	"github.com/tfstackplan/tfstackplan/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
