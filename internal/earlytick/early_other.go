//go:build !(linux && (amd64 || arm64))

package earlytick

import (
	"os"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/tickfile"
	"github.com/tfstackplan/tfstackplan/internal/tickline"
)

func init() {
	if Handle(os.Args[1:], os.Getenv, func() (int64, bool) { return time.Now().UnixNano(), true }) {
		os.Exit(0)
	}
}

// appendTick appends r to the tick file in dir, and reports whether it did.
func appendTick(dir string, r tickline.Record) bool { return tickfile.Append(dir, r) == nil }
