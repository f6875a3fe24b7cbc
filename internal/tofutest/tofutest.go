// Package tofutest gives tests the fake OpenTofu of testdata/faketofu, which replays the real
// OpenTofu 1.12.6 recordings of testdata/tofu (see the fake's doc comment for what it covers).
//
//	bin := tofutest.Build(t)                   // .../tofu, with .../terraform beside it
//	cmd.Env = append(os.Environ(), tofutest.Env(t)...)
//	tofutest.WriteCase(t, stackDir, "mixed")   // what `tofu plan` in stackDir replays
//
// Its own tests hold the fake to the recordings, and, with TFSTACKPLAN_TOFU set to a real tofu,
// hold the real tofu to the fake.
package tofutest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// CaseFile is the file of the working directory naming the case the fake replays.
const CaseFile = "faketofu.case"

var (
	buildOnce sync.Once
	buildBin  string
	buildErr  error
)

// Build builds testdata/faketofu (once per test binary; the binary is kept in the temporary
// directory under a digest of its sources, so later runs reuse it) and returns the path of the
// fake `tofu`; a `terraform` (the same fake) is in the same directory, which can go first on PATH.
func Build(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() { buildBin, buildErr = build() })
	if buildErr != nil {
		t.Fatalf("building the fake tofu: %v", buildErr)
	}
	return buildBin
}

func build() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	src := filepath.Join(root, "testdata", "faketofu")
	h := sha256.New()
	fmt.Fprintln(h, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	files, err := filepath.Glob(filepath.Join(src, "*.go"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("no Go files in %s", src)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", filepath.Base(f), len(b))
		h.Write(b)
	}
	dir := filepath.Join(os.TempDir(), "tfstackplan-faketofu-"+hex.EncodeToString(h.Sum(nil))[:16])
	bin := filepath.Join(dir, "tofu")
	if _, err := os.Stat(filepath.Join(dir, "terraform")); err == nil {
		return bin, nil
	}
	tmp, err := os.MkdirTemp(os.TempDir(), "tfstackplan-faketofu-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("go", "build", "-o", filepath.Join(tmp, "tofu"), "./testdata/faketofu")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%v\n%s", err, out)
	}
	if err := os.Link(filepath.Join(tmp, "tofu"), filepath.Join(tmp, "terraform")); err != nil {
		return "", err
	}
	// Another test binary may have built the same sources meanwhile: either directory will do.
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "terraform")); serr != nil {
			return "", err
		}
	}
	return bin, nil
}

// Fixtures returns the absolute path of testdata/tofu, the recordings the fake replays.
func Fixtures(t testing.TB) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "testdata", "tofu")
}

// Env returns the environment the fake needs (FAKETOFU_FIXTURES), to append to a command's.
func Env(t testing.TB) []string {
	t.Helper()
	return []string{"FAKETOFU_FIXTURES=" + Fixtures(t)}
}

// WriteCase makes the fake's `plan` in dir replay the recorded case name (a directory of
// testdata/tofu such as "mixed" or "error").
func WriteCase(t testing.TB, dir, name string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, CaseFile), []byte(name+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

var (
	rootOnce sync.Once
	rootDir  string
	rootErr  error
)

// moduleRoot is the directory of the module's go.mod, found upwards from the working directory
// (a test's is its package directory).
func moduleRoot() (string, error) {
	rootOnce.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			rootErr = err
			return
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "testdata", "faketofu", "main.go")); err == nil {
				if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
					rootDir = dir
					return
				}
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				rootErr = fmt.Errorf("no module root with testdata/faketofu above the working directory")
				return
			}
			dir = parent
		}
	})
	return rootDir, rootErr
}
