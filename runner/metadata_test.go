package runner

import (
	"slices"
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
