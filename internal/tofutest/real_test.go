package tofutest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

// TestRealTofuAgreesWithFake runs the real tofu (TFSTACKPLAN_TOFU, e.g. built by
// shared/tools/build-real-tools.sh) and the fake through the same sequences and requires the
// same output, exit codes and files, except for what differs between any two real runs (random
// ids, timestamps, the lock holder and the order of concurrent progress lines: see loosen). It
// detects drift between the recordings and the real binary: when it fails after a tofu upgrade,
// re-record with scripts/capture/tofu.sh. It takes about a minute.
func TestRealTofuAgreesWithFake(t *testing.T) {
	bin := os.Getenv("TFSTACKPLAN_TOFU")
	if bin == "" {
		t.Skip("set TFSTACKPLAN_TOFU to a real tofu 1.12.6 to compare it with the fake")
	}
	rt := tool{bin: bin, env: append(cleanEnv("TF_"), "CHECKPOINT_DISABLE=1")}
	fake := fakeTool(t)
	fx := Fixtures(t)
	tf := func(t *testing.T, dir, src string) {
		t.Helper()
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, "main.tf"), string(b))
	}
	ok := func(t *testing.T, r result, what string) {
		t.Helper()
		if r.rc != 0 {
			t.Fatalf("real %s failed: %+v", what, r)
		}
	}
	agree := func(t *testing.T, what string, realDir, fakeDir string, realR, fakeR result) {
		t.Helper()
		same(t, what, loosen(realR), loosen(fakeR))
		if rf, ff := listing(t, realDir), listing(t, fakeDir); !slices.Equal(rf, ff) {
			t.Errorf("%s: real left %q, fake left %q", what, rf, ff)
		}
	}
	both := func(t *testing.T, what, realDir, fakeDir string, args ...string) {
		t.Helper()
		agree(t, what, realDir, fakeDir, rt.run(t, realDir, args...), fake.run(t, fakeDir, args...))
	}

	t.Run("version", func(t *testing.T) {
		rd, fd := t.TempDir(), t.TempDir()
		both(t, "version", rd, fd, "version")
		both(t, "version -json", rd, fd, "version", "-json")
	})

	for _, c := range cases(t) {
		t.Run(c, func(t *testing.T) {
			rd, fd := t.TempDir(), t.TempDir()
			WriteCase(t, fd, c)
			tf(t, rd, filepath.Join(fx, c, "v1.tf"))
			ok(t, rt.run(t, rd, "init", "-input=false", "-no-color"), "init")
			ok(t, rt.run(t, rd, "apply", "-auto-approve", "-input=false", "-no-color"), "apply of v1")
			tf(t, rd, filepath.Join(fx, c, "v2.tf"))
			both(t, "init", rd, fd, "init", "-input=false", "-no-color")
			r, f := rt.run(t, rd, argv(t, c, "plan-out")...), fake.run(t, fd, argv(t, c, "plan-out")...)
			agree(t, "plan", rd, fd, r, f)
			if r.rc != 0 {
				return
			}
			both(t, "show -json", rd, fd, argv(t, c, "show-json")...)
			both(t, "apply", rd, fd, argv(t, c, "apply")...)
			both(t, "apply again", rd, fd, argv(t, c, "apply-again")...)
		})
	}

	t.Run("spellings", func(t *testing.T) {
		rd, fd := t.TempDir(), t.TempDir()
		WriteCase(t, fd, "create")
		tf(t, rd, filepath.Join(fx, "create", "v1.tf"))
		ok(t, rt.run(t, rd, "init", "-input=false", "-no-color"), "init")
		ok(t, rt.run(t, rd, "apply", "-auto-approve", "-input=false", "-no-color"), "apply of v1")
		tf(t, rd, filepath.Join(fx, "create", "v2.tf"))
		long := "some/very/long/path/that/goes/on/and/on/and/" + planFile
		for _, d := range []string{rd, fd} {
			if err := os.MkdirAll(filepath.Join(d, filepath.Dir(long)), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		both(t, "plan -out LONG", rd, fd, "plan", "-input=false", "-no-color", "-lock-timeout", "0s", "-out", long)
		both(t, "plan --out=other", rd, fd, "plan", "--input=false", "-no-color", "--out=other.tfplan")
		// Both refuse --no-color (the fake with its own message) and write no plan.
		if r, f := rt.run(t, rd, "plan", "--no-color", "-out=x.tfplan"), fake.run(t, fd, "plan", "--no-color", "-out=x.tfplan"); r.rc != 1 || f.rc != 1 || exists(filepath.Join(rd, "x.tfplan")) || exists(filepath.Join(fd, "x.tfplan")) {
			t.Errorf("plan --no-color: real %+v, fake %+v", r, f)
		}
		both(t, "show -json LONG", rd, fd, "show", "-json", long)
		both(t, "apply -lock-timeout 0s LONG", rd, fd, "apply", "-input=false", "-no-color", "-lock-timeout", "0s", long)
		both(t, "apply of the now stale other.tfplan", rd, fd, "apply", "-input=false", "-no-color", "other.tfplan")
	})

	t.Run("bad plan files", func(t *testing.T) {
		rd, fd := t.TempDir(), t.TempDir()
		tf(t, rd, filepath.Join(fx, "mixed", "v1.tf"))
		ok(t, rt.run(t, rd, "init", "-input=false", "-no-color"), "init")
		for _, name := range []string{"show-missing", "apply-missing"} {
			both(t, name, rd, fd, argv(t, "_cli", name)...)
		}
		for _, d := range []string{rd, fd} {
			write(t, filepath.Join(d, planFile), "garbage\n")
		}
		for _, name := range []string{"show-corrupt", "apply-corrupt"} {
			both(t, name, rd, fd, argv(t, "_cli", name)...)
		}
	})

	t.Run("stale", func(t *testing.T) {
		rd, fd := t.TempDir(), t.TempDir()
		WriteCase(t, fd, "mixed")
		tf(t, rd, filepath.Join(fx, "mixed", "v1.tf"))
		ok(t, rt.run(t, rd, "init", "-input=false", "-no-color"), "init")
		ok(t, rt.run(t, rd, "apply", "-auto-approve", "-input=false", "-no-color"), "apply of v1")
		tf(t, rd, filepath.Join(fx, "mixed", "v2.tf"))
		both(t, "plan", rd, fd, argv(t, "mixed", "plan-out")...)
		both(t, "another plan", rd, fd, "plan", "-input=false", "-no-color", "-out=other.tfplan")
		both(t, "its apply", rd, fd, "apply", "-input=false", "-no-color", "other.tfplan")
		both(t, "apply of the first plan", rd, fd, argv(t, "_cli", "apply-stale")...)
	})

	t.Run("lock", func(t *testing.T) {
		rd, fd := t.TempDir(), t.TempDir()
		WriteCase(t, fd, "mixed")
		tf(t, rd, filepath.Join(fx, "mixed", "v1.tf"))
		ok(t, rt.run(t, rd, "init", "-input=false", "-no-color"), "init")
		ok(t, rt.run(t, rd, "plan", "-input=false", "-no-color", "-out="+planFile), "plan")
		fake.run(t, fd, argv(t, "mixed", "plan-out")...)
		id, release := holdLock(t, rt, rd)
		write(t, filepath.Join(fd, "faketofu.lock"), id+"\n")
		for _, name := range []string{"plan-locked", "plan-locked-0s", "apply-locked", "apply-locked-0s"} {
			r, f := rt.run(t, rd, argv(t, "_cli", name)...), fake.run(t, fd, argv(t, "_cli", name)...)
			if !strings.Contains(r.stderr, "ID:        "+id+"\n") || !strings.Contains(f.stderr, "ID:        "+id+"\n") {
				t.Errorf("%s: the lock error does not name the lock %s:\nreal:\n%s\nfake:\n%s", name, id, r.stderr, f.stderr)
			}
			same(t, name, loosen(r), loosen(f))
		}
		// The real local backend cannot force-unlock another process's lock (the fake models a
		// remote backend's lock, which can: see "force-unlock remote").
		r := rt.run(t, rd, "force-unlock", "-force", id)
		same(t, "force-unlock of a held local lock", recorded(t, "_cli", "force-unlock"), r)
		release()
		os.Remove(filepath.Join(fd, "faketofu.lock"))
		both(t, "force-unlock without a lock", rd, fd, "force-unlock", "-force", id)
	})

	t.Run("force-unlock remote", func(t *testing.T) {
		srv := httptest.NewServer(httpBackend())
		defer srv.Close()
		rd, fd := t.TempDir(), t.TempDir()
		write(t, filepath.Join(rd, "main.tf"), `terraform {
  backend "http" {
    address        = "`+srv.URL+`/state"
    lock_address   = "`+srv.URL+`/lock"
    unlock_address = "`+srv.URL+`/lock"
  }
}
resource "terraform_data" "a" {
  input = "one"
}
`)
		ok(t, rt.run(t, rd, "init", "-input=false", "-no-color"), "init")
		write(t, filepath.Join(fd, "faketofu.lock"), "")
		id := "f825e672-52d7-6b27-0f78-d4f55aecb0ca"
		same(t, "force-unlock", loosen(rt.run(t, rd, "force-unlock", "-force", id)), loosen(fake.run(t, fd, "force-unlock", "-force", id)))
	})

	for _, tc := range []struct {
		sig  syscall.Signal
		name string
	}{{syscall.SIGINT, "plan-sigint"}, {syscall.SIGTERM, "plan-sigterm"}} {
		t.Run(tc.name, func(t *testing.T) {
			rd, fd := t.TempDir(), t.TempDir()
			WriteCase(t, fd, "mixed")
			// The configuration of scripts/capture/tofu.sh: its local is slow only in the plan
			// walk, where a signal stops the plan (one during validation would be lost).
			write(t, filepath.Join(rd, "main.tf"), `resource "terraform_data" "seed" { input = 700 }`+"\n")
			ok(t, rt.run(t, rd, "init", "-input=false", "-no-color"), "init")
			ok(t, rt.run(t, rd, "apply", "-auto-approve", "-input=false", "-no-color"), "apply of the seed")
			// A signal must land in the slow local's evaluation, whose length depends on the
			// machine (the recordings were made with a signal 2s in; on a faster machine the plan
			// was over by then). So the test times a plan without it (start-up and refresh, s)
			// and one with it (s plus the local, l), and signals at s + l/2.
			start := time.Now()
			ok(t, rt.run(t, rd, "plan", "-input=false", "-no-color"), "the plan without the slow local")
			s := time.Since(start)
			b, _ := os.ReadFile(filepath.Join(rd, "main.tf"))
			write(t, filepath.Join(rd, "main.tf"), string(b)+`locals {
  slow = sum(flatten([for i in range(terraform_data.seed.output) : [for j in range(terraform_data.seed.output) : i * j]]))
}
resource "terraform_data" "a" {
  input = local.slow
}
`)
			marker := filepath.Join(t.TempDir(), "sleeping")
			slow := fake
			slow.env = append(slices.Clone(fake.env), "FAKETOFU_SLEEP=1m", "FAKETOFU_APPLY_SLEEP=1m", "FAKETOFU_SLEEP_MARKER="+marker)
			start = time.Now()
			ok(t, rt.run(t, rd, "plan", "-input=false", "-no-color"), "the plan with the slow local")
			delay := s + max(time.Since(start)-s, 0)/2
			args := argv(t, "_cli", tc.name)
			r := rt.signalled(t, rd, "", delay, tc.sig, args...)
			f := slow.signalled(t, fd, marker, 0, tc.sig, args...)
			agree(t, tc.name, rd, fd, interruptOrder(r), interruptOrder(f))
			both(t, "show -json of the interrupted plan", rd, fd, argv(t, "_cli", "show-interrupted")...)
			both(t, "apply of the interrupted plan", rd, fd, argv(t, "_cli", "apply-interrupted")...)

			// The apply walk evaluates the slow local again, in about the time a plan takes.
			start = time.Now()
			ok(t, rt.run(t, rd, "plan", "-input=false", "-no-color", "-out="+planFile), "plan")
			delay = s + max(time.Since(start)-s, 0)/2
			fake.run(t, fd, "plan", "-input=false", "-no-color", "-out="+planFile)
			os.Remove(marker)
			apply := strings.Replace(tc.name, "plan-", "apply-", 1)
			args = argv(t, "_cli", apply)
			r = rt.signalled(t, rd, "", delay, tc.sig, args...)
			f = slow.signalled(t, fd, marker, 0, tc.sig, args...)
			agree(t, apply, rd, fd, interruptOrder(r), interruptOrder(f))
			both(t, "the same apply again", rd, fd, argv(t, "_cli", "apply-after-sigint")...)
		})
	}
}

// listing is what a command left in dir, less the files of the state (real: terraform.tfstate*
// and the lock info, fake: faketofu.*) and the configuration.
func listing(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		n := d.Name()
		if n == "main.tf" || strings.HasPrefix(n, "terraform.tfstate") || n == ".terraform.tfstate.lock.info" || strings.HasPrefix(n, "faketofu.") {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		names = append(names, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// holdLock starts an interactive `tofu apply` in dir that holds the state lock at its approval
// prompt; it returns the lock's ID and a func that answers "no" and waits for it.
func holdLock(t *testing.T, rt tool, dir string) (string, func()) {
	t.Helper()
	cmd, _, _ := rt.command(dir, []string{"apply", "-no-color"})
	var out testkit.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := false
	release := func() {
		if done {
			return
		}
		done = true
		io.WriteString(stdin, "no\n")
		stdin.Close()
		cmd.Wait()
	}
	t.Cleanup(release)
	var info struct{ ID string }
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if strings.Contains(out.String(), "Enter a value:") {
			if b, err := os.ReadFile(filepath.Join(dir, ".terraform.tfstate.lock.info")); err == nil && json.Unmarshal(b, &info) == nil && info.ID != "" {
				return info.ID, release
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lock holder never reached its prompt:\n%s", out.String())
		}
	}
}

// httpBackend is a state server for tofu's "http" backend (as scripts/capture/httpstate).
func httpBackend() http.Handler {
	var (
		mu          sync.Mutex
		state, lock []byte
	)
	mux := http.NewServeMux()
	mux.HandleFunc("/state", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.Method {
		case http.MethodGet:
			if state == nil {
				http.NotFound(w, r)
				return
			}
			w.Write(state)
		case http.MethodPost:
			state, _ = io.ReadAll(r.Body)
		case http.MethodDelete:
			state = nil
		}
	})
	mux.HandleFunc("/lock", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.Method {
		case "LOCK":
			if lock != nil {
				w.WriteHeader(http.StatusLocked)
				w.Write(lock)
				return
			}
			lock, _ = io.ReadAll(r.Body)
		case "UNLOCK":
			lock = nil
		}
	})
	return mux
}
