package tofutest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// result is what one command printed and its exit code, or one recording.
type result struct {
	stdout, stderr string
	rc             int
}

// tool runs one binary (the fake or the real tofu) with its environment.
type tool struct {
	bin string
	env []string
}

func fakeTool(t *testing.T, extraEnv ...string) tool {
	env := cleanEnv("FAKETOFU_")
	env = append(env, Env(t)...)
	return tool{bin: Build(t), env: append(env, extraEnv...)}
}

// cleanEnv is the test's environment without the variables starting with prefix.
func cleanEnv(prefix string) []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, prefix) })
}

func (tl tool) command(dir string, args []string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	cmd := exec.Command(tl.bin, args...)
	cmd.Dir = dir
	cmd.Env = tl.env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	return cmd, &o, &e
}

// run runs the tool in dir, with the paths of dir written as <tmp> in what it printed.
func (tl tool) run(t *testing.T, dir string, args ...string) result {
	t.Helper()
	cmd, o, e := tl.command(dir, args)
	return finish(t, dir, cmd.Run(), o, e)
}

// signalled starts the tool in dir, waits for the file marker to exist (unless "") and then
// for delay, sends sig and waits for the tool to exit.
func (tl tool) signalled(t *testing.T, dir, marker string, delay time.Duration, sig syscall.Signal, args ...string) result {
	t.Helper()
	cmd, o, e := tl.command(dir, args)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); marker != "" && !exists(marker); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("%s never appeared\nstdout:\n%s\nstderr:\n%s", marker, o, e)
		}
	}
	time.Sleep(delay)
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	return finish(t, dir, cmd.Wait(), o, e)
}

func finish(t *testing.T, dir string, err error, o, e *bytes.Buffer) result {
	t.Helper()
	rc := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		rc = ee.ExitCode()
		if rc < 0 {
			t.Fatalf("killed: %v\nstdout:\n%s\nstderr:\n%s", err, o, e)
		}
	case err != nil:
		t.Fatal(err)
	}
	tmp := func(s string) string { return strings.ReplaceAll(s, dir, "<tmp>") }
	return result{stdout: tmp(o.String()), stderr: tmp(e.String()), rc: rc}
}

// recorded reads the recording dir/name of testdata/tofu.
func recorded(t *testing.T, dir, name string) result {
	t.Helper()
	base := filepath.Join(Fixtures(t), dir, name)
	read := func(ext string) string {
		b, err := os.ReadFile(base + ext)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	rc, err := strconv.Atoi(strings.TrimSpace(read(".rc")))
	if err != nil {
		t.Fatal(err)
	}
	return result{stdout: read(".stdout"), stderr: read(".stderr"), rc: rc}
}

// argv is the recorded command line of dir/name, without the leading "tofu".
func argv(t *testing.T, dir, name string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Fixtures(t), dir, name+".cmd"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 || f[0] != "tofu" {
		t.Fatalf("%s/%s.cmd: not a tofu command: %q", dir, name, b)
	}
	return f[1:]
}

// same reports a difference between want and got (both already normalized as needed).
func same(t *testing.T, what string, want, got result) {
	t.Helper()
	if want.rc != got.rc {
		t.Errorf("%s: exit code %d, want %d", what, got.rc, want.rc)
	}
	for _, s := range []struct{ name, want, got string }{{"stdout", want.stdout, got.stdout}, {"stderr", want.stderr, got.stderr}} {
		if s.want != s.got {
			t.Errorf("%s: %s differs at %s\n--- want\n%s\n--- got\n%s", what, s.name, firstDiff(s.want, s.got), s.want, s.got)
		}
	}
}

// firstDiff says where two texts start to differ.
func firstDiff(a, b string) string {
	al, bl := strings.SplitAfter(a, "\n"), strings.SplitAfter(b, "\n")
	for i := 0; i < len(al) || i < len(bl); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return "line " + strconv.Itoa(i+1) + ": want " + strconv.Quote(x) + ", got " + strconv.Quote(y)
		}
	}
	return "?"
}

// cases are the recorded cases (directories of testdata/tofu with a plan-out recording).
func cases(t *testing.T) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(Fixtures(t), "*", "plan-out.cmd"))
	if err != nil || len(m) == 0 {
		t.Fatalf("no recorded cases (%v)", err)
	}
	var cs []string
	for _, p := range m {
		cs = append(cs, filepath.Base(filepath.Dir(p)))
	}
	return cs
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

var (
	uuidRE     = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	stampRE    = regexp.MustCompile(`"timestamp":"[^"]*"`)
	createdRE  = regexp.MustCompile(`(?m)^(  Created: +).*$`)
	whoRE      = regexp.MustCompile(`(?m)^(  Who: +).*$`)
	afterRE    = regexp.MustCompile(` after [0-9]+s\b`)
	deposedRE  = regexp.MustCompile(`\(deposed object [0-9a-f]{8}\)`)
	progressRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*\.[^ ]*( \(deposed object [^)]*\))?: `)
)

// loosen erases what differs between two runs of the same real command: random ids and deposed
// object keys, the plan's timestamp, a lock's creation time and holder, durations, and the order of concurrent progress
// lines ("terraform_data.a: Creating...") within each run of them.
func loosen(r result) result {
	f := func(s string) string {
		s = uuidRE.ReplaceAllString(s, "<id>")
		s = stampRE.ReplaceAllString(s, `"timestamp":"<ts>"`)
		s = createdRE.ReplaceAllString(s, "${1}<time>")
		s = whoRE.ReplaceAllString(s, "${1}<who>")
		s = afterRE.ReplaceAllString(s, " after <n>s")
		s = deposedRE.ReplaceAllString(s, "(deposed object <key>)")
		lines := strings.SplitAfter(s, "\n")
		for i := 0; i < len(lines); {
			j := i
			for j < len(lines) && progressRE.MatchString(lines[j]) {
				j++
			}
			if j > i {
				slices.Sort(lines[i:j])
				i = j
			} else {
				i++
			}
		}
		return strings.Join(lines, "")
	}
	return result{stdout: f(r.stdout), stderr: f(r.stderr), rc: r.rc}
}

// interruptOrder makes the place of tofu's "Stopping operation..." in stdout not matter: after
// a signal, real tofu prints it before or after its "Interrupt received." paragraph depending
// on which of its goroutines runs first. The line is counted, not placed, and the blank lines
// around where it was are collapsed.
func interruptOrder(r result) result {
	const stop = "Stopping operation..."
	var out []string
	n := 0
	for _, line := range strings.Split(r.stdout, "\n") {
		if line == stop {
			n++
			continue
		}
		if line == "" && len(out) > 0 && out[len(out)-1] == "" {
			continue
		}
		out = append(out, line)
	}
	r.stdout = strings.Join(out, "\n") + strings.Repeat("["+stop+"]\n", n)
	return r
}

// The two orders real tofu printed after a SIGTERM normalize to the same output; a missing
// "Stopping operation..." does not.
func TestInterruptOrder(t *testing.T) {
	before := "seed: Refreshing state...\nStopping operation...\n\nInterrupt received.\nGracefully shutting down...\n\n\nPlanning failed.\n"
	after := "seed: Refreshing state...\n\nInterrupt received.\nGracefully shutting down...\n\nStopping operation...\n\nPlanning failed.\n"
	missing := "seed: Refreshing state...\n\nInterrupt received.\nGracefully shutting down...\n\nPlanning failed.\n"
	a, b, c := interruptOrder(result{stdout: before}), interruptOrder(result{stdout: after}), interruptOrder(result{stdout: missing})
	if a.stdout != b.stdout {
		t.Fatalf("the two orders differ:\n%q\n%q", a.stdout, b.stdout)
	}
	if a.stdout == c.stdout {
		t.Fatalf("a missing Stopping operation... went unnoticed: %q", c.stdout)
	}
}
