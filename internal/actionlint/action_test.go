package actionlint

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/tfstackplan/tfstackplan/internal/cli"
)

const (
	actionFile   = "../../action.yml"
	examplesGlob = "../../examples/github-workflows/*.yml"
	// projectWorkflowsGlob are the project's own workflows: CI and the release.
	projectWorkflowsGlob = "../../.github/workflows/*.yml"
	// driverFiles are where the driver writes its $GITHUB_OUTPUT keys (driverOutputs).
	driverFiles = "../../internal/job/outputs.go ../../internal/job/drift.go"
)

// action is the part of action.yml the checks read.
type action struct {
	Name        string                  `yaml:"name"`
	Description string                  `yaml:"description"`
	Inputs      map[string]actionInput  `yaml:"inputs"`
	Outputs     map[string]actionOutput `yaml:"outputs"`
	Runs        struct {
		Using string `yaml:"using"`
		Steps []step `yaml:"steps"`
	} `yaml:"runs"`
}

type actionInput struct {
	Description string  `yaml:"description"`
	Required    bool    `yaml:"required"`
	Default     *string `yaml:"default"`
}

type actionOutput struct {
	Description string `yaml:"description"`
	Value       string `yaml:"value"`
}

type step struct {
	Name  string            `yaml:"name"`
	ID    string            `yaml:"id"`
	If    string            `yaml:"if"`
	Uses  string            `yaml:"uses"`
	Run   string            `yaml:"run"`
	Shell string            `yaml:"shell"`
	With  map[string]string `yaml:"with"`
	Env   map[string]string `yaml:"env"`
}

var (
	exprRe      = regexp.MustCompile(`\$\{\{(.*?)\}\}`)
	inputRefRe  = regexp.MustCompile(`\binputs\.([A-Za-z_][A-Za-z0-9_-]*)`)
	stepRefRe   = regexp.MustCompile(`\bsteps\.([A-Za-z_][A-Za-z0-9_-]*)\.`)
	outputValRe = regexp.MustCompile(`^\$\{\{\s*steps\.([A-Za-z_][A-Za-z0-9_-]*)\.outputs\.([A-Za-z_][A-Za-z0-9_-]*)\s*\}\}$`)
	usesLineRe  = regexp.MustCompile(`^\s*(?:-\s+)?uses:\s*(\S+)(.*)$`)
	pinnedRe    = regexp.MustCompile(`^([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)(/[A-Za-z0-9_./-]+)?@([0-9a-f]{40})$`)
	versionCmt  = regexp.MustCompile(`^\s+#\s+v[0-9]+(\.[0-9]+)*\s*$`)
)

// checkAction returns what is wrong with an action.yml: not a composite action, a `run:` step
// without `shell:`, an expression naming an input or step that does not exist, an output that
// is not a step's output, an expression inside a script, an action not pinned by commit.
func checkAction(src []byte) []string {
	var a action
	if err := yaml.Unmarshal(src, &a); err != nil {
		return []string{"action.yml is not YAML: " + err.Error()}
	}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if a.Name == "" || a.Description == "" {
		bad("the action needs a name and a description")
	}
	if a.Runs.Using != "composite" {
		bad("runs.using is %q, not composite", a.Runs.Using)
	}
	if len(a.Runs.Steps) == 0 {
		bad("runs.steps is empty")
	}
	for name, in := range a.Inputs {
		if in.Description == "" {
			bad("input %s has no description", name)
		}
	}
	ids := map[string]bool{}
	for i, s := range a.Runs.Steps {
		where := fmt.Sprintf("step %d (%s)", i+1, cmp(s.ID, s.Name))
		switch {
		case s.Run != "" && s.Uses != "":
			bad("%s has both run: and uses:", where)
		case s.Run == "" && s.Uses == "":
			bad("%s has neither run: nor uses:", where)
		case s.Run != "" && s.Shell == "":
			bad("%s uses run: without shell: (a composite action's run steps need one)", where)
		}
		if strings.Contains(s.Run, "${{") {
			bad("%s interpolates an expression into its script: pass it through env", where)
		}
		if s.ID != "" {
			if ids[s.ID] {
				bad("step id %s is used twice", s.ID)
			}
			ids[s.ID] = true
		}
	}
	exprs := []string{}
	for _, m := range exprRe.FindAllStringSubmatch(string(src), -1) {
		exprs = append(exprs, m[1])
	}
	for _, s := range a.Runs.Steps {
		exprs = append(exprs, s.If)
	}
	for _, e := range exprs {
		for _, m := range inputRefRe.FindAllStringSubmatch(e, -1) {
			if _, ok := a.Inputs[m[1]]; !ok {
				bad("inputs.%s is referenced but is not an input", m[1])
			}
		}
		for _, m := range stepRefRe.FindAllStringSubmatch(e, -1) {
			if !ids[m[1]] {
				bad("steps.%s is referenced but no step has that id", m[1])
			}
		}
	}
	for name, o := range a.Outputs {
		if o.Description == "" {
			bad("output %s has no description", name)
		}
		if m := outputValRe.FindStringSubmatch(strings.TrimSpace(o.Value)); m == nil {
			bad("output %s is %q, not ${{ steps.ID.outputs.NAME }}", name, o.Value)
		}
	}
	problems = append(problems, checkPinned("action.yml", src, nil)...)
	slices.Sort(problems)
	return slices.Compact(problems)
}

func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// checkPinned checks that every action a file uses, other than a local one and this project's
// own (pinned by users to its release), names a full commit SHA followed by a `# vX.Y.Z`
// comment; pins (when not nil) collects action → SHA across files.
func checkPinned(file string, src []byte, pins map[string]map[string]bool) []string {
	var problems []string
	for i, line := range strings.Split(string(src), "\n") {
		m := usesLineRe.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		ref, rest := strings.Trim(m[1], `"'`), m[2]
		if strings.HasPrefix(ref, "./") || strings.HasPrefix(ref, "tfstackplan/tfstackplan@") {
			continue
		}
		p := pinnedRe.FindStringSubmatch(ref)
		if p == nil || !versionCmt.MatchString(rest) {
			problems = append(problems, fmt.Sprintf("%s:%d: %s is not pinned by a full commit SHA with a # vX.Y.Z comment", file, i+1, ref))
			continue
		}
		if pins != nil {
			if pins[p[1]] == nil {
				pins[p[1]] = map[string]bool{}
			}
			pins[p[1]][p[3]+rest] = true
		}
	}
	return problems
}

func readAction(t *testing.T) ([]byte, action) {
	t.Helper()
	src, err := os.ReadFile(actionFile)
	if err != nil {
		t.Fatal(err)
	}
	var a action
	if err := yaml.Unmarshal(src, &a); err != nil {
		t.Fatalf("action.yml: %v", err)
	}
	return src, a
}

func TestActionStructure(t *testing.T) {
	src, _ := readAction(t)
	for _, p := range checkAction(src) {
		t.Error(p)
	}
}

// TestActionStructureRejectsBrokenCopies breaks a copy of action.yml in each way the check
// exists for, and expects the check to say so: the check itself is tested.
func TestActionStructureRejectsBrokenCopies(t *testing.T) {
	src, _ := readAction(t)
	for _, tc := range []struct{ name, old, new, want string }{
		{"not yaml", "runs:\n", "runs: [\n", "not YAML"},
		{"not composite", "using: composite", "using: node24", `runs.using is "node24"`},
		{"run without shell", "      id: install\n      shell: bash\n", "      id: install\n", "install) uses run: without shell:"},
		{"unknown input", "${{ inputs.release-url }}", "${{ inputs.release-uri }}", "inputs.release-uri is referenced but is not an input"},
		{"unknown input in if", "if: inputs.version == 'source'", "if: inputs.versions == 'source'", "inputs.versions is referenced"},
		{"output of a missing step", "${{ steps.run.outputs.status }}", "${{ steps.runs.outputs.status }}", "steps.runs is referenced but no step has that id"},
		{"output not a step output", "value: ${{ steps.run.outputs.class }}", "value: ${{ inputs.environment }}", "output class is"},
		{"expression in a script", `if [ "$TSP_VERSION" = source ]`, `if [ "${{ inputs.version }}" = source ]`, "interpolates an expression into its script"},
		{"unpinned action", "actions/setup-go@b7ad1dad31e06c5925ef5d2fc7ad053ef454303e # v7.0.0", "actions/setup-go@v7", "actions/setup-go@v7 is not pinned"},
		{"pin without version", "b7ad1dad31e06c5925ef5d2fc7ad053ef454303e # v7.0.0", "b7ad1dad31e06c5925ef5d2fc7ad053ef454303e", "is not pinned"},
		{"input without description", "  dir:\n    description: ", "  dir:\n    summary: ", "input dir has no description"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !bytes.Contains(src, []byte(tc.old)) {
				t.Fatalf("action.yml no longer contains %q: update the test", tc.old)
			}
			broken := bytes.Replace(src, []byte(tc.old), []byte(tc.new), 1)
			problems := checkAction(broken)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("want a problem containing %q, got %q", tc.want, problems)
			}
		})
	}
}

// actionOnly are the inputs that are not flags of tfstackplan run: installation, the working
// directory, what goes through the environment, and the extra arguments.
var actionOnly = []string{"command", "version", "release-url", "working-directory", "server", "audience", "auth", "token", "args", "shard-results"}

// TestActionCoversDriverFlags holds the inputs to the flags of `run plan`, `run apply`,
// `run drift` and `run tick`: each flag is an input of the same name, each input is a flag or
// action-only.
func TestActionCoversDriverFlags(t *testing.T) {
	_, a := readAction(t)
	flags := map[string]bool{}
	for _, op := range []string{"plan", "apply", "merge", "drift", "tick"} {
		cmd := runCmd(t, op)
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			flags[f.Name] = true
			if f.Name == "help" || f.Name == "changed" { // changed is the default
				return
			}
			if op == "merge" && f.Name == "matrix" {
				return // merge's --matrix is the matrix-result input
			}
			if _, ok := a.Inputs[f.Name]; !ok {
				t.Errorf("tfstackplan run %s --%s has no input in action.yml: add one (and map it in the run step)", op, f.Name)
			}
		})
	}
	for name := range a.Inputs {
		if !flags[name] && !slices.Contains(actionOnly, name) {
			t.Errorf("input %s is not a flag of tfstackplan run plan|apply|merge|drift|tick", name)
		}
	}
}

func runCmd(t *testing.T, op string) *cobra.Command {
	t.Helper()
	var out bytes.Buffer
	root := cli.NewRootCmd(&cli.IO{In: strings.NewReader(""), Out: &out, ErrOut: &out})
	cmd, _, err := root.Find([]string{"run", op})
	if err != nil || cmd.Name() != op {
		t.Fatalf("tfstackplan run %s: %v", op, err)
	}
	return cmd
}

// driverOutputs returns the $GITHUB_OUTPUT keys the driver writes: the string keys of the
// name/value pairs in internal/job/outputs.go's writeOutputs and internal/job/drift.go's driftOutputs (those of
// run drift, which writeOutputs adds).
func driverOutputs(t *testing.T) []string {
	t.Helper()
	var keys []string
	for _, file := range strings.Fields(driverFiles) {
		keys = append(keys, outputKeys(t, file)...)
	}
	if len(keys) < 5 || !slices.Contains(keys, "has-drift") {
		t.Fatalf("found only %q as $GITHUB_OUTPUT keys in %s's writeOutputs and driftOutputs: update driverOutputs", keys, driverFiles)
	}
	return keys
}

// outputKeys returns the keys of the [2]string pairs in file's writeOutputs and driftOutputs.
func outputKeys(t *testing.T, file string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Recv == nil || (fn.Name.Name != "writeOutputs" && fn.Name.Name != "driftOutputs") {
			continue
		}
		ast.Inspect(fn, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok || len(lit.Elts) != 2 {
				return true
			}
			if arr, ok := lit.Type.(*ast.ArrayType); lit.Type != nil && (!ok || arr.Len == nil) {
				return true // only [2]string pairs, typed or elided
			}
			if s, ok := lit.Elts[0].(*ast.BasicLit); ok && s.Kind == token.STRING {
				k, _ := strconv.Unquote(s.Value)
				keys = append(keys, k)
			}
			return true
		})
	}
	return keys
}

// TestActionOutputsCoverDriver: every key the driver writes to $GITHUB_OUTPUT is an output of
// the action, read from the run step; every output of the run step is one the driver writes.
func TestActionOutputsCoverDriver(t *testing.T) {
	_, a := readAction(t)
	keys := driverOutputs(t)
	for _, k := range keys {
		o, ok := a.Outputs[k]
		if !ok {
			t.Errorf("the driver writes %s to $GITHUB_OUTPUT, action.yml has no output %s", k, k)
			continue
		}
		if m := outputValRe.FindStringSubmatch(o.Value); m == nil || m[1] != "run" || m[2] != k {
			t.Errorf("output %s is %q, want ${{ steps.run.outputs.%s }}", k, o.Value, k)
		}
	}
	for name, o := range a.Outputs {
		if m := outputValRe.FindStringSubmatch(o.Value); m != nil && m[1] == "run" && !slices.Contains(keys, m[2]) {
			t.Errorf("output %s reads steps.run.outputs.%s, which the driver does not write", name, m[2])
		}
	}
}

func stepByID(t *testing.T, a action, id string) step {
	t.Helper()
	for _, s := range a.Runs.Steps {
		if s.ID == id {
			return s
		}
	}
	t.Fatalf("action.yml has no step %s", id)
	return step{}
}

var envExprRe = regexp.MustCompile(`^\$\{\{\s*(inputs|steps\.install\.outputs)\.([A-Za-z_][A-Za-z0-9_-]*)\s*\}\}$`)

// stepEnv evaluates a step's env as the runner would for the given inputs (the rest take
// their defaults) and install outputs, on top of base. Each value must be a literal or one
// plain `${{ inputs.X }}` or `${{ steps.install.outputs.X }}`.
func stepEnv(t *testing.T, a action, s step, inputs, install map[string]string, base []string) []string {
	t.Helper()
	env := slices.Clone(base)
	for k, v := range s.Env {
		if strings.Contains(v, "${{") {
			m := envExprRe.FindStringSubmatch(v)
			if m == nil {
				t.Fatalf("step %s: env %s is %q: only one plain inputs.X or steps.install.outputs.X", s.ID, k, v)
			}
			if m[1] == "inputs" {
				var given bool
				if v, given = inputs[m[2]]; !given {
					v = ""
					if d := a.Inputs[m[2]].Default; d != nil {
						v = *d
					}
				}
			} else {
				v = install[m[2]]
			}
		}
		env = append(env, k+"="+v)
	}
	for k := range inputs {
		if _, ok := a.Inputs[k]; !ok {
			t.Fatalf("the test gives input %s, which action.yml does not have", k)
		}
	}
	return env
}

// runStep runs a step's script as the runner does (bash --noprofile --norc -eo pipefail).
func runStep(t *testing.T, s step, env []string, dir string) (string, int) {
	t.Helper()
	if s.Shell != "bash" {
		t.Fatalf("step %s: shell %q, the test runs bash", s.ID, s.Shell)
	}
	script := filepath.Join(t.TempDir(), "step.sh")
	if err := os.WriteFile(script, []byte(s.Run), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "--noprofile", "--norc", "-eo", "pipefail", script)
	cmd.Env, cmd.Dir = env, dir
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	return string(out), code
}

// baseEnv is the test's environment without what a runner or a job would set.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, "GITHUB_") && !strings.HasPrefix(k, "RUNNER_") && !strings.HasPrefix(k, "TFSTACKPLAN_") &&
			!strings.HasPrefix(k, "TSP_") && k != "CURL_CA_BUNDLE" && k != "SSL_CERT_FILE" {
			env = append(env, kv)
		}
	}
	return env
}

func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not on PATH", tool)
		}
	}
}

// ghOutputs reads a $GITHUB_OUTPUT file of name=value lines.
func ghOutputs(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = v
		}
	}
	return out
}

func tarGz(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		body := files[name]
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// releaseServer is a loopback HTTPS server of release files, by URL path, and the PEM file of
// its certificate for curl (the install step downloads over HTTPS only).
type releaseServer struct {
	URL, CA string
	mu      sync.Mutex // guards files and broken, which the handler reads
	files   map[string][]byte
	broken  bool
}

func newReleaseServer(t *testing.T) *releaseServer {
	t.Helper()
	rs := &releaseServer{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rs.mu.Lock()
		b, ok := rs.files[r.URL.Path]
		ok = ok && !rs.broken
		rs.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	rs.URL, rs.CA = srv.URL, filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(rs.CA, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	return rs
}

// serve replaces what the server has.
func (rs *releaseServer) serve(files map[string][]byte) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.files, rs.broken = files, false
}

// breakAll has the server answer 404 to everything.
func (rs *releaseServer) breakAll() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.broken = true
}

// installRun is what one run of the install step did.
type installRun struct {
	out, ghPath string
	outputs     map[string]string
	code        int
}

// runInstall runs action.yml's install step with inputs, its release-url set to rs's
// /releases/, on a runner of runnerOS and runnerArch (Linux, X64, ...) whose RUNNER_TEMP is temp.
func runInstall(t *testing.T, rs *releaseServer, temp string, inputs map[string]string, runnerOS, runnerArch string) installRun {
	t.Helper()
	_, a := readAction(t)
	s := stepByID(t, a, "install")
	dir := t.TempDir()
	out, ghPath := filepath.Join(dir, "output"), filepath.Join(dir, "path")
	for _, f := range []string{out, ghPath} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	inputs["release-url"] = rs.URL + "/releases/"
	env := stepEnv(t, a, s, inputs, nil, append(baseEnv(),
		"RUNNER_TEMP="+temp, "RUNNER_OS="+runnerOS, "RUNNER_ARCH="+runnerArch, "GITHUB_OUTPUT="+out, "GITHUB_PATH="+ghPath,
		"CURL_CA_BUNDLE="+rs.CA, "SSL_CERT_FILE="+rs.CA))
	text, code := runStep(t, s, env, dir)
	p, _ := os.ReadFile(ghPath)
	return installRun{out: text, code: code, outputs: ghOutputs(t, out), ghPath: strings.TrimSpace(string(p))}
}

// installedNothing fails t when a failed install set outputs or PATH or left a binary.
func installedNothing(t *testing.T, r installRun, temp string) {
	t.Helper()
	if r.outputs["path"] != "" || r.ghPath != "" {
		t.Errorf("a failed install set outputs %q, PATH %q", r.outputs, r.ghPath)
	}
	if m, _ := filepath.Glob(filepath.Join(temp, "tfstackplan", "*", "tfstackplan")); len(m) > 0 {
		t.Errorf("a failed install left %q", m)
	}
}

// TestInstallStep runs the install step against a local release server: the archive for the
// runner's OS and architecture is downloaded, checked against the checksums file, installed,
// put on PATH and cached; a tampered archive, a missing checksum, a malformed version and an
// OS without releases all fail without installing anything.
func TestInstallStep(t *testing.T) {
	need(t, "bash", "curl", "tar", "awk")
	rs := newReleaseServer(t)

	const version = "v1.2.3"
	archive := tarGz(t, map[string]string{
		"README.md":   "not the binary\n",
		"tfstackplan": "#!/bin/sh\necho 'tfstackplan " + version + "'\n",
	})
	sum := sha256.Sum256(archive)
	serve := func(sums string) {
		rs.serve(map[string][]byte{
			"/releases/" + version + "/tfstackplan_1.2.3_linux_amd64.tar.gz": archive,
			"/releases/" + version + "/tfstackplan_1.2.3_checksums.txt":      []byte(sums),
		})
	}
	goodSums := hex.EncodeToString(sum[:]) + "  tfstackplan_1.2.3_linux_amd64.tar.gz\n" +
		strings.Repeat("0", 64) + "  tfstackplan_1.2.3_darwin_arm64.tar.gz\n"
	install := func(t *testing.T, temp string, inputs map[string]string, runnerOS string) installRun {
		return runInstall(t, rs, temp, inputs, runnerOS, "X64")
	}

	t.Run("verified", func(t *testing.T) {
		serve(goodSums)
		temp := t.TempDir()
		r := install(t, temp, map[string]string{"version": version}, "Linux")
		if r.code != 0 {
			t.Fatalf("exit %d:\n%s", r.code, r.out)
		}
		bin := filepath.Join(temp, "tfstackplan", version, "tfstackplan")
		if r.outputs["path"] != bin || r.outputs["version"] != "tfstackplan "+version || r.ghPath != filepath.Dir(bin) {
			t.Errorf("outputs %q, GITHUB_PATH %q; want path %s", r.outputs, r.ghPath, bin)
		}
		if !strings.Contains(r.out, "sha256 of tfstackplan_1.2.3_linux_amd64.tar.gz verified") {
			t.Errorf("no verification in the log:\n%s", r.out)
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(bin), "README.md")); err == nil {
			t.Error("the archive's other files were installed too")
		}
		// Installed once per job: a second use of the action downloads nothing.
		rs.breakAll()
		r = install(t, temp, map[string]string{"version": version}, "Linux")
		if r.code != 0 || r.outputs["path"] != bin {
			t.Errorf("second install: exit %d, outputs %q:\n%s", r.code, r.outputs, r.out)
		}
	})
	for _, tc := range []struct {
		name, sums, version, os, want string
	}{
		{"tampered archive", strings.Replace(goodSums, hex.EncodeToString(sum[:]), strings.Repeat("f", 64), 1), version, "Linux", "checksum mismatch for tfstackplan_1.2.3_linux_amd64.tar.gz"},
		{"no checksum", strings.Repeat("0", 64) + "  tfstackplan_1.2.3_darwin_arm64.tar.gz\n", version, "Linux", "tfstackplan_1.2.3_checksums.txt has no checksum for tfstackplan_1.2.3_linux_amd64.tar.gz"},
		{"no release", goodSums, "v9.9.9", "Linux", "could not download tfstackplan_9.9.9_checksums.txt"},
		{"malformed version", goodSums, "v1.2.3/../../x", "Linux", "version must be vMAJOR.MINOR.PATCH or source"},
		{"latest is not a version", goodSums, "latest", "Linux", "version must be vMAJOR.MINOR.PATCH or source"},
		{"windows", goodSums, version, "Windows", "no tfstackplan release for runner OS 'Windows'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			serve(tc.sums)
			temp := t.TempDir()
			r := install(t, temp, map[string]string{"version": tc.version}, tc.os)
			if r.code == 0 || !strings.Contains(r.out, "::error title=tfstackplan action::"+tc.want) {
				t.Errorf("exit %d, want a failure with %q:\n%s", r.code, tc.want, r.out)
			}
			installedNothing(t, r, temp)
		})
	}
}

// TestInstallStepSource builds from the action's checkout (version: source) with `go build`;
// a tiny stand-in module keeps it fast.
func TestInstallStepSource(t *testing.T) {
	need(t, "bash", "go")
	_, a := readAction(t)
	s := stepByID(t, a, "install")
	src := t.TempDir()
	for name, body := range map[string]string{
		"go.mod":                  "module example.com/tfstackplan\n\ngo 1.24\n",
		"cmd/tfstackplan/main.go": "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"tfstackplan (devel)\") }\n",
	} {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dir, temp := t.TempDir(), t.TempDir()
	out, ghPath := filepath.Join(dir, "output"), filepath.Join(dir, "path")
	env := stepEnv(t, a, s, map[string]string{"version": "source"}, nil, append(baseEnv(),
		"RUNNER_TEMP="+temp, "GITHUB_ACTION_PATH="+src, "GITHUB_OUTPUT="+out, "GITHUB_PATH="+ghPath))
	text, code := runStep(t, s, env, dir)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, text)
	}
	got := ghOutputs(t, out)
	if want := filepath.Join(temp, "tfstackplan", "source", "tfstackplan"); got["path"] != want || got["version"] != "tfstackplan (devel)" {
		t.Errorf("outputs %q, want path %s", got, want)
	}
}

// TestRunStep runs the run step with a stand-in tfstackplan that records its arguments, its
// directory and its environment: each input becomes its flag or variable, relative result
// and comment paths become absolute, nothing empty hides the job's own variables, and the
// exit code is tfstackplan's own. The arguments must parse as the real command's flags.
func TestRunStep(t *testing.T) {
	need(t, "bash")
	_, a := readAction(t)
	s := stepByID(t, a, "run")
	rec := t.TempDir()
	bin := filepath.Join(t.TempDir(), "tfstackplan")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nout="+rec+"\npwd >\"$out/pwd\"\n: >\"$out/args\"\n"+
		"for a in \"$@\"; do printf '%s\\n' \"$a\" >>\"$out/args\"; done\nenv >\"$out/env\"\nexit \"${FAKE_EXIT:-0}\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	if err := os.Mkdir(filepath.Join(work, "infra"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(work, "shards"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"s-1.json", "s-2.json", "other.json"} {
		if err := os.WriteFile(filepath.Join(work, "shards", f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct {
		name   string
		inputs map[string]string
		jobEnv []string
		code   int
		args   []string
		env    []string // NAME=VALUE that must be set; NAME= alone: must not be set
		out    string
	}{{
		name: "plan, every flag",
		inputs: map[string]string{
			"command": "plan", "working-directory": "infra", "environment": "prod", "dir": "stacks/prod", "all": "true",
			"base": "origin/main", "parallel": "4", "script": "plan2", "continue-on-error": "true", "dry-run": "true",
			"result": "out/result.json", "comment-file": "/tmp/c.md", "plan-out": "p.tfplan", "plan-file": "p.json",
			"log-file": "l.log", "pr": "7", "sha": "0123abc", "repo": "acme/infra", "lock-timeout": "5m", "force-unlock": "42",
			"terramate": "/opt/terramate", "args": "--changed\n\n--base=a b; echo x\r\n",
		},
		args: []string{"run", "plan", "--environment=prod", "--dir=stacks/prod", "--all", "--base=origin/main", "--parallel=4",
			"--script=plan2", "--continue-on-error", "--dry-run", "--result=" + filepath.Join(work, "infra", "out/result.json"),
			"--comment-file=/tmp/c.md", "--plan-out=p.tfplan", "--plan-file=p.json", "--log-file=l.log", "--pr=7",
			"--sha=0123abc", "--repo=acme/infra", "--lock-timeout=5m", "--force-unlock=42", "--terramate=/opt/terramate", "--changed", "--base=a b; echo x"},
	}, {
		name:   "apply, defaults and the job's variables",
		inputs: map[string]string{"command": "apply", "environment": "dev", "comment-file": "c.md"},
		jobEnv: []string{"TFSTACKPLAN_SERVER=https://job.example", "TFSTACKPLAN_AUDIENCE=job-aud", "TFSTACKPLAN_AUTH=github-actions"},
		args:   []string{"run", "apply", "--environment=dev", "--comment-file=" + filepath.Join(work, "c.md")},
		env: []string{"TFSTACKPLAN_SERVER=https://job.example", "TFSTACKPLAN_AUDIENCE=job-aud", "TFSTACKPLAN_AUTH=github-actions",
			"TFSTACKPLAN_TOKEN=", "TSP_COMMAND=", "TSP_BIN="},
	}, {
		name:   "server settings through the environment",
		inputs: map[string]string{"command": "plan", "environment": "dev", "server": "https://tsp.example", "audience": "aud", "auth": "github-actions", "token": "s3cret"},
		jobEnv: []string{"TFSTACKPLAN_SERVER=https://job.example", "TFSTACKPLAN_AUTH=google"},
		args:   []string{"run", "plan", "--environment=dev"},
		env:    []string{"TFSTACKPLAN_SERVER=https://tsp.example", "TFSTACKPLAN_AUDIENCE=aud", "TFSTACKPLAN_AUTH=github-actions", "TFSTACKPLAN_TOKEN=s3cret", "TSP_TOKEN=", "TSP_AUTH="},
	}, {
		name: "drift, its flags only",
		inputs: map[string]string{
			"command": "drift", "working-directory": "infra", "environment": "prod", "dir": "stacks/prod", "all": "true", "base": "origin/main",
			"parallel": "4", "result": "r.json", "issue-file": "issue.md", "fail-on-drift": "true", "comment-file": "c.md", "pr": "7",
			"sha": "0123abc", "repo": "acme/infra", "force-unlock": "42", "continue-on-error": "true",
		},
		args: []string{"run", "drift", "--environment=prod", "--dir=stacks/prod", "--parallel=4", "--result=" + filepath.Join(work, "infra", "r.json"),
			"--issue-file=" + filepath.Join(work, "infra", "issue.md"), "--fail-on-drift", "--sha=0123abc", "--repo=acme/infra"},
	}, {
		name:   "drift, fail-on-drift not a boolean",
		inputs: map[string]string{"command": "drift", "environment": "prod", "fail-on-drift": "1"},
		code:   2,
		out:    "input fail-on-drift must be true or false, not '1'",
	}, {
		name:   "tick",
		inputs: map[string]string{"command": "tick", "environment": "ignored", "phase": "apply", "stack": "stacks/a", "status": "succeeded", "message": "two words", "execution": "ex-1"},
		args:   []string{"run", "tick", "--phase=apply", "--stack=stacks/a", "--status=succeeded", "--message=two words"},
		env:    []string{"TFSTACKPLAN_EXECUTION=ex-1"},
	}, {
		name:   "the exit code is tfstackplan's",
		inputs: map[string]string{"command": "apply", "environment": "prod"},
		jobEnv: []string{"FAKE_EXIT=3"},
		code:   3,
		args:   []string{"run", "apply", "--environment=prod"},
	}, {
		name:   "not a boolean",
		inputs: map[string]string{"command": "plan", "dry-run": "yes"},
		code:   2,
		out:    "input dry-run must be true or false, not 'yes'",
	}, {
		name:   "unknown command",
		inputs: map[string]string{"command": "destroy"},
		code:   2,
		out:    "command must be plan, apply, merge, drift or tick, not 'destroy'",
	}, {
		name:   "a fan-out's shard",
		inputs: map[string]string{"command": "plan", "environment": "prod", "shard": "2/8", "matrix-result": "m.json", "execution": "ex-1"},
		args:   []string{"run", "plan", "--environment=prod", "--execution=ex-1", "--shard=2/8", "--matrix-result=" + filepath.Join(work, "m.json")},
	}, {
		name:   "a fan-out's matrix",
		inputs: map[string]string{"command": "apply", "environment": "prod", "matrix": "8"},
		args:   []string{"run", "apply", "--environment=prod", "--matrix=8"},
	}, {
		name: "merge: files and patterns, a pattern matching nothing adds nothing",
		inputs: map[string]string{"command": "merge", "environment": "ignored", "matrix-result": "m.json", "result": "/tmp/r.json",
			"shard-results": "shards/s-*.json\r\n\nnone/*.json\n/abs/one.json; echo x"},
		args: []string{"run", "merge", "--matrix=" + filepath.Join(work, "m.json"), "--result=/tmp/r.json",
			filepath.Join(work, "shards/s-1.json"), filepath.Join(work, "shards/s-2.json")},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			for _, f := range []string{"args", "env", "pwd"} {
				os.Remove(filepath.Join(rec, f))
			}
			env := stepEnv(t, a, s, tc.inputs, map[string]string{"path": bin}, append(baseEnv(), tc.jobEnv...))
			out, code := runStep(t, s, env, work)
			if code != tc.code || !strings.Contains(out, tc.out) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tc.code, tc.out, out)
			}
			argsFile, err := os.ReadFile(filepath.Join(rec, "args"))
			if tc.args == nil {
				if err == nil {
					t.Fatalf("tfstackplan ran: %q", argsFile)
				}
				return
			}
			if err != nil {
				t.Fatalf("tfstackplan did not run:\n%s", out)
			}
			if got := strings.Split(strings.TrimSuffix(string(argsFile), "\n"), "\n"); !slices.Equal(got, tc.args) {
				t.Errorf("arguments\n got %q\nwant %q", got, tc.args)
			}
			if err := runCmd(t, tc.args[1]).ParseFlags(tc.args[2:]); err != nil {
				t.Errorf("tfstackplan %s does not take these arguments: %v", strings.Join(tc.args[:2], " "), err)
			}
			pwd, _ := os.ReadFile(filepath.Join(rec, "pwd"))
			wantDir := work
			if d := tc.inputs["working-directory"]; d != "" {
				wantDir = filepath.Join(work, d)
			}
			if strings.TrimSpace(string(pwd)) != wantDir {
				t.Errorf("ran in %s, want %s", pwd, wantDir)
			}
			envFile, _ := os.ReadFile(filepath.Join(rec, "env"))
			got := strings.Split(string(envFile), "\n")
			for _, kv := range tc.env {
				if k, v, _ := strings.Cut(kv, "="); v == "" {
					if slices.ContainsFunc(got, func(l string) bool { return strings.HasPrefix(l, k+"=") }) {
						t.Errorf("%s is set for tfstackplan", k)
					}
				} else if !slices.Contains(got, kv) {
					t.Errorf("%s is not set for tfstackplan", kv)
				}
			}
		})
	}
}

// TestActionScriptsShellcheck checks the action's scripts with bash -n and, when it is on
// PATH, shellcheck (actionlint does that for workflows, not for actions).
func TestActionScriptsShellcheck(t *testing.T) {
	need(t, "bash")
	_, a := readAction(t)
	shellcheck, _ := exec.LookPath("shellcheck")
	if shellcheck == "" {
		t.Log("shellcheck is not on PATH: bash -n only")
	}
	for _, s := range a.Runs.Steps {
		if s.Run == "" {
			continue
		}
		if out, err := runWithStdin(s.Run, "bash", "-n"); err != nil {
			t.Errorf("step %s: bash -n: %v\n%s", s.ID, err, out)
		}
		if shellcheck != "" {
			if out, err := runWithStdin(s.Run, shellcheck, "--shell=bash", "-"); err != nil {
				t.Errorf("step %s: shellcheck: %v\n%s", s.ID, err, out)
			}
		}
	}
}

func runWithStdin(stdin, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// workflow is the part of an example workflow these checks read.
type workflow struct {
	Jobs map[string]struct {
		Permissions map[string]string `yaml:"permissions"`
		Steps       []step            `yaml:"steps"`
	} `yaml:"jobs"`
}

// example is one of the example workflows: its file name, its text and what the checks read.
type example struct {
	name string
	src  []byte
	w    workflow
}

// readExamples reads the example workflows.
func readExamples(t *testing.T) []example {
	t.Helper()
	return readWorkflows(t, examplesGlob, 4)
}

// readWorkflows reads the workflows a glob names, at least least of them.
func readWorkflows(t *testing.T, glob string, least int) []example {
	t.Helper()
	files, err := filepath.Glob(glob)
	if err != nil || len(files) < least {
		t.Fatalf("workflows %s: %q, %v", glob, files, err)
	}
	var out []example
	for _, f := range files {
		ex := example{name: filepath.Base(f)}
		if ex.src, err = os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(ex.src, &ex.w); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, ex)
	}
	return out
}

// TestExampleWorkflows: in the examples and the project's own workflows, every third-party
// action is pinned by commit (the same commit for one action everywhere, action.yml included),
// no script (run:, github-script's script:) interpolates an expression, and the comment
// scripts of plan.yml, plan-fanout.yml and rerun.yml are the same.
func TestExampleWorkflows(t *testing.T) {
	pins := map[string]map[string]bool{}
	src, _ := readAction(t)
	checkPinned("action.yml", src, pins)
	scripts := map[string]string{}
	for _, ex := range append(readExamples(t), readWorkflows(t, projectWorkflowsGlob, 2)...) {
		for _, p := range checkPinned(ex.name, ex.src, pins) {
			t.Error(p)
		}
		for job, j := range ex.w.Jobs {
			for i, s := range j.Steps {
				where := fmt.Sprintf("%s: job %s step %d (%s)", ex.name, job, i+1, cmp(s.ID, s.Name))
				if strings.Contains(s.Run, "${{") {
					t.Errorf("%s interpolates an expression into its script: pass it through env", where)
				}
				if strings.HasPrefix(s.Uses, "actions/github-script@") {
					if strings.Contains(s.With["script"], "${{") {
						t.Errorf("%s interpolates an expression into its script: pass it through env", where)
					}
					if s.Name == "Comment on the pull request" {
						scripts[where] = s.With["script"]
					}
				}
			}
		}
	}
	for name, shas := range pins {
		if len(shas) > 1 {
			t.Errorf("%s is pinned to different commits: %q", name, slices.Sorted(maps.Keys(shas)))
		}
	}
	if len(scripts) != 3 {
		t.Fatalf("want the comment script in plan.yml, plan-fanout.yml and rerun.yml, found %d: %q", len(scripts), scripts)
	}
	var first string
	for where, s := range scripts {
		if first == "" {
			first = s
		} else if s != first {
			t.Errorf("the comment scripts differ (%s): keep plan.yml's, plan-fanout.yml's and rerun.yml's the same", where)
		}
	}
}

// TestExampleWorkflowsAuthenticateWithGitHubOIDC: every job of the examples that runs the
// action against a server sends the job's own GitHub OIDC token (auth: github-actions, with an
// audience, no static token), and so may request it (id-token: write).
func TestExampleWorkflowsAuthenticateWithGitHubOIDC(t *testing.T) {
	n := 0
	for _, ex := range readExamples(t) {
		for job, j := range ex.w.Jobs {
			for _, s := range j.Steps {
				if !strings.HasPrefix(s.Uses, "tfstackplan/tfstackplan@") || s.With["server"] == "" {
					continue
				}
				n++
				where := fmt.Sprintf("%s: job %s", ex.name, job)
				if s.With["auth"] != "github-actions" || s.With["audience"] == "" || s.With["token"] != "" {
					t.Errorf("%s: auth %q, audience %q, token %q; want auth github-actions with an audience", where, s.With["auth"], s.With["audience"], s.With["token"])
				}
				if j.Permissions["id-token"] != "write" {
					t.Errorf("%s: permissions %v, want id-token: write", where, j.Permissions)
				}
			}
		}
	}
	if n < 5 {
		t.Errorf("%d jobs run the action against a server, want the plan, apply and drift jobs of the examples", n)
	}
}
