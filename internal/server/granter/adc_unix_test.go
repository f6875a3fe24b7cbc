//go:build unix

package granter_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/granter"
	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

// NewGCPIAM gives up on Application Default Credentials when its context ends, even while the
// lookup does not. Off Google Cloud the library probes the metadata server at its fixed address
// and by DNS, without the context, which a test may not reach. With GCE_METADATA_HOST set, as
// here, it skips that probe and asks the server (one that accepts and never answers) for the
// universe domain under the context; the lookup the context does not reach here is the read of
// a gcloud credentials file that is a FIFO nobody writes.
func TestADCLookupEndsWithTheContext(t *testing.T) {
	hole, err := testkit.BlackHole(t.Cleanup)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		fifo bool
	}{
		{"metadata server never answers", false},
		{"credentials file never written", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			home := t.TempDir()
			t.Setenv("HOME", home)
			t.Setenv("CLOUDSDK_CONFIG", t.TempDir())
			t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", "")
			t.Setenv("GCE_METADATA_HOST", hole)
			t.Setenv("GCE_METADATA_IP", hole)
			if tc.fifo {
				testkit.StalledADC(t, home)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := granter.NewGCPIAM(ctx, granter.GCPIAMConfig{})
				done <- err
			}()
			timer := time.NewTimer(20 * time.Second)
			defer timer.Stop()
			select {
			case err := <-done:
				if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "context deadline exceeded") {
					t.Fatalf("error %v, want one naming the context's deadline", err)
				}
			case <-timer.C:
				t.Fatal("NewGCPIAM did not return after its context ended")
			}
		})
	}
}
