//go:build unix

package job

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/runner"
)

// BenchmarkDiscovery measures what `run plan` spends before any stack runs (setup, discover
// and the HEAD commit: the terramate calls, the git calls, the path checks) on a generated
// project of 10, 200 and 1000 stacks, all changed. It uses the fake terramate, or the real one
// named by TFSTACKPLAN_TERRAMATE. Besides ms/op it reports:
//
//	terramate-ms/op   wall time during which at least one terramate process was running
//	driver-ms/op      ms/op minus terramate-ms/op: the driver's own wall time (its own work and
//	                  the git calls it makes itself)
//	driver-cpu-ms/op  CPU time of the test process itself (getrusage RUSAGE_SELF)
//	tm-cpu-ms/op      CPU time of the child processes (RUSAGE_CHILDREN): terramate and the git
//	                  commands it runs, and the driver's own two git calls (a few ms)
//	tm-calls/op       terramate invocations
//
//	go test -run '^$' -bench BenchmarkDiscovery -benchtime 10x ./runner
func BenchmarkDiscovery(b *testing.B) {
	bin := os.Getenv("TFSTACKPLAN_TERRAMATE")
	for _, n := range []int{10, 200, 1000} {
		b.Run(fmt.Sprintf("stacks=%d", n), func(b *testing.B) {
			if bin == "" {
				bin = fakeTerramate(b)
			}
			root := discoveryProject(b, n)
			var busy tmBusy
			tm := &runner.Terramate{Bin: bin, Exec: busy.exec}
			ctx := context.Background()
			self0, children0 := rusage(b)
			b.ResetTimer()
			for b.Loop() {
				r := newRun(RunOptions{
					Op: OpPlan, Environment: "bench", WorkDir: root, Terramate: tm,
					Getenv: func(string) string { return "" },
				})
				ok := r.setup(ctx) == nil && r.discover(ctx) == nil
				r.awaitHead()
				if !ok {
					b.Fatalf("discovery failed: %+v", r.res.Error)
				}
				if r.res.SHA == "" {
					b.Fatal("no commit: git's HEAD was not recorded")
				}
				if len(r.res.Stacks) != n {
					b.Fatalf("discovered %d stacks, want %d", len(r.res.Stacks), n)
				}
				if n >= 20 && len(r.res.Edges) == 0 {
					b.Fatal("discovered no edges")
				}
			}
			b.StopTimer()
			self1, children1 := rusage(b)
			ops := float64(b.N)
			total := float64(b.Elapsed().Milliseconds())
			tmBusyTime, tmCalls := busy.total()
			tmMS := float64(tmBusyTime.Milliseconds())
			b.ReportMetric(total/ops, "ms/op")
			b.ReportMetric(tmMS/ops, "terramate-ms/op")
			b.ReportMetric((total-tmMS)/ops, "driver-ms/op")
			b.ReportMetric(float64((self1-self0).Milliseconds())/ops, "driver-cpu-ms/op")
			b.ReportMetric(float64((children1-children0).Milliseconds())/ops, "tm-cpu-ms/op")
			b.ReportMetric(float64(tmCalls)/ops, "tm-calls/op")
		})
	}
}

// tmBusy is an ExecFunc that runs terramate for real and measures the wall time during which at
// least one invocation was running (concurrent calls count once).
type tmBusy struct {
	mu     sync.Mutex
	active int
	since  time.Time
	busy   time.Duration
	calls  int
}

func (t *tmBusy) exec(ctx context.Context, name string, args []string, dir string, env []string, stdout, stderr io.Writer) error {
	t.mu.Lock()
	if t.active == 0 {
		t.since = time.Now()
	}
	t.active++
	t.calls++
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.active--
		if t.active == 0 {
			t.busy += time.Since(t.since)
		}
		t.mu.Unlock()
	}()
	return runner.RealExec(ctx, nil, runner.DefaultInterruptGrace, name, args, dir, env, stdout, stderr)
}

// total returns the busy time and the number of invocations so far.
func (t *tmBusy) total() (time.Duration, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.busy, t.calls
}

// rusage returns the CPU time (user + system) of this process and of its waited-for children.
func rusage(b *testing.B) (self, children time.Duration) {
	cpu := func(who int) time.Duration {
		var u syscall.Rusage
		if err := syscall.Getrusage(who, &u); err != nil {
			b.Fatal(err)
		}
		return time.Duration(u.Utime.Nano() + u.Stime.Nano())
	}
	return cpu(syscall.RUSAGE_SELF), cpu(syscall.RUSAGE_CHILDREN)
}
