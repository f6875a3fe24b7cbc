// Command faketofu is a stand-in for OpenTofu 1.12.6 (`tofu`) that replays, byte for byte, what
// the real binary printed for the commands the tfstackplan script library runs. The recordings
// are in testdata/tofu (made by scripts/capture/tofu.sh with the real binary; see its header for
// every file) and package internal/tofutest holds the fake to them. Build it explicitly:
//
//	go build -o DIR/tofu ./testdata/faketofu     (and/or -o DIR/terraform)
//
// Invoked as `terraform` it behaves identically: there are no Terraform recordings, and the real
// tofu invoked through a `terraform` symlink prints the same OpenTofu texts too.
//
// Files of the working directory (git-ignore `faketofu.*` where terramate runs the fake: it
// refuses to run with untracked files):
//
//	faketofu.case   one line: the case `plan` replays, a directory of FAKETOFU_FIXTURES
//	faketofu.state  written by apply: the state serial (absent = 0)
//	faketofu.lock   present = another process holds the state lock; its first line, when not
//	                empty, is the lock ID printed in the lock error instead of the recorded one
//	faketofu.env    written by apply: the fake's environment, sorted KEY=VALUE lines (what the
//	                last apply ran with)
//
// Environment:
//
//	FAKETOFU_FIXTURES      absolute path of testdata/tofu (required)
//	FAKETOFU_SLEEP         a Go duration to sleep at the start of `plan` (to interrupt it)
//	FAKETOFU_APPLY_SLEEP   the same for `apply`, once plan file, lock and state are checked
//	FAKETOFU_SLEEP_MARKER  a file the fake writes ("COMMAND PID") as one of these sleeps begins,
//	                       once it handles signals: wait for it, then interrupt
//
// Commands, with the flag spellings of Go's flag package (-flag=v, -flag v, --flag=v), except
// -no-color, which tofu accepts only spelled so (it rejects --no-color):
//
//	version [-json]              _cli/version, _cli/version-json
//	init [-input=B] [-no-color]  _cli/init; creates nothing (real init with only the built-in
//	                             terraform_data creates neither .terraform/ nor a lock file)
//	plan -out=FILE [-input=B] [-no-color] [-lock-timeout=D] [-lock=B] [-parallelism=N]
//	                             CASE/plan-out (stdout, stderr, rc); on rc 0 writes FILE, a small
//	                             JSON saved plan naming the case and the state serial. The
//	                             "Saved the plan to:" trailer names FILE, wrapped like tofu does.
//	show -json FILE              the CASE/show-json of the case inside FILE (not faketofu.case);
//	                             _cli/show-missing or _cli/show-corrupt for a missing FILE or one
//	                             the fake did not write
//	apply [-input=B] [-no-color] [-lock-timeout=D] [-lock=B] [-parallelism=N] [-auto-approve] FILE
//	                             in tofu's order: _cli/apply-missing / apply-corrupt; the lock;
//	                             _cli/apply-stale when the state serial moved since the plan;
//	                             _cli/apply-interrupted for an interrupted plan's file; else
//	                             CASE/apply, and the serial moves unless the case's real apply
//	                             did not change the state (CASE/apply-again.rc is 0: no-changes)
//	force-unlock -force ID       with faketofu.lock: removes it, _cli/force-unlock-remote (the
//	                             success text, recorded on the "http" backend); without:
//	                             _cli/force-unlock (the local backend's "LocalState not locked")
//
// Anything else fails with a "faketofu:" message and exit code 1.
//
// The lock (plan and apply): while faketofu.lock exists the fake polls for up to -lock-timeout
// (default 0s); past 400ms it prints "Acquiring state lock. This may take a few moments..." as
// tofu does; at the deadline it fails with _cli/plan-locked or _cli/apply-locked.
//
// Signals: SIGINT or SIGTERM during FAKETOFU_SLEEP or while plan waits for the lock makes it exit
// at once with _cli/plan-sigint or _cli/plan-sigterm, leaving an errored plan in FILE as real tofu
// does; during FAKETOFU_APPLY_SLEEP with _cli/apply-sigint or apply-sigterm, and the state serial
// moves as the real interrupted apply moved it (_cli/apply-after-sigint is "Saved plan is
// stale"). Real tofu first finishes the graph node it is evaluating, then prints the same texts.
//
// Where it cannot follow tofu: it knows only the recorded cases and commands; output of an
// interrupted plan, the lock error and the stale error are those of the recording's own
// configuration (a lock error always names the recorded holder, time and host, except the ID);
// ids and timestamps are those of the recording (CASE/plan-out, show-json and apply share the
// same ids); a file name other than tfstackplan.tfplan is substituted into the recorded
// messages, but the wrapping of diagnostics (show/apply of a missing or corrupt file) stays that
// of the recorded name; TF_IN_AUTOMATION (which drops tofu's "next step" texts) is ignored; a
// second signal ("Two interrupts received") is never needed since the fake exits at the first.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"
)

// Files of the working directory.
const (
	caseFile  = "faketofu.case"
	stateFile = "faketofu.state"
	lockFile  = "faketofu.lock"
	envFile   = "faketofu.env"
)

const (
	cliDir       = "_cli"               // recordings shared by every case
	recordedPlan = "tfstackplan.tfplan" // the -out name used by the recordings
	lockSlowMsg  = 400 * time.Millisecond
	outputWidth  = 78 // tofu's columns when stdout is not a terminal
)

// savedPlan is the fake's saved plan file.
type savedPlan struct {
	Faketofu int    `json:"faketofu"`
	Case     string `json:"case"`
	Serial   int    `json:"serial"`
	Errored  bool   `json:"errored,omitempty"`
}

// recording is one recorded command.
type recording struct {
	stdout, stderr []byte
	rc             int
}

type fake struct {
	fixtures string
	cwd      string
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	f := &fake{fixtures: os.Getenv("FAKETOFU_FIXTURES")}
	if f.fixtures == "" || !filepath.IsAbs(f.fixtures) {
		return fail("FAKETOFU_FIXTURES must be the absolute path of testdata/tofu")
	}
	var err error
	if f.cwd, err = os.Getwd(); err != nil {
		return fail(err.Error())
	}
	if len(args) == 0 {
		return fail("no command")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "version":
		return f.version(rest)
	case "init":
		return f.init(rest)
	case "plan":
		return f.plan(rest)
	case "show":
		return f.show(rest)
	case "apply":
		return f.apply(rest)
	case "force-unlock":
		return f.forceUnlock(rest)
	}
	return fail(fmt.Sprintf("unsupported command %q", cmd))
}

func fail(msg string) int {
	fmt.Fprintf(os.Stderr, "faketofu: %s\n", msg)
	return 1
}

// flags parses Go-flag-style arguments: bools are the flags with no value (-json, -force, ...),
// the others take "=v" or the next argument; -no-color is accepted everywhere, spelled exactly
// so. It returns the flags and the positional arguments.
func flags(args []string, bools, values []string) (map[string]string, []string, error) {
	got := map[string]string{}
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		if a == "-no-color" { // tofu takes it out before its flag set sees the rest: no --no-color
			got["no-color"] = "true"
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		switch {
		case contains(bools, name):
			if !hasVal {
				val = "true"
			}
			if _, err := strconv.ParseBool(val); err != nil {
				return nil, nil, fmt.Errorf("invalid boolean value %q for -%s", val, name)
			}
		case contains(values, name):
			if !hasVal {
				if i+1 >= len(args) {
					return nil, nil, fmt.Errorf("flag needs an argument: -%s", name)
				}
				i++
				val = args[i]
			}
		default:
			return nil, nil, fmt.Errorf("unsupported flag %q", a)
		}
		got[name] = val
	}
	return got, pos, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (f *fake) version(args []string) int {
	fl, pos, err := flags(args, []string{"json"}, nil)
	if err != nil || len(pos) > 0 {
		return fail(fmt.Sprintf("version: %v %v", err, pos))
	}
	if b, _ := strconv.ParseBool(fl["json"]); b {
		return f.replay(cliDir, "version-json", nil)
	}
	return f.replay(cliDir, "version", nil)
}

func (f *fake) init(args []string) int {
	if _, pos, err := flags(args, []string{"input", "upgrade", "reconfigure"}, nil); err != nil || len(pos) > 0 {
		return fail(fmt.Sprintf("init: %v %v", err, pos))
	}
	return f.replay(cliDir, "init", nil)
}

var lockFlags = []string{"lock-timeout"}

func (f *fake) plan(args []string) int {
	fl, pos, err := flags(args, []string{"input", "lock"}, append([]string{"out", "parallelism"}, lockFlags...))
	if err != nil || len(pos) > 0 {
		return fail(fmt.Sprintf("plan: %v %v", err, pos))
	}
	out := fl["out"]
	if out == "" {
		return fail("plan: only plan -out=FILE was recorded")
	}
	timeout, err := lockTimeout(fl)
	if err != nil {
		return fail("plan: " + err.Error())
	}
	c, err := f.caseName()
	if err != nil {
		return fail(err.Error())
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	interrupted := func(s os.Signal) int {
		name := "plan-sigint"
		if s == syscall.SIGTERM {
			name = "plan-sigterm"
		}
		if err := writePlan(out, savedPlan{Case: c, Serial: readSerial(), Errored: true}); err != nil {
			return fail(err.Error())
		}
		return f.replay(cliDir, name, nil)
	}
	if s, err := pause("plan", "FAKETOFU_SLEEP", sigs); err != nil {
		return fail(err.Error())
	} else if s != nil {
		return interrupted(s)
	}
	if rc, locked, s := f.waitLock("plan-locked", fl, timeout, sigs); s != nil {
		return interrupted(s)
	} else if locked {
		return rc
	}
	rc := f.replay(c, "plan-out", func(b []byte) []byte { return planTrailer(b, out) })
	if rc == 0 {
		if err := writePlan(out, savedPlan{Case: c, Serial: readSerial()}); err != nil {
			return fail(err.Error())
		}
	}
	return rc
}

func (f *fake) show(args []string) int {
	fl, pos, err := flags(args, []string{"json"}, nil)
	if err != nil || len(pos) != 1 || fl["json"] == "" {
		return fail(fmt.Sprintf("show: only show -json FILE was recorded (%v)", err))
	}
	p, rc, ok := f.readPlan(pos[0], "show")
	if !ok {
		return rc
	}
	if p.Errored {
		return f.replay(cliDir, "show-interrupted", nil)
	}
	return f.replay(p.Case, "show-json", nil)
}

func (f *fake) apply(args []string) int {
	fl, pos, err := flags(args, []string{"input", "lock", "auto-approve"}, append([]string{"parallelism"}, lockFlags...))
	if err != nil || len(pos) != 1 {
		return fail(fmt.Sprintf("apply: only the apply of a saved plan file was recorded (%v %v)", err, pos))
	}
	timeout, err := lockTimeout(fl)
	if err != nil {
		return fail("apply: " + err.Error())
	}
	env := slices.Sorted(slices.Values(os.Environ()))
	if err := os.WriteFile(envFile, []byte(strings.Join(env, "\n")+"\n"), 0o600); err != nil {
		return fail(err.Error())
	}
	p, rc, ok := f.readPlan(pos[0], "apply")
	if !ok {
		return rc
	}
	if rc, locked, _ := f.waitLock("apply-locked", fl, timeout, nil); locked {
		return rc
	}
	serial := readSerial()
	switch {
	case p.Serial != serial:
		return f.replay(cliDir, "apply-stale", nil)
	case p.Errored:
		return f.replay(cliDir, "apply-interrupted", nil)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if s, err := pause("apply", "FAKETOFU_APPLY_SLEEP", sigs); err != nil {
		return fail(err.Error())
	} else if s != nil {
		name := "apply-sigint"
		if s == syscall.SIGTERM {
			name = "apply-sigterm"
		}
		return f.applied(cliDir, name, "apply-after-sigint", serial)
	}
	return f.applied(p.Case, "apply", "apply-again", serial)
}

// applied replays dir/name and moves the state serial when the recording dir/again (the same
// saved plan applied once more) says the real apply changed the state.
func (f *fake) applied(dir, name, again string, serial int) int {
	a, err := f.load(dir, again)
	if err != nil {
		return fail(err.Error())
	}
	rc := f.replay(dir, name, nil)
	if a.rc != 0 {
		if err := os.WriteFile(stateFile, fmt.Appendf(nil, "serial %d\n", serial+1), 0o644); err != nil {
			return fail(err.Error())
		}
	}
	return rc
}

// pause sleeps for the duration in the variable name, if set, and returns the signal that ended
// it early. It creates FAKETOFU_SLEEP_MARKER first.
func pause(cmd, name string, sigs <-chan os.Signal) (os.Signal, error) {
	d := os.Getenv(name)
	if d == "" {
		return nil, nil
	}
	sleep, err := time.ParseDuration(d)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if m := os.Getenv("FAKETOFU_SLEEP_MARKER"); m != "" {
		if err := os.WriteFile(m, fmt.Appendf(nil, "%s %d\n", cmd, os.Getpid()), 0o644); err != nil {
			return nil, err
		}
	}
	select {
	case s := <-sigs:
		return s, nil
	case <-time.After(sleep):
		return nil, nil
	}
}

func (f *fake) forceUnlock(args []string) int {
	fl, pos, err := flags(args, []string{"force"}, nil)
	if err != nil || len(pos) != 1 || fl["force"] != "true" {
		return fail(fmt.Sprintf("force-unlock: only force-unlock -force ID was recorded (%v)", err))
	}
	if _, err := os.Stat(lockFile); err != nil {
		return f.replay(cliDir, "force-unlock", nil)
	}
	if err := os.Remove(lockFile); err != nil {
		return fail(err.Error())
	}
	return f.replay(cliDir, "force-unlock-remote", nil)
}

// caseName reads faketofu.case.
func (f *fake) caseName() (string, error) {
	b, err := os.ReadFile(caseFile)
	if err != nil {
		return "", fmt.Errorf("no case to replay: %w", err)
	}
	c := strings.TrimSpace(string(b))
	if c == "" || c == cliDir || strings.ContainsAny(c, `/\`) {
		return "", fmt.Errorf("%s: not a case name: %q", caseFile, c)
	}
	if _, err := os.Stat(filepath.Join(f.fixtures, c, "plan-out.rc")); err != nil {
		return "", fmt.Errorf("%s: no recorded case %q in %s", caseFile, c, f.fixtures)
	}
	return c, nil
}

func lockTimeout(fl map[string]string) (time.Duration, error) {
	if fl["lock-timeout"] == "" {
		return 0, nil
	}
	return time.ParseDuration(fl["lock-timeout"])
}

// waitLock waits up to timeout for faketofu.lock to go away (unless -lock=false). When it stays,
// it replays the recorded lock error (name) and reports locked; a signal on sigs ends the wait.
func (f *fake) waitLock(name string, fl map[string]string, timeout time.Duration, sigs <-chan os.Signal) (rc int, locked bool, sig os.Signal) {
	if use, err := strconv.ParseBool(fl["lock"]); err == nil && !use {
		return 0, false, nil
	}
	r, err := f.load(cliDir, name)
	if err != nil {
		return fail(err.Error()), true, nil
	}
	start := time.Now()
	said := false
	for {
		id, err := os.ReadFile(lockFile)
		if errors.Is(err, os.ErrNotExist) {
			return 0, false, nil
		}
		waited := time.Since(start)
		if !said && waited >= lockSlowMsg && timeout > lockSlowMsg {
			os.Stdout.Write(f.fix(r.stdout)) // "Acquiring state lock. This may take a few moments..."
			said = true
		}
		if waited >= timeout {
			first, _, _ := strings.Cut(string(id), "\n")
			os.Stderr.Write(f.fix(lockID(r.stderr, strings.TrimSpace(first))))
			return r.rc, true, nil
		}
		select {
		case s := <-sigs:
			return 0, false, s
		case <-time.After(min(50*time.Millisecond, timeout-waited)):
		}
	}
}

// lockID puts id in place of the recorded lock ID of a lock error.
func lockID(stderr []byte, id string) []byte {
	if id == "" {
		return stderr
	}
	lines := strings.SplitAfter(string(stderr), "\n")
	for i, l := range lines {
		if rest, ok := strings.CutPrefix(l, "  ID:"); ok {
			val := strings.TrimSpace(rest)
			lines[i] = strings.Replace(l, val, id, 1)
		}
	}
	return []byte(strings.Join(lines, ""))
}

// readPlan reads a saved plan, or replays the recorded failure of command (show or apply) for
// a missing or foreign file.
func (f *fake) readPlan(path, command string) (savedPlan, int, bool) {
	sub := func(b []byte) []byte { return bytes.ReplaceAll(b, []byte(recordedPlan), []byte(path)) }
	b, err := os.ReadFile(path)
	if err != nil {
		return savedPlan{}, f.replay(cliDir, command+"-missing", sub), false
	}
	var p savedPlan
	if json.Unmarshal(b, &p) != nil || p.Faketofu != 1 || p.Case == "" {
		return savedPlan{}, f.replay(cliDir, command+"-corrupt", sub), false
	}
	return p, 0, true
}

func writePlan(path string, p savedPlan) error {
	p.Faketofu = 1
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func readSerial() int {
	b, err := os.ReadFile(stateFile)
	if err != nil {
		return 0
	}
	var n int
	fmt.Sscanf(string(b), "serial %d", &n)
	return n
}

// planTrailer names path instead of tfstackplan.tfplan in the "Saved the plan to:" trailer,
// wrapped as tofu wraps it.
func planTrailer(stdout []byte, path string) []byte {
	render := func(p string) string {
		return "\n" + wrap("Saved the plan to: "+p, outputWidth-1) +
			"\n\nTo perform exactly these actions, run the following command to apply:\n" +
			"    tofu apply " + strconv.Quote(p) + "\n"
	}
	return bytes.Replace(stdout, []byte(render(recordedPlan)), []byte(render(path)), 1)
}

// wrap is the greedy word wrap of tofu's format.WordWrap (github.com/mitchellh/go-wordwrap) for
// one line of words separated by single spaces.
func wrap(line string, limit int) string {
	var b strings.Builder
	n := 0
	for i, w := range strings.Split(line, " ") {
		wl := utf8.RuneCountInString(w)
		switch {
		case i == 0:
		case n+1+wl > limit:
			b.WriteByte('\n')
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += wl
	}
	return b.String()
}

// load reads the recording dir/name.
func (f *fake) load(dir, name string) (recording, error) {
	base := filepath.Join(f.fixtures, dir, name)
	var r recording
	var err error
	if r.stdout, err = os.ReadFile(base + ".stdout"); err != nil {
		return r, err
	}
	if r.stderr, err = os.ReadFile(base + ".stderr"); err != nil {
		return r, err
	}
	rc, err := os.ReadFile(base + ".rc")
	if err != nil {
		return r, err
	}
	if r.rc, err = strconv.Atoi(strings.TrimSpace(string(rc))); err != nil {
		return r, fmt.Errorf("%s.rc: %w", base, err)
	}
	return r, nil
}

// fix puts the working directory back where the recording says <tmp>.
func (f *fake) fix(b []byte) []byte {
	return bytes.ReplaceAll(b, []byte("<tmp>"), []byte(f.cwd))
}

// replay prints the recording dir/name (stdout through edit, when not nil) and returns its rc.
func (f *fake) replay(dir, name string, edit func([]byte) []byte) int {
	r, err := f.load(dir, name)
	if err != nil {
		return fail(err.Error())
	}
	if edit != nil {
		r.stdout, r.stderr = edit(r.stdout), edit(r.stderr)
	}
	os.Stdout.Write(f.fix(r.stdout))
	os.Stderr.Write(f.fix(r.stderr))
	return r.rc
}
