package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/tfstackplan/tfstackplan/internal/testkit"
	"github.com/tfstackplan/tfstackplan/runner"
)

// fakes are the stand-ins the driver's end-to-end scripts put on PATH: the fake terramate
// (testdata/faketerramate) and the fake tofu/terraform (testdata/faketofu), built once per
// test run.
var fakes struct {
	once sync.Once
	dir  string
	err  error
}

func buildFakes(t *testing.T) string {
	t.Helper()
	fakes.once.Do(func() {
		dir, err := os.MkdirTemp("", "tfstackplan-fakes-")
		if err != nil {
			fakes.err = err
			return
		}
		for _, b := range []struct{ out, pkg string }{
			{"terramate", "../../testdata/faketerramate"},
			{"tofu", "../../testdata/faketofu"},
		} {
			out, err := exec.Command("go", "build", "-o", filepath.Join(dir, b.out), b.pkg).CombinedOutput()
			if err != nil {
				fakes.err = fmt.Errorf("building %s: %v\n%s", b.pkg, err, out)
				return
			}
		}
		if err := os.Symlink("tofu", filepath.Join(dir, "terraform")); err != nil {
			fakes.err = err
			return
		}
		fakes.dir = dir
	})
	if fakes.err != nil {
		t.Fatal(fakes.err)
	}
	return fakes.dir
}

// TestRunScripts runs testdata/run/*.txtar: `run plan|apply|tick` end to end as processes, with
// the fake terramate and the fake tofu on PATH, the script library of scripts/terramate, a git
// project laid out by each script, and (where a script says `serve`) a real control plane.
func TestRunScripts(t *testing.T) {
	bin := buildFakes(t)
	fixtures, err := filepath.Abs("../../testdata/tofu")
	if err != nil {
		t.Fatal(err)
	}
	lib, err := filepath.Abs("../../scripts/terramate")
	if err != nil {
		t.Fatal(err)
	}
	testscript.Run(t, testscript.Params{
		Dir: "testdata/run",
		Setup: func(env *testscript.Env) error {
			env.Setenv("PATH", bin+string(os.PathListSeparator)+env.Getenv("PATH"))
			env.Setenv("FAKETOFU_FIXTURES", fixtures)
			env.Setenv("TFSTACKPLAN_LIB", lib)
			env.Setenv("TFSTACKPLAN_SERVER", "")
			env.Setenv("TFSTACKPLAN_AUDIENCE", "")
			env.Setenv("TFSTACKPLAN_AUTH", "")
			env.Setenv("TFSTACKPLAN_TOKEN", "")
			env.Setenv("GCE_METADATA_HOST", "127.0.0.1:1")
			env.Setenv("GIT_AUTHOR_NAME", "ci")
			env.Setenv("GIT_AUTHOR_EMAIL", "ci@example.com")
			env.Setenv("GIT_COMMITTER_NAME", "ci")
			env.Setenv("GIT_COMMITTER_EMAIL", "ci@example.com")
			env.Setenv("GIT_CONFIG_NOSYSTEM", "1")
			env.Setenv("NO_COLOR", "1")
			for _, k := range []string{"GITHUB_ACTIONS", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY", "GITHUB_EVENT_PATH", "GITHUB_SHA", "GITHUB_REF", "GITHUB_REPOSITORY", "RUNNER_TEMP"} {
				env.Setenv(k, "")
			}
			// The projects' origin is a local path, which names no repository.
			env.Setenv("GITHUB_REPOSITORY", "acme/infra")
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"gitproject": cmdGitProject,
			"gitcommit":  cmdGitCommit,
			"installlib": cmdInstallLib,
			"serve":      cmdServe,
			"json":       cmdJSON,
			"jsonsame":   cmdJSONSame,
			"admin":      cmdAdmin,
			"blackhole":  cmdBlackhole,
			"waitfile":   cmdWaitFile,
			"exitcode":   cmdExitCode,
			"jsonenv":    cmdJSONEnv,
			"apiget":     cmdAPIGet,
			"serverlog":  cmdServerLog,
			"errserver":  cmdErrServer,
		},
	})
}

func git(ts *testscript.TestScript, dir string, args ...string) string {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+ts.Getenv("WORK"), "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=ci", "GIT_AUTHOR_EMAIL=ci@example.com", "GIT_COMMITTER_NAME=ci", "GIT_COMMITTER_EMAIL=ci@example.com")
	out, err := cmd.CombinedOutput()
	if err != nil {
		ts.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// cmdGitProject DIR: makes DIR a git repository on main with everything committed, pushed to a
// bare origin (DIR.origin), and checks out the branch `feature`.
func cmdGitProject(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: gitproject DIR")
	}
	dir := ts.MkAbs(args[0])
	origin := dir + ".origin"
	git(ts, filepath.Dir(dir), "init", "-q", "--bare", "-b", "main", origin)
	git(ts, dir, "init", "-q", "-b", "main")
	git(ts, dir, "add", "-A")
	git(ts, dir, "commit", "-qm", "init")
	git(ts, dir, "remote", "add", "origin", origin)
	git(ts, dir, "push", "-q", "origin", "main")
	git(ts, dir, "checkout", "-qb", "feature")
}

// cmdGitCommit DIR MESSAGE: commits everything in DIR.
func cmdGitCommit(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: gitcommit DIR MESSAGE")
	}
	dir := ts.MkAbs(args[0])
	git(ts, dir, "add", "-A")
	git(ts, dir, "commit", "-qm", args[1])
}

// cmdInstallLib DIR: copies the script library (scripts/terramate) into DIR, as a user would,
// and appends its gitignore lines to DIR/.gitignore.
func cmdInstallLib(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: installlib DIR")
	}
	dir := ts.MkAbs(args[0])
	lib := ts.Getenv("TFSTACKPLAN_LIB")
	entries, err := os.ReadDir(lib)
	ts.Check(err)
	for _, e := range entries {
		name := e.Name()
		b, err := os.ReadFile(filepath.Join(lib, name))
		ts.Check(err)
		switch {
		case strings.HasSuffix(name, ".tm.hcl"):
			ts.Check(os.WriteFile(filepath.Join(dir, name), b, 0o644))
		case name == "gitignore":
			f, err := os.OpenFile(filepath.Join(dir, ".gitignore"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
			ts.Check(err)
			_, err = f.Write(b)
			ts.Check(err)
			ts.Check(f.Close())
		}
	}
}

// Tokens of the control plane `serve` starts.
const (
	testRunnerToken = "run-script-runner-token"
	testAdminToken  = "run-script-admin-token"
)

// cmdServe [POLICY]: starts a real control plane (SQLite in $WORK) on a loopback port for the
// rest of the script, with a runner and an admin token, and sets SERVER to its URL and
// RUNNER_TOKEN to the runner's token.
func cmdServe(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) > 1 {
		ts.Fatalf("usage: serve [POLICY]")
	}
	work := ts.Getenv("WORK")
	tokens := filepath.Join(work, ".serve-tokens.hcl")
	ts.Check(os.WriteFile(tokens, []byte(fmt.Sprintf(`
token "runner" {
  secret = %q
  roles  = ["runner"]
}
token "admin" {
  secret = %q
  roles  = ["runner", "admin"]
}
`, testRunnerToken, testAdminToken)), 0o600))
	opts := &ServeOptions{
		IO: &IO{Out: io.Discard, ErrOut: io.Discard}, Listen: "127.0.0.1:0",
		DB: "sqlite:" + filepath.Join(work, ".serve.db"), Tokens: tokens, RateLimit: 10000,
		ShutdownTimeout: 2 * time.Second,
	}
	if len(args) == 1 {
		opts.Policy = ts.MkAbs(args[0])
	}
	ready := make(chan string, 1)
	opts.Ready = func(addr string) { ready <- addr }
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- runServe(ctx, opts) }()
	select {
	case addr := <-ready:
		ts.Defer(func() {
			cancel()
			<-errc
		})
		ts.Setenv("SERVER", "http://"+addr)
		ts.Setenv("RUNNER_TOKEN", testRunnerToken)
	case err := <-errc:
		cancel()
		ts.Fatalf("serve: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		ts.Fatalf("serve did not start")
	}
}

// cmdJSON FILE PATH [WANT]: the value at PATH (dotted; numbers index arrays; # is the length)
// in the JSON file, compared with WANT (a string value compares unquoted, anything else as
// compact JSON). Without WANT it only checks that PATH exists. With ! it checks the value differs.
func cmdJSON(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 2 || len(args) > 3 {
		ts.Fatalf("usage: json FILE PATH [WANT]")
	}
	var doc any
	ts.Check(json.Unmarshal([]byte(ts.ReadFile(args[0])), &doc))
	v, ok := jsonAt(doc, args[1])
	if len(args) == 2 {
		if ok == neg {
			ts.Fatalf("json %s: path %s exists: %v", args[0], args[1], ok)
		}
		return
	}
	if !ok {
		ts.Fatalf("json %s: no %s", args[0], args[1])
	}
	got := ""
	if s, isStr := v.(string); isStr {
		got = s
	} else {
		b, _ := json.Marshal(v)
		got = string(b)
	}
	if (got == args[2]) == neg {
		ts.Fatalf("json %s %s = %s, want %s%s", args[0], args[1], got, map[bool]string{true: "not "}[neg], args[2])
	}
}

// cmdJSONSame FILE1 PATH1 FILE2 PATH2: the two values are equal (with !: differ).
func cmdJSONSame(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 4 {
		ts.Fatalf("usage: jsonsame FILE1 PATH1 FILE2 PATH2")
	}
	get := func(file, p string) string {
		var doc any
		ts.Check(json.Unmarshal([]byte(ts.ReadFile(file)), &doc))
		v, ok := jsonAt(doc, p)
		if !ok {
			ts.Fatalf("json %s: no %s", file, p)
		}
		b, _ := json.Marshal(v)
		return string(b)
	}
	a, b := get(args[0], args[1]), get(args[2], args[3])
	if (a == b) == neg {
		ts.Fatalf("%s %s = %s, %s %s = %s", args[0], args[1], a, args[2], args[3], b)
	}
}

// jsonAt returns the value at a dotted path: keys, list indexes, `#` (a list's length) and `*`
// (every element's value at the rest of the path, as a list).
func jsonAt(v any, p string) (any, bool) {
	if p == "." || p == "" {
		return v, true
	}
	parts := strings.Split(p, ".")
	for n, part := range parts {
		if x, ok := v.([]any); ok && part == "*" {
			// Every element's value at the rest of the path, as a list.
			rest := strings.Join(parts[n+1:], ".")
			out := make([]any, 0, len(x))
			for _, el := range x {
				ev, ok := jsonAt(el, rest)
				if !ok {
					return nil, false
				}
				out = append(out, ev)
			}
			return out, true
		}
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[part]; !ok {
				return nil, false
			}
		case []any:
			if part == "#" {
				v = float64(len(x))
				continue
			}
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// cmdAdmin satisfy ENV PR CLASS TARGET: approves the PR's latest plan for a gate with the admin
// token, as `admin gates satisfy --latest` does (its output goes to the script's stdout).
func cmdAdmin(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 5 || args[0] != "satisfy" {
		ts.Fatalf("usage: admin satisfy ENV PR CLASS TARGET")
	}
	pr, err := strconv.Atoi(args[2])
	ts.Check(err)
	var out bytes.Buffer
	opts := &AdminGatesSatisfyOptions{IO: &IO{Out: &out, ErrOut: &out}, Environment: args[1], PR: pr, Class: args[3], Target: args[4],
		Latest: true, Reason: "approved in a test",
		Conn: ConnOptions{Server: ts.Getenv("SERVER"), Timeout: DefaultOperatorTimeout, Getenv: func(k string) string {
			if k == runner.EnvToken {
				return testAdminToken
			}
			return ts.Getenv(k)
		}}}
	err = runAdminGatesSatisfy(context.Background(), opts)
	ts.Logf("%s", out.String())
	if (err != nil) != neg {
		ts.Fatalf("admin satisfy: %v", err)
	}
}

// cmdBlackhole: a loopback listener that accepts connections and never answers, for the rest
// of the script; BLACKHOLE is its URL.
func cmdBlackhole(ts *testscript.TestScript, neg bool, args []string) {
	addr, err := testkit.BlackHole(ts.Defer)
	ts.Check(err)
	ts.Setenv("BLACKHOLE", "http://"+addr)
}

// cmdWaitFile FILE [SECONDS]: waits until FILE exists (default 30 s).
func cmdWaitFile(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 1 || len(args) > 2 {
		ts.Fatalf("usage: waitfile FILE [SECONDS]")
	}
	limit := 30 * time.Second
	if len(args) == 2 {
		n, err := strconv.Atoi(args[1])
		ts.Check(err)
		limit = time.Duration(n) * time.Second
	}
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(ts.MkAbs(args[0])); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	ts.Fatalf("%s did not appear within %s", args[0], limit)
}

// cmdExitCode N COMMAND ARGS...: runs COMMAND like exec and checks its exit code is N.
func cmdExitCode(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: exitcode N COMMAND [ARGS...]")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			ts.Fatalf("%s: %v", args[1], err)
		}
		got = ee.ExitCode()
	}
	if got != want {
		ts.Fatalf("%s exited %d, want %d", args[1], got, want)
	}
}

// cmdErrServer STATUS CODE: a loopback server answering every request with HTTP STATUS and the
// JSON error body {"code": CODE}; ERRSERVER is its URL.
func cmdErrServer(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: errserver STATUS CODE")
	}
	status, err := strconv.Atoi(args[0])
	ts.Check(err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"code":%q,"message":"test server says %s"}`, args[1], args[1])
	}))
	ts.Defer(srv.Close)
	ts.Setenv("ERRSERVER", srv.URL)
}

// cmdJSONEnv NAME FILE PATH: sets NAME to the (string) value at PATH in the JSON file.
func cmdJSONEnv(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: jsonenv NAME FILE PATH")
	}
	var doc any
	ts.Check(json.Unmarshal([]byte(ts.ReadFile(args[1])), &doc))
	v, ok := jsonAt(doc, args[2])
	if !ok {
		ts.Fatalf("json %s: no %s", args[1], args[2])
	}
	ts.Setenv(args[0], fmt.Sprint(v))
}

// apiGet reads an API path of the server `serve` started, as the admin.
func apiGet(ts *testscript.TestScript, p string) []byte {
	req, err := http.NewRequest("GET", ts.Getenv("SERVER")+p, nil)
	ts.Check(err)
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	resp, err := http.DefaultClient.Do(req)
	ts.Check(err)
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	ts.Check(err)
	if resp.StatusCode != http.StatusOK {
		ts.Fatalf("GET %s: %s: %s", p, resp.Status, b)
	}
	return b
}

// cmdAPIGet PATH FILE: writes the JSON answer of GET PATH (as the admin) to FILE.
func cmdAPIGet(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: apiget PATH FILE")
	}
	ts.Check(os.WriteFile(ts.MkAbs(args[1]), apiGet(ts, args[0]), 0o644))
}

// cmdServerLog EXECUTION STACK FILE: writes the latest generation of the stack's log, as the
// server has it, to FILE.
func cmdServerLog(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: serverlog EXECUTION STACK FILE")
	}
	b := apiGet(ts, "/api/v1/executions/"+url.PathEscape(args[0])+"/log?stack="+url.QueryEscape(args[1]))
	var slice struct {
		Data []byte `json:"data"`
	}
	ts.Check(json.Unmarshal(b, &slice))
	ts.Check(os.WriteFile(ts.MkAbs(args[2]), slice.Data, 0o644))
}
