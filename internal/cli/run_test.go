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
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/job"
	"github.com/tfstackplan/tfstackplan/runner"
)

// signalRun starts a run whose terramate blocks in its script until released, and returns
// the run's signal channel, what Exit was called with, the run's end and what terramate's
// context ended with.
func signalRun(t *testing.T) (sigs chan os.Signal, exited chan int, release func(), done chan error, cause func() error) {
	t.Helper()
	root := t.TempDir()
	if out, err := exec.Command("git", "init", "-q", root).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	if err := os.MkdirAll(filepath.Join(root, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	scriptStarted := make(chan struct{})
	released := make(chan struct{})
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
			<-released // a terramate that does not stop until released
			return ctx.Err()
		}
		return nil
	}}
	sigs = make(chan os.Signal, 3)
	exited = make(chan int, 1)
	opts := &RunOptions{
		IO: &IO{Out: io.Discard, ErrOut: io.Discard}, Signals: sigs, Exit: func(code int) { exited <- code },
		Run: job.RunOptions{Op: job.OpPlan, Environment: "prod", WorkDir: root, Dir: root, Terramate: tm,
			ResultPath: filepath.Join(t.TempDir(), "r.json"), Getenv: func(string) string { return "" }},
	}
	done = make(chan error, 1)
	go func() { done <- runRun(context.Background(), opts) }()
	<-scriptStarted
	var once sync.Once
	release = func() { once.Do(func() { close(released) }) }
	t.Cleanup(release)
	return sigs, exited, release, done, func() error { return sawCause }
}

// GitHub cancels with SIGINT and, 7.5 s later, SIGTERM: the first is forwarded (the run's
// context ends with it), the second changes nothing, and the run ends as the first signal's.
func TestRunSecondSignalDoesNotKill(t *testing.T) {
	sigs, exited, release, done, cause := signalRun(t)
	sigs <- syscall.SIGINT
	sigs <- syscall.SIGTERM
	// The second signal is handled before the run can end: the loop reads the channel in
	// order, and the run waits for terramate, which waits for release.
	for len(sigs) > 0 {
		time.Sleep(10 * time.Millisecond)
	}
	release()
	err := <-done
	select {
	case code := <-exited:
		t.Fatalf("two signals exited the process with %d", code)
	default:
	}
	var se *SignalError
	if !errors.As(err, &se) || ExitCode(err) != 130 {
		t.Errorf("runRun = %v (exit %d), want the first signal's (SIGINT) SignalError", err, ExitCode(err))
	}
	var sc runner.SignalCause
	if !errors.As(cause(), &sc) || sc.Signal != syscall.SIGINT {
		t.Errorf("terramate's context ended with %v, want SIGINT", cause())
	}
}

// A third signal kills terramate's group and exits at once with 128+signal, without waiting.
func TestRunThirdSignalExitsAtOnce(t *testing.T) {
	sigs, exited, release, done, _ := signalRun(t)
	sigs <- syscall.SIGINT
	sigs <- syscall.SIGTERM
	sigs <- syscall.SIGTERM
	select {
	case code := <-exited:
		if code != 143 {
			t.Errorf("third signal (SIGTERM) exited %d, want 143", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a third signal did not exit") // a guard against hanging, not a speed check
	}
	release()
	<-done
}

// --interrupt-grace must be positive and bounded; a bad one is a usage error before anything
// runs.
func TestRunInterruptGraceChecked(t *testing.T) {
	t.Chdir(t.TempDir()) // a flag error writes its result document to the default path
	for _, v := range []string{"0s", "-1s", "11m", "banana"} {
		var out, errOut bytes.Buffer
		root := NewRootCmd(&IO{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
		root.SetArgs([]string{"run", "plan", "-e", "prod", "--result", filepath.Join(t.TempDir(), "r.json"), "--interrupt-grace", v})
		err := root.Execute()
		if ExitCode(err) != 2 || !strings.Contains(err.Error()+errOut.String(), "interrupt-grace") {
			t.Errorf("--interrupt-grace %s: exit %d, %v %s; want a usage error naming the flag", v, ExitCode(err), err, errOut.String())
		}
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
