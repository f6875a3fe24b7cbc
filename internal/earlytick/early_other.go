//go:build !(linux && (amd64 || arm64))

package earlytick

import (
	"os"
	"time"
)

func init() {
	if Handle(os.Args[1:], os.Getenv, func() int64 { return time.Now().UnixNano() }) {
		os.Exit(0)
	}
}
