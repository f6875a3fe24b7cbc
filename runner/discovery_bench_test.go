//go:build unix

package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkDiscovery measures what `run plan` spends before any stack runs (setup and
// discover: the terramate calls, the git calls, the path checks) on a generated
// project of 10, 200 and 1000 stacks, all changed. It uses the fake terramate, or the real one
// named by TFSTACKPLAN_TERRAMATE. Besides ms/op it reports:
//
//	terramate-ms/op   wall time during which at least one terramate process was running
//	driver-ms/op      ms/op minus terramate-ms/op: the driver's own wall time (its own work and
//	                  the git calls it makes itself)
//	driver-cpu-ms/op  CPU time of the test process itself (getrusage RUSAGE_SELF)
//	tm-cpu-ms/op      CPU time of the terramate processes (RUSAGE_CHILDREN)
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
			tm := &Terramate{Bin: bin, Exec: busy.exec}
			ctx := context.Background()
			self0, children0 := rusage(b)
			b.ResetTimer()
			for b.Loop() {
				r := newRun(RunOptions{
					Op: OpPlan, Environment: "bench", WorkDir: root, Terramate: tm,
					Getenv: func(string) string { return "" },
				})
				if !r.setup() || !r.discover(ctx) {
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
			tmMS := float64(busy.total().Milliseconds())
			b.ReportMetric(total/ops, "ms/op")
			b.ReportMetric(tmMS/ops, "terramate-ms/op")
			b.ReportMetric((total-tmMS)/ops, "driver-ms/op")
			b.ReportMetric(float64((self1-self0).Milliseconds())/ops, "driver-cpu-ms/op")
			b.ReportMetric(float64((children1-children0).Milliseconds())/ops, "tm-cpu-ms/op")
			b.ReportMetric(float64(busy.calls)/ops, "tm-calls/op")
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
	return tmRealExec(ctx, nil, DefaultInterruptGrace, name, args, dir, env, stdout, stderr)
}

func (t *tmBusy) total() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.busy
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

// discoveryProject lays out a git repository of n stacks, stacks/sNNNN, for both the real
// terramate (stack.tm.hcl) and the fake (.faketerramate.json): main pushed to a bare origin,
// and a branch, feature, that changes every stack. As in scripts/bench/genproject.sh every 20th
// stack runs after the one before it and the one 10 before it (few edges, so real run-graph's
// path enumeration stays cheap).
func discoveryProject(b *testing.B, n int) string {
	b.Helper()
	tmp := b.TempDir()
	root, origin := filepath.Join(tmp, "repo"), filepath.Join(tmp, "origin.git")
	write := func(rel, content string) {
		p := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	git := func(dir string, args ...string) {
		cmd := exec.Command("git", append([]string{"-c", "user.name=bench", "-c", "user.email=bench@example.invalid",
			"-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false"}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	write("tfstackplan.hcl", "environment \"bench\" {\n  dir = \"stacks\"\n}\n")
	write("terramate.tm.hcl", "terramate {\n  config {\n  }\n}\n")
	sc := tmScenario{}
	name := func(i int) string { return fmt.Sprintf("s%04d", i) }
	for i := range n {
		s := tmStack{Path: "stacks/" + name(i), Name: name(i), ID: name(i)}
		after := ""
		if i > 0 && i%20 == 0 {
			s.After = []string{"/stacks/" + name(i-1), "/stacks/" + name(i-10)}
			after = fmt.Sprintf("  after = [%q, %q]\n", s.After[0], s.After[1])
		}
		sc.Stacks = append(sc.Stacks, s)
		sc.Changed = append(sc.Changed, tmChange{Stack: s.Path, Why: "stack has unmerged changes"})
		write(s.Path+"/stack.tm.hcl", tmStackHCL(s.Name, after))
	}
	js, err := json.MarshalIndent(sc, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	write(".faketerramate.json", string(js))
	git(tmp, "init", "-q", "--bare", "-b", "main", origin)
	git(root, "init", "-q", "-b", "main")
	git(root, "add", "-A")
	git(root, "commit", "-qm", "stacks")
	git(root, "remote", "add", "origin", origin)
	git(root, "push", "-q", "origin", "main")
	git(root, "checkout", "-qb", "feature")
	for i := range n {
		write("stacks/"+name(i)+"/main.tf", "# changed on feature\n")
	}
	git(root, "add", "-A")
	git(root, "commit", "-qm", "change every stack")
	return root
}
