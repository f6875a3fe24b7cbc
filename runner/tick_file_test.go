package runner

import (
	"bufio"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Concurrent appends (parallel stacks ticking at once) each land as one whole line.
func TestAppendTickConcurrentLinesStayWhole(t *testing.T) {
	dir := t.TempDir()
	const writers, each = 8, 50
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				r := tickRecord{Stack: "stacks/s" + string(rune('a'+w)), Phase: "plan", Message: strings.Repeat("m", 900), At: int64(i)}
				if err := appendTick(dir, r); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	f, err := os.Open(filepath.Join(dir, tickFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	perStack := map[string]int64{}
	n := 0
	for sc.Scan() {
		var r tickRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %d does not parse: %v", n+1, err)
		}
		if last, ok := perStack[r.Stack]; ok && r.At != last+1 {
			t.Fatalf("stack %s: tick %d after %d", r.Stack, r.At, last)
		}
		perStack[r.Stack] = r.At
		n++
	}
	if n != writers*each {
		t.Fatalf("%d lines, want %d", n, writers*each)
	}
}

// Every field is clipped to maxTickField bytes, and the line is what encoding/json makes of
// the clipped record.
func TestAppendTickClipsFields(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("y", 3*maxTickField)
	if err := appendTick(dir, tickRecord{Stack: long, Phase: long, Status: long, Message: long, At: 3}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, tickFile))
	if err != nil {
		t.Fatal(err)
	}
	clipped := long[:maxTickField]
	want := `{"stack":"` + clipped + `","phase":"` + clipped + `","status":"` + clipped + `","message":"` + clipped + `","at":3}` + "\n"
	if string(b) != want {
		t.Fatalf("tick file = %.80q..., want %.80q...", b, want)
	}
}

func TestAppendTickReportsAMissingDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	err := appendTick(dir, tickRecord{Stack: "a", Phase: "p"})
	if path := filepath.Join(dir, tickFile); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Fatalf("appendTick into a missing directory: %v, want a not-exist error naming %s", err, path)
	}
}

// The tick file is created readable by its owner only (a message may say more than a log
// line should), and each append adds exactly its line.
func TestAppendTickCreatesAPrivateFile(t *testing.T) {
	dir := t.TempDir()
	for _, phase := range []string{"init", "plan"} {
		if err := appendTick(dir, tickRecord{Stack: "a", Phase: phase, At: 7}); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, tickFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("tick file mode %v, want 0600", fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := "{\"stack\":\"a\",\"phase\":\"init\",\"at\":7}\n{\"stack\":\"a\",\"phase\":\"plan\",\"at\":7}\n"; string(b) != want {
		t.Errorf("tick file:\n%s\nwant\n%s", b, want)
	}
}
