package notify_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/notify"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// buildServe builds tfstackplan for the tests that run `serve` as a process of its own.
func buildServe(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	bin := filepath.Join(t.TempDir(), "tfstackplan")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/tfstackplan/tfstackplan/cmd/tfstackplan").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

const secretEnv = "TFSTACKPLAN_NOTIFY_SERVE_TEST_SECRET"

// writePolicy writes a policy gating prod's destructive changes, notifying url.
func writePolicy(t *testing.T, url string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policy.hcl")
	src := `environment "prod" {
  requester = "deployer@proj.iam.gserviceaccount.com"
  gate {
    classes = ["destructive"]
    stacks  = ["**"]
  }
}
notify "ops" {
  url        = "` + url + `"
  secret_env = "` + secretEnv + `"
  events     = ["gate.waiting"]
}
`
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

var servingRE = regexp.MustCompile(`msg=serving addr=(\S+)`)

// serve starts `tfstackplan serve` with env added to its environment and returns it with its
// base URL.
func serve(t *testing.T, bin string, env []string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--insecure-no-auth"}, args...)...)
	cmd.Env = append(append(os.Environ(), "GCE_METADATA_HOST=127.0.0.1:1", "GCE_METADATA_IP=127.0.0.1:1"), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := servingRE.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	select {
	case addr := <-found:
		return cmd, "http://" + addr
	case <-time.After(60 * time.Second):
		t.Fatal("serve did not report its address")
	}
	return nil, ""
}

func post(t *testing.T, url string, body any) {
	t.Helper()
	data, _ := json.Marshal(body)
	res, err := http.Post(url, "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	msg, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %s", url, res.StatusCode, msg)
	}
}

// TestServeKilledWithDeliveriesPendingDeliversThemAfterRestart: events acknowledged while the
// receiver refuses them are still delivered, each under its one delivery id, by the server
// restarted after a SIGKILL.
func TestServeKilledWithDeliveriesPendingDeliversThemAfterRestart(t *testing.T) {
	bin := buildServe(t)
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			db := "sqlite:" + filepath.Join(t.TempDir(), "notify.db")
			if backend == "postgres" {
				u, _ := storetest.PostgresURL(t)
				db = u
			}
			var mu sync.Mutex
			up := false
			attempts, delivered := map[string]int{}, map[string]bool{}
			rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				mu.Lock()
				defer mu.Unlock()
				id := r.Header.Get(notify.HeaderDelivery)
				attempts[id]++
				if !up || !notify.Verify([]byte("kill-test-secret"), body, r.Header.Get(notify.HeaderSignature)) {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				delivered[id] = true
			}))
			defer rc.Close()
			policy := writePolicy(t, rc.URL+"/hook")
			env := []string{secretEnv + "=kill-test-secret"}
			cmd, base := serve(t, bin, env, "--db", db, "--policy", policy)
			const n = 20
			for i := range n {
				id := fmt.Sprint("plan-", i)
				post(t, base+"/api/v1/events/init", map[string]any{"execution_id": id, "repo": "acme/infra", "environment": "prod", "op": "plan",
					"pr": i + 1, "sha": "abc", "stacks": []string{"db"}})
				post(t, base+"/api/v1/events/finalize", map[string]any{"execution_id": id, "status": "succeeded",
					"stacks": []map[string]any{{"stack": "db", "status": "succeeded", "class": "destructive", "plan_hash": "h"}}})
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			mu.Lock()
			before := len(delivered)
			up = true
			mu.Unlock()
			if before != 0 {
				t.Fatalf("%d delivered before the receiver was up", before)
			}
			serve(t, bin, env, "--db", db, "--policy", policy)
			deadline := time.Now().Add(90 * time.Second)
			for time.Now().Before(deadline) {
				mu.Lock()
				k := len(delivered)
				mu.Unlock()
				if k == n {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(delivered) != n || len(attempts) != n {
				t.Fatalf("%d of %d events delivered after the restart, %d delivery ids seen", len(delivered), n, len(attempts))
			}
		})
	}
}

// TestServeRefusesANotifySecretMissingFromTheEnvironment: serve does not start, and says which
// variable is missing.
func TestServeRefusesANotifySecretMissingFromTheEnvironment(t *testing.T) {
	bin := buildServe(t)
	policy := writePolicy(t, "https://hooks.example.com/tfstackplan")
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--insecure-no-auth", "--policy", policy,
		"--db", "sqlite:"+filepath.Join(t.TempDir(), "x.db"))
	cmd.Env = append(os.Environ(), secretEnv+"=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		want := `notify "ops": secret_env ` + secretEnv + ` is not set in the server's environment`
		if err == nil || !strings.Contains(stderr.String(), want) {
			t.Fatalf("serve ended with %v, stderr %q; want a failure saying %q", err, stderr.String(), want)
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("serve started without the notify secret")
	}
}
