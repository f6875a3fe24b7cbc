package cli

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/runner"
)

// tickLine is one line of the driver's tick file, as a script's reader sees it.
type tickLine struct {
	Stack   string `json:"stack"`
	Phase   string `json:"phase"`
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
	At      int64  `json:"at"`
}

// Every tick call has the outcome its contract gives it through the command line: offline,
// exit 0 and nothing written; under the driver, exit 0, no output and one line in the driver's
// tick file (fields clipped to 1 KiB), the stack from --stack or else TFSTACKPLAN_STACK; a
// missing or blank phase, a missing stack where there is somewhere to report, or a malformed
// command line, a usage error (exit 2).
func TestTickCommandLine(t *testing.T) {
	odd := "stacks/ünï code/\"quoted\" <&> \xff\x00 tab\t"
	argsCases := []struct {
		args  []string
		usage bool     // a usage error whatever the environment
		want  tickLine // the tick (Stack "" : the environment's)
	}{
		{args: []string{"--phase", "plan", "--stack", "stacks/a"}, want: tickLine{Phase: "plan", Stack: "stacks/a"}},
		{args: []string{"--phase=plan", "--stack=stacks/a", "--status=succeeded", "--message=all=good"},
			want: tickLine{Phase: "plan", Stack: "stacks/a", Status: "succeeded", Message: "all=good"}},
		{args: []string{"--phase", "done", "--status", "failed", "--message", "--not-a-flag"},
			want: tickLine{Phase: "done", Status: "failed", Message: "--not-a-flag"}},
		{args: []string{"--phase", "plan"}, want: tickLine{Phase: "plan"}},
		{args: []string{"--phase", "plan", "--stack="}, want: tickLine{Phase: "plan"}},
		{args: []string{"--stack", odd, "--phase", odd, "--message", strings.Repeat("m", 3000)},
			want: tickLine{Phase: odd, Stack: odd, Message: strings.Repeat("m", 1024)}},
		{args: []string{"--phase", "plan", "--phase", "show", "--stack", "s"}, want: tickLine{Phase: "show", Stack: "s"}},
		{args: []string{"--phase", " ", "--stack", "s"}, usage: true},
		{args: []string{"--phase", "plan", "--stack", "s", "extra"}, usage: true},
		{args: []string{"--phase", "plan", "--bogus", "x"}, usage: true},
		{args: []string{"--", "--phase", "a"}, usage: true},
		{args: []string{"--phase"}, usage: true},
		{args: nil, usage: true},
	}
	envCases := []struct {
		env     map[string]string
		offline bool
	}{
		{env: map[string]string{}, offline: true},
		{env: map[string]string{runner.EnvStack: "stacks/from-env"}, offline: true},
		{env: map[string]string{runner.EnvStack: "stacks/from-env", runner.EnvTickDir: "DIR"}},
		{env: map[string]string{runner.EnvTickDir: "DIR"}},
		{env: map[string]string{runner.EnvStack: " ", runner.EnvTickDir: "DIR"}},
		{env: map[string]string{runner.EnvServer: "http://127.0.0.1:1", runner.EnvStack: "s"}, offline: true},
		{env: map[string]string{runner.EnvServer: "  ", runner.EnvExecution: "e", runner.EnvStack: "s"}, offline: true},
	}
	written := 0
	for _, ac := range argsCases {
		for _, ec := range envCases {
			dir := t.TempDir()
			for _, k := range []string{runner.EnvStack, runner.EnvTickDir, runner.EnvServer, runner.EnvExecution, runner.EnvToken, runner.EnvAudience, runner.EnvAuth} {
				v := ec.env[k]
				if v == "DIR" {
					v = dir
				}
				t.Setenv(k, v)
			}
			want := ac.want
			if want.Stack == "" {
				want.Stack = ec.env[runner.EnvStack]
			}
			usage := ac.usage || !ec.offline && strings.TrimSpace(want.Stack) == ""
			args := append([]string{"run", "tick"}, ac.args...)
			var out, errOut bytes.Buffer
			code := Main(args, strings.NewReader(""), &out, &errOut)
			got := tickLines(t, dir)
			switch {
			case usage:
				if code != ExitUsage || errOut.Len() == 0 || got != "" {
					t.Fatalf("%q %v: exit %d, stderr %q, tick file %q; want a usage error and no tick", args, ec.env, code, errOut.String(), got)
				}
			case code != 0 || out.Len() > 0 || errOut.Len() > 0:
				t.Fatalf("%q %v: exit %d with %q %q; want 0 and no output", args, ec.env, code, out.String(), errOut.String())
			case ec.offline:
				if got != "" {
					t.Fatalf("%q %v: offline, yet the tick file holds %s", args, ec.env, got)
				}
			default:
				if w := encodeTick(t, want); got != w {
					t.Fatalf("%q %v: tick file\n got %.300s\nwant %.300s", args, ec.env, got, w)
				}
				written++
			}
		}
	}
	if written < 15 {
		t.Fatalf("only %d of the combinations wrote a tick; the table no longer covers the driver's path", written)
	}
}

// A tick sent straight to a server (scripts run by hand for an execution) that does not
// answer warns and still exits 0: the server never fails a script.
func TestTickStraightToADeadServerWarns(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(runner.EnvServer, "http://127.0.0.1:1")
	t.Setenv(runner.EnvExecution, "e")
	t.Setenv(runner.EnvStack, "s")
	t.Setenv(runner.EnvTickDir, "")
	t.Setenv(runner.EnvToken, "")
	t.Setenv(runner.EnvAudience, "")
	var out, errOut bytes.Buffer
	if code := Main([]string{"run", "tick", "--phase", "plan"}, strings.NewReader(""), &out, &errOut); code != 0 || out.Len() > 0 ||
		!strings.Contains(errOut.String(), "warning: tick not reported") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 0 and a warning", code, out.String(), errOut.String())
	}
	if got := tickLines(t, dir); got != "" {
		t.Fatalf("tick file: %s", got)
	}
}

// tickLines reads dir's tick file with each record's time zeroed ("" when there is none).
func tickLines(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "ticks.jsonl"))
	if os.IsNotExist(err) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for l := range bytes.Lines(b) {
		var r tickLine
		if err := json.Unmarshal(l, &r); err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		if r.At == 0 {
			t.Fatalf("a tick without a time: %s", l)
		}
		r.At = 0
		lines = append(lines, encodeTick(t, r))
	}
	return strings.Join(lines, "\n")
}

// encodeTick is r as JSON after one trip through its encoding (invalid UTF-8 then reads as
// U+FFFD), so that a tick written and one expected compare as text.
func encodeTick(t *testing.T, r tickLine) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	if err == nil {
		b, err = json.Marshal(r)
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The built binary answers a tick through its one command line: under the driver, offline,
// and with a usage error.
func TestTickThroughTheBinary(t *testing.T) {
	bin := buildBinary(t)
	run := func(env []string, args ...string) (code int, stderr string) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), append([]string{"TFSTACKPLAN_SERVER=", "TFSTACKPLAN_TICK_DIR=", "TFSTACKPLAN_STACK=", "GCE_METADATA_HOST=127.0.0.1:1"}, env...)...)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, errb.String()
	}

	dir := t.TempDir()
	if code, stderr := run([]string{"TFSTACKPLAN_TICK_DIR=" + dir, "TFSTACKPLAN_STACK=stacks/a"}, "run", "tick", "--phase", "plan"); code != 0 || stderr != "" {
		t.Fatalf("tick under the driver: exit %d, stderr %q", code, stderr)
	}
	if got := tickLines(t, dir); got != `{"stack":"stacks/a","phase":"plan","at":0}` {
		t.Fatalf("tick file: %s", got)
	}
	if code, stderr := run(nil, "run", "tick", "--phase", "plan", "--stack", "s"); code != 0 || stderr != "" {
		t.Fatalf("offline tick: exit %d, stderr %q", code, stderr)
	}
	if code, stderr := run(nil, "run", "tick", "--stack", "s"); code != 2 || !strings.Contains(stderr, "needs --phase and a stack") {
		t.Fatalf("a tick without a phase: exit %d, stderr %q (want the usage error)", code, stderr)
	}
}

// Product code is plain Go: no package init function (start-up work is built when first
// needed) and no assembly. Tests and testdata may do as they like.
func TestNoPackageInitNorAssemblyInProductCode(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (name == "testdata" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasSuffix(path, ".s"):
			t.Errorf("%s: assembly in product code", path)
		case strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go"):
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Name.Name == "init" {
					t.Errorf("%s: a package init function", fset.Position(fn.Pos()))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
