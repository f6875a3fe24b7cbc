package granter_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/granter"
	"github.com/tfstackplan/tfstackplan/internal/server/granter/iamfake"
	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

// External account credentials whose credential_source is a client certificate (X.509 workload
// identity federation) sign in through an STS that requires the certificate in the TLS
// handshake and takes the certificate chain as the subject token, whether they come as the
// credentials file or as Application Default Credentials, and whether they name the certificate
// config by use_default_certificate_config (the file GOOGLE_API_CERTIFICATE_CONFIG names) or by
// certificate_config_location. The test runs in a process that trusts the test CA
// (testkit.InX509Child).
func TestX509WorkloadIdentityFederation(t *testing.T) {
	cases := []struct {
		name        string
		adc         bool
		certificate map[string]any
	}{
		{"file, use_default_certificate_config", false, map[string]any{"use_default_certificate_config": true}},
		{"file, certificate_config_location", false, map[string]any{"certificate_config_location": ""}},
		{"ADC, use_default_certificate_config", true, map[string]any{"use_default_certificate_config": true}},
		{"ADC, certificate_config_location", true, map[string]any{"certificate_config_location": ""}},
	}
	const refused = "IAM refusing the handshake fails at once"
	names := []string{refused}
	for _, tc := range cases {
		names = append(names, tc.name)
	}
	if !testkit.InX509Child(t, names...) {
		return
	}
	w := testkit.NewX509Workload(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, ok := tc.certificate["certificate_config_location"]; ok {
				tc.certificate["certificate_config_location"] = w.CertConfig
			}
			t.Setenv("HOME", t.TempDir())
			t.Setenv("CLOUDSDK_CONFIG", t.TempDir())
			w.UseCertConfig(t, tc.certificate)
			tokenURL, stsGranted := w.StartSTS(t, "", iamfake.Token)
			fake := iamfake.Start(t)
			fake.AddAccount(requester)
			creds := filepath.Join(t.TempDir(), "external-account.json")
			b, err := json.Marshal(w.ExternalAccount(tokenURL, tc.certificate))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(creds, b, 0o600); err != nil {
				t.Fatal(err)
			}
			cfg := granter.GCPIAMConfig{Endpoint: fake.URL, CredentialsFile: creds}
			if tc.adc {
				cfg.CredentialsFile = ""
				t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", creds)
			}

			g, err := granter.NewGCPIAM(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			g.Now = func() time.Time { return now }
			g.Sleep = func(context.Context, time.Duration) error { return nil }
			b2 := lease("x509", time.Hour)
			if err := g.Grant(context.Background(), b2); err != nil {
				t.Fatal(err)
			}
			check(t, fake.Policy(requester).Bindings, want(b2))
			if n := stsGranted.Load(); n != 1 {
				t.Errorf("STS called %d times, want 1", n)
			}
		})
	}
	// A TLS alert from the server (here: no client certificate, which the granter's IAM client
	// never has) is its answer to the handshake, the same on every attempt: not retried.
	t.Run(refused, func(t *testing.T) {
		t.Setenv("CLOUDSDK_CONFIG", t.TempDir())
		fake := iamfake.Start(t)
		iam := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			t.Error("IAM answered a request it should never have received")
			http.Error(w, "no", http.StatusTeapot)
		}))
		iam.TLS = w.ServerTLS()
		iam.StartTLS()
		defer iam.Close()
		g, err := granter.NewGCPIAM(context.Background(), granter.GCPIAMConfig{Endpoint: iam.URL, CredentialsFile: fake.CredentialsFile(t)})
		if err != nil {
			t.Fatal(err)
		}
		sleeps := 0
		g.Now = func() time.Time { return now }
		g.Sleep = func(context.Context, time.Duration) error { sleeps++; return nil }
		err = g.Grant(context.Background(), lease("x509-refused", time.Hour))
		if err == nil || !strings.Contains(err.Error(), "certificate required") {
			t.Fatalf("error %v, want the server's refusal of the handshake", err)
		}
		if sleeps != 0 {
			t.Errorf("retried %d times", sleeps)
		}
	})
}
