package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// demoScript is the quick start `make demo` runs.
const demoScript = "../../scripts/demo.sh"

// demoEnv is the environment the quick start runs with in the tests: no user settings that
// could send it elsewhere, no download that could reach the network (the Go module proxy off,
// the OpenTofu download pointed at a closed loopback port), its cache and temporary
// directories inside the test's. emptyModCache also gives Go an empty module cache, so that
// nothing can be installed from it either.
func demoEnv(t *testing.T, path string, emptyModCache bool) []string {
	t.Helper()
	home := t.TempDir()
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "PATH", k == "HOME", k == "TMPDIR", k == "XDG_CACHE_HOME",
			strings.HasPrefix(k, "DEMO_"), strings.HasPrefix(k, "GO"):
			continue
		}
		env = append(env, kv)
	}
	modCache := goEnv(t, "GOMODCACHE")
	if emptyModCache {
		modCache = filepath.Join(home, "gomod")
	}
	return append(env, "PATH="+path, "HOME="+home, "TMPDIR="+t.TempDir(),
		"DEMO_CACHE="+filepath.Join(home, "demo-cache"), "DEMO_TOFU_URL=http://127.0.0.1:1",
		"GOPROXY=off", "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local", "GOMODCACHE="+modCache,
		"GOCACHE="+goEnv(t, "GOCACHE"), "GCE_METADATA_HOST=127.0.0.1:1")
}

// wantLines fails t for each of wants that out does not contain.
func wantLines(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func goEnv(t *testing.T, key string) string {
	t.Helper()
	out, err := exec.Command("go", "env", key).Output()
	if err != nil {
		t.Fatalf("go env %s: %v", key, err)
	}
	return strings.TrimSpace(string(out))
}

func runDemo(t *testing.T, env []string, timeout time.Duration) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", demoScript)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("scripts/demo.sh did not finish in %s\n%s", timeout, out.String())
	}
	return out.String(), err
}

// TestDemoMissingTools is the quick start on a machine without terramate, tofu or terraform,
// and without the network: it installs nothing, names what to install and where from, and
// exits non-zero.
func TestDemoMissingTools(t *testing.T) {
	// A PATH with the ordinary tools the script may use and none of terramate, tofu, terraform.
	bin := t.TempDir()
	for _, name := range []string{"bash", "env", "go", "git", "curl", "dirname", "mktemp", "mkdir", "rm",
		"cat", "uname", "tr", "tail", "head", "cut", "sed", "grep", "awk", "sha256sum", "shasum",
		"unzip", "python3", "install", "ln", "cp", "mv", "seq", "sleep", "xargs"} {
		if p, err := exec.LookPath(name); err == nil {
			must(t, os.Symlink(p, filepath.Join(bin, name)))
		}
	}
	env := demoEnv(t, bin, true)
	cache := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "DEMO_CACHE="); ok {
			cache = v
		}
	}
	out, err := runDemo(t, env, 2*time.Minute)
	t.Logf("scripts/demo.sh:\n%s", out)
	if code := exitCodeOf(err); code == 0 || code == -1 {
		t.Fatalf("exit %d (%v), want a non-zero exit", code, err)
	}
	wantLines(t, out,
		"demo: cannot run: missing tools that could not be installed here:",
		"terramate 0.17.2: go install github.com/terramate-io/terramate/cmd/terramate@v0.17.2",
		"module lookup disabled by GOPROXY=off",
		"OpenTofu 1.12.6 (tofu): https://github.com/opentofu/opentofu/releases/download/v1.12.6/tofu_1.12.6_")
	for _, name := range []string{"terramate", "tofu"} {
		if _, err := os.Stat(filepath.Join(cache, "bin", name)); err == nil {
			t.Errorf("%s was installed into the cache", name)
		}
	}
}

// TestDemoRealTools runs the quick start, non-interactive, with the REAL terramate and OpenTofu
// (opt-in, like TestRealToolsPlanApply): the destructive prod plan, the gate's refusal, the
// admin's approval on the plan's web page, the apply, and the execution's live page answering
// 200.
func TestDemoRealTools(t *testing.T) {
	tmBin, tofuBin := os.Getenv("TFSTACKPLAN_TERRAMATE"), os.Getenv("TFSTACKPLAN_TOFU")
	if tmBin == "" || tofuBin == "" {
		t.Skip("set TFSTACKPLAN_TERRAMATE and TFSTACKPLAN_TOFU to the real terramate 0.17.2 and OpenTofu 1.12.6 to run scripts/demo.sh")
	}
	// The tools under their own names, first on PATH; the script builds tfstackplan (DEMO_BIN).
	bin := t.TempDir()
	for _, tool := range [][2]string{{"terramate", tmBin}, {"tofu", tofuBin}} {
		abs, err := filepath.Abs(tool[1])
		must(t, err)
		must(t, os.Symlink(abs, filepath.Join(bin, tool[0])))
	}
	env := append(demoEnv(t, bin+string(os.PathListSeparator)+os.Getenv("PATH"), false),
		"DEMO_NONINTERACTIVE=1", "DEMO_BIN="+filepath.Join(t.TempDir(), "tfstackplan"))
	out, err := runDemo(t, env, 10*time.Minute)
	t.Logf("scripts/demo.sh:\n%s", out)
	if err != nil {
		t.Fatalf("scripts/demo.sh: %v", err)
	}
	wantLines(t, out,
		"demo: terramate 0.17.2 ("+bin,
		"demo: building ",
		"demo: main applied: 6 stacks",
		"tfstackplan plan dev: succeeded (http://127.0.0.1:",
		"  succeeded  mutating      stacks/dev/app\n",
		"tfstackplan plan prod: succeeded (http://127.0.0.1:",
		"  succeeded  destructive   stacks/prod/app\n      - terraform_data.legacy_cron (delete: ",
		"      ± terraform_data.worker (replace, ",
		"tfstackplan apply prod: denied (http://127.0.0.1:",
		"no active grant approved this plan's content for gate destructive",
		"demo: prod apply refused by the gate (exit 3): not-satisfied\n",
		"demo: approval page: http://127.0.0.1:",
		"demo: approved on the page: gate destructive on **\n",
		"demo: approved: PR 1 in prod, reason \"demo\": the grant approves the content of plan ",
		"demo: the same from the CLI: TFSTACKPLAN_TOKEN=<admin token> tfstackplan admin gates satisfy --repo example/demo --environment prod --pr 1 --class destructive --target '**' --execution ",
		"tfstackplan apply prod: succeeded (http://127.0.0.1:",
		"gate: satisfied (requester demo-deployer@demo-project.iam.gserviceaccount.com)",
		"demo: prod apply succeeded\n",
		"stacks/prod/app state: terraform_data.web terraform_data.worker \n",
		"tfstackplan apply dev: succeeded (http://127.0.0.1:")
	if !regexp.MustCompile(`demo: live page http://127\.0\.0\.1:\d+/ui/executions/[0-9a-f]+ answered HTTP 200\n`).MatchString(out) {
		t.Errorf("output lacks the live page answering 200")
	}
}
