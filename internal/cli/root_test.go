package cli

import (
	"bytes"
	"strings"
	"testing"
)

func runMain(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = Main(args, strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestExitCodes(t *testing.T) {
	cases := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"bare prints usage on stderr", nil, ExitUsage, "", "Usage:"},
		{"unknown command", []string{"bogus"}, ExitUsage, "", "unknown command"},
		{"unknown flag", []string{"--nope"}, ExitUsage, "", "unknown flag"},
		{"version", []string{"version"}, ExitOK, "tfstackplan ", ""},
		{"--version", []string{"--version"}, ExitOK, "tfstackplan ", ""},
		{"--version=raw", []string{"--version=raw"}, ExitOK, "path\t", ""},
		{"version --raw", []string{"version", "--raw"}, ExitOK, "path\t", ""},
		{"version takes no args", []string{"version", "x"}, ExitUsage, "", "unknown command"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runMain(tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			if tc.stdout != "" && !strings.Contains(out, tc.stdout) {
				t.Errorf("stdout %q lacks %q", out, tc.stdout)
			}
			if tc.stdout == "" && out != "" {
				t.Errorf("stdout should be empty, got %q", out)
			}
			if tc.stderr != "" && !strings.Contains(errOut, tc.stderr) {
				t.Errorf("stderr %q lacks %q", errOut, tc.stderr)
			}
		})
	}
}

func TestExitCodeMap(t *testing.T) {
	if ExitCode(nil) != 0 || ExitCode(Usagef("x")) != 2 || ExitCode(errWrap(ErrGateDenied)) != 3 || ExitCode(errWrap(errString("boom"))) != 1 {
		t.Fatal("exit code map is wrong")
	}
}

type errString string

func (e errString) Error() string { return string(e) }

type wrapped struct{ err error }

func (w wrapped) Error() string { return "wrapped: " + w.err.Error() }
func (w wrapped) Unwrap() error { return w.err }

func errWrap(err error) error { return wrapped{err} }
