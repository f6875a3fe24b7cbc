//go:build unix

package testkit

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// StalledADC makes home's gcloud Application Default Credentials file a FIFO nobody writes,
// so that a lookup of Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS unset,
// HOME set to home) blocks on reading it, as on a stalled network mount, without touching the
// network. When t ends, the FIFO is opened for writing and closed, which ends the blocked read.
func StalledADC(t *testing.T, home string) {
	t.Helper()
	dir := filepath.Join(home, ".config", "gcloud")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "application_default_credentials.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
}
