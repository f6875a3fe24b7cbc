package actionlint

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const releaseScript = "../../scripts/release.sh"

// runnerOf is the RUNNER_OS and RUNNER_ARCH of a GitHub runner of this machine's platform.
func runnerOf(t *testing.T) (string, string) {
	t.Helper()
	osName := map[string]string{"linux": "Linux", "darwin": "macOS"}[runtime.GOOS]
	arch := map[string]string{"amd64": "X64", "arm64": "ARM64"}[runtime.GOARCH]
	if osName == "" || arch == "" {
		t.Skipf("no release for %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	return osName, arch
}

// TestInstallReleaseSnapshot builds a release snapshot of this machine's platform with
// scripts/release.sh (as `make release-snapshot` does for all four), serves it over loopback
// HTTPS, and runs action.yml's install step against it: the archive's checksum is verified and
// the installed binary prints the snapshot's version; the same archive with one byte changed
// is refused and nothing is installed.
func TestInstallReleaseSnapshot(t *testing.T) {
	need(t, "bash", "curl", "tar", "gzip", "awk", "go", "git")
	runnerOS, runnerArch := runnerOf(t)
	out := t.TempDir()
	cmd := exec.Command("bash", releaseScript, "--snapshot", "--out", out)
	cmd.Env = append(os.Environ(), "PLATFORMS="+runtime.GOOS+"/"+runtime.GOARCH)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release.sh --snapshot: %v\n%s", err, b)
	}
	dirs, err := os.ReadDir(out)
	if err != nil || len(dirs) != 1 {
		t.Fatalf("want one version directory in the output, got %v (%v)", dirs, err)
	}
	version := dirs[0].Name()
	if !strings.HasPrefix(version, "v0.0.0-snapshot.") {
		t.Fatalf("snapshot version %q", version)
	}
	n := strings.TrimPrefix(version, "v")
	archiveName := fmt.Sprintf("tfstackplan_%s_%s_%s.tar.gz", n, runtime.GOOS, runtime.GOARCH)
	sumsName := "tfstackplan_" + n + "_checksums.txt"
	files := map[string][]byte{}
	for _, name := range []string{archiveName, sumsName} {
		b, err := os.ReadFile(filepath.Join(out, version, name))
		if err != nil {
			t.Fatal(err)
		}
		files["/releases/"+version+"/"+name] = b
	}
	archive := files["/releases/"+version+"/"+archiveName]
	sum := sha256.Sum256(archive)
	if want := hex.EncodeToString(sum[:]) + "  " + archiveName + "\n"; string(files["/releases/"+version+"/"+sumsName]) != want {
		t.Errorf("%s is %q, want %q", sumsName, files["/releases/"+version+"/"+sumsName], want)
	}
	checkArchive(t, archive)

	rs := newReleaseServer(t)
	t.Run("verified", func(t *testing.T) {
		rs.serve(files)
		temp := t.TempDir()
		r := runInstall(t, rs, temp, map[string]string{"version": version}, runnerOS, runnerArch)
		if r.code != 0 {
			t.Fatalf("exit %d:\n%s", r.code, r.out)
		}
		if want := "sha256 of " + archiveName + " verified: " + hex.EncodeToString(sum[:]); !strings.Contains(r.out, want) {
			t.Errorf("no %q in the log:\n%s", want, r.out)
		}
		bin := filepath.Join(temp, "tfstackplan", version, "tfstackplan")
		if r.outputs["path"] != bin || r.outputs["version"] != "tfstackplan "+version || r.ghPath != filepath.Dir(bin) {
			t.Errorf("outputs %q, GITHUB_PATH %q; want path %s, version tfstackplan %s", r.outputs, r.ghPath, bin, version)
		}
		if got, err := exec.Command(bin, "version").Output(); err != nil || string(got) != "tfstackplan "+version+"\n" {
			t.Errorf("the installed binary prints %q (%v)", got, err)
		}
	})
	t.Run("tampered", func(t *testing.T) {
		tampered := slices.Clone(archive)
		tampered[len(tampered)/2] ^= 0xff
		bad := map[string][]byte{}
		for k, v := range files {
			bad[k] = v
		}
		bad["/releases/"+version+"/"+archiveName] = tampered
		rs.serve(bad)
		temp := t.TempDir()
		r := runInstall(t, rs, temp, map[string]string{"version": version}, runnerOS, runnerArch)
		if want := "::error title=tfstackplan action::checksum mismatch for " + archiveName; r.code == 0 || !strings.Contains(r.out, want) {
			t.Errorf("exit %d, want a failure with %q:\n%s", r.code, want, r.out)
		}
		installedNothing(t, r, temp)
	})
}

// checkArchive checks a release archive's entries: the executable tfstackplan and README.md,
// owned by root, with no build machine's user or path in them.
func checkArchive(t *testing.T, archive []byte) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || h.Typeflag != tar.TypeReg {
			t.Errorf("%s: uid %d gid %d %q/%q type %c, want a regular file of 0/0", h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.Typeflag)
		}
		if want := map[string]int64{"tfstackplan": 0o755, "README.md": 0o644}[h.Name]; h.Mode != want {
			t.Errorf("%s: mode %o, want %o", h.Name, h.Mode, want)
		}
	}
	if !slices.Equal(names, []string{"tfstackplan", "README.md"}) {
		t.Errorf("the archive holds %q, want tfstackplan and README.md", names)
	}
}

// TestReleaseVersionIsTheActionsDefault: a release (not a snapshot) must be the version
// action.yml installs by default, or the action at that tag would install another release.
func TestReleaseVersionIsTheActionsDefault(t *testing.T) {
	need(t, "bash", "awk")
	_, a := readAction(t)
	def := a.Inputs["version"].Default
	if def == nil || !strings.HasPrefix(*def, "v") {
		t.Fatalf("action.yml's version input has no release as its default: %v", def)
	}
	for _, tc := range []struct{ version, want string }{
		{"v99.0.0", "action.yml's version input defaults to '" + *def + "', not v99.0.0"},
		{"", "usage: scripts/release.sh"},
	} {
		args := []string{releaseScript, "--out", t.TempDir()}
		if tc.version != "" {
			args = append(args, tc.version)
		}
		b, err := exec.Command("bash", args...).CombinedOutput()
		if err == nil || !strings.Contains(string(b), tc.want) {
			t.Errorf("release.sh %q: %v, want a failure with %q:\n%s", tc.version, err, tc.want, b)
		}
	}
	// With the default version, the check passes and the build starts; PLATFORMS=bad/x stops
	// it before anything is built.
	cmd := exec.Command("bash", releaseScript, "--out", t.TempDir(), *def)
	cmd.Env = append(os.Environ(), "PLATFORMS=bad/x")
	b, _ := cmd.CombinedOutput()
	if want := "platform 'bad/x' is not one action.yml installs"; !strings.Contains(string(b), want) {
		t.Errorf("release.sh %s: want %q after the version check, got:\n%s", *def, want, b)
	}
}
