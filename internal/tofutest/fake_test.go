package tofutest

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The fake must print exactly what the real tofu printed in every recording of testdata/tofu,
// run the way the script library runs it.

const planFile = "tfstackplan.tfplan"

// TestFakeCases runs, per case, init, plan -out, show -json, apply and the same apply again.
func TestFakeCases(t *testing.T) {
	fake := fakeTool(t)
	for _, c := range cases(t) {
		t.Run(c, func(t *testing.T) {
			dir := t.TempDir()
			WriteCase(t, dir, c)
			same(t, "init", recorded(t, "_cli", "init"), fake.run(t, dir, argv(t, "_cli", "init")...))
			plan := recorded(t, c, "plan-out")
			same(t, "plan", plan, fake.run(t, dir, argv(t, c, "plan-out")...))
			if got := exists(filepath.Join(dir, planFile)); got != (plan.rc == 0) {
				t.Fatalf("plan rc %d, plan file written: %v", plan.rc, got)
			}
			if plan.rc != 0 {
				return
			}
			for _, step := range []string{"show-json", "apply", "apply-again"} {
				same(t, step, recorded(t, c, step), fake.run(t, dir, argv(t, c, step)...))
			}
		})
	}
}

func TestFakeVersion(t *testing.T) {
	fake := fakeTool(t)
	dir := t.TempDir()
	for _, name := range []string{"version", "version-json"} {
		same(t, name, recorded(t, "_cli", name), fake.run(t, dir, argv(t, "_cli", name)...))
	}
	terraform := fake
	terraform.bin = filepath.Join(filepath.Dir(fake.bin), "terraform")
	same(t, "terraform version", recorded(t, "_cli", "version"), terraform.run(t, dir, "version"))
}

// TestFakeBadPlanFiles: show and apply of a missing plan file and of one that is not a plan.
func TestFakeBadPlanFiles(t *testing.T) {
	fake := fakeTool(t)
	dir := t.TempDir()
	for _, name := range []string{"show-missing", "apply-missing"} {
		same(t, name, recorded(t, "_cli", name), fake.run(t, dir, argv(t, "_cli", name)...))
	}
	write(t, filepath.Join(dir, planFile), "garbage\n")
	for _, name := range []string{"show-corrupt", "apply-corrupt"} {
		same(t, name, recorded(t, "_cli", name), fake.run(t, dir, argv(t, "_cli", name)...))
	}
	// The file name is the one given.
	got := fake.run(t, dir, "show", "-json", "other.tfplan")
	if !strings.Contains(got.stderr, "open other.tfplan: no such") || strings.Contains(got.stderr, planFile) || got.rc != 1 {
		t.Errorf("show of a missing other.tfplan: %+v", got)
	}
}

// TestFakeStalePlan: a saved plan is stale once another apply changed the state; a no-changes
// apply does not change it.
func TestFakeStalePlan(t *testing.T) {
	fake := fakeTool(t)
	dir := t.TempDir()
	WriteCase(t, dir, "mixed")
	fake.run(t, dir, argv(t, "mixed", "plan-out")...)
	fake.run(t, dir, "plan", "-input=false", "-no-color", "-out=other.tfplan")
	if r := fake.run(t, dir, "apply", "-input=false", "-no-color", "other.tfplan"); r.rc != 0 {
		t.Fatalf("apply: %+v", r)
	}
	same(t, "apply-stale", recorded(t, "_cli", "apply-stale"), fake.run(t, dir, argv(t, "_cli", "apply-stale")...))

	WriteCase(t, dir, "no-changes")
	fake.run(t, dir, "plan", "-out=a.tfplan")
	fake.run(t, dir, "plan", "-out=b.tfplan")
	same(t, "no-changes apply", recorded(t, "no-changes", "apply"), fake.run(t, dir, "apply", "a.tfplan"))
	same(t, "no-changes apply of an older plan", recorded(t, "no-changes", "apply"), fake.run(t, dir, "apply", "b.tfplan"))
}

// TestFakeLock: plan and apply while faketofu.lock exists, and force-unlock.
func TestFakeLock(t *testing.T) {
	fake := fakeTool(t)
	dir := t.TempDir()
	WriteCase(t, dir, "mixed")
	fake.run(t, dir, argv(t, "mixed", "plan-out")...)
	lock := filepath.Join(dir, "faketofu.lock")
	write(t, lock, "")
	for _, name := range []string{"plan-locked", "plan-locked-0s", "apply-locked", "apply-locked-0s"} {
		start := time.Now()
		same(t, name, recorded(t, "_cli", name), fake.run(t, dir, argv(t, "_cli", name)...))
		if d := time.Since(start); strings.Contains(strings.Join(argv(t, "_cli", name), " "), "-lock-timeout=1s") && d < time.Second {
			t.Errorf("%s returned after %v, before its -lock-timeout", name, d)
		}
	}

	// The lock file's ID stands in the error.
	write(t, lock, "my-lock-id\n")
	want := recorded(t, "_cli", "plan-locked-0s")
	want.stderr = uuidRE.ReplaceAllString(want.stderr, "my-lock-id")
	same(t, "lock error with an id", want, fake.run(t, dir, argv(t, "_cli", "plan-locked-0s")...))

	// A lock released within the timeout: the plan goes on, with the "Acquiring" line only after
	// 400ms of waiting.
	plan := recorded(t, "mixed", "plan-out")
	for _, tc := range []struct {
		release time.Duration
		prefix  string
	}{{50 * time.Millisecond, ""}, {1500 * time.Millisecond, recorded(t, "_cli", "plan-locked").stdout}} {
		write(t, lock, "")
		go func() { time.Sleep(tc.release); os.Remove(lock) }()
		want := plan
		want.stdout = tc.prefix + plan.stdout
		same(t, "plan with a lock released after "+tc.release.String(), want,
			fake.run(t, dir, "plan", "-input=false", "-no-color", "-lock-timeout=20s", "-out="+planFile))
	}

	// -lock=false ignores the lock.
	write(t, lock, "")
	same(t, "plan -lock=false", plan, fake.run(t, dir, "plan", "-lock=false", "-input=false", "-no-color", "-out="+planFile))

	// force-unlock: the remote backend's success with a lock, the local backend's error without.
	same(t, "force-unlock", recorded(t, "_cli", "force-unlock-remote"), fake.run(t, dir, argv(t, "_cli", "force-unlock-remote")...))
	if exists(lock) {
		t.Error("force-unlock left faketofu.lock")
	}
	same(t, "force-unlock without a lock", recorded(t, "_cli", "force-unlock"), fake.run(t, dir, argv(t, "_cli", "force-unlock")...))
}

// TestFakeInterrupt: SIGINT/SIGTERM during FAKETOFU_SLEEP and FAKETOFU_APPLY_SLEEP.
func TestFakeInterrupt(t *testing.T) {
	for _, tc := range []struct {
		sig         syscall.Signal
		plan, apply string
	}{{syscall.SIGINT, "plan-sigint", "apply-sigint"}, {syscall.SIGTERM, "plan-sigterm", "apply-sigterm"}} {
		t.Run(tc.plan, func(t *testing.T) {
			dir := t.TempDir()
			marker := filepath.Join(t.TempDir(), "sleeping")
			fake := fakeTool(t, "FAKETOFU_SLEEP=1m", "FAKETOFU_SLEEP_MARKER="+marker)
			WriteCase(t, dir, "mixed")
			start := time.Now()
			got := fake.signalled(t, dir, marker, 0, tc.sig, argv(t, "_cli", tc.plan)...)
			same(t, tc.plan, recorded(t, "_cli", tc.plan), got)
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("exited %v after the start", d)
			}
			if b, err := os.ReadFile(marker); err != nil || !strings.HasPrefix(string(b), "plan ") {
				t.Errorf("marker: %q, %v", b, err)
			}
			same(t, "show-interrupted", recorded(t, "_cli", "show-interrupted"), fake.run(t, dir, argv(t, "_cli", "show-interrupted")...))
			same(t, "apply-interrupted", recorded(t, "_cli", "apply-interrupted"), fake.run(t, dir, argv(t, "_cli", "apply-interrupted")...))
		})
		t.Run(tc.apply, func(t *testing.T) {
			dir := t.TempDir()
			marker := filepath.Join(t.TempDir(), "sleeping")
			fake := fakeTool(t, "FAKETOFU_APPLY_SLEEP=1m", "FAKETOFU_SLEEP_MARKER="+marker)
			WriteCase(t, dir, "mixed")
			same(t, "plan", recorded(t, "mixed", "plan-out"), fake.run(t, dir, argv(t, "mixed", "plan-out")...))
			if exists(marker) {
				t.Fatal("plan slept on FAKETOFU_APPLY_SLEEP")
			}
			same(t, tc.apply, recorded(t, "_cli", tc.apply), fake.signalled(t, dir, marker, 0, tc.sig, argv(t, "_cli", tc.apply)...))
			same(t, "apply-after-sigint", recorded(t, "_cli", "apply-after-sigint"), fake.run(t, dir, argv(t, "_cli", "apply-after-sigint")...))
		})
	}
	t.Run("short sleeps", func(t *testing.T) {
		dir := t.TempDir()
		WriteCase(t, dir, "update")
		fake := fakeTool(t, "FAKETOFU_SLEEP=10ms", "FAKETOFU_APPLY_SLEEP=10ms")
		same(t, "plan", recorded(t, "update", "plan-out"), fake.run(t, dir, argv(t, "update", "plan-out")...))
		same(t, "apply", recorded(t, "update", "apply"), fake.run(t, dir, argv(t, "update", "apply")...))
	})
}

// TestFakeEnvFile: apply, and only apply, writes its environment to faketofu.env.
func TestFakeEnvFile(t *testing.T) {
	dir := t.TempDir()
	WriteCase(t, dir, "update")
	fake := fakeTool(t, "SOME_SETTING=deployer@example.com")
	envFile := filepath.Join(dir, "faketofu.env")
	for _, args := range [][]string{{"version"}, {"init"}, argv(t, "update", "plan-out"), argv(t, "update", "show-json")} {
		fake.run(t, dir, args...)
		if exists(envFile) {
			t.Fatalf("%q wrote faketofu.env", args)
		}
	}
	same(t, "apply", recorded(t, "update", "apply"), fake.run(t, dir, argv(t, "update", "apply")...))
	b, err := os.ReadFile(envFile)
	if err != nil || !strings.Contains(string(b), "\nSOME_SETTING=deployer@example.com\n") {
		t.Errorf("faketofu.env: %v\n%s", err, b)
	}
}

// TestFakeSpellings: the flag spellings of Go's flag package, and other plan file names.
func TestFakeSpellings(t *testing.T) {
	fake := fakeTool(t)
	dir := t.TempDir()
	WriteCase(t, dir, "mixed")
	plan := recorded(t, "mixed", "plan-out")
	for _, args := range [][]string{
		{"plan", "-input=false", "-no-color", "-lock-timeout", "0s", "-out", planFile},
		{"plan", "--input=false", "-no-color", "--lock-timeout=0s", "--out=" + planFile},
		{"plan", "-out=" + planFile},
	} {
		same(t, strings.Join(args, " "), plan, fake.run(t, dir, args...))
	}
	same(t, "apply -lock-timeout 0s", recorded(t, "mixed", "apply"),
		fake.run(t, dir, "apply", "-input=false", "-no-color", "-lock-timeout", "0s", planFile))

	// Checked against the real tofu: a name too long for one line moves to the next.
	long := "some/very/long/path/that/goes/on/and/on/and/" + planFile
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(long)), 0o755); err != nil {
		t.Fatal(err)
	}
	want := plan
	want.stdout = strings.Replace(plan.stdout, "\nSaved the plan to: "+planFile+"\n\nTo perform exactly these actions, run the following command to apply:\n    tofu apply \""+planFile+"\"\n",
		"\nSaved the plan to:\n"+long+"\n\nTo perform exactly these actions, run the following command to apply:\n    tofu apply \""+long+"\"\n", 1)
	if want.stdout == plan.stdout {
		t.Fatal("the recorded plan has no trailer")
	}
	same(t, "plan -out=LONG", want, fake.run(t, dir, "plan", "-input=false", "-no-color", "-out="+long))
	same(t, "show -json LONG", recorded(t, "mixed", "show-json"), fake.run(t, dir, "show", "-json", long))
}

// TestFakeRefuses: what was not recorded fails clearly.
func TestFakeRefuses(t *testing.T) {
	fake := fakeTool(t)
	dir := t.TempDir()
	for _, args := range [][]string{
		{"destroy"},
		{"plan", "-out=" + planFile},             // no faketofu.case
		{"plan", "-detailed-exitcode", "-out=x"}, // not recorded
		{"apply", "-auto-approve"},               // apply without a plan file
		{"force-unlock", "abc"},                  // without -force
		{"show", planFile},                       // without -json
	} {
		got := fake.run(t, dir, args...)
		if got.rc != 1 || !strings.HasPrefix(got.stderr, "faketofu: ") || got.stdout != "" {
			t.Errorf("%q: %+v", args, got)
		}
	}
	WriteCase(t, dir, "no-such-case")
	if got := fake.run(t, dir, "plan", "-out=x"); got.rc != 1 || !strings.Contains(got.stderr, "no recorded case") {
		t.Errorf("unknown case: %+v", got)
	}
	noFixtures := fake
	noFixtures.env = cleanEnv("FAKETOFU_")
	if got := noFixtures.run(t, dir, "version"); got.rc != 1 || !strings.Contains(got.stderr, "FAKETOFU_FIXTURES") {
		t.Errorf("without FAKETOFU_FIXTURES: %+v", got)
	}
}
