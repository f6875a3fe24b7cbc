package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/runner"
)

// The first signal is forwarded (the run's context ends with it); a second one exits at once
// with 128+signal, without waiting for terramate.
func TestRunSecondSignalExitsAtOnce(t *testing.T) {
	root := t.TempDir()
	if out, err := exec.Command("git", "init", "-q", root).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	if err := os.MkdirAll(filepath.Join(root, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	scriptStarted := make(chan struct{})
	release := make(chan struct{})
	var sawCause error
	tm := &runner.Terramate{Exec: func(ctx context.Context, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
		switch {
		case slices.Equal(args, []string{"list", "--changed"}):
			fmt.Fprintln(stdout, "a")
		case args[0] == "experimental":
			fmt.Fprint(stdout, "digraph {\n}\n")
		case args[0] == "script":
			close(scriptStarted)
			<-ctx.Done()
			sawCause = context.Cause(ctx)
			<-release // a terramate that does not stop
			return ctx.Err()
		}
		return nil
	}}
	sigs := make(chan os.Signal, 2)
	exited := make(chan int, 1)
	var errOut bytes.Buffer
	opts := &RunOptions{
		IO: &IO{Out: io.Discard, ErrOut: &errOut}, Signals: sigs, Exit: func(code int) { exited <- code },
		Run: runner.RunOptions{Op: runner.OpPlan, Environment: "prod", WorkDir: root, Dir: root, Terramate: tm,
			ResultPath: filepath.Join(t.TempDir(), "r.json"), Getenv: func(string) string { return "" }},
	}
	done := make(chan error, 1)
	go func() { done <- runRun(context.Background(), opts) }()
	<-scriptStarted
	sigs <- syscall.SIGTERM
	sigs <- syscall.SIGTERM
	select {
	case code := <-exited:
		if code != 143 {
			t.Errorf("second SIGTERM exited %d, want 143", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a second signal did not exit") // a guard against hanging, not a speed check
	}
	close(release)
	err := <-done
	var se *SignalError
	if !errors.As(err, &se) || ExitCode(err) != 143 {
		t.Errorf("runRun = %v (exit %d), want a SIGTERM SignalError", err, ExitCode(err))
	}
	var sc runner.SignalCause
	if !errors.As(sawCause, &sc) || sc.Signal != syscall.SIGTERM {
		t.Errorf("terramate's context ended with %v, want the signal", sawCause)
	}
}

// The driver's runtime settings: its own unless the user's environment chooses.
func TestDriverRuntimeSettings(t *testing.T) {
	for _, tc := range []struct {
		name, user string
		choose     func(func(string) string) (int, bool)
		want       int
	}{
		{"GOMAXPROCS", "4", driverMaxProcs, 1},
		{"GOGC", "50", driverGCPercent, 200},
	} {
		env := func(v string) func(string) string {
			return func(k string) string {
				if k == tc.name {
					return v
				}
				return ""
			}
		}
		if n, set := tc.choose(env("")); !set || n != tc.want {
			t.Errorf("%s unset: got (%d, %v), want (%d, true)", tc.name, n, set, tc.want)
		}
		if n, set := tc.choose(env(tc.user)); set {
			t.Errorf("%s=%s chosen by the user: got (%d, %v), want it left alone", tc.name, tc.user, n, set)
		}
	}
}
