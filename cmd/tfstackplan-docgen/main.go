// Command tfstackplan-docgen writes the CLI reference (docs/cli.md) from tfstackplan's command
// tree. Run it from the repository root after changing a command or a flag:
//
//	go run ./cmd/tfstackplan-docgen            # writes docs/cli.md
//	go run ./cmd/tfstackplan-docgen -o -       # prints it
//
// scripts/check-generated.sh (part of `make test`) fails when docs/cli.md is stale.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tfstackplan/tfstackplan/internal/cli"
)

func main() {
	out := flag.String("o", cli.ReferenceFile, "output file (- for stdout)")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: tfstackplan-docgen [-o FILE]")
		os.Exit(2)
	}
	var b bytes.Buffer
	if err := cli.WriteReference(&b); err != nil {
		fmt.Fprintln(os.Stderr, "tfstackplan-docgen:", err)
		os.Exit(1)
	}
	if *out == "-" {
		_, _ = os.Stdout.Write(b.Bytes())
		return
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "tfstackplan-docgen:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, b.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "tfstackplan-docgen:", err)
		os.Exit(1)
	}
}
