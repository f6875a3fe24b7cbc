package tickfile

import (
	"bufio"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// encodingCases are strings that exercise every escape encoding/json applies.
var encodingCases = []string{
	"", "stacks/prod/a", `quote " and \ backslash`, "tab\tnew\nline\rcr", "\b\f\x00\x01\x1f\x7f",
	"<script>&amp;</script>", "line\u2028sep\u2029para", "ünïcödé 日本 🚀", "bad \xff\xfe utf8 \xe2\x82",
	"cut rune \xe6\x97", strings.Repeat("é", 600),
}

func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	for _, s := range encodingCases {
		for _, r := range []Record{
			{Stack: s, Phase: s, Status: s, Message: s, At: 1700000000123456789},
			{Stack: s, Phase: "plan", At: -1},
			{Stack: "a", Phase: s, Status: s, At: 0},
		} {
			checkSame(t, r)
		}
	}
}

func FuzzAppendJSON(f *testing.F) {
	for _, s := range encodingCases {
		f.Add(s, s, int64(42))
	}
	f.Fuzz(func(t *testing.T, a, b string, at int64) {
		checkSame(t, Record{Stack: a, Phase: b, Status: b, Message: a, At: at})
		checkSame(t, Record{Stack: b, Phase: a, At: at})
	})
}

func checkSame(t *testing.T, r Record) {
	t.Helper()
	want, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.AppendJSON(nil); string(got) != string(want) {
		t.Fatalf("AppendJSON(%#v)\n got %s\nwant %s", r, got, want)
	}
}

func TestAppendIntMatchesStrconv(t *testing.T) {
	for _, n := range []int64{0, 1, -1, 9, 10, -10, 1796114412647223557, math.MaxInt64, math.MinInt64, math.MinInt64 + 1} {
		if got, want := string(appendInt(nil, n)), strconv.FormatInt(n, 10); got != want {
			t.Errorf("appendInt(%d) = %s, want %s", n, got, want)
		}
	}
}

func TestClip(t *testing.T) {
	long := strings.Repeat("x", MaxField+10)
	if got := Clip(long); len(got) != MaxField {
		t.Fatalf("Clip kept %d bytes, want %d", len(got), MaxField)
	}
	if got := Clip("short"); got != "short" {
		t.Fatalf("Clip changed a short string: %q", got)
	}
}

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
				r := Record{Stack: "stacks/s" + string(rune('a'+w)), Phase: "plan", Message: strings.Repeat("m", 900), At: int64(i)}
				if err := Append(dir, r); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	f, err := os.Open(Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	perStack := map[string]int64{}
	n := 0
	for sc.Scan() {
		var r Record
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
	long := strings.Repeat("y", 3*MaxField)
	if err := Append(dir, Record{Stack: long, Phase: long, Status: long, Message: long}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{r.Stack, r.Phase, r.Status, r.Message} {
		if len(f) != MaxField {
			t.Fatalf("a field kept %d bytes, want %d", len(f), MaxField)
		}
	}
}

func TestAppendReportsAMissingDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	err := Append(dir, Record{Stack: "a", Phase: "p"})
	var ae *AppendError
	if !errors.As(err, &ae) || ae.Op != "open" || ae.Errno != uintptr(syscall.ENOENT) || !strings.Contains(err.Error(), Path(dir)) {
		t.Fatalf("Append into a missing directory: %v, want ENOENT on open, naming %s", err, Path(dir))
	}
	want := "tick file " + Path(dir) + ": open: errno " + strconv.Itoa(int(syscall.ENOENT))
	if err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
}

// The tick file is created readable by its owner only (a message may say more than a log
// line should), and each Append adds exactly its line.
func TestAppendCreatesAPrivateFile(t *testing.T) {
	dir := t.TempDir()
	for _, phase := range []string{"init", "plan"} {
		if err := Append(dir, Record{Stack: "a", Phase: phase, At: 7}); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("tick file mode %v, want 0600", fi.Mode().Perm())
	}
	b, err := os.ReadFile(Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	if want := "{\"stack\":\"a\",\"phase\":\"init\",\"at\":7}\n{\"stack\":\"a\",\"phase\":\"plan\",\"at\":7}\n"; string(b) != want {
		t.Errorf("tick file:\n%s\nwant\n%s", b, want)
	}
}
