package granter_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/granter"
	"github.com/tfstackplan/tfstackplan/internal/server/granter/iamfake"
)

const (
	requester = "deployer@proj.iam.gserviceaccount.com"
	runner    = "serviceAccount:ci@proj.iam.gserviceaccount.com"
)

var now = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

func TestMain(m *testing.M) {
	// Nothing here may leave the machine. The default transport reads the proxy variables once
	// and never proxies loopback, so any other address ends at a closed local port.
	for k, v := range map[string]string{
		"HTTP_PROXY": "http://127.0.0.1:1", "HTTPS_PROXY": "http://127.0.0.1:1", "NO_PROXY": "",
		"http_proxy": "http://127.0.0.1:1", "https_proxy": "http://127.0.0.1:1", "no_proxy": "",
		"GCE_METADATA_HOST": "127.0.0.1:1", "GCE_METADATA_IP": "127.0.0.1:1",
		"GOOGLE_AUTH_TRUST_BOUNDARY_ENABLED": "false", "GOOGLE_APPLICATION_CREDENTIALS": "", "GOOGLE_CLOUD_QUOTA_PROJECT": "",
	} {
		os.Setenv(k, v)
	}
	os.Exit(m.Run())
}

type env struct {
	fake   *iamfake.Server
	g      *granter.GCPIAM
	mu     sync.Mutex
	sleeps []time.Duration
}

// setup starts a fake holding requester's empty policy and a GCPIAM signing in with a key file
// whose token endpoint is the fake.
func setup(t *testing.T) *env {
	t.Helper()
	t.Setenv("GCE_METADATA_HOST", "127.0.0.1:1")
	t.Setenv("CLOUDSDK_CONFIG", t.TempDir())
	e := &env{fake: iamfake.Start(t)}
	e.fake.AddAccount(requester)
	g, err := granter.NewGCPIAM(context.Background(), granter.GCPIAMConfig{Endpoint: e.fake.URL, CredentialsFile: e.fake.CredentialsFile(t)})
	if err != nil {
		t.Fatal(err)
	}
	g.Now = func() time.Time { return now }
	g.Sleep = func(_ context.Context, d time.Duration) error {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.sleeps = append(e.sleeps, d)
		return nil
	}
	e.g = g
	return e
}

// granterFor returns a GCPIAM of endpoint signing in with credentialsFile, on e's clock and
// recording its sleeps in e's.
func (e *env) granterFor(t *testing.T, endpoint, credentialsFile string) *granter.GCPIAM {
	t.Helper()
	g, err := granter.NewGCPIAM(context.Background(), granter.GCPIAMConfig{Endpoint: endpoint, CredentialsFile: credentialsFile})
	if err != nil {
		t.Fatal(err)
	}
	g.Now, g.Sleep = e.g.Now, e.g.Sleep
	return g
}

// keyWith writes fake's service account key, changed by edit, to a new file and returns its
// path.
func keyWith(t *testing.T, fake *iamfake.Server, edit func(key map[string]any)) string {
	t.Helper()
	var key map[string]any
	b, err := os.ReadFile(fake.CredentialsFile(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &key); err != nil {
		t.Fatal(err)
	}
	edit(key)
	if b, err = json.Marshal(key); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "key.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func lease(id string, ttl time.Duration) granter.Binding {
	return granter.Binding{LeaseID: id, Environment: "prod", Requester: requester, Member: runner, ExpiresAt: now.Add(ttl)}
}

// want is the binding Grant should add for b.
func want(b granter.Binding) iamfake.Binding {
	return iamfake.Binding{Role: granter.TokenCreatorRole, Members: []string{b.Member}, Condition: &iamfake.Expr{
		Title:       "tfstackplan-lease-" + b.LeaseID,
		Description: "tfstackplan lease of environment prod to apply execution " + b.LeaseID,
		Expression:  fmt.Sprintf("request.time < timestamp(%q)", b.ExpiresAt.UTC().Format(time.RFC3339)),
	}}
}

// others are bindings another tool put on the account; a granter must leave them alone.
var others = []iamfake.Binding{
	{Role: "roles/iam.serviceAccountUser", Members: []string{"user:alice@example.com"}},
	{Role: granter.TokenCreatorRole, Members: []string{"group:ops@example.com"}},
	{Role: granter.TokenCreatorRole, Members: []string{"user:bob@example.com"}, Condition: &iamfake.Expr{
		Title: "office-hours", Expression: `request.time.getHours("Europe/Berlin") < 18`}},
}

func (e *env) bindings() []iamfake.Binding { return e.fake.Policy(requester).Bindings }

func check(t *testing.T, got []iamfake.Binding, want ...iamfake.Binding) {
	t.Helper()
	if len(got) == 0 {
		got = nil
	}
	if len(want) == 0 {
		want = nil
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("bindings:\n got %s\nwant %s", dump(got), dump(want))
	}
}

func dump(bs []iamfake.Binding) string {
	var s []string
	for _, b := range bs {
		c := ""
		if b.Condition != nil {
			c = fmt.Sprintf(" if %+v", *b.Condition)
		}
		s = append(s, fmt.Sprintf("%s %v%s", b.Role, b.Members, c))
	}
	return "[" + strings.Join(s, "; ") + "]"
}

func calls(t *testing.T, e *env, get, set int) {
	t.Helper()
	if g, s := e.fake.Calls("getIamPolicy"), e.fake.Calls("setIamPolicy"); g != get || s != set {
		t.Fatalf("getIamPolicy %d, setIamPolicy %d calls; want %d, %d", g, s, get, set)
	}
}

func TestGrantAddsExactlyTheBinding(t *testing.T) {
	e := setup(t)
	e.fake.SetPolicy(requester, iamfake.Policy{Bindings: others})
	b := lease("0123abcd", 2*time.Hour)
	if err := e.g.Grant(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	check(t, e.bindings(), append(others[:3:3], want(b))...)
	if v := e.fake.Policy(requester).Version; v != 3 {
		t.Errorf("policy version %d, want 3", v)
	}
	if n := e.fake.Calls("token"); n != 1 {
		t.Errorf("%d token requests, want 1: the key file's sign-in must be used", n)
	}
	calls(t, e, 1, 1)

	// Granting again changes nothing and writes nothing.
	if err := e.g.Grant(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	check(t, e.bindings(), append(others[:3:3], want(b))...)
	calls(t, e, 2, 1)

	// Granting the same lease with a new expiry replaces the old binding.
	b.ExpiresAt = b.ExpiresAt.Add(time.Hour)
	if err := e.g.Grant(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	check(t, e.bindings(), append(others[:3:3], want(b))...)
}

func TestRevokeRemovesOnlyItsLease(t *testing.T) {
	e := setup(t)
	e.fake.SetPolicy(requester, iamfake.Policy{Bindings: others})
	ctx := context.Background()
	one, two := lease("lease-1", time.Hour), lease("lease-2", 2*time.Hour)
	two.Member = "principalSet://iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/gh/attribute.repository/o/r"
	for _, b := range []granter.Binding{one, two} {
		if err := e.g.Grant(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	check(t, e.bindings(), append(others[:3:3], want(one), want(two))...)

	if err := e.g.Revoke(ctx, granter.Binding{LeaseID: one.LeaseID, Requester: requester}); err != nil {
		t.Fatal(err)
	}
	check(t, e.bindings(), append(others[:3:3], want(two))...)
	if err := e.g.Revoke(ctx, two); err != nil {
		t.Fatal(err)
	}
	check(t, e.bindings(), others...)
	calls(t, e, 4, 4)

	// Revoking what is not there is success, and writes nothing.
	if err := e.g.Revoke(ctx, one); err != nil {
		t.Fatalf("revoke of an absent lease: %v", err)
	}
	check(t, e.bindings(), others...)
	calls(t, e, 5, 4)
}

func TestConcurrentModificationIsRetriedAndKept(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	carol := iamfake.Binding{Role: "roles/iam.serviceAccountUser", Members: []string{"user:carol@example.com"}}
	e.fake.ConcurrentWrite(requester, func(p *iamfake.Policy) { p.Bindings = append(p.Bindings, carol) })
	b := lease("abc", time.Hour)
	if err := e.g.Grant(ctx, b); err != nil {
		t.Fatal(err)
	}
	check(t, e.bindings(), carol, want(b))
	calls(t, e, 2, 2)
	if len(e.sleeps) != 1 {
		t.Errorf("sleeps %v, want one backoff before the re-read", e.sleeps)
	}

	dave := iamfake.Binding{Role: granter.TokenCreatorRole, Members: []string{"user:dave@example.com"}}
	e.fake.ConcurrentWrite(requester, func(p *iamfake.Policy) { p.Bindings = append(p.Bindings, dave) })
	if err := e.g.Revoke(ctx, b); err != nil {
		t.Fatal(err)
	}
	check(t, e.bindings(), carol, dave)
	calls(t, e, 4, 4)
}

func TestTransientErrorsAreRetried(t *testing.T) {
	for _, tc := range []struct {
		method string
		code   int
		n      int
	}{
		{"getIamPolicy", 429, 2},
		{"getIamPolicy", 503, 1},
		{"setIamPolicy", 500, 2},
		{"setIamPolicy", 502, 1},
		{"", 504, 3},
	} {
		t.Run(fmt.Sprintf("%s-%d", tc.method, tc.code), func(t *testing.T) {
			e := setup(t)
			e.fake.Fail(tc.method, tc.n, tc.code)
			b := lease("x1", time.Hour)
			if err := e.g.Grant(context.Background(), b); err != nil {
				t.Fatal(err)
			}
			check(t, e.bindings(), want(b))
			if len(e.sleeps) != tc.n {
				t.Fatalf("sleeps %v, want %d", e.sleeps, tc.n)
			}
			for i, d := range e.sleeps {
				ceiling := min(granter.DefaultBaseDelay<<i, granter.DefaultMaxDelay)
				if d < ceiling/2 || d > ceiling {
					t.Errorf("backoff %d is %s, want within [%s, %s]", i+1, d, ceiling/2, ceiling)
				}
			}
		})
	}
}

func TestPersistentServerErrorFails(t *testing.T) {
	e := setup(t)
	e.fake.Fail("setIamPolicy", 100, 503)
	err := e.g.Grant(context.Background(), lease("x1", time.Hour))
	for _, s := range []string{requester, "setIamPolicy", "HTTP 503 Service Unavailable", "gave up after 6 attempts", "grant lease x1"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Fatalf("error %v does not say %q", err, s)
		}
	}
	if code, ok := granter.HTTPStatus(err); !ok || code != 503 {
		t.Errorf("error %v does not unwrap to the 503 answer (got %d, %t)", err, code, ok)
	}
	calls(t, e, granter.DefaultMaxAttempts, granter.DefaultMaxAttempts)
	if len(e.sleeps) != granter.DefaultMaxAttempts-1 {
		t.Errorf("sleeps %v, want %d", e.sleeps, granter.DefaultMaxAttempts-1)
	}
	check(t, e.bindings())
}

func TestPermanentErrorsFailAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name, account string
		code          int
		says          string
	}{
		{"forbidden", requester, 403, "HTTP 403 Forbidden: scripted fault (the control plane's identity needs"},
		{"bad request", requester, 400, "HTTP 400 Bad Request"},
		{"unknown account", "nobody@proj.iam.gserviceaccount.com", 0, "HTTP 404 Not Found: Unknown service account"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t)
			if tc.code != 0 {
				e.fake.Fail("getIamPolicy", 1, tc.code)
			}
			b := lease("x1", time.Hour)
			b.Requester = tc.account
			err := e.g.Grant(context.Background(), b)
			if err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), tc.account) {
				t.Fatalf("error %v, want one naming %s and saying %q", err, tc.account, tc.says)
			}
			calls(t, e, 1, 0)
			if len(e.sleeps) != 0 {
				t.Errorf("slept %v before a permanent error", e.sleeps)
			}
		})
	}
}

func TestRetriesStopBeforeTheDeadline(t *testing.T) {
	e := setup(t)
	e.g.Now = time.Now
	e.g.BaseDelay, e.g.MaxDelay = time.Minute, time.Hour
	e.fake.Fail("", 100, 503)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := lease("x1", time.Hour)
	b.ExpiresAt = time.Now().Add(time.Hour)
	err := e.g.Grant(ctx, b)
	if err == nil || !strings.Contains(err.Error(), "deadline is too near") || !strings.Contains(err.Error(), "HTTP 503") {
		t.Fatalf("error %v, want giving up on the deadline with the 503", err)
	}
	calls(t, e, 1, 0)
}

func TestLeasesOnOneAccountAreIndependent(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	var bs []granter.Binding
	for i := range errs {
		b := lease(fmt.Sprintf("lease-%d", i), time.Duration(i+1)*time.Hour)
		bs = append(bs, b)
		wg.Go(func() { errs[i] = e.g.Grant(ctx, b) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, x := range e.bindings() {
		got[x.Condition.Title] = true
	}
	if len(got) != len(bs) {
		t.Fatalf("%d lease bindings after %d concurrent grants: %s", len(got), len(bs), dump(e.bindings()))
	}
	for i, b := range bs {
		if i%2 == 0 {
			if err := e.g.Revoke(ctx, b); err != nil {
				t.Fatal(err)
			}
		}
	}
	var left []iamfake.Binding
	for i, b := range bs {
		if i%2 == 1 {
			left = append(left, want(b))
		}
	}
	check(t, sortByTitle(e.bindings()), left...)
}

func sortByTitle(bs []iamfake.Binding) []iamfake.Binding {
	out := append([]iamfake.Binding(nil), bs...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j].Condition.Title < out[i].Condition.Title {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestRemoveExpired(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	old := iamfake.Binding{Role: granter.TokenCreatorRole, Members: []string{"user:eve@example.com"}, Condition: &iamfake.Expr{
		Title: "someone-else", Expression: `request.time < timestamp("2020-01-01T00:00:00Z")`}}
	e.fake.SetPolicy(requester, iamfake.Policy{Bindings: []iamfake.Binding{old}})
	short, long := lease("short", time.Hour), lease("long", 3*time.Hour)
	for _, b := range []granter.Binding{short, long} {
		if err := e.g.Grant(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := e.g.RemoveExpired(ctx, requester, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(removed, []string{granter.ConditionTitle("short")}) {
		t.Fatalf("removed %q, want only the short lease", removed)
	}
	check(t, e.bindings(), old, want(long))

	// Nothing expired: no write.
	sets := e.fake.Calls("setIamPolicy")
	if removed, err = e.g.RemoveExpired(ctx, requester, now.Add(2*time.Hour)); err != nil || len(removed) != 0 {
		t.Fatalf("second sweep removed %q, %v", removed, err)
	}
	if e.fake.Calls("setIamPolicy") != sets {
		t.Error("a sweep that removed nothing wrote the policy")
	}
}

func TestGrantChecksItsInput(t *testing.T) {
	e := setup(t)
	for name, tc := range map[string]struct {
		edit func(*granter.Binding)
		says string
	}{
		"expired":      {func(b *granter.Binding) { b.ExpiresAt = now }, "already expired"},
		"no member":    {func(b *granter.Binding) { b.Member = "" }, "not an IAM principal"},
		"bare member":  {func(b *granter.Binding) { b.Member = "ci@proj.iam.gserviceaccount.com" }, "not an IAM principal"},
		"no lease id":  {func(b *granter.Binding) { b.LeaseID = "" }, "lease id"},
		"bad account":  {func(b *granter.Binding) { b.Requester = "projects/p/serviceAccounts/x@y" }, "not a service account email"},
		"no requester": {func(b *granter.Binding) { b.Requester = "" }, "not a service account email"},
	} {
		b := lease("x1", time.Hour)
		tc.edit(&b)
		if err := e.g.Grant(context.Background(), b); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: error %v, want %q", name, err, tc.says)
		}
	}
	calls(t, e, 0, 0)
}

func TestApplicationDefaultCredentials(t *testing.T) {
	e := setup(t)
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", e.fake.CredentialsFile(t))
	g, err := granter.New(context.Background(), granter.KindGCPIAM, granter.GCPIAMConfig{Endpoint: strings.TrimSuffix(e.fake.URL, "/")})
	if err != nil {
		t.Fatal(err)
	}
	if g.Name() != granter.KindGCPIAM {
		t.Errorf("name %q", g.Name())
	}
	b := lease("adc", 1000*time.Hour)
	b.ExpiresAt = time.Now().Add(time.Hour)
	if err := g.Grant(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if err := g.Revoke(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	check(t, e.bindings())
}

func TestNewGCPIAMRejectsBadConfig(t *testing.T) {
	t.Setenv("GCE_METADATA_HOST", "127.0.0.1:1")
	dir := t.TempDir()
	odd := dir + "/odd.json"
	if err := os.WriteFile(odd, []byte(`{"type":"gdch_service_account"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg  granter.GCPIAMConfig
		says string
	}{
		{granter.GCPIAMConfig{Endpoint: "127.0.0.1:8080"}, "not an absolute URL"},
		{granter.GCPIAMConfig{CredentialsFile: dir + "/missing.json"}, "credentials file"},
		{granter.GCPIAMConfig{CredentialsFile: odd}, `type "gdch_service_account" (accepted: service_account`},
	} {
		if _, err := granter.NewGCPIAM(context.Background(), tc.cfg); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%+v: error %v, want %q", tc.cfg, err, tc.says)
		}
	}
}

func TestSignInRefusedFailsAtOnce(t *testing.T) {
	e := setup(t)
	var creds map[string]string
	data, err := os.ReadFile(e.fake.CredentialsFile(t))
	if err == nil {
		err = json.Unmarshal(data, &creds)
	}
	if err != nil {
		t.Fatal(err)
	}
	creds["client_email"] = "impostor@proj.iam.gserviceaccount.com"
	data, _ = json.Marshal(creds)
	path := t.TempDir() + "/impostor.json"
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	g, err := granter.NewGCPIAM(context.Background(), granter.GCPIAMConfig{Endpoint: e.fake.URL, CredentialsFile: path})
	if err != nil {
		t.Fatal(err)
	}
	g.Now = e.g.Now
	g.Sleep = e.g.Sleep
	err = g.Grant(context.Background(), lease("x1", time.Hour))
	if err == nil || !strings.Contains(err.Error(), requester) || !strings.Contains(err.Error(), "invalid_grant") {
		t.Fatalf("error %v, want the refused sign-in for %s", err, requester)
	}
	if n := e.fake.Calls("token"); n != 1 || len(e.sleeps) != 0 {
		t.Errorf("%d sign-ins and sleeps %v, want one sign-in and no retry", n, e.sleeps)
	}
}

func TestUnreachableEndpointIsRetriedThenFails(t *testing.T) {
	e := setup(t)
	g, err := granter.NewGCPIAM(context.Background(), granter.GCPIAMConfig{Endpoint: "http://127.0.0.1:1/", CredentialsFile: e.fake.CredentialsFile(t)})
	if err != nil {
		t.Fatal(err)
	}
	g.Now = e.g.Now
	g.Sleep = e.g.Sleep
	g.MaxAttempts = 3
	err = g.Grant(context.Background(), lease("x1", time.Hour))
	if err == nil || !strings.Contains(err.Error(), "gave up after 3 attempts") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("error %v, want giving up on a refused connection", err)
	}
	if len(e.sleeps) != 2 {
		t.Errorf("sleeps %v, want 2", e.sleeps)
	}
}

func TestMalformedAnswerFailsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name, method, contentType, body string
		get, set                        int
		says                            string
	}{
		{"cut JSON", "getIamPolicy", "application/json", `{"etag":"BwY=","bindings":[`, 1, 0, "unexpected end of JSON input"},
		{"HTML page", "getIamPolicy", "text/html", "<html>Sign in to continue</html>", 1, 0, "invalid character '<'"},
		{"wrong type", "getIamPolicy", "application/json", `{"etag":"BwY=","bindings":"none"}`, 1, 0, `field "bindings" holds a JSON string`},
		{"wrong nested type", "getIamPolicy", "application/json", `{"etag":"BwY=","bindings":[{"role":"r/x","condition":{"title":7}}]}`, 1, 0, `field "bindings.condition.title" holds a JSON number`},
		{"null", "getIamPolicy", "application/json", "null", 1, 0, "the body is null"},
		{"empty", "getIamPolicy", "application/json", "", 1, 0, "the body is empty"},
		{"no etag", "getIamPolicy", "application/json", `{"version":1}`, 1, 0, "the policy has no etag"},
		{"null binding", "getIamPolicy", "application/json", `{"etag":"BwY=","bindings":[null]}`, 1, 0, "binding 0 is null"},
		{"binding without role", "getIamPolicy", "application/json", `{"etag":"BwY=","bindings":[{"members":["user:a@b"]}]}`, 1, 0, "binding 0 has no role"},
		{"trailing data", "setIamPolicy", "application/json", `{"etag":"BwY="} {"etag":"BwZ="}`, 1, 1, "after top-level value"},
		{"too large", "getIamPolicy", "application/json", `{"etag":"BwY=","x":"` + strings.Repeat("a", 1<<20) + `"}`, 1, 0, "larger than 1048576 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t)
			e.fake.Answer(tc.method, 1, 200, tc.contentType, tc.body)
			err := e.g.Grant(context.Background(), lease("x1", time.Hour))
			for _, s := range []string{requester, tc.method + ": malformed answer", tc.says} {
				if err == nil || !strings.Contains(err.Error(), s) {
					t.Fatalf("error %v does not say %q", err, s)
				}
			}
			calls(t, e, tc.get, tc.set)
			if len(e.sleeps) != 0 {
				t.Errorf("slept %v: a malformed answer is not retried", e.sleeps)
			}
		})
	}
}

func TestErrorAnswersAreSurfaced(t *testing.T) {
	for _, tc := range []struct {
		name, contentType, body string
		code                    int
		says                    string
	}{
		{"google JSON", "application/json; charset=UTF-8",
			`{"error":{"code":400,"message":"Invalid policy version 2 requested.","status":"INVALID_ARGUMENT","details":[]}}`,
			400, "getIamPolicy: HTTP 400 Bad Request: Invalid policy version 2 requested."},
		{"google JSON without a message", "application/json", `{"error":{"code":403,"status":"PERMISSION_DENIED"}}`,
			403, "HTTP 403 Forbidden: PERMISSION_DENIED (the control plane's identity needs"},
		{"proxy page", "text/html", "<html>\n  <body>Access denied by proxy</body>\n</html>\n",
			407, "HTTP 407 Proxy Authentication Required: <html> <body>Access denied by proxy</body> </html>"},
		{"empty body", "text/plain", "", 404, "getIamPolicy: HTTP 404 Not Found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t)
			e.fake.Answer("getIamPolicy", 1, tc.code, tc.contentType, tc.body)
			err := e.g.Grant(context.Background(), lease("x1", time.Hour))
			if err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), requester) {
				t.Fatalf("error %v, want one naming %s and saying %q", err, requester, tc.says)
			}
			if code, ok := granter.HTTPStatus(err); !ok || code != tc.code {
				t.Errorf("error unwraps to HTTP %d (%t), want %d", code, ok, tc.code)
			}
			calls(t, e, 1, 0)
		})
	}

	t.Run("long body", func(t *testing.T) {
		e := setup(t)
		e.fake.Answer("getIamPolicy", 1, 400, "text/plain", strings.Repeat("é", 2<<20))
		err := e.g.Grant(context.Background(), lease("x1", time.Hour))
		if err == nil || !strings.Contains(err.Error(), "HTTP 400 Bad Request: éé") || !strings.HasSuffix(err.Error(), "é…") {
			t.Fatalf("error %.300v..., want the start of the body, cut", err)
		}
		if n := len(err.Error()); n > 1000 {
			t.Errorf("error of %d bytes: the quoted body is not bounded", n)
		}
	})

	// Google's own message is bounded too: it reaches the audit record and the gate's answer.
	t.Run("long google message", func(t *testing.T) {
		e := setup(t)
		msg := strings.Repeat("x", 100_000)
		e.fake.Answer("getIamPolicy", 1, 400, "application/json", `{"error":{"code":400,"message":"`+msg+`","status":"INVALID_ARGUMENT"}}`)
		err := e.g.Grant(context.Background(), lease("x1", time.Hour))
		if err == nil || !strings.Contains(err.Error(), "HTTP 400 Bad Request: xxx") || len(err.Error()) > 1000 {
			t.Fatalf("error of %d bytes, want Google's message cut", len(fmt.Sprint(err)))
		}
	})
}

// An IAM answer that redirects is an error, not a second request: the access token would go
// along to wherever the redirect points.
func TestRedirectIsNotFollowed(t *testing.T) {
	e := setup(t)
	var elsewhere atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
	}))
	t.Cleanup(other.Close)
	redirecting := httptest.NewServer(http.RedirectHandler(other.URL+"/steal", http.StatusTemporaryRedirect))
	t.Cleanup(redirecting.Close)
	g := e.granterFor(t, redirecting.URL, e.fake.CredentialsFile(t))
	err := g.Grant(context.Background(), lease("x1", time.Hour))
	if code, ok := granter.HTTPStatus(err); !ok || code != http.StatusTemporaryRedirect {
		t.Fatalf("error %v, want the 307 answer", err)
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the redirect was followed (%d requests elsewhere)", n)
	}
	if testing.Verbose() {
		t.Log(err)
	}
}

// Without an endpoint, IAM is called in the credentials' universe.
func TestEndpointFollowsTheUniverseDomain(t *testing.T) {
	t.Setenv("GCE_METADATA_HOST", "127.0.0.1:1")
	fake := iamfake.Start(t)
	for universe, want := range map[string]string{"": "https://iam.googleapis.com/", "sovereign.example": "https://iam.sovereign.example/"} {
		path := keyWith(t, fake, func(key map[string]any) {
			delete(key, "universe_domain")
			if universe != "" {
				key["universe_domain"] = universe
			}
		})
		g, err := granter.NewGCPIAM(context.Background(), granter.GCPIAMConfig{CredentialsFile: path})
		if err != nil {
			t.Fatal(err)
		}
		if got := granter.Endpoint(g); got != want {
			t.Errorf("universe %q: endpoint %s, want %s", universe, got, want)
		}
	}
}

func TestBearerTokenIsSent(t *testing.T) {
	e := setup(t)
	t.Setenv("GOOGLE_CLOUD_QUOTA_PROJECT", "billing-proj")
	g := e.granterFor(t, e.fake.URL, e.fake.CredentialsFile(t))
	if err := g.Grant(context.Background(), lease("x1", time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := e.fake.Header("Authorization"); got != "Bearer "+iamfake.Token {
		t.Errorf("Authorization %q, want the token the key file signed in for", got)
	}
	if got := e.fake.Header("X-Goog-User-Project"); got != "billing-proj" {
		t.Errorf("X-Goog-User-Project %q, want the quota project", got)
	}

	// A token IAM refuses is a permanent failure, and the error does not repeat it.
	const refused = "iamfake-refused-token-value"
	e.fake.IssueToken(refused)
	g = e.granterFor(t, e.fake.URL, e.fake.CredentialsFile(t))
	err := g.Revoke(context.Background(), lease("x1", time.Hour))
	if err == nil || !strings.Contains(err.Error(), "getIamPolicy: HTTP 401 Unauthorized: Request had invalid authentication credentials.") {
		t.Fatalf("error %v, want IAM's 401", err)
	}
	if strings.Contains(err.Error(), refused) {
		t.Errorf("error %v repeats the access token", err)
	}
	if got := e.fake.Header("Authorization"); got != "Bearer "+refused {
		t.Errorf("Authorization %q, want the newly issued token", got)
	}
	if len(e.sleeps) != 0 {
		t.Errorf("slept %v before a refused token", e.sleeps)
	}
}

func TestCredentialsFileOfUnsupportedType(t *testing.T) {
	e := setup(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content, says string
	}{
		{"external user", `{"type":"external_account_authorized_user","token_url":"` + e.fake.URL + `token"}`,
			`has type "external_account_authorized_user" (accepted: service_account, authorized_user, external_account, impersonated_service_account)`},
		{"no type", `{"client_email":"x@y","token_uri":"` + e.fake.URL + `token"}`, `has type ""`},
		{"not JSON", "client_email: x@y\n", "credentials file " + dir + "/not JSON.json: invalid character"},
	} {
		path := dir + "/" + tc.name + ".json"
		if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := granter.NewGCPIAM(context.Background(), granter.GCPIAMConfig{Endpoint: e.fake.URL, CredentialsFile: path})
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.says)
		}
	}
	if n := e.fake.Calls("token"); n != 0 {
		t.Errorf("%d sign-ins with rejected credentials files", n)
	}

	// A file of an accepted type is only used at the first call: a bad key fails it there,
	// before any unsigned request reaches IAM.
	path := dir + "/bad-key.json"
	if err := os.WriteFile(path, []byte(`{"type":"service_account","client_email":"x@y","private_key":"not a key","token_uri":"`+e.fake.URL+`token"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	g := e.granterFor(t, e.fake.URL, path)
	err := g.Grant(context.Background(), lease("x1", time.Hour))
	if err == nil || !strings.Contains(err.Error(), "getIamPolicy: ") || !strings.Contains(err.Error(), "getting an access token") {
		t.Fatalf("error %v, want the failed sign-in", err)
	}
	calls(t, e, 0, 0)
}

func TestAccountIsEscapedInThePath(t *testing.T) {
	e := setup(t)
	odd := "odd%2Fname@proj.iam.gserviceaccount.com"
	e.fake.AddAccount(odd)
	b := lease("x1", time.Hour)
	b.Requester = odd
	if err := e.g.Grant(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if got := e.fake.Policy(odd).Bindings; len(got) != 1 || got[0].Condition == nil || got[0].Condition.Title != granter.ConditionTitle("x1") {
		t.Fatalf("the grant did not land on %s: %s", odd, dump(got))
	}
	check(t, e.bindings())
}

// A token endpoint's answer is cut in the error, which reaches the audit record: the auth
// library quotes a body without an OAuth error code whole.
func TestTokenEndpointAnswerIsBounded(t *testing.T) {
	e := setup(t)
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, "<html>"+strings.Repeat("proxy says no ", 10_000)+"</html>")
	}))
	t.Cleanup(page.Close)
	path := keyWith(t, e.fake, func(key map[string]any) { key["token_uri"] = page.URL + "/token" })
	g := e.granterFor(t, e.fake.URL, path)
	err := g.Grant(context.Background(), lease("x1", time.Hour))
	if err == nil || !strings.Contains(err.Error(), "getting an access token") || len(err.Error()) > 1500 {
		t.Fatalf("error of %d bytes: %.300v", len(fmt.Sprint(err)), err)
	}
}

// A token endpoint that redirects is an error, not a second request: the signed assertion
// would be posted again to wherever the redirect points.
func TestTokenEndpointRedirectIsNotFollowed(t *testing.T) {
	e := setup(t)
	var elsewhere atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"access_token":"`+iamfake.Token+`","token_type":"Bearer","expires_in":3600}`)
	}))
	t.Cleanup(other.Close)
	redirecting := httptest.NewServer(http.RedirectHandler(other.URL+"/steal", http.StatusTemporaryRedirect))
	t.Cleanup(redirecting.Close)
	path := keyWith(t, e.fake, func(key map[string]any) { key["token_uri"] = redirecting.URL + "/token" })
	g := e.granterFor(t, e.fake.URL, path)
	err := g.Grant(context.Background(), lease("x1", time.Hour))
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the redirect was followed (%d requests elsewhere; grant error %v)", n, err)
	}
	if err == nil || !strings.Contains(err.Error(), "getting an access token") || !strings.Contains(err.Error(), "307") || len(err.Error()) > 1500 {
		t.Fatalf("error of %d bytes: %.300v; want the token endpoint's 307", len(fmt.Sprint(err)), err)
	}
	calls(t, e, 0, 0)
}

// An IAM endpoint whose certificate the granter does not trust fails the grant at once: the
// next attempt would meet the same certificate.
func TestUntrustedCertificateFailsAtOnce(t *testing.T) {
	e := setup(t)
	iam := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		t.Error("IAM answered a request it should never have received")
	}))
	defer iam.Close()
	g := e.granterFor(t, iam.URL, e.fake.CredentialsFile(t))
	err := g.Grant(context.Background(), lease("x1", time.Hour))
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("error %v, want the untrusted certificate", err)
	}
	if len(e.sleeps) != 0 {
		t.Errorf("slept %v before a permanent error", e.sleeps)
	}
}
