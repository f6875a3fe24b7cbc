package runner

import (
	"fmt"
	"math/rand/v2"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/events"
)

// The metadata terramate printed derives exactly the edges its run-graph drew, on the plain
// fixture project and on the ordering one (a directory in before, a tag filter in after, and
// the untagged nested stack the tagged parent drags in).
func TestMetadataEdgesMatchRecordedRunGraph(t *testing.T) {
	t.Parallel()
	for _, pair := range [][2]string{
		{"13-debug-show-metadata", "10-run-graph-dir"},
		{"27-ordering-debug-show-metadata", "25-ordering-run-graph"},
	} {
		stacks, err := parseMetadata(tmRecordedBytes(t, pair[0]))
		if err != nil {
			t.Fatal(err)
		}
		got := metadataEdges(stacks)
		want, err := runGraphEdges(tmRecordedBytes(t, pair[1]))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: metadata edges\n%v\nrun-graph edges\n%v", pair[0], got, want)
		}
	}
}

func TestMetadataEdgesForms(t *testing.T) {
	t.Parallel()
	e := func(from, to string) events.Edge { return events.Edge{From: from, To: to} }
	stacks := []stackMeta{
		{Path: "/a", Tags: []string{"x", "y"}},
		{Path: "/a/nested"},
		{Path: "/a-sibling"},
		{Path: "/b", Tags: []string{"y"}},
		{Path: "/c", After: []string{"tag:x:y"}},        // AND
		{Path: "/d", After: []string{"tag:nope,y"}},     // OR
		{Path: "/e/f", After: []string{"../../b", "."}}, // relative; "." is itself: ignored
		{Path: "/g", Before: []string{"/"}},             // the whole project
	}
	got := metadataEdges(stacks)
	want := []events.Edge{
		e("/a", "/c"), e("/a", "/d"), e("/a/nested", "/c"), e("/a/nested", "/d"),
		e("/b", "/d"), e("/b", "/e/f"),
		e("/g", "/a"), e("/g", "/a-sibling"), e("/g", "/a/nested"), e("/g", "/b"), e("/g", "/c"), e("/g", "/d"), e("/g", "/e/f"),
	}
	slices.SortFunc(want, compareEdges)
	if !slices.Equal(got, want) {
		t.Errorf("edges\n got %v\nwant %v", got, want)
	}
}

func TestParseMetadataErrors(t *testing.T) {
	t.Parallel()
	for _, src := range []string{
		"stack /a:\n",
		"stack \"relative\":\n",
		"stack \"/a\":\n\tterramate.stack.after=[\"/b\"\n",
		"stack \"/a\":\n\tterramate.stack.tags=[\"x\" \"y\"]\n",
		"stack \"/a\":\n\tterramate.stack.before=[unquoted]\n",
	} {
		if _, err := parseMetadata([]byte(src)); err == nil {
			t.Errorf("parseMetadata(%q) accepted", src)
		}
	}
	got, err := parseMetadata([]byte("Available metadata:\n\nstack \"/a b\":\n\tterramate.stack.after=[\"/c\\\"d\"]\n\tterramate.stack.unknown=whatever\n"))
	if err != nil || len(got) != 1 || got[0].Path != "/a b" || !slices.Equal(got[0].After, []string{`/c"d`}) {
		t.Errorf("parseMetadata = %+v, %v", got, err)
	}
}

// metadataEdgesByScan is metadataEdges as it was: every tag filter evaluated over every stack
// for each stack naming it, and every path starting with a directory's name walked (the
// oracle of TestMetadataEdgesMatchTheScan).
func metadataEdgesByScan(stacks []stackMeta) []events.Edge {
	paths := make([]string, len(stacks))
	for i, s := range stacks {
		paths[i] = s.Path
	}
	slices.Sort(paths)
	tags := map[string][]string{}
	for _, s := range stacks {
		tags[s.Path] = s.Tags
	}
	sel := func(self, entry string) []string {
		var dirs []string
		if filter, ok := strings.CutPrefix(entry, "tag:"); ok {
			for _, p := range paths {
				if matchTagFilter(filter, tags[p]) {
					dirs = append(dirs, p)
				}
			}
		} else {
			abs := entry
			if !strings.HasPrefix(abs, "/") {
				abs = path.Join(self, abs)
			}
			dirs = append(dirs, path.Clean("/"+abs))
		}
		var out []string
		for _, d := range dirs {
			i, _ := slices.BinarySearch(paths, d)
			for ; i < len(paths) && strings.HasPrefix(paths[i], d); i++ {
				if paths[i] != self && tmPathWithin(paths[i], d) {
					out = append(out, paths[i])
				}
			}
		}
		return out
	}
	out := []events.Edge{}
	for _, s := range stacks {
		for _, a := range s.After {
			for _, t := range sel(s.Path, a) {
				out = append(out, events.Edge{From: t, To: s.Path})
			}
		}
		for _, b := range s.Before {
			for _, t := range sel(s.Path, b) {
				out = append(out, events.Edge{From: s.Path, To: t})
			}
		}
	}
	slices.SortFunc(out, compareEdges)
	return slices.Compact(out)
}

// On random projects (nested stacks, names that are prefixes of each other, a root stack,
// tag filters, relative and absolute entries) the edges are the ones the scan derived.
func TestMetadataEdgesMatchTheScan(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(13, 14))
	names := []string{"a", "a-b", "ab", "b", "a/c", "a/c-d", "a-b/c", "b/a", "c"}
	entries := []string{"/", "/a", "/a-b", "a", "..", "../a", ".", "/nope", "tag:x", "tag:x:y", "tag:y,z", "tag:"}
	for run := 0; run < 500; run++ {
		var stacks []stackMeta
		seen := map[string]bool{}
		for range 1 + r.IntN(8) {
			p := "/" + names[r.IntN(len(names))]
			if r.IntN(10) == 0 {
				p = "/"
			}
			if seen[p] {
				continue
			}
			seen[p] = true
			s := stackMeta{Path: p}
			for range r.IntN(3) {
				s.Tags = append(s.Tags, []string{"x", "y", "z"}[r.IntN(3)])
			}
			for range r.IntN(3) {
				s.After = append(s.After, entries[r.IntN(len(entries))])
			}
			for range r.IntN(2) {
				s.Before = append(s.Before, entries[r.IntN(len(entries))])
			}
			stacks = append(stacks, s)
		}
		if got, want := metadataEdges(stacks), metadataEdgesByScan(stacks); !slices.Equal(got, want) {
			t.Fatalf("stacks %+v:\n got %v\nwant %v", stacks, got, want)
		}
	}
}

// BenchmarkMetadataEdges: 5,000 stacks /stacks/app-NNNNN, each after "tag:none" (no stack has
// it) and after "/stacks/app" (a directory with no stack, whose name starts all the others):
// both were a scan of every stack for each stack (3.0 and 2.1 s at this size in the audit).
func BenchmarkMetadataEdges(b *testing.B) {
	var stacks []stackMeta
	for i := range 5000 {
		stacks = append(stacks, stackMeta{Path: fmt.Sprintf("/stacks/app-%05d", i), After: []string{"tag:none", "/stacks/app"}})
	}
	for b.Loop() {
		if got := metadataEdges(stacks); len(got) != 0 {
			b.Fatalf("%d edges", len(got))
		}
	}
}

// tmPathWithin reports whether p is dir or below it (the scan oracle's test).
func tmPathWithin(p, dir string) bool {
	return dir == "/" || p == dir || strings.HasPrefix(p, dir+"/")
}
