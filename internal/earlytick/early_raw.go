//go:build linux && (amd64 || arm64)

package earlytick

import "github.com/tfstackplan/tfstackplan/internal/rawsys"

func init() {
	cmdline, e := rawsys.ReadFile("/proc/self/cmdline")
	if e != 0 {
		return
	}
	args := splitNUL(cmdline)
	if len(args) == 0 || !isTick(args[1:]) {
		return
	}
	environ, e := rawsys.ReadFile("/proc/self/environ")
	if e != 0 {
		return
	}
	env := splitNUL(environ)
	if Handle(args[1:], func(key string) string { return lookup(env, key) }, rawsys.NowUnixNano) {
		rawsys.Exit(0)
	}
}

// splitNUL splits the NUL-terminated strings of a /proc/self/cmdline or environ file.
func splitNUL(b []byte) []string {
	var out []string
	start := 0
	for i, c := range b {
		if c == 0 {
			out = append(out, string(b[start:i]))
			start = i + 1
		}
	}
	if start < len(b) { // a last string without its NUL
		out = append(out, string(b[start:]))
	}
	return out
}

// lookup returns the value of key in env ("KEY=value" strings) as os.Getenv does: the first
// entry for key wins, entries without '=' are skipped, and a missing key is "".
func lookup(env []string, key string) string {
	for _, kv := range env {
		if len(kv) > len(key) && kv[len(key)] == '=' && kv[:len(key)] == key {
			return kv[len(key)+1:]
		}
	}
	return ""
}
