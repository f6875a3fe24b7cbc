package runner

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"
)

// A script's own stderr precedes terramate's diagnostic and may quote anything, e.g. an
// OpenTofu error about a configuration that does not parse: the cause comes from terramate's
// own "Error:" block only.
func TestTerramateErrorCauseComesFromTerramatesOwnDiagnostic(t *testing.T) {
	cases := []struct {
		name   string
		stderr string
		cause  error
		failed []string
	}{
		{
			name: "script output mentions a parse error",
			stderr: "/stacks/a (script:0 job:0.0)> tofu plan\n" +
				"Error: unable to parse configuration\n" +
				"│ HCL syntax error in main.tf\n" +
				"Error: one or more commands failed\n" +
				"> execution failed: running tofu plan (in /stacks/a): exit status 1\n",
			cause:  ErrScriptFailed,
			failed: []string{"/stacks/a"},
		},
		{
			name: "script output mentions untracked files and a cycle",
			stderr: "repository has untracked files\ncycle detected: /x -> /y -> /x\n" +
				"Error: one or more commands failed\n" +
				"> execution failed: running bash -c false (in /stacks/b c): exit status 1\n" +
				"> execution failed: running bash -c false (in /stacks/d): exit status 2\n",
			cause:  ErrScriptFailed,
			failed: []string{"/stacks/b c", "/stacks/d"},
		},
		{
			name:   "terramate's own parse error",
			stderr: "Error: unable to parse configuration\n> /p/stack.tm.hcl:2,10-3,1: HCL syntax error: bad\n",
			cause:  ErrTerramateConfig,
		},
		{
			name:   "cycle reported inside terramate's block",
			stderr: "Script 0 at /scripts.tm.hcl:1,1-9,2 having 1 job(s)\nError: one or more commands failed\n> cycle detected: cycle detected: /a -> /b -> /a: checking node id \"/a\"\n",
			cause:  ErrStackCycle,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tm := &Terramate{Exec: func(_ context.Context, _ string, _ []string, _ string, _ []string, _, stderr io.Writer) error {
				_, _ = io.WriteString(stderr, tc.stderr)
				return tmExitError(1)
			}}
			err := tm.ScriptRun(context.Background(), io.Discard, ScriptRunOptions{Script: "plan"})
			var te *TerramateError
			if !errors.As(err, &te) || !errors.Is(err, tc.cause) {
				t.Fatalf("err = %v, want cause %v", err, tc.cause)
			}
			if tc.failed != nil && !slices.Equal(te.FailedStacks, tc.failed) {
				t.Errorf("FailedStacks = %q, want %q", te.FailedStacks, tc.failed)
			}
		})
	}
}
