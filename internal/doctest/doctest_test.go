package doctest_test

// TestDocs runs the ```sh blocks of README.md and docs/*.md (see the package documentation for
// the convention). Each document gets its own sandbox:
//
//   - a temporary directory: HOME, a `work` directory the first block starts in, git configured
//     with a name and `main` as the default branch, nothing of the caller's environment but
//     PATH (no GITHUB_*, no TFSTACKPLAN_*, no cloud credentials: the metadata server is a
//     closed loopback port);
//   - first on PATH, tfstackplan built from this checkout, and terramate, tofu and terraform:
//     the real ones that TFSTACKPLAN_TERRAMATE and TFSTACKPLAN_TOFU name, else the project's
//     stand-ins (see shim_test.go);
//   - TFSTACKPLAN_SRC, the repository root, for the documents' commands that copy from the
//     checkout (the script library);
//   - the blocks run one after another, each in a fresh bash (set -eu -o pipefail) that starts
//     where the previous one ended: its directory, variables and functions;
//   - a `doctest: serve` block's server is stopped when the document ends.
//
// Binaries are built once per test run.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/doctest"
)

func TestMain(m *testing.M) {
	if code, ok := shim(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// repoRoot is the repository root, from this package's directory.
const repoRoot = "../.."

// blockTimeout bounds one block; serveTimeout the wait for a server to listen.
const (
	blockTimeout = 3 * time.Minute
	serveTimeout = 30 * time.Second
)

// docAddr is the address documents give a server; the sandbox replaces it by the real one.
const docAddr = "127.0.0.1:8080"

// documents returns README.md and docs/*.md, relative to the repository root.
func documents(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, d := range docs {
		rel, _ := filepath.Rel(repoRoot, d)
		out = append(out, filepath.ToSlash(rel))
	}
	return out
}

func parseDoc(t *testing.T, name string) []*doctest.Block {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot, name))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := doctest.Parse(name, src)
	if err != nil {
		t.Errorf("%v", err)
	}
	return blocks
}

// TestDocsConvention: every code block of the documents follows the convention, whether or
// not the documents are run.
func TestDocsConvention(t *testing.T) {
	for _, name := range documents(t) {
		parseDoc(t, name)
	}
}

func TestDocs(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the documents' commands are not run")
	}
	for _, name := range documents(t) {
		blocks := parseDoc(t, name)
		runnable, shell := false, false
		for _, b := range blocks {
			runnable = runnable || b.Runnable()
			shell = shell || b.Lang == "sh"
		}
		if !shell {
			continue
		}
		t.Run(name, func(t *testing.T) {
			if !runnable {
				for _, b := range blocks {
					if b.Lang == "sh" {
						t.Logf("%s: not run: %s", b.Where(), b.Skip)
					}
				}
				return
			}
			runDoc(t, blocks)
		})
	}
}

// toolchain is what every sandbox puts on PATH, built once.
type toolchain struct {
	bin      string // tfstackplan, terramate, tofu, terraform
	fakeTM   bool   // terramate is the stand-in
	fakeTofu bool   // tofu is the stand-in
	fixtures string // testdata/tofu, for the stand-in tofu
	env      []string
}

var tools struct {
	once sync.Once
	tc   *toolchain
	err  error
}

func buildTools(t *testing.T) *toolchain {
	t.Helper()
	tools.once.Do(func() { tools.tc, tools.err = newToolchain() })
	if tools.err != nil {
		t.Fatal(tools.err)
	}
	return tools.tc
}

func newToolchain() (*toolchain, error) {
	dir, err := os.MkdirTemp("", "tfstackplan-doctest-")
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "bin")
	fakes := filepath.Join(dir, "fakes")
	for _, d := range []string{bin, fakes} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, err
		}
	}
	tc := &toolchain{bin: bin}
	// One go build: the three main packages compile in parallel.
	cmd := exec.Command("go", "build", "-o", fakes+"/", "./cmd/tfstackplan", "./testdata/faketerramate", "./testdata/faketofu")
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building the tools: %v\n%s", err, out)
	}
	if err := os.Rename(filepath.Join(fakes, "tfstackplan"), filepath.Join(bin, "tfstackplan")); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	link := func(target, name string) error { return os.Symlink(target, filepath.Join(bin, name)) }
	if real := os.Getenv("TFSTACKPLAN_TERRAMATE"); real != "" {
		err = link(real, "terramate")
	} else {
		tc.fakeTM = true
		tc.env = append(tc.env, "DOCTEST_FAKETERRAMATE="+filepath.Join(fakes, "faketerramate"))
		err = link(self, "terramate")
	}
	if err != nil {
		return nil, err
	}
	if real := os.Getenv("TFSTACKPLAN_TOFU"); real != "" {
		err = link(real, "tofu")
	} else {
		tc.fakeTofu = true
		if tc.fixtures, err = filepath.Abs(filepath.Join(repoRoot, "testdata", "tofu")); err != nil {
			return nil, err
		}
		tc.env = append(tc.env, "DOCTEST_FAKETOFU="+filepath.Join(fakes, "faketofu"), "FAKETOFU_FIXTURES="+tc.fixtures)
		err = link(self, "tofu")
	}
	if err != nil {
		return nil, err
	}
	return tc, link("tofu", "terraform")
}

// sandbox is one document's environment.
type sandbox struct {
	t     *testing.T
	tc    *toolchain
	root  string // everything of the sandbox
	state string // the shell state the next block starts from
	env   []string
	addr  string // the server's real address, once a serve block ran
}

func newSandbox(t *testing.T, tc *toolchain) *sandbox {
	root := t.TempDir()
	s := &sandbox{t: t, tc: tc, root: root, state: filepath.Join(root, ".state.sh")}
	home := filepath.Join(root, "home")
	work := filepath.Join(root, "work")
	for _, d := range []string{home, work, filepath.Join(root, "terramate.d")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	excludes := filepath.Join(root, "gitexcludes")
	var ignored []string
	if tc.fakeTM {
		ignored = append(ignored, ".faketerramate.json")
	}
	if tc.fakeTofu {
		ignored = append(ignored, "faketofu.*")
	}
	src, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		excludes: strings.Join(ignored, "\n") + "\n",
		filepath.Join(root, "gitconfig"): fmt.Sprintf("[user]\n\tname = doc\n\temail = doc@example.com\n"+
			"[init]\n\tdefaultBranch = main\n[core]\n\texcludesFile = %s\n[advice]\n\tdetachedHead = false\n", excludes),
		filepath.Join(root, "tofurc"): "",
		filepath.Join(root, "terramate.rc"): fmt.Sprintf("disable_checkpoint = true\ndisable_checkpoint_signature = true\n"+
			"disable_telemetry = true\nuser_terramate_dir = %q\n", filepath.Join(root, "terramate.d")),
		s.state: fmt.Sprintf("cd -- %q\n", work),
	}
	for p, content := range files {
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s.env = append([]string{
		"PATH=" + tc.bin + string(os.PathListSeparator) + os.Getenv("PATH"),
		"HOME=" + home,
		"TMPDIR=" + os.TempDir(),
		"LANG=C.UTF-8",
		"TERM=dumb",
		"NO_COLOR=1",
		"GIT_CONFIG_GLOBAL=" + filepath.Join(root, "gitconfig"),
		"GIT_CONFIG_NOSYSTEM=1",
		"GCE_METADATA_HOST=127.0.0.1:1",
		"GCE_METADATA_IP=127.0.0.1:1",
		"CHECKPOINT_DISABLE=1",
		"TF_CLI_CONFIG_FILE=" + filepath.Join(root, "tofurc"),
		"TM_CLI_CONFIG_FILE=" + filepath.Join(root, "terramate.rc"),
		"TFSTACKPLAN_SRC=" + src,
	}, tc.env...)
	return s
}

func runDoc(t *testing.T, blocks []*doctest.Block) {
	tc := buildTools(t)
	s := newSandbox(t, tc)
	for _, b := range blocks {
		body := b.Body
		if s.addr != "" {
			body = strings.ReplaceAll(body, docAddr, s.addr)
		}
		switch {
		case b.WriteFile != "":
			s.writeFile(b, body)
		case b.Lang != "sh":
		case b.Skip != "":
			t.Logf("%s: not run: %s", b.Where(), b.Skip)
		case b.Serve:
			s.serve(b)
		default:
			s.run(b, body)
		}
	}
}

// cwd is the directory the last block ended in.
func (s *sandbox) cwd() string {
	out, err := exec.Command("bash", "--noprofile", "--norc", "-c", `. "$1" >/dev/null 2>&1; pwd`, "bash", s.state).Output()
	if err != nil {
		s.t.Fatalf("reading the sandbox's directory: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func (s *sandbox) writeFile(b *doctest.Block, body string) {
	p := b.WriteFile
	if !filepath.IsAbs(p) {
		p = filepath.Join(s.cwd(), p)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		s.t.Fatalf("%s: %v", b.Where(), err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		s.t.Fatalf("%s: %v", b.Where(), err)
	}
}

// saveState writes the shell's variables, functions and directory for the next block, leaving
// out what bash sets itself.
const saveState = `
__doctest_save() {
  local v
  for v in $(compgen -v); do
    case $v in
      BASH*|EUID|PPID|SHELLOPTS|UID|GROUPS|FUNCNAME|PIPESTATUS|DIRSTACK|SHLVL|PWD|OLDPWD|_|LINENO|SECONDS|RANDOM|SRANDOM|EPOCH*|HISTCMD|COMP_WORDBREAKS|OPTIND|OPTERR|OPTARG|IFS|PS1|PS2|PS4|HOSTNAME|HOSTTYPE|MACHTYPE|OSTYPE|COLUMNS|LINES|v) continue ;;
    esac
    declare -p "$v" 2>/dev/null || true
  done
  declare -f
  printf 'cd -- %q\n' "$PWD"
}
`

// run runs one block in a fresh bash that starts from the state the previous block left.
func (s *sandbox) run(b *doctest.Block, body string) {
	t := s.t
	script := filepath.Join(s.root, ".block.sh")
	text := fmt.Sprintf("%s\n. %q\nset -eu -o pipefail\n%s\nset +eu +o pipefail\n__doctest_save >%q.new && mv -f %q.new %q\n",
		saveState, s.state, body, s.state, s.state, s.state)
	if err := os.WriteFile(script, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := os.CreateTemp(s.root, ".out-*")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "--noprofile", "--norc", script)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = s.root, s.env, out, out
	// Its own process group: a block that hangs is killed with everything it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	start := time.Now()
	err = cmd.Run()
	output, _ := os.ReadFile(out.Name())
	switch {
	case ctx.Err() != nil:
		t.Fatalf("%s: the block did not finish within %s:\n%s\noutput:\n%s", b.Where(), blockTimeout, indent(b.Body), indent(string(output)))
	case err != nil:
		t.Fatalf("%s: the block failed (%v):\n%s\noutput:\n%s", b.Where(), err, indent(b.Body), indent(string(output)))
	}
	t.Logf("%s: ran in %s:\n%s", b.Where(), time.Since(start).Round(time.Millisecond), indent(tail(string(output), 4<<10)))
}

var servingRE = regexp.MustCompile(`msg=serving addr=(\S+)`)

// serve starts a serve block's command in the background, on a free port, until the document
// ends.
func (s *sandbox) serve(b *doctest.Block) {
	t := s.t
	if s.addr != "" {
		t.Fatalf("%s: a second `doctest: serve` block in one document", b.Where())
	}
	line, err := doctest.ServeCommand(b)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(line, docAddr) {
		t.Fatalf("%s: the served command must listen on %s (the doc test moves it to a free port)", b.Where(), docAddr)
	}
	line = strings.ReplaceAll(line, docAddr, "127.0.0.1:0")
	logPath := filepath.Join(s.root, ".serve.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command("bash", "--noprofile", "--norc", "-c", fmt.Sprintf(". %q\nexec %s", s.state, line))
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = s.root, s.env, logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})
	deadline := time.After(serveTimeout)
	for {
		log, _ := os.ReadFile(logPath)
		if m := servingRE.FindSubmatch(log); m != nil {
			s.addr = string(m[1])
			t.Logf("%s: serving on %s (the document's %s)", b.Where(), s.addr, docAddr)
			return
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("%s: the server exited (%v):\n%s", b.Where(), err, indent(string(log)))
		case <-deadline:
			t.Fatalf("%s: the server did not listen within %s:\n%s", b.Where(), serveTimeout, indent(string(log)))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

func indent(s string) string {
	s = tail(strings.TrimRight(s, "\n"), 16<<10)
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}
