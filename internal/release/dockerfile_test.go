package release

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

const root = "../.."

// instruction is one Dockerfile instruction: its keyword (upper case) and its arguments, with
// continuation lines joined.
type instruction struct {
	cmd, args string
	line      int
}

// stage is one FROM ... of the Dockerfile and its instructions.
type stage struct {
	from, name string
	ins        []instruction
}

// all returns the arguments of the stage's instructions of one keyword.
func (s stage) all(cmd string) []string {
	var out []string
	for _, in := range s.ins {
		if in.cmd == cmd {
			out = append(out, in.args)
		}
	}
	return out
}

var fromRe = regexp.MustCompile(`^(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$`)

func readDockerfile(t *testing.T) []stage {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stages []stage
	var cur strings.Builder
	start := 0
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if strings.HasSuffix(line, `\`) {
			cur.WriteString(strings.TrimSuffix(line, `\`) + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		cur.Reset()
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: start}
		if in.cmd == "FROM" {
			m := fromRe.FindStringSubmatch(in.args)
			if m == nil {
				t.Fatalf("Dockerfile:%d: FROM %s", in.line, in.args)
			}
			stages = append(stages, stage{from: m[1], name: m[2]})
			continue
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("Dockerfile:%d: %s before FROM", in.line, in.cmd)
			}
			continue
		}
		stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(stages) < 2 {
		t.Fatalf("the Dockerfile has %d stages, want a build stage and the image", len(stages))
	}
	return stages
}

// buildCommand is the build stage's `go build` RUN line.
func buildCommand(t *testing.T, stages []stage) string {
	t.Helper()
	for _, s := range stages[:len(stages)-1] {
		for _, run := range s.all("RUN") {
			if strings.Contains(run, "go build") {
				return run
			}
		}
	}
	t.Fatal("no RUN ... go build in the Dockerfile's build stages")
	return ""
}

// entrypoint is the image's ENTRYPOINT, which must be in exec (JSON) form: scratch has no
// shell to run the shell form.
func entrypoint(t *testing.T, img stage) []string {
	t.Helper()
	eps := img.all("ENTRYPOINT")
	if len(eps) != 1 {
		t.Fatalf("the image has %d ENTRYPOINTs, want one", len(eps))
	}
	var argv []string
	if err := json.Unmarshal([]byte(eps[0]), &argv); err != nil || len(argv) < 2 {
		t.Fatalf("ENTRYPOINT %s: want the exec form [\"/path/tfstackplan\", \"serve\", ...] (%v)", eps[0], err)
	}
	return argv
}

// imageUser is the image's last USER, as uid and gid.
func imageUser(t *testing.T, img stage) (int, int) {
	t.Helper()
	users := img.all("USER")
	if len(users) == 0 {
		t.Fatal("the image has no USER: it would run as root")
	}
	u, g, _ := strings.Cut(users[len(users)-1], ":")
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if err1 != nil || err2 != nil || uid == 0 || gid == 0 {
		t.Fatalf("USER %s: want a numeric non-root UID:GID (scratch has no /etc/passwd to name one)", users[len(users)-1])
	}
	return uid, gid
}

// TestDockerfile holds the image of `serve` to what docs/deploy.md promises: a static cgo-free
// build stamped with its version, from a Go matching go.mod's; an empty base with nothing that
// needs a shell; a non-root user; /data, owned by that user, as the volume and the working
// directory (where the default --db puts the database); serve as the entrypoint.
func TestDockerfile(t *testing.T) {
	stages := readDockerfile(t)
	img := stages[len(stages)-1]

	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	var builder stage
	for _, s := range stages[:len(stages)-1] {
		if strings.HasPrefix(s.from, "golang:") {
			builder = s
		}
	}
	if goLine == nil || builder.from != "golang:"+string(goLine[1]) {
		t.Errorf("the build stage is FROM %q, want golang:%s (go.mod's go)", builder.from, goLine[1])
	}
	build := buildCommand(t, stages)
	for _, want := range []string{"CGO_ENABLED=0 ", "-trimpath", "internal/buildinfo.version=$VERSION", "-o /out/tfstackplan ", "./cmd/tfstackplan"} {
		if !strings.Contains(build, want) {
			t.Errorf("the build command lacks %q: %s", want, build)
		}
	}

	if img.from != "scratch" && !strings.Contains(img.from, "distroless/static") {
		t.Errorf("the image is FROM %s, want scratch or a distroless static base", img.from)
	}
	for _, in := range img.ins {
		if in.cmd == "RUN" || in.cmd == "SHELL" || in.cmd == "HEALTHCHECK" {
			t.Errorf("Dockerfile:%d: %s in the image stage: the image has no shell", in.line, in.cmd)
		}
	}
	if cmds := img.all("CMD"); len(cmds) > 0 && !strings.HasPrefix(cmds[0], "[") {
		t.Errorf("CMD %s: want the exec form", cmds[0])
	}
	uid, gid := imageUser(t, img)
	argv := entrypoint(t, img)
	if argv[1] != "serve" || slices.Contains(argv, "--insecure-no-auth") {
		t.Errorf("ENTRYPOINT %q: want tfstackplan serve, with authentication", argv)
	}
	copies := img.all("COPY")
	if !slices.Contains(copies, "--from=build /out/tfstackplan "+argv[0]) {
		t.Errorf("the entrypoint %s is not the build stage's /out/tfstackplan: COPY %q", argv[0], copies)
	}
	if !slices.Contains(copies, "--from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt") {
		t.Errorf("no CA certificates are copied (the server fetches ID token keys over HTTPS): COPY %q", copies)
	}
	workdirs := img.all("WORKDIR")
	if len(workdirs) == 0 || workdirs[len(workdirs)-1] != "/data" || !slices.Contains(img.all("VOLUME"), "/data") {
		t.Errorf("WORKDIR %q, VOLUME %q: want /data as both (the default --db is ./tfstackplan.db)", workdirs, img.all("VOLUME"))
	}
	if owned := "--from=build --chown=" + strconv.Itoa(uid) + ":" + strconv.Itoa(gid) + " /out/data /data"; !slices.Contains(copies, owned) {
		t.Errorf("/data is not created owned by the image's user (COPY %s): a new volume would not be writable; COPY %q", owned, copies)
	}
}

// TestDockerignore: .dockerignore keeps the history and build output out of the build context
// and none of the files the build reads (go.mod, go.sum, each Go and embedded file of the
// module's packages that cmd/tfstackplan imports).
func TestDockerignore(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			if strings.HasPrefix(l, "!") {
				t.Fatalf(".dockerignore: %s: the check does not read exceptions", l)
			}
			patterns = append(patterns, strings.TrimPrefix(l, "/"))
		}
	}
	ignored := func(path string) string {
		for p := path; p != "."; p = filepath.Dir(p) {
			for _, pat := range patterns {
				if ok, _ := filepath.Match(pat, p); ok {
					return pat
				}
			}
		}
		return ""
	}
	for _, p := range []string{".git", "bin", "dist"} {
		if ignored(p) == "" {
			t.Errorf(".dockerignore does not leave out %s", p)
		}
	}
	need(t, "go")
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "-f", `{{if .Module}}{{if .Module.Main}}{{.Dir}}|{{join .GoFiles ","}},{{join .EmbedFiles ","}}{{end}}{{end}}`, "./cmd/tfstackplan")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	files := []string{"go.mod", "go.sum"}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		dir, names, _ := strings.Cut(l, "|")
		rel, err := filepath.Rel(abs, dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range strings.Split(names, ",") {
			if n != "" {
				files = append(files, filepath.Join(rel, n))
			}
		}
	}
	if len(files) < 20 {
		t.Fatalf("go list found only %q", files)
	}
	for _, f := range files {
		if pat := ignored(f); pat != "" {
			t.Errorf(".dockerignore's %s leaves out %s, which the build needs", pat, f)
		}
	}
}

func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not on PATH", tool)
		}
	}
}

// sandbox runs "$@" in a new mount namespace where every file system is read-only but $1 (the
// data directory, which becomes the working directory), as the UID and GID in $2 and $3: the
// image's user on a read-only root with its volume.
const sandbox = `set -eu
data=$1 uid=$2 gid=$3
shift 3
mount --bind "$data" "$data"
awk '{ print $5 }' /proc/self/mountinfo | while read -r mp; do
  [ "$mp" = "$data" ] || mount -o remount,bind,ro "$mp" 2>/dev/null || true
done
for d in / "$(dirname "$data")"; do
  if touch "$d/.rw-probe" 2>/dev/null; then echo "sandbox: $d is still writable" >&2; exit 97; fi
done
cd "$data"
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups -- "$@"
`

var servingRe = regexp.MustCompile(`msg=serving addr=(\S+)`)

// TestImageEntrypointReadOnly builds tfstackplan with the Dockerfile's own build command and
// runs the image's entrypoint as the image would: as its user, in /data's stand-in, with every
// other file system read-only and no HOME or TMPDIR. It checks the binary is static, and that
// serve migrates its SQLite database in the data directory, answers /readyz, reports the
// stamped version, authenticates API calls, and stops cleanly on SIGTERM. It needs root (a
// mount namespace); docker itself is not needed.
func TestImageEntrypointReadOnly(t *testing.T) {
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("needs root on Linux for a read-only mount namespace")
	}
	need(t, "go", "sh", "unshare", "mount", "setpriv", "awk")
	if err := exec.Command("unshare", "--mount", "true").Run(); err != nil {
		t.Skipf("no mount namespace here: %v", err)
	}
	stages := readDockerfile(t)
	img := stages[len(stages)-1]
	uid, gid := imageUser(t, img)
	argv := entrypoint(t, img)

	// A world-readable tree (t.TempDir's parent is 0700): the image's user must reach it.
	top, err := os.MkdirTemp("", "tfstackplan-image-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	out, data := filepath.Join(top, "out"), filepath.Join(top, "data")
	for _, d := range []string{top, out, data} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(data, uid, gid); err != nil {
		t.Fatal(err)
	}

	const version = "v0.0.0-image.test"
	build := strings.ReplaceAll(buildCommand(t, stages), "/out/", out+"/")
	cmd := exec.Command("sh", "-c", build)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "TARGETOS="+runtime.GOOS, "TARGETARCH="+runtime.GOARCH, "VERSION="+version)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's build command: %v\n%s", err, b)
	}
	bin := filepath.Join(out, "tfstackplan")
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("the binary is dynamically linked (program header %v): scratch has no libc", p.Type)
		}
	}
	ef.Close()

	const secret = "image-test-secret-0123456789"
	tokens := filepath.Join(top, "tokens.hcl")
	if err := os.WriteFile(tokens, []byte("token \"ops\" {\n  secret = \""+secret+"\"\n  roles  = [\"viewer\"]\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-c", sandbox, "sh", data, strconv.Itoa(uid), strconv.Itoa(gid), bin}, argv[1:]...)
	args = append(args, "--listen=127.0.0.1:0", "--tokens="+tokens)
	srv := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "--", "sh"}, args...)...)
	// The image's environment: no HOME, no TMPDIR; no metadata server either.
	srv.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "GCE_METADATA_HOST=127.0.0.1:1", "GCE_METADATA_IP=127.0.0.1:1"}
	var log testkit.SyncBuffer
	srv.Stdout, srv.Stderr = &log, &log
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = srv.Process.Kill()
			<-exited
		}
	})
	var addr string
	// Generous: a busy machine may take long to start it; the test only waits, it does not time.
	deadline := time.After(2 * time.Minute)
	for addr == "" {
		if m := servingRe.FindStringSubmatch(log.String()); m != nil {
			addr = m[1]
			break
		}
		select {
		case err := <-exited:
			stopped = true
			t.Fatalf("serve exited (%v):\n%s", err, log.String())
		case <-deadline:
			t.Fatalf("serve did not listen:\n%s", log.String())
		case <-time.After(50 * time.Millisecond):
		}
	}

	get := func(path, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/readyz", ""); code != 200 || strings.TrimSpace(body) != "ready" {
		t.Errorf("/readyz: %d %q", code, body)
	}
	if code, body := get("/api/v1/health", ""); code != 200 || !strings.Contains(body, `"version":"`+version+`"`) {
		t.Errorf("/api/v1/health: %d %s, want version %s", code, body, version)
	}
	if code, body := get("/api/v1/executions", secret); code != 200 {
		t.Errorf("/api/v1/executions with the token: %d %s", code, body)
	}
	if code, _ := get("/api/v1/executions", ""); code != 401 {
		t.Errorf("/api/v1/executions without a token: %d, want 401", code)
	}

	if err := srv.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if err := <-exited; err != nil {
		t.Errorf("serve did not stop cleanly on SIGTERM: %v\n%s", err, log.String())
	}
	fi, err := os.Stat(filepath.Join(data, "tfstackplan.db"))
	if err != nil {
		t.Fatalf("no database in the data directory: %v\n%s", err, log.String())
	}
	if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != uid || fi.Size() == 0 {
		t.Errorf("tfstackplan.db: owner %d, size %d; want the image's user %d and a migrated database", st.Uid, fi.Size(), uid)
	}
}
