package cli

import (
	"strings"
	"testing"
)

func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{
		"bash": "# bash completion V2 for tfstackplan",
		"zsh":  "#compdef tfstackplan",
		"fish": "# fish completion for tfstackplan",
	} {
		code, out, errOut := runMain("completion", shell)
		if code != ExitOK || !strings.Contains(out, want) || errOut != "" {
			t.Errorf("%s: exit %d, stderr %q, stdout lacks %q", shell, code, errOut, want)
		}
	}
	for _, args := range [][]string{{"completion"}, {"completion", "tcsh"}, {"completion", "bash", "zsh"}} {
		if code, _, _ := runMain(args...); code != ExitUsage {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	// The scripts complete the operator commands and the values of their enum flags.
	code, out, _ := runMain("__complete", "admin", "checks", "override", "--conclusion", "")
	if code != ExitOK || !strings.Contains(out, "action_required") {
		t.Fatalf("__complete --conclusion: exit %d, %q", code, out)
	}
	code, out, _ = runMain("__complete", "")
	for _, cmd := range []string{"claims", "admin", "executions", "logs", "completion"} {
		if code != ExitOK || !strings.Contains(out, cmd) {
			t.Fatalf("__complete: exit %d, %q lacks %s", code, out, cmd)
		}
	}
}
