//go:build linux && (amd64 || arm64)

package earlytick

import (
	"github.com/tfstackplan/tfstackplan/internal/rawsys"
	"github.com/tfstackplan/tfstackplan/internal/tickline"
)

func init() {
	if handleProc(rawsys.ReadFile, rawsys.NowUnixNano) {
		rawsys.Exit(0)
	}
}

// handleProc is Handle on the process's own arguments and environment, read from
// /proc/self through read, with clock for the tick's time, and reports whether it handled the
// call. It declines (false) whenever it cannot be sure what the call is: a file that cannot be
// read or was cut short (see splitNUL); Handle declines a clock that fails.
func handleProc(read func(path string) ([]byte, rawsys.Errno), clock func() (int64, bool)) bool {
	cmdline, e := read("/proc/self/cmdline")
	// Kernels before 4.2 return one page of cmdline: a read of a page or more may be cut on a
	// string boundary, arguments missing, and is left to the full command line.
	if e != 0 || len(cmdline) >= 4096 {
		return false
	}
	args, ok := splitNUL(cmdline)
	if !ok || len(args) == 0 || !isTick(args[1:]) {
		return false
	}
	environ, e := read("/proc/self/environ")
	if e != 0 {
		return false
	}
	env, ok := splitNUL(environ)
	if !ok {
		return false
	}
	return Handle(args[1:], func(key string) string { return lookup(env, key) }, clock)
}

// splitNUL splits NUL-terminated strings, and reports whether the last one had its NUL: one
// without is a list cut short (kernels before 4.2 cut cmdline at one page), not the
// process's own.
func splitNUL(b []byte) ([]string, bool) {
	var out []string
	start := 0
	for i, c := range b {
		if c == 0 {
			out = append(out, string(b[start:i]))
			start = i + 1
		}
	}
	return out, start == len(b)
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

// appendTick appends r to the tick file in dir as internal/tickfile's Append does, with raw
// system calls (a process that has nothing else to do: see internal/rawsys), and reports
// whether it did. A failure is ignored, as `run tick` always ignores it.
func appendTick(dir string, r tickline.Record) bool {
	line := tickline.Line(r)
	fd, e := rawsys.Open(tickline.Path(dir), rawsys.O_WRONLY|rawsys.O_APPEND|rawsys.O_CREAT|rawsys.O_CLOEXEC, 0o600)
	if e != 0 {
		return false
	}
	n, e := rawsys.Write(fd, line)
	return rawsys.Close(fd) == 0 && e == 0 && n == len(line)
}
