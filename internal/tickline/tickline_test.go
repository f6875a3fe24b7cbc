package tickline

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
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

// Line clips every field and ends the object with a newline.
func TestLine(t *testing.T) {
	long := strings.Repeat("y", 2*MaxField)
	got := string(Line(Record{Stack: long, Phase: "plan", Message: long, At: 3}))
	want := `{"stack":"` + long[:MaxField] + `","phase":"plan","message":"` + long[:MaxField] + `","at":3}` + "\n"
	if got != want {
		t.Fatalf("Line = %.80q..., want %.80q...", got, want)
	}
	if p := Path("/tmp/d"); p != "/tmp/d/"+Name {
		t.Fatalf("Path = %q", p)
	}
}
