//go:build linux && (amd64 || arm64)

package earlytick

import (
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/rawsys"
	"github.com/tfstackplan/tfstackplan/internal/tickfile"
	"github.com/tfstackplan/tfstackplan/internal/tickline"
)

// The arguments and the environment read from /proc are the ones os gives: the test binary
// runs itself with odd arguments and an odd environment, and the child compares.
func TestProcArgsAndEnvironmentAreOsArgsAndGetenv(t *testing.T) {
	if os.Getenv("EARLYTICK_CHILD") == "1" {
		cmdline, e := readProc("cmdline")
		if e != nil {
			t.Fatal(e)
		}
		if got, ok := splitNUL(cmdline); !ok || !slices.Equal(got, os.Args) {
			t.Fatalf("/proc/self/cmdline gives %q, os.Args is %q", got, os.Args)
		}
		environ, e := readProc("environ")
		if e != nil {
			t.Fatal(e)
		}
		env, ok := splitNUL(environ)
		if !ok {
			t.Fatalf("environ without its last NUL: %q", environ)
		}
		for _, k := range []string{"EARLYTICK_DUP", "EARLYTICK_EMPTY", "EARLYTICK_EQ", "EARLYTICK_NOEQ", "EARLYTICK", "EARLYTICK_MISSING", "EARLYTICK_UTF8", "PATH"} {
			if got, want := lookup(env, k), os.Getenv(k); got != want {
				t.Errorf("lookup(%s) = %q, os.Getenv gives %q", k, got, want)
			}
		}
		if lookup(env, "EARLYTICK_DUP") != "first" {
			t.Errorf("a repeated variable: %q, want the first", lookup(env, "EARLYTICK_DUP"))
		}
		return
	}
	args := []string{"-test.run=^TestProcArgsAndEnvironmentAreOsArgsAndGetenv$", "", "two words", "--phase=x=y", "\xff\xfe", "日本"}
	// os.StartProcess, not os/exec: exec.Cmd drops the repeated variable.
	out, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	p, err := os.StartProcess(os.Args[0], append([]string{os.Args[0]}, args...), &os.ProcAttr{
		Env: []string{"EARLYTICK_CHILD=1", "PATH=" + os.Getenv("PATH"),
			"EARLYTICK_DUP=first", "EARLYTICK_DUP=second", "EARLYTICK_EMPTY=", "EARLYTICK_EQ=a=b=c",
			"EARLYTICK_NOEQ", "EARLYTICK_UTF8=\xff ü", "=nokey"},
		Files: []*os.File{nil, out, out},
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(out.Name())
	if !st.Success() || !strings.Contains(string(b), "PASS") {
		t.Fatalf("child: %v\n%s", st, b)
	}
}

func readProc(name string) ([]byte, error) {
	b, e := rawsys.ReadFile("/proc/self/" + name)
	if e != 0 {
		return nil, syscall.Errno(e)
	}
	return b, nil
}

func TestSplitNUL(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		ok   bool
	}{
		{"", nil, true},
		{"\x00", []string{""}, true},
		{"a\x00\x00b\x00", []string{"a", "", "b"}, true},
		{"a\x00b", []string{"a"}, false}, // cut short: the early path declines
	} {
		if got, ok := splitNUL([]byte(tc.in)); !slices.Equal(got, tc.want) || ok != tc.ok {
			t.Errorf("splitNUL(%q) = %q %v, want %q %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// appendTick writes what internal/tickfile's Append writes: the same lines, a file only its
// owner reads, nothing into a missing directory.
func TestAppendTickIsTickfileAppend(t *testing.T) {
	raw, portable := t.TempDir(), t.TempDir()
	for _, r := range []tickline.Record{{Stack: "a", Phase: "init", At: 1}, {Stack: "a\xff<b>", Phase: "plan", Message: strings.Repeat("m", 2000), At: 2}} {
		if !appendTick(raw, r) {
			t.Fatalf("appendTick(%v) failed", r)
		}
		if err := tickfile.Append(portable, r); err != nil {
			t.Fatal(err)
		}
	}
	a, errA := os.ReadFile(tickline.Path(raw))
	b, errB := os.ReadFile(tickline.Path(portable))
	if errA != nil || errB != nil || string(a) != string(b) || strings.Count(string(a), "\n") != 2 {
		t.Fatalf("raw %q (%v)\nportable %q (%v)", a, errA, b, errB)
	}
	if fi, err := os.Stat(tickline.Path(raw)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("tick file mode %v, %v: want 0600", fi.Mode(), err)
	}
	if appendTick(raw+"/missing", tickline.Record{Stack: "a", Phase: "p"}) {
		t.Fatal("appendTick into a missing directory reported success")
	}
}

// handleProc declines whatever it cannot be sure of, and reads the clock only for a tick that
// records a time.
func TestHandleProcDeclinesWhenUnsure(t *testing.T) {
	dir := t.TempDir()
	nul := func(ss ...string) []byte { return []byte(strings.Join(ss, "\x00") + "\x00") }
	tick := nul("tfstackplan", "run", "tick", "--phase", "plan", "--stack", "s")
	offline := nul("PATH=/bin")
	driver := nul("PATH=/bin", tickline.EnvDir+"="+dir)
	long := nul("tfstackplan", "run", "tick", "--phase", "plan", "--stack", "s", "--message", strings.Repeat("m", 4096))
	okClock := func() (int64, bool) { return 42, true }
	badClock := func() (int64, bool) { return 0, false }
	for _, tc := range []struct {
		name             string
		cmdline, environ []byte
		cmdErr, envErr   rawsys.Errno
		clock            func() (int64, bool)
		want             bool
	}{
		{"offline", tick, offline, 0, 0, badClock, true}, // no time needed, the clock is not read
		{"under the driver", tick, driver, 0, 0, okClock, true},
		{"under the driver, the clock fails", tick, driver, 0, 0, badClock, false},
		{"cmdline unreadable", nil, offline, 2, 0, okClock, false},
		{"environ unreadable", tick, nil, 0, 13, okClock, false},
		{"cmdline cut", tick[:len(tick)-1], offline, 0, 0, okClock, false},
		{"environ cut", tick, offline[:len(offline)-1], 0, 0, okClock, false},
		{"a page of cmdline or more", long, offline, 0, 0, okClock, false},
		{"not a tick", nul("tfstackplan", "version"), offline, 0, 0, okClock, false},
		{"empty cmdline", []byte{}, offline, 0, 0, okClock, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read := func(path string) ([]byte, rawsys.Errno) {
				switch path {
				case "/proc/self/cmdline":
					return tc.cmdline, tc.cmdErr
				case "/proc/self/environ":
					return tc.environ, tc.envErr
				}
				t.Fatalf("read %s", path)
				return nil, 0
			}
			if got := handleProc(read, tc.clock); got != tc.want {
				t.Fatalf("handleProc = %v, want %v", got, tc.want)
			}
		})
	}
	b, err := os.ReadFile(tickline.Path(dir))
	if err != nil || string(b) != `{"stack":"s","phase":"plan","at":42}`+"\n" {
		t.Fatalf("tick file %q, %v: want the one tick handled under the driver", b, err)
	}
}
