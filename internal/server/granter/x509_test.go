package granter_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
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
		name         string
		adc          bool
		impersonated bool // the certificate signs in the source_credentials of an impersonated_service_account
		certificate  map[string]any
	}{
		{"file, use_default_certificate_config", false, false, map[string]any{"use_default_certificate_config": true}},
		{"file, certificate_config_location", false, false, map[string]any{"certificate_config_location": ""}},
		{"ADC, use_default_certificate_config", true, false, map[string]any{"use_default_certificate_config": true}},
		{"ADC, certificate_config_location", true, false, map[string]any{"certificate_config_location": ""}},
		{"impersonated file, use_default_certificate_config", false, true, map[string]any{"use_default_certificate_config": true}},
		{"impersonated ADC, use_default_certificate_config", true, true, map[string]any{"use_default_certificate_config": true}},
		{"impersonated ADC, certificate_config_location", true, true, map[string]any{"certificate_config_location": ""}},
	}
	const refused = "IAM refusing the handshake fails at once"
	const internal = "IAM's internal_error alert is retried"
	names := []string{refused, internal}
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
			fake := iamfake.Start(t)
			fake.AddAccount(requester)
			account := w.ExternalAccount("", tc.certificate)
			var stsGranted *atomic.Int32
			var impersonated atomic.Int32
			if tc.impersonated {
				account["token_url"], stsGranted = w.StartSTS(t, "", "federated-token")
				account = map[string]any{
					"type":                              "impersonated_service_account",
					"service_account_impersonation_url": impersonation(t, &impersonated) + "/v1/projects/-/serviceAccounts/granter@proj.iam.gserviceaccount.com:generateAccessToken",
					"source_credentials":                account,
				}
			} else {
				account["token_url"], stsGranted = w.StartSTS(t, "", iamfake.Token)
			}
			creds := filepath.Join(t.TempDir(), "credentials.json")
			b, err := json.Marshal(account)
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
			if n, want := impersonated.Load(), map[bool]int32{true: 1}[tc.impersonated]; n != want {
				t.Errorf("generateAccessToken called %d times, want %d", n, want)
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
	// An alert that is no refusal of the client (internal_error: the server failed to find its
	// certificate) may be gone on the next attempt: retried.
	t.Run(internal, func(t *testing.T) {
		t.Setenv("CLOUDSDK_CONFIG", t.TempDir())
		fake := iamfake.Start(t)
		// Not httptest's TLS server, which would present its own certificate.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		iam := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			t.Error("IAM answered a request it should never have received")
		}), ErrorLog: log.New(io.Discard, "", 0)}
		go iam.Serve(tls.NewListener(ln, &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return nil, errors.New("no certificate today")
		}}))
		defer iam.Close()
		g, err := granter.NewGCPIAM(context.Background(), granter.GCPIAMConfig{Endpoint: "https://" + ln.Addr().String(), CredentialsFile: fake.CredentialsFile(t)})
		if err != nil {
			t.Fatal(err)
		}
		sleeps := 0
		g.Now = func() time.Time { return now }
		g.Sleep = func(context.Context, time.Duration) error { sleeps++; return nil }
		g.MaxAttempts = 3
		err = g.Grant(context.Background(), lease("x509-internal", time.Hour))
		if err == nil || !strings.Contains(err.Error(), "internal error") || !strings.Contains(err.Error(), "gave up after 3 attempts") {
			t.Fatalf("error %v, want the internal_error alert, retried", err)
		}
		if sleeps != 2 {
			t.Errorf("slept %d times, want 2", sleeps)
		}
	})
}

// impersonation starts, on 127.0.0.1 until t ends, IAM's generateAccessToken for the granter's
// own service account: it trades the STS's federated-token for iamfake's token, counting the
// trades in n, and fails t on any other request. It returns its URL.
func impersonation(t *testing.T, n *atomic.Int32) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || r.URL.Path != "/v1/projects/-/serviceAccounts/granter@proj.iam.gserviceaccount.com:generateAccessToken" ||
			r.Header.Get("Authorization") != "Bearer federated-token" {
			t.Errorf("generateAccessToken: %s %s, Authorization %q", r.Method, r.URL, r.Header.Get("Authorization"))
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"accessToken":%q,"expireTime":%q}`, iamfake.Token, time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}
