// Package buildinfo reports the program's version from the build information Go embeds.
package buildinfo

import (
	"runtime/debug"
	"strings"
	"sync"
)

// version is stamped at link time by release builds (scripts/release.sh, the Dockerfile):
// -ldflags "-X github.com/tfstackplan/tfstackplan/internal/buildinfo.version=vX.Y.Z".
var version string

// Version is the version a release build was stamped with; else the module version, or
// "(devel)" plus the VCS revision when built from a tree.
func Version() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	if v == "(devel)" {
		var rev, dirty string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
				if len(rev) > 12 {
					rev = rev[:12]
				}
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "-dirty"
				}
			}
		}
		if rev != "" {
			v += " " + rev + dirty
		}
	}
	return v
}

// UserAgent is the User-Agent every HTTP request of the runner carries.
func UserAgent() string { return userAgent() }

// userAgent is computed once: reading the build information costs every request otherwise.
var userAgent = sync.OnceValue(func() string {
	return "tfstackplan/" + strings.ReplaceAll(Version(), " ", "-")
})

// Raw returns the full build information as Go prints it (`go version -m` style).
func Raw() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "build information unavailable\n"
	}
	return bi.String()
}
