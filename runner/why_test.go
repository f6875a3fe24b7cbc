package runner

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tfstackplan/tfstackplan/events"
)

func TestParseLine(t *testing.T) {
	t.Parallel()
	const net = "../../../../modules/net"
	tests := []struct {
		line string
		want events.ChangeReason
	}{
		{"stacks/prod/network - stack has unmerged changes",
			events.ChangeReason{Stack: "stacks/prod/network", Kind: events.ReasonUnmerged}},
		{`stacks/nonprod/cluster/b - stack changed because watched file "/config/b.json" changed`,
			events.ChangeReason{Stack: "stacks/nonprod/cluster/b", Kind: events.ReasonWatchedFile, Detail: "/config/b.json"}},
		{`cluster/a - stack changed because "` + net + `" changed because module "` + net + `" has unmerged changes`,
			events.ChangeReason{Stack: "cluster/a", Kind: events.ReasonModule, Detail: net, Chain: []string{`module "` + net + `" has unmerged changes`}}},
		// terramate's nested module form: each step's source unquoted, a trailing space.
		{`s - stack changed because "../m1" changed because module "../m1" changed because ../m2 changed because module "../m3" has unmerged changes `,
			events.ChangeReason{Stack: "s", Kind: events.ReasonModule, Detail: "../m1",
				Chain: []string{`module "../m1"`, "../m2", `module "../m3" has unmerged changes`}}},
		{"stacks/nonprod/network - stack has been triggered by: /.tmtriggers/stacks/nonprod/network/changed-1.tm.hcl",
			events.ChangeReason{Stack: "stacks/nonprod/network", Kind: events.ReasonTrigger, Detail: "/.tmtriggers/stacks/nonprod/network/changed-1.tm.hcl"}},
		{`live/app - stack changed because module "/live/app" changed because "/live/vpc" changed`,
			events.ChangeReason{Stack: "live/app", Kind: events.ReasonTerragruntModule, Detail: "/live/app", Chain: []string{`"/live/vpc" changed`}}},
		// Spaces and " - " inside the stack path.
		{"stacks/nonprod/odd name - stack has unmerged changes",
			events.ChangeReason{Stack: "stacks/nonprod/odd name", Kind: events.ReasonUnmerged}},
		{"stacks/a - b - stack has unmerged changes",
			events.ChangeReason{Stack: "stacks/a - b", Kind: events.ReasonUnmerged}},
		// Unknown forms are kept verbatim.
		{"stacks/x - stack changed because the moon is full",
			events.ChangeReason{Stack: "stacks/x", Kind: events.ReasonOther, Raw: "stack changed because the moon is full"}},
		{`stacks/x - stack changed because "unterminated`,
			events.ChangeReason{Stack: "stacks/x", Kind: events.ReasonOther, Raw: `stack changed because "unterminated`}},
		// Found by FuzzParseLine: the watched-file prefix and suffix overlap.
		{"0 - stack changed because watched file changed",
			events.ChangeReason{Stack: "0", Kind: events.ReasonOther, Raw: "stack changed because watched file changed"}},
		{"stack has unmerged changes", events.ChangeReason{Kind: events.ReasonUnmerged}},
		{"something else entirely", events.ChangeReason{Kind: events.ReasonOther, Raw: "something else entirely"}},
		{"", events.ChangeReason{Kind: events.ReasonOther}},
	}
	for _, tt := range tests {
		got := ParseLine(tt.line)
		if got.Stack != tt.want.Stack || got.Kind != tt.want.Kind || got.Detail != tt.want.Detail || !slices.Equal(got.Chain, tt.want.Chain) {
			t.Errorf("ParseLine(%q)\n got %+v\nwant %+v", tt.line, got, tt.want)
		}
		if tt.want.Raw != "" && got.Raw != tt.want.Raw {
			t.Errorf("ParseLine(%q).Raw = %q, want %q", tt.line, got.Raw, tt.want.Raw)
		}
	}
}

// Every --why line recorded from terramate parses into a known kind.
func TestParseLineRecorded(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"04-list-changed-why", "07-list-tier-changed-why", "32-trigger-list-changed-why"} {
		for _, line := range tmRecordedLines(t, c) {
			r := ParseLine(line)
			if r.Kind == events.ReasonOther || r.Stack == "" || !strings.HasPrefix(line, r.Stack+" - ") || !strings.HasSuffix(line, r.Raw) {
				t.Errorf("%s: ParseLine(%q) = %+v", c, line, r)
			}
		}
	}
}

func TestParseWhyLinesPrefersListedStacks(t *testing.T) {
	t.Parallel()
	// "a - stack has unmerged changes" could be the stack "a" (unmerged) or ... only the
	// listed stacks decide; an unknown reason still keeps the listed stack.
	got := ParseWhyLines([]string{
		"x - y - stack has unmerged changes",
		"x - stack changed because of reasons",
		"unlisted - stack has unmerged changes",
	}, []string{"x - y", "x"})
	want := []events.ChangeReason{
		{Stack: "unlisted", Kind: events.ReasonUnmerged},
		{Stack: "x", Kind: events.ReasonOther},
		{Stack: "x - y", Kind: events.ReasonUnmerged},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i].Stack != want[i].Stack || got[i].Kind != want[i].Kind {
			t.Errorf("%d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

func FuzzParseLine(f *testing.F) {
	cases, _ := filepath.Glob(filepath.Join(tmFixtureDir, "cases", "*why.stdout"))
	for _, c := range cases {
		for _, l := range tmReadLines(f, c) {
			f.Add(l)
		}
	}
	f.Add(`a - stack changed because module "x" changed because "y" changed because module "z" changed because "w" changed`)
	f.Add(`a - b - stack changed because "\"q\"" changed because x`)
	f.Fuzz(func(t *testing.T, line string) {
		r := ParseLine(line)
		switch r.Kind {
		case events.ReasonUnmerged, events.ReasonWatchedFile, events.ReasonModule, events.ReasonTrigger, events.ReasonTerragruntModule:
			if r.Raw == "" {
				t.Fatalf("known reason without raw text: %+v", r)
			}
		case events.ReasonOther:
		default:
			t.Fatalf("unknown kind %q", r.Kind)
		}
		// Nothing is dropped: the stack and the raw reason are both taken from the line.
		if !strings.HasPrefix(line, r.Stack) || !strings.Contains(line, r.Raw) {
			t.Fatalf("ParseLine(%q) = %+v: parts not from the line", line, r)
		}
		if r.Stack != "" && len(r.Stack)+len(whySeparator)+len(r.Raw) != len(strings.TrimRight(line, "\r\n")) {
			t.Fatalf("ParseLine(%q) = %+v: the line is not stack + separator + reason", line, r)
		}
		if utf8.ValidString(line) && !utf8.ValidString(r.Detail) && r.Kind == events.ReasonTrigger {
			t.Fatalf("detail of valid input became invalid: %+v", r)
		}
		// Resolving against the stack ParseLine found gives the same reason.
		if r.Stack != "" {
			again := ParseWhyLines([]string{strings.TrimRight(line, "\r\n")}, []string{r.Stack})
			if len(again) != 1 || again[0].Kind != r.Kind || again[0].Detail != r.Detail {
				t.Fatalf("ParseWhyLines disagrees: %+v vs %+v", again, r)
			}
		}
	})
}

func tmReadLines(t testing.TB, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return tmLines(b)
}

// BenchmarkParseWhyLinesManySeparators: one 256 KB line made of " - " (a watched file or
// module source named so) among 5,000 listed stacks. Every prefix ending at a separator was
// hashed in full (the line's length squared: 0.6 s for this line, 8.9 s at 1 MB); only
// prefixes as long as a listed stack are looked up now.
func BenchmarkParseWhyLinesManySeparators(b *testing.B) {
	var stacks []string
	for i := range 5000 {
		stacks = append(stacks, fmt.Sprintf("stacks/app-%05d", i))
	}
	line := "stacks/app-00007" + strings.Repeat(" - ", 256<<10/3) + "stack has unmerged changes"
	for b.Loop() {
		if got := ParseWhyLines([]string{line}, stacks); got[0].Stack != "stacks/app-00007" {
			b.Fatalf("got %+v", got[0])
		}
	}
}

func firstN(s string, n int) string { return s[:min(n, len(s))] }
