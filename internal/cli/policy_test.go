package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runPolicyTest without a process: its output, and the exit codes its errors map to.
func TestRunPolicyTest(t *testing.T) {
	dir := t.TempDir()
	rego := filepath.Join(dir, "p.rego")
	if err := os.WriteFile(rego, []byte(`package main

deny contains rc.address if {
	some rc in input.resource_changes
	rc.change.actions == ["delete"]
}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	plans := filepath.Join("..", "..", "testdata", "tofu")
	for _, tc := range []struct {
		name     string
		opts     PolicyTestOptions
		code     int
		stdout   string
		errorHas string
	}{
		{"fails", PolicyTestOptions{Policies: []string{rego}, Plans: []string{filepath.Join(plans, "delete", "plan.json")}},
			ExitPolicy, "FAIL - " + filepath.Join(plans, "delete", "plan.json") + " - main - terraform_data.c\n", "policy failed: 1 failure"},
		{"passes", PolicyTestOptions{Policies: []string{rego}, Plans: []string{filepath.Join(plans, "update", "plan.json")}},
			ExitOK, "\n1 plan: 0 failures, 0 warnings\n", ""},
		{"no policy", PolicyTestOptions{Plans: []string{"x.json"}}, ExitUsage, "", "--policy PATH is required"},
		{"bad version", PolicyTestOptions{Policies: []string{rego}, Plans: []string{"x.json"}, RegoVersion: "1"}, ExitUsage, "", "--rego-version"},
		{"missing plan", PolicyTestOptions{Policies: []string{rego}, Plans: []string{filepath.Join(dir, "none.json")}}, ExitFailure, "", "none.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			opts := tc.opts
			opts.IO = &IO{Out: &out, ErrOut: &errOut}
			if opts.RegoVersion == "" {
				opts.RegoVersion = "v1"
			}
			err := runPolicyTest(context.Background(), &opts)
			if code := ExitCode(err); code != tc.code {
				t.Errorf("exit %d (%v), want %d", code, err, tc.code)
			}
			if tc.errorHas != "" && (err == nil || !strings.Contains(err.Error(), tc.errorHas)) {
				t.Errorf("error %v, want it to contain %q", err, tc.errorHas)
			}
			if !strings.Contains(out.String(), tc.stdout) {
				t.Errorf("stdout %q, want it to contain %q", out.String(), tc.stdout)
			}
		})
	}
}
