package tickfile

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

	"github.com/tfstackplan/tfstackplan/internal/tickline"
)

// Concurrent appends (parallel stacks ticking at once) each land as one whole line.
func TestAppendConcurrentLinesStayWhole(t *testing.T) {
	dir := t.TempDir()
	const writers, each = 8, 50
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				r := tickline.Record{Stack: "stacks/s" + string(rune('a'+w)), Phase: "plan", Message: strings.Repeat("m", 900), At: int64(i)}
				if err := Append(dir, r); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	f, err := os.Open(tickline.Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	perStack := map[string]int64{}
	n := 0
	for sc.Scan() {
		var r tickline.Record
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

func TestAppendClipsFields(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("y", 3*tickline.MaxField)
	if err := Append(dir, tickline.Record{Stack: long, Phase: long, Status: long, Message: long}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(tickline.Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	var r tickline.Record
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{r.Stack, r.Phase, r.Status, r.Message} {
		if len(f) != tickline.MaxField {
			t.Fatalf("a field kept %d bytes, want %d", len(f), tickline.MaxField)
		}
	}
}

func TestAppendReportsAMissingDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	err := Append(dir, tickline.Record{Stack: "a", Phase: "p"})
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), tickline.Path(dir)) {
		t.Fatalf("Append into a missing directory: %v, want a not-exist error naming %s", err, tickline.Path(dir))
	}
}

// The tick file is created readable by its owner only (a message may say more than a log
// line should), and each Append adds exactly its line.
func TestAppendCreatesAPrivateFile(t *testing.T) {
	dir := t.TempDir()
	for _, phase := range []string{"init", "plan"} {
		if err := Append(dir, tickline.Record{Stack: "a", Phase: phase, At: 7}); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(tickline.Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("tick file mode %v, want 0600", fi.Mode().Perm())
	}
	b, err := os.ReadFile(tickline.Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	if want := "{\"stack\":\"a\",\"phase\":\"init\",\"at\":7}\n{\"stack\":\"a\",\"phase\":\"plan\",\"at\":7}\n"; string(b) != want {
		t.Errorf("tick file:\n%s\nwant\n%s", b, want)
	}
}
