package runner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"testing"
)

// The tick file is read as it grows; a torn last line waits for its end.
func TestTickReaderIncremental(t *testing.T) {
	dir := t.TempDir()
	r := newTickReader(dir, func(stack string) bool { return stack != "c" })
	if got := r.next(); len(got) != 0 {
		t.Fatalf("no file: %v", got)
	}
	f, err := os.OpenFile(filepath.Join(dir, tickFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprint(f, `{"stack":"a","phase":"plan","at":1}`+"\n"+`{"stack":"b","pha`)
	if got := r.next(); len(got) != 1 || got[0].Stack != "a" {
		t.Fatalf("first read = %v", got)
	}
	fmt.Fprint(f, `se":"done","at":2}`+"\nnot json\n"+`{"stack":"c","phase":"done","at":3}`+"\n"+`{"stack":"a","phase":"x","status":"Error","at":4}`+"\n")
	if got := r.next(); len(got) != 3 || got[0].Stack != "b" || got[0].Phase != "done" || got[1].Stack != "c" {
		t.Fatalf("second read = %v", got)
	}
	want := map[string]tickSummary{"a": {failed: true}, "b": {done: true}}
	if !maps.Equal(r.stacks, want) {
		t.Errorf("stacks = %v, want %v (c is not a stack of the run)", r.stacks, want)
	}
}

// Offline, a tick reads only the environment and touches no network: with a server set but no
// execution it returns at once; under the driver it only appends to the tick file.
func TestTickOfflineAndUnderDriver(t *testing.T) {
	if w, err := Tick(context.Background(), TickOptions{Phase: "plan", Getenv: func(string) string { return "" }}); err != nil || w != "" {
		t.Errorf("no stack, offline: %q %v (an offline tick does nothing)", w, err)
	}
	if w, err := Tick(context.Background(), TickOptions{Stack: "s", Getenv: func(string) string { return "" }}); !errors.Is(err, ErrTickUsage) || w != "" {
		t.Errorf("no phase: %q %v", w, err)
	}
	dir := t.TempDir()
	for _, kv := range []map[string]string{{EnvTickDir: dir}, {EnvServer: "http://127.0.0.1:1", EnvExecution: "e"}} {
		if w, err := Tick(context.Background(), TickOptions{Phase: "plan", Getenv: func(k string) string { return kv[k] }}); !errors.Is(err, ErrTickUsage) || w != "" {
			t.Errorf("no stack with %v: %q %v", kv, w, err)
		}
	}
	kv := map[string]string{EnvStack: "stacks/a", EnvTickDir: dir, EnvServer: "http://127.0.0.1:1", EnvExecution: "e"}
	w, err := Tick(context.Background(), TickOptions{Phase: "plan", Status: "ok", Getenv: func(k string) string { return kv[k] }})
	if err != nil || w != "" {
		t.Fatalf("under the driver: %q %v", w, err)
	}
	if got := newTickReader(dir, func(string) bool { return true }).next(); len(got) != 1 || got[0].Stack != "stacks/a" || got[0].Status != "ok" {
		t.Errorf("recorded = %v", got)
	}
}
