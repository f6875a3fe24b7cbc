package runner

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/gauth"
	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

const sampleConfig = `
environment "nonprod" {
  server   = "http://127.0.0.1:9"
  dir      = "stacks/nonprod"
}

environment "prod" {
  audience     = "tfstackplan-prod"
  dir          = "stacks/prod"
  plan_script  = "preview"
  apply_script = "deploy"
  log_file     = "out.log"
  plan_json    = "plan.json"
  gated        = true
}
`

func TestParseConfig(t *testing.T) {
	cfg, err := ParseConfig("tfstackplan.hcl", []byte(sampleConfig))
	if err != nil {
		t.Fatal(err)
	}
	np, err := cfg.Environment("nonprod")
	if err != nil {
		t.Fatal(err)
	}
	want := Environment{Name: "nonprod", Server: "http://127.0.0.1:9", Dir: "stacks/nonprod", PlanScript: "plan", ApplyScript: "apply", LogFile: DefaultLogFile, PlanJSON: DefaultPlanJSONFile}
	want.Range = np.Range
	if np != want {
		t.Errorf("nonprod = %+v\nwant %+v", np, want)
	}
	if np.Range.Start.Line != 2 {
		t.Errorf("nonprod block starts at line %d, want 2", np.Range.Start.Line)
	}
	prod, _ := cfg.Environment("prod")
	if !prod.Gated || prod.PlanScript != "preview" || prod.ApplyScript != "deploy" || prod.LogFile != "out.log" || prod.PlanJSON != "plan.json" || prod.Audience != "tfstackplan-prod" {
		t.Errorf("prod = %+v", prod)
	}
	if _, err := cfg.Environment("staging"); err == nil || !strings.Contains(err.Error(), "nonprod, prod") {
		t.Errorf("unknown environment error %v should list the defined ones", err)
	}
}

func TestParseConfigErrorsCarryPosition(t *testing.T) {
	cases := []struct{ src, want string }{
		{"environment \"x\" {\n  server = \n}\n", "cfg.hcl:2,"},
		{"environment \"x\" {\n  bogus = 1\n}\n", "cfg.hcl:2,3: Unsupported argument"},
		{"environment \"x\" {\n  gated = \"maybe\"\n}\n", "cfg.hcl:2,"},
		{"\n\nenvironment \"x\" {\n  dir = \"../outside\"\n}\n", "cfg.hcl:3,1: invalid dir"},
		{"environment \"x\" {\n  dir = \"/abs\"\n}\n", "cfg.hcl:1,1: invalid dir"},
		{"environment \"x\" {\n  server = \"ftp://h\"\n}\n", "cfg.hcl:1,1: invalid server"},
		{"environment \"x\" {\n  log_file = \"../../etc/passwd\"\n}\n", "invalid log_file"},
		{"environment \"x\" {}\nenvironment \"x\" {}\n", "cfg.hcl:2,1: duplicate environment"},
		{"environment \"x\" {\n  plan_script = \"tfstackplan  plan\"\n}\n", "invalid plan_script"},
		{"environment \"x\" {\n  apply_script = \" apply\"\n}\n", "invalid apply_script"},
		{"environment \"x\" {\n  apply_script = \"a\\tb\"\n}\n", "invalid apply_script"},
	}
	// A script with several labels is named by its labels separated by single spaces.
	cfg, err := ParseConfig("cfg.hcl", []byte("environment \"x\" {\n  plan_script = \"tfstackplan plan\"\n}\n"))
	if err != nil {
		t.Fatalf("multi-label script name: %v", err)
	}
	if x, _ := cfg.Environment("x"); x.PlanScript != "tfstackplan plan" {
		t.Fatalf("plan_script %q", x.PlanScript)
	}
	for _, tc := range cases {
		_, err := ParseConfig("cfg.hcl", []byte(tc.src))
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseConfig(%q) error = %v, want it to contain %q", tc.src, err, tc.want)
		}
	}
}

func TestClientForEnvironmentPrecedence(t *testing.T) {
	cfg, err := ParseConfig("tfstackplan.hcl", []byte(sampleConfig))
	if err != nil {
		t.Fatal(err)
	}
	none := mapEnv(nil)
	c, err := clientForEnvironment(cfg, "nonprod", none)
	if err != nil || !c.Enabled() || c.BaseURL() != "http://127.0.0.1:9" {
		t.Fatalf("config server: %v %v", c.BaseURL(), err)
	}
	c, err = clientForEnvironment(cfg, "nonprod", mapEnv(map[string]string{EnvServer: "http://127.0.0.1:10"}))
	if err != nil || c.BaseURL() != "http://127.0.0.1:10" {
		t.Fatalf("TFSTACKPLAN_SERVER must win: %v %v", c.BaseURL(), err)
	}
	// prod is gated and has no server: disabled, and the gate denies.
	c, err = clientForEnvironment(cfg, "prod", none)
	if err != nil || c.Enabled() {
		t.Fatalf("prod: enabled=%v err=%v", c.Enabled(), err)
	}
	if v := c.GateCheck(context.Background(), events.GateCheck{}); v.Allowed() {
		t.Fatal("a gated environment without a server must deny")
	}
	if _, err := clientForEnvironment(cfg, "staging", none); err == nil {
		t.Fatal("unknown environment must be an error")
	}
	c, err = clientForEnvironment(nil, "anything", none)
	if err != nil || c.Enabled() || !c.GateCheck(context.Background(), events.GateCheck{}).Allowed() {
		t.Fatalf("no config, no server: %v", err)
	}
}

// mapEnv is a getenv reading kv.
func mapEnv(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestClientForEnvironmentReadsRepoRoot(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, ConfigFileName), []byte(sampleConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(root, "stacks", "nonprod")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(sub)
	t.Setenv(EnvServer, "")
	t.Setenv(EnvAudience, "")
	c, err := ClientForEnvironment("nonprod")
	if err != nil || c.BaseURL() != "http://127.0.0.1:9" {
		t.Fatalf("ClientForEnvironment from a sub-directory: %q %v", c.BaseURL(), err)
	}
	if err := os.WriteFile(filepath.Join(root, ConfigFileName), []byte("environment {"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ClientForEnvironment("nonprod"); err == nil || !strings.Contains(err.Error(), ConfigFileName+":1") {
		t.Fatalf("broken config error %v should name file:line", err)
	}
}

func TestAPITokenFuncEmptyAudienceProbesNothing(t *testing.T) {
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "must-not-be-read.json"))
	tok, err := APITokenFunc("")
	if tok != nil || err != nil {
		t.Fatalf("APITokenFunc(\"\") = %v, %v", tok != nil, err)
	}
}

// TestAPITokenFuncFromLocalCredentials mints a Google ID token from a service-account key
// whose token endpoint is a loopback test server, and sends it to the control plane.
func TestAPITokenFuncFromLocalCredentials(t *testing.T) {
	var minted atomic.Int32
	idToken := testkit.UnsignedJWT(t, map[string]any{"aud": "tfstackplan-test", "exp": time.Now().Add(time.Hour).Unix(), "iss": "https://accounts.google.com"})
	tokenSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil || r.Form.Get("assertion") == "" {
			http.Error(w, "no assertion", 400)
			return
		}
		minted.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id_token":%q,"token_type":"Bearer","expires_in":3600}`, idToken)
	}))
	defer tokenSrv.Close()
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", writeServiceAccount(t, tokenSrv.URL+"/token"))
	t.Setenv("GCE_METADATA_HOST", testkit.ClosedLoopbackAddr(t))

	tok, err := APITokenFunc("tfstackplan-test")
	if err != nil || tok == nil {
		t.Fatalf("APITokenFunc: %v", err)
	}
	mem := newMemServer()
	srv := mem.start(t)
	c, err := NewClientTokenSource(srv.URL, tok)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := c.Phase(context.Background(), events.PhaseEvent{ExecutionID: "e", Stack: "s", Phase: "p", Seq: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	mem.mu.Lock()
	defer mem.mu.Unlock()
	for _, a := range mem.auth {
		if a != "Bearer "+idToken {
			t.Fatalf("server saw Authorization %q", a)
		}
	}
	if n := minted.Load(); n != 1 {
		t.Errorf("token endpoint called %d times; the token should be cached", n)
	}
}

func TestAPITokenFuncWithoutCredentials(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("CLOUDSDK_CONFIG", t.TempDir())
	t.Setenv("GCE_METADATA_HOST", testkit.ClosedLoopbackAddr(t))
	for name, creds := range map[string]string{"missing file": filepath.Join(t.TempDir(), "nope.json"), "no file, no metadata server": ""} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", creds)
			tok, err := APITokenFunc("aud")
			if tok != nil || !errors.Is(err, gauth.ErrNoCredentials) {
				t.Fatalf("APITokenFunc without credentials = %v, %v", tok != nil, err)
			}
			// ClientFromEnv-style construction warns and goes unauthenticated.
			var warn strings.Builder
			c, err := clientFor("http://127.0.0.1:9", ServerAuth{Audience: "aud"}, mapEnv(nil), &warn)
			if err != nil || !c.Enabled() || c.token != nil || !strings.Contains(warn.String(), "unauthenticated") {
				t.Fatalf("clientFor: err=%v token=%v warn=%q", err, c.token != nil, warn.String())
			}
		})
	}
}

func writeServiceAccount(t *testing.T, tokenURI string) string {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	sa := map[string]string{
		"type": "service_account", "project_id": "test", "private_key_id": "k1",
		"private_key": string(pemKey), "client_email": "runner@test.iam.gserviceaccount.com",
		"client_id": "1", "token_uri": tokenURI,
	}
	b, _ := json.Marshal(sa)
	file := filepath.Join(t.TempDir(), "sa.json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

func TestClientFromEnv(t *testing.T) {
	t.Setenv(EnvServer, "")
	if c := ClientFromEnv(); c.Enabled() {
		t.Fatal("empty TFSTACKPLAN_SERVER must disable the client")
	}
	t.Setenv(EnvServer, "http://127.0.0.1:9")
	t.Setenv(EnvAudience, "")
	c := ClientFromEnv()
	if !c.Enabled() || c.BaseURL() != "http://127.0.0.1:9" || c.token != nil {
		t.Fatalf("ClientFromEnv = %q token=%v", c.BaseURL(), c.token != nil)
	}
	t.Setenv(EnvServer, "ftp://nope")
	if c := ClientFromEnv(); c.Enabled() {
		t.Fatal("a malformed TFSTACKPLAN_SERVER must leave reporting disabled, not crash")
	}
}
