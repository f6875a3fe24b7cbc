package runner

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
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
		got, err := resolveStackPath(root, stack)
		if err != nil || got != want {
			t.Errorf("resolveStackPath(%q) = %q, %v; want %q", stack, got, err, want)
		}
	}
	bad := []string{
		"", "..", "../outside", "stacks/../../outside", "stacks/a/../../..", "/etc", "/",
		"stacks/out", "stacks/out/x", "stacks/rel-out", "stacks/dangling", "stacks/dangling/x",
		"a\x00b", `..\outside`,
	}
	for _, stack := range bad {
		if got, err := resolveStackPath(root, stack); err == nil {
			t.Errorf("resolveStackPath(%q) = %q, want an error", stack, got)
		} else if stack != "" && !strings.Contains(err.Error(), "stack path") {
			t.Errorf("resolveStackPath(%q) error %q does not name what was wrong", stack, err)
		}
	}
	if _, err := resolveStackPath(root, "stacks/out"); !errors.Is(err, ErrPathEscapes) {
		t.Errorf("symlink escape error %v does not wrap ErrPathEscapes", err)
	}
}

func TestSafepathResolveStackFile(t *testing.T) {
	root, _ := safepathTree(t)
	realRoot, _ := filepath.EvalSymlinks(root)
	if _, err := resolveStackFile(root, "stacks/b", "in.log"); !errors.Is(err, ErrPathEscapes) {
		t.Errorf("a dangling link is refused until its target exists, got %v", err)
	}
	if err := os.WriteFile(filepath.Join(root, "stacks", "a", "x.log"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := resolveStackFile(root, "stacks/b", "in.log"); err != nil || got != filepath.Join(realRoot, "stacks", "a", "x.log") {
		t.Errorf("symlink inside root: %q, %v", got, err)
	}
	if got, err := resolveStackFile(root, "stacks/b", "later.log"); err != nil || got != filepath.Join(realRoot, "stacks", "b", "later.log") {
		t.Errorf("missing file: %q, %v", got, err)
	}
	for _, c := range [][2]string{
		{"stacks/b", "out.log"}, {"stacks/b", "../a/x.log"}, {"stacks/b", "/etc/passwd"},
		{"stacks/out", "secret.log"}, {"stacks/b", ""}, {"../root/stacks/b", "x.log"},
	} {
		if got, err := resolveStackFile(root, c[0], c[1]); err == nil {
			t.Errorf("resolveStackFile(%q, %q) = %q, want an error", c[0], c[1], got)
		}
	}
}

func TestSafepathOpenResolvedRefusesSwappedLink(t *testing.T) {
	root, outside := safepathTree(t)
	p, err := resolveStackFile(root, "stacks/a", "swap.log")
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

// TestSafepathLinkOutsideAndBackIsRefused: every link on the way must resolve inside the root,
// even when a later element of the path is a link leading back in; the error names the link.
// A chain of links is judged by where it ends, as filepath.EvalSymlinks resolves it.
func TestSafepathLinkOutsideAndBackIsRefused(t *testing.T) {
	root, outside := safepathTree(t)
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "stacks", "a"), filepath.Join(outside, "back")); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][3]string{
		{"stacks/out/back", "x.log", "symbolic link stacks/out resolves outside"},
		{"stacks/rel-out/back", "x.log", "symbolic link stacks/rel-out resolves outside"},
		{"stacks/dangling/x", "x.log", "symbolic link stacks/dangling dangles or loops"},
		{"stacks/b", "out.log", "symbolic link stacks/b/out.log resolves outside"},
	} {
		got, err := resolveStackFile(root, c[0], c[1])
		if !errors.Is(err, ErrPathEscapes) || !strings.Contains(err.Error(), c[2]) {
			t.Errorf("resolveStackFile(%q, %q) = %q, %v; want ErrPathEscapes saying %q", c[0], c[1], got, err, c[2])
		}
	}
	if err := os.Symlink(filepath.Join(outside, "back"), filepath.Join(root, "stacks", "hop")); err != nil {
		t.Fatal(err)
	}
	if got, err := resolveStackFile(root, "stacks/hop", "x.log"); err != nil || got != filepath.Join(realRoot, "stacks", "a", "x.log") {
		t.Errorf("a chain of links ending inside the root: %q, %v", got, err)
	}
}

// safepathOracle is the definition resolve implements, the way it was written before: resolve
// the longest existing prefix of root/rel with filepath.EvalSymlinks, refuse a dangling or
// looping link, any error but "does not exist", and a result outside root.
func safepathOracle(realRoot, rel string) (string, bool) {
	existing, missing := filepath.Join(realRoot, filepath.FromSlash(rel)), ""
	for {
		resolved, err := filepath.EvalSymlinks(existing)
		if err == nil {
			full := filepath.Join(resolved, missing)
			return full, within(realRoot, full)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", false
		}
		if fi, lerr := os.Lstat(existing); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return "", false
		}
		parent := filepath.Dir(existing)
		if parent == existing || !within(realRoot, parent) {
			return "", false
		}
		missing = filepath.Join(filepath.Base(existing), missing)
		existing = parent
	}
}

// TestSafepathResolveMatchesEvalSymlinks holds the element-by-element walk to the oracle over a
// random tree of directories, files and links (relative and absolute, chains, dangling, loops)
// that never leave the root: every name either resolves to the oracle's path or is refused
// where the oracle refuses it too.
func TestSafepathResolveMatchesEvalSymlinks(t *testing.T) {
	for seed := range 20 {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		base := t.TempDir()
		root := filepath.Join(base, "root")
		names := []string{"."}
		if err := os.MkdirAll(root, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range 40 {
			parent := names[rng.IntN(len(names))]
			if fi, err := os.Stat(filepath.Join(root, parent)); err != nil || !fi.IsDir() {
				continue
			}
			name := filepath.Join(parent, fmt.Sprintf("e%d", i))
			p := filepath.Join(root, name)
			var err error
			switch rng.IntN(5) {
			case 0, 1:
				err = os.Mkdir(p, 0o755)
			case 2:
				err = os.WriteFile(p, nil, 0o644)
			case 3: // absolute link to another name (or to one that will never exist)
				target := filepath.Join(root, names[rng.IntN(len(names))])
				if rng.IntN(4) == 0 {
					target = filepath.Join(root, "never")
				}
				err = os.Symlink(target, p)
			case 4: // relative link, possibly looping onto itself
				target := names[rng.IntN(len(names))]
				rel, rerr := filepath.Rel(filepath.Dir(p), filepath.Join(root, target))
				if rerr != nil {
					t.Fatal(rerr)
				}
				if rng.IntN(5) == 0 {
					rel = filepath.Base(p)
				}
				err = os.Symlink(rel, p)
			}
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, name)
		}
		sr, err := newStackRoot(root)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			for _, rel := range []string{n, filepath.Join(n, "log"), filepath.Join(n, "new", "log")} {
				want, ok := safepathOracle(sr.real, rel)
				got, err := sr.resolve(rel, "stack path")
				if ok != (err == nil) || (ok && got != want) {
					t.Fatalf("seed %d: resolve(%q) = %q, %v; the oracle gives %q, %v", seed, rel, got, err, want, ok)
				}
			}
		}
	}
}

// BenchmarkResolveStackFile: resolving one stack's log under a root resolved once (what the
// pump and the run do), against resolving the root again on every call.
func BenchmarkResolveStackFile(b *testing.B) {
	root := filepath.Join(b.TempDir(), "a", "b", "c", "project")
	if err := os.MkdirAll(filepath.Join(root, "stacks", "bench", "s0001"), 0o755); err != nil {
		b.Fatal(err)
	}
	b.Run("root-once", func(b *testing.B) {
		sr, err := newStackRoot(root)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := sr.stackFile("stacks/bench/s0001", "tfstackplan.log"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("root-each-call", func(b *testing.B) {
		for b.Loop() {
			if _, err := resolveStackFile(root, "stacks/bench/s0001", "tfstackplan.log"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// stackFileInfo gives the lstat of the resolved path, so that callers need not look again:
// the file's own, a link's target's, nothing for a missing file.
func TestStackFileInfo(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "s"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "s", "log"), []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "target"), []byte("123"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "target"), filepath.Join(root, "s", "link")); err != nil {
		t.Fatal(err)
	}
	sr, err := newStackRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		file string
		size int64 // -1: no info
	}{{"log", 5}, {"link", 3}, {"missing", -1}} {
		path, fi, err := sr.stackFileInfo("s", c.file)
		if err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		want, _ := sr.stackFile("s", c.file)
		switch {
		case path != want:
			t.Errorf("%s: path %s, stackFile says %s", c.file, path, want)
		case c.size < 0 && fi != nil:
			t.Errorf("%s: info %v for a missing file", c.file, fi)
		case c.size >= 0 && (fi == nil || !fi.Mode().IsRegular() || fi.Size() != c.size):
			t.Errorf("%s: info %v, want a regular file of %d bytes", c.file, fi, c.size)
		}
	}
}
