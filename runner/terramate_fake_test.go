package runner

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestFakeTerramateMatchesRecordedCases runs the fake terramate on the fixture project, changed
// as each recorded case says, and compares stdout, stderr and the exit code with what terramate
// 0.17.2 printed. The temporary directory is normalised to <tmp>. `--parallel` interleaves
// stacks nondeterministically (in terramate as in the fake), so that case compares the lines as
// multisets and checks each stack's commands stay in order.
func TestFakeTerramateMatchesRecordedCases(t *testing.T) {
	bin := fakeTerramate(t)
	for _, c := range tmLoadCases(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			tmp, proj := tmMakeProject(t)
			sc := tmBaseScenario(t)
			tmApplyCase(t, proj, c.name, sc)
			tmWriteScenario(t, proj, sc)

			var stdout, stderr bytes.Buffer
			cmd := exec.Command(bin, c.args...)
			cmd.Dir = filepath.Join(proj, c.dir)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			rc := 0
			if err := cmd.Run(); err != nil {
				var ee *exec.ExitError
				if !errors.As(err, &ee) {
					t.Fatal(err)
				}
				rc = ee.ExitCode()
			}
			norm := func(s string) string { return strings.ReplaceAll(s, tmp, "<tmp>") }
			gotOut, gotErr := norm(stdout.String()), norm(stderr.String())
			if rc != c.rc {
				t.Errorf("exit code %d, recorded %d (stderr %q)", rc, c.rc, gotErr)
			}
			if slices.Contains(c.args, "--parallel") {
				tmCompareInterleaved(t, "stdout", gotOut, c.stdout)
				tmCompareInterleaved(t, "stderr", gotErr, c.stderr)
				return
			}
			if gotOut != c.stdout {
				t.Errorf("stdout differs\n got: %q\nwant: %q", gotOut, c.stdout)
			}
			if gotErr != c.stderr {
				t.Errorf("stderr differs\n got: %q\nwant: %q", gotErr, c.stderr)
			}
		})
	}
}

// tmCompareInterleaved compares got and want as multisets of lines and checks that the lines of
// each stack ("/stack (script:0 job:0.N)> ...") keep their relative order.
func tmCompareInterleaved(t *testing.T, stream, got, want string) {
	t.Helper()
	g, w := strings.SplitAfter(got, "\n"), strings.SplitAfter(want, "\n")
	if !slices.Equal(slices.Sorted(slices.Values(g)), slices.Sorted(slices.Values(w))) {
		t.Errorf("%s lines differ\n got: %q\nwant: %q", stream, got, want)
		return
	}
	perStack := func(lines []string) map[string][]string {
		m := map[string][]string{}
		for _, l := range lines {
			if stack, _, ok := strings.Cut(l, " (script:"); ok {
				m[stack] = append(m[stack], l)
			}
		}
		return m
	}
	gs, ws := perStack(g), perStack(w)
	for stack, lines := range ws {
		if !slices.Equal(gs[stack], lines) {
			t.Errorf("%s: commands of %s out of order: %q, want %q", stream, stack, gs[stack], lines)
		}
	}
}
