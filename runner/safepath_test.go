package runner

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func safepathTree(t *testing.T) (root, outside string) {
	t.Helper()
	base := t.TempDir()
	root = filepath.Join(base, "root")
	outside = filepath.Join(base, "outside")
	for _, d := range []string{root, outside, filepath.Join(root, "stacks", "a"), filepath.Join(root, "stacks", "b")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "secret.log"), []byte("outside"), 0o644); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		filepath.Join(root, "stacks", "out"):          outside,
		filepath.Join(root, "stacks", "in"):           filepath.Join(root, "stacks", "a"),
		filepath.Join(root, "stacks", "rel-in"):       "a",
		filepath.Join(root, "stacks", "rel-out"):      "../../outside",
		filepath.Join(root, "stacks", "dangling"):     filepath.Join(outside, "nope"),
		filepath.Join(root, "stacks", "b", "out.log"): filepath.Join(outside, "secret.log"),
		filepath.Join(root, "stacks", "b", "in.log"):  filepath.Join(root, "stacks", "a", "x.log"),
	}
	for link, target := range links {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	return root, outside
}

func TestSafepathResolveStackPath(t *testing.T) {
	root, _ := safepathTree(t)
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		t.Fatal(err)
	}
	ok := map[string]string{
		"stacks/a":          filepath.Join(realRoot, "stacks", "a"),
		"stacks/a/":         filepath.Join(realRoot, "stacks", "a"),
		"./stacks/a":        filepath.Join(realRoot, "stacks", "a"),
		"stacks/in":         filepath.Join(realRoot, "stacks", "a"),
		"stacks/rel-in":     filepath.Join(realRoot, "stacks", "a"),
		"stacks/not-yet":    filepath.Join(realRoot, "stacks", "not-yet"),
		"stacks/in/new/sub": filepath.Join(realRoot, "stacks", "a", "new", "sub"),
		".":                 realRoot,
	}
	for stack, want := range ok {
		got, err := ResolveStackPath(root, stack)
		if err != nil || got != want {
			t.Errorf("ResolveStackPath(%q) = %q, %v; want %q", stack, got, err, want)
		}
	}
	bad := []string{
		"", "..", "../outside", "stacks/../../outside", "stacks/a/../../..", "/etc", "/",
		"stacks/out", "stacks/out/x", "stacks/rel-out", "stacks/dangling", "stacks/dangling/x",
		"a\x00b", `..\outside`,
	}
	for _, stack := range bad {
		if got, err := ResolveStackPath(root, stack); err == nil {
			t.Errorf("ResolveStackPath(%q) = %q, want an error", stack, got)
		} else if stack != "" && !strings.Contains(err.Error(), "stack path") {
			t.Errorf("ResolveStackPath(%q) error %q does not name what was wrong", stack, err)
		}
	}
	if _, err := ResolveStackPath(root, "stacks/out"); !errors.Is(err, ErrPathEscapes) {
		t.Errorf("symlink escape error %v does not wrap ErrPathEscapes", err)
	}
}

func TestSafepathResolveStackFile(t *testing.T) {
	root, _ := safepathTree(t)
	realRoot, _ := filepath.EvalSymlinks(root)
	if _, err := ResolveStackFile(root, "stacks/b", "in.log"); !errors.Is(err, ErrPathEscapes) {
		t.Errorf("a dangling link is refused until its target exists, got %v", err)
	}
	if err := os.WriteFile(filepath.Join(root, "stacks", "a", "x.log"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := ResolveStackFile(root, "stacks/b", "in.log"); err != nil || got != filepath.Join(realRoot, "stacks", "a", "x.log") {
		t.Errorf("symlink inside root: %q, %v", got, err)
	}
	if got, err := ResolveStackFile(root, "stacks/b", "later.log"); err != nil || got != filepath.Join(realRoot, "stacks", "b", "later.log") {
		t.Errorf("missing file: %q, %v", got, err)
	}
	for _, c := range [][2]string{
		{"stacks/b", "out.log"}, {"stacks/b", "../a/x.log"}, {"stacks/b", "/etc/passwd"},
		{"stacks/out", "secret.log"}, {"stacks/b", ""}, {"../root/stacks/b", "x.log"},
	} {
		if got, err := ResolveStackFile(root, c[0], c[1]); err == nil {
			t.Errorf("ResolveStackFile(%q, %q) = %q, want an error", c[0], c[1], got)
		}
	}
}

func TestSafepathOpenResolvedRefusesSwappedLink(t *testing.T) {
	root, outside := safepathTree(t)
	p, err := ResolveStackFile(root, "stacks/a", "swap.log")
	if err != nil {
		t.Fatal(err)
	}
	// Resolved while absent, then replaced by a link pointing outside before the open.
	if err := os.Symlink(filepath.Join(outside, "secret.log"), p); err != nil {
		t.Fatal(err)
	}
	if f, _, err := openResolved(p); err == nil {
		f.Close()
		t.Fatal("openResolved followed a symbolic link swapped in after resolution")
	}
}
