// Package earlytick answers the common `tfstackplan run tick` calls from its init function,
// before the rest of the binary is initialized, and ends the process there.
//
// A tick runs between every two commands of every stack's script, so its start-up cost is
// paid thousands of times in one CI run. Most of that cost is the initialization of packages
// a tick never uses (Google's API clients, gRPC, protobuf, the SQL drivers, HCL, cobra). Go
// initializes packages one at a time, each time the first in import-path order whose imports
// are all initialized (the Go specification, "Package initialization"). On Linux on amd64 and
// arm64 this package and the two it imports (internal/tickline, internal/rawsys) import
// nothing with initialization work: the arguments and the environment come from
// /proc/self/cmdline and /proc/self/environ, the tick file is written with raw system calls.
// So it runs as the fifth package with init work, before even os. Elsewhere it imports os
// (and internal/tickfile), and runs right after it, still long before the heavy ones.
// internal/cli's tests check both with GODEBUG=inittrace=1. internal/cli imports it, so every
// binary with the command line has it.
//
// It handles exactly the calls whose outcome needs nothing else:
//
//	tfstackplan run tick [--phase P] [--stack S] [--status S] [--message M]
//
// with no other argument, each flag at most once, as `--flag value` or `--flag=value`, a
// non-blank phase, and either
//   - TFSTACKPLAN_TICK_DIR set (under `run plan|apply`) and a non-blank stack (--stack, or
//     TFSTACKPLAN_STACK): the tick is appended to the driver's tick file, exit 0; or
//   - no TFSTACKPLAN_TICK_DIR, and no TFSTACKPLAN_SERVER or no TFSTACKPLAN_EXECUTION
//     (offline): nothing to do, stack or not, exit 0.
//
// Every other call (help, an unknown or repeated flag, a missing value or phase, a missing
// stack where there is somewhere to report, a tick sent straight to a server), and every call
// when /proc cannot be read whole or the
// clock fails, is left alone: init returns and the full command line runs it as it always
// did. The outcome is the same either way (internal/cli's tests compare the two paths call by
// call); only the cost differs.
package earlytick

import "github.com/tfstackplan/tfstackplan/internal/tickline"

// The environment a tick reads; the same names as runner's EnvStack, EnvServer and
// EnvExecution (runner cannot be imported here: it is one of the heavy packages).
const (
	envStack     = "TFSTACKPLAN_STACK"
	envServer    = "TFSTACKPLAN_SERVER"
	envExecution = "TFSTACKPLAN_EXECUTION"
)

// Handle carries out the tick that args (the command line without the program name) describe
// when it is one of the calls this package handles, and reports whether it did; the process
// then has nothing left to do and exits 0. now returns the time in Unix nanoseconds, or false
// when the clock fails; it is read only for a tick under the driver, the one that records a
// time, and a failure declines the call. A tick file that cannot be written is ignored, as `run tick` always does: the driver then relies
// on terramate's output.
func Handle(args []string, getenv func(string) string, now func() (int64, bool)) bool {
	if !isTick(args) {
		return false
	}
	var r tickline.Record
	seen := map[string]bool{}
	for rest := args[2:]; len(rest) > 0; {
		arg := rest[0]
		rest = rest[1:]
		if len(arg) < 2 || arg[:2] != "--" {
			return false
		}
		name, value, hasValue := cut(arg[2:], '=')
		if seen[name] {
			return false
		}
		if !hasValue {
			if len(rest) == 0 {
				return false
			}
			value, rest = rest[0], rest[1:]
		}
		switch name {
		case "phase":
			r.Phase = value
		case "stack":
			r.Stack = value
		case "status":
			r.Status = value
		case "message":
			r.Message = value
		default:
			return false
		}
		seen[name] = true
	}
	if r.Stack == "" {
		r.Stack = getenv(envStack)
	}
	if blank(r.Phase) {
		return false
	}
	dir := getenv(tickline.EnvDir)
	if dir == "" {
		return blank(getenv(envServer)) || getenv(envExecution) == ""
	}
	if blank(r.Stack) {
		return false
	}
	at, ok := now()
	if !ok {
		return false
	}
	r.At = at
	appendTick(dir, r)
	return true
}

// isTick reports whether args (without the program name) start with `run tick`.
func isTick(args []string) bool { return len(args) >= 2 && args[0] == "run" && args[1] == "tick" }

// cut is strings.Cut for one byte.
func cut(s string, sep byte) (before, after string, found bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == sep {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// blank reports whether s is empty or white space only: strings.TrimSpace(s) == "", with
// Unicode's White_Space property spelled out (unicode.IsSpace's list).
func blank(s string) bool {
	for _, r := range s {
		switch r {
		case '\t', '\n', '\v', '\f', '\r', ' ', 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000:
		default:
			if r < 0x2000 || r > 0x200A {
				return false
			}
		}
	}
	return true
}
