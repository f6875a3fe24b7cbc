package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

const serveTestTokens = `
token "runner" {
  secret = "serve-test-runner-secret"
  roles  = ["runner"]
}
`

func writeServeTokens(t *testing.T) string {
	t.Helper()
	return writeTokensFile(t, serveTestTokens)
}

// writeTokensFile writes a tokens file holding src and returns its path.
func writeTokensFile(t *testing.T, src string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens.hcl")
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestServeRefusesUnsafeOrBrokenConfig(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name string
		opts ServeOptions
		want string
	}{
		{"insecure off loopback", ServeOptions{Listen: "0.0.0.0:0", InsecureNoAuth: true}, "loopback"},
		{"insecure on a LAN address", ServeOptions{Listen: "192.168.1.10:0", InsecureNoAuth: true}, "loopback"},
		{"no auth at all", ServeOptions{Listen: "127.0.0.1:0"}, "no authentication configured"},
		{"bad db", ServeOptions{Listen: "127.0.0.1:0", InsecureNoAuth: true, DB: "mysql://x"}, "sqlite:PATH or postgres://URL"},
		{"missing tokens file", ServeOptions{Listen: "127.0.0.1:0", Tokens: filepath.Join(dir, "none.hcl")}, "tokens file"},
		{"negative session TTL", ServeOptions{Listen: "127.0.0.1:0", InsecureNoAuth: true, SessionTTL: -time.Hour}, "--session-ttl"},
		{"negative failure burst", ServeOptions{Listen: "127.0.0.1:0", InsecureNoAuth: true, AuthFailureBurst: -1}, "--auth-failure-burst"},
		{"negative failure window", ServeOptions{Listen: "127.0.0.1:0", InsecureNoAuth: true, AuthFailureWindow: -time.Minute}, "--auth-failure-window"},
		{"short metrics token", ServeOptions{Listen: "127.0.0.1:0", InsecureNoAuth: true, MetricsToken: "short"}, "metrics token (--metrics-token or TFSTACKPLAN_METRICS_TOKEN) is 5 bytes: want at least 16"},
		{"metrics token with a space", ServeOptions{Listen: "127.0.0.1:0", InsecureNoAuth: true, MetricsToken: "a-long-enough-token with-a-space"}, "space or a control character"},
		{"stale-after shorter than the heartbeats", ServeOptions{Listen: "127.0.0.1:0", InsecureNoAuth: true, StaleAfter: 20 * time.Second}, "--stale-after 20s: want 0 (never) or at least 1m0s"},
		{"negative stale-after", ServeOptions{Listen: "127.0.0.1:0", InsecureNoAuth: true, StaleAfter: -time.Minute}, "--stale-after"},
		{"missing policy", ServeOptions{Listen: "127.0.0.1:0", InsecureNoAuth: true, Policy: filepath.Join(dir, "none.hcl"), DB: "sqlite:" + filepath.Join(dir, "x.db")}, "policy"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var errOut bytes.Buffer
			tc.opts.IO = &IO{Out: io.Discard, ErrOut: &errOut}
			err := runServe(context.Background(), &tc.opts)
			var ue *UsageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want a usage error mentioning %q", err, tc.want)
			}
		})
	}
}

// Without --metrics-token, serve takes the metrics token from TFSTACKPLAN_METRICS_TOKEN; the
// flag, when given, wins.
func TestServeReadsTheMetricsTokenFromTheEnvironment(t *testing.T) {
	t.Setenv(EnvMetricsToken, "from-env")
	for _, args := range [][]string{{}, {"--metrics-token", "from-flag"}} {
		cmd := newServeCmd(&IO{Out: io.Discard, ErrOut: io.Discard}, nil)
		cmd.SetArgs(append([]string{"--listen", "127.0.0.1:0", "--insecure-no-auth"}, args...))
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		err := cmd.Execute()
		want := "from-env"
		if len(args) > 0 {
			want = "from-flag"
		}
		// Both are too short: the usage error says how long the token it used is.
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("is %d bytes", len(want))) {
			t.Errorf("serve %q with %s set: %v, want the %s token refused", args, EnvMetricsToken, err, want)
		}
	}
}

func TestServeRunsAndShutsDownGracefully(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := make(chan string, 1)
	done := make(chan error, 1)
	opts := &ServeOptions{IO: &IO{Out: io.Discard, ErrOut: io.Discard}, Listen: "127.0.0.1:0",
		DB: "sqlite:" + filepath.Join(dir, "s.db"), Tokens: writeServeTokens(t), RateLimit: 100,
		LogRetention: time.Hour, ShutdownTimeout: time.Minute, Ready: func(a string) { addr <- a }}
	go func() { done <- runServe(ctx, opts) }()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("serve ended early: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not start")
	}
	for _, path := range []string{"/healthz", "/readyz", "/api/v1/health", "/metrics"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
	}
	resp, err := http.Get(base + "/api/v1/claims")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("unauthenticated claims: %d", resp.StatusCode)
	}
	// A live page stream stays open until shutdown, which must end it rather than wait for it.
	req, _ := http.NewRequest("GET", base+"/ui/stream/executions", nil)
	req.Header.Set("Authorization", "Bearer serve-test-runner-secret")
	stream, err := http.DefaultClient.Do(req)
	if err != nil || stream.StatusCode != 200 {
		t.Fatalf("stream: %v %v", stream, err)
	}
	defer stream.Body.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not shut down with a live stream open")
	}
	if _, err := io.Copy(io.Discard, stream.Body); err != nil && !strings.Contains(err.Error(), "EOF") {
		t.Logf("stream ended with %v", err)
	}
}

// buildBinary builds tfstackplan once for the subprocess tests.
func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	bin := filepath.Join(t.TempDir(), "tfstackplan")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/tfstackplan/tfstackplan/cmd/tfstackplan")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

var servingRE = regexp.MustCompile(`msg=serving addr=(\S+)`)

// startServe starts `tfstackplan serve` and returns its process and base URL.
func startServe(t *testing.T, bin string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), "GCE_METADATA_HOST=127.0.0.1:1", "GCE_METADATA_IP=127.0.0.1:1")
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

func postJSON(client *http.Client, url, token string, body any) (int, error) {
	data, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", url, bytes.NewReader(data))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// TestServeCrashKeepsAcknowledgedEvents kills the server with SIGKILL during ingestion,
// restarts it on the same database, and checks every acknowledged chunk is there.
func TestServeCrashKeepsAcknowledgedEvents(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	db := "sqlite:" + filepath.Join(dir, "crash.db")
	tokens := writeServeTokens(t)
	const token = "serve-test-runner-secret"
	cmd, base := startServe(t, bin, "--db", db, "--tokens", tokens, "--rate-limit", "100000")
	client := &http.Client{Timeout: 5 * time.Second}
	if code, err := postJSON(client, base+"/api/v1/events/init", token, map[string]any{
		"execution_id": "crash", "repo": "acme/infra", "environment": "prod", "op": "plan", "stacks": []string{"s0", "s1", "s2", "s3"}}); err != nil || code != 200 {
		t.Fatalf("init: %d %v", code, err)
	}
	var acked sync.Map // "stack/offset" → true
	var n atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stack := fmt.Sprint("s", w)
			for i := 0; i < 100000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				data := fmt.Sprintf("line %06d of %s\n", i, stack)
				off := int64(i * len(data))
				code, err := postJSON(client, base+"/api/v1/events/log", token, map[string]any{
					"execution_id": "crash", "stack": stack, "generation": 1, "offset": off,
					"data": base64.StdEncoding.EncodeToString([]byte(data))})
				if err != nil {
					return // the server died
				}
				if code == 200 {
					acked.Store(fmt.Sprintf("%s/%d", stack, off), data)
					n.Add(1)
				}
			}
		}()
	}
	// Phase events on stack "ticks", phase name p<seq>: the stack shows the highest seq stored.
	var lastPhase atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for seq := int64(1); seq < 1000000; seq++ {
			select {
			case <-stop:
				return
			default:
			}
			code, err := postJSON(client, base+"/api/v1/events/phase", token, map[string]any{
				"execution_id": "crash", "stack": "ticks", "phase": fmt.Sprint("p", seq), "seq": seq})
			if err != nil {
				return
			}
			if code == 200 {
				lastPhase.Store(seq)
			}
		}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for n.Load() < 2000 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	close(stop)
	wg.Wait()
	if n.Load() == 0 {
		t.Fatal("nothing was acknowledged before the kill")
	}

	_, base = startServe(t, bin, "--db", db, "--tokens", tokens)
	missing, checked := 0, 0
	acked.Range(func(k, v any) bool {
		checked++
		stack, off, _ := strings.Cut(k.(string), "/")
		req, _ := http.NewRequest("GET", fmt.Sprintf("%s/api/v1/executions/crash/log?stack=%s&generation=1&offset=%s&limit=%d", base, stack, off, len(v.(string))), nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var slice struct{ Data []byte }
		_ = json.NewDecoder(resp.Body).Decode(&slice)
		resp.Body.Close()
		if string(slice.Data) != v.(string) {
			missing++
			if missing < 5 {
				t.Errorf("acknowledged chunk %s lost after restart: got %q", k, slice.Data)
			}
		}
		return true
	})
	if missing > 0 {
		t.Fatalf("%d of %d acknowledged chunks lost", missing, checked)
	}
	req, _ := http.NewRequest("GET", base+"/api/v1/executions/crash", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var x struct {
		Stacks []struct{ Stack, Phase string }
	}
	_ = json.NewDecoder(resp.Body).Decode(&x)
	resp.Body.Close()
	var shown int64 = -1
	for _, st := range x.Stacks {
		if st.Stack == "ticks" {
			_, _ = fmt.Sscanf(st.Phase, "p%d", &shown)
		}
	}
	if last := lastPhase.Load(); last > 0 && shown < last {
		t.Fatalf("last acknowledged phase seq %d, stored state shows %d", last, shown)
	}
	t.Logf("%d acknowledged chunks and phase seq %d all present after kill -9 and restart", checked, lastPhase.Load())
}

func TestLoopbackListenChecksAddresses(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "[::1]:0": true, "localhost:0": true,
		"0.0.0.0:0": false, ":8080": false, "[::]:0": false, "192.168.1.10:0": false, "no-port": false,
	} {
		if got := isLoopbackListen(addr); got != want {
			t.Errorf("isLoopbackListen(%q) = %v, want %v", addr, got, want)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if !isLoopbackAddr(ln.Addr()) {
		t.Errorf("bound %s is loopback", ln.Addr())
	}
	if isLoopbackAddr(&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 80}) || isLoopbackAddr(&net.TCPAddr{IP: net.IPv4zero}) {
		t.Error("a non-loopback bound address passed")
	}
}
