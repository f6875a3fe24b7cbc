//go:build unix

package cli

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

// serve gives up starting a granter whose credentials lookup does not finish within
// GranterSetupTimeout, and says so. The lookup blocks on reading Application Default
// Credentials from a FIFO nobody writes (no network involved: the metadata host is a closed
// loopback port).
func TestServeGranterSetupIsBounded(t *testing.T) {
	home := t.TempDir()
	t.Setenv("GCE_METADATA_HOST", testkit.ClosedLoopbackAddr(t))
	t.Setenv("HOME", home)
	t.Setenv("CLOUDSDK_CONFIG", "")
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", "")
	testkit.StalledADC(t, home)
	policy := filepath.Join(t.TempDir(), "policy.hcl")
	if err := os.WriteFile(policy, []byte(`granter "gcp-iam" {}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := &ServeOptions{IO: &IO{Out: io.Discard, ErrOut: io.Discard}, Listen: "127.0.0.1:0",
		DB: "sqlite:" + filepath.Join(t.TempDir(), "db"), InsecureNoAuth: true, Policy: policy,
		GranterSetupTimeout: 200 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- runServe(ctx, opts) }()
	timer := time.NewTimer(20 * time.Second)
	defer timer.Stop()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), `granter "gcp-iam" did not start within 200ms`) {
			t.Fatalf("serve: %v, want the granter's start-up to time out", err)
		}
	case <-timer.C:
		t.Fatal("serve did not give up on the granter's start-up")
	}
}
