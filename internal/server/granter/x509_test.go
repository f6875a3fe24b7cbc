package granter_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/granter"
	"github.com/tfstackplan/tfstackplan/internal/server/granter/iamfake"
)

// x509ChildEnv, in the environment of a re-executed test binary, names the directory where
// TestX509WorkloadIdentityFederation writes its test CA, the file SSL_CERT_FILE names.
const x509ChildEnv = "TFSTACKPLAN_GRANTER_X509_TEST_DIR"

// External account credentials whose credential_source is a client certificate (X.509 workload
// identity federation) sign in through an STS that requires the certificate in the TLS
// handshake and takes the certificate chain as the subject token, whether they come as the
// credentials file or as Application Default Credentials, and whether they name the certificate
// config by use_default_certificate_config (the file GOOGLE_API_CERTIFICATE_CONFIG names) or by
// certificate_config_location.
//
// The library's mTLS client verifies the STS with the system roots, which a process loads once:
// the test runs in a re-executed test binary whose SSL_CERT_FILE is the test CA, written before
// that process makes its first TLS connection.
func TestX509WorkloadIdentityFederation(t *testing.T) {
	dir := os.Getenv(x509ChildEnv)
	if dir == "" {
		runX509Child(t)
		return
	}
	pki := newTestPKI(t)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", pki.ca.Raw)
	certFile, keyFile := filepath.Join(dir, "workload.pem"), filepath.Join(dir, "workload-key.pem")
	writePEM(t, certFile, "CERTIFICATE", pki.client.Certificate[0])
	keyDER, err := x509.MarshalPKCS8PrivateKey(pki.client.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	certConfig := filepath.Join(dir, "certificate_config.json")
	writeJSON(t, certConfig, map[string]any{"cert_configs": map[string]any{"workload": map[string]string{"cert_path": certFile, "key_path": keyFile}}})

	const poolAudience = "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/onprem/providers/x509"
	wantSubject, err := json.Marshal([]string{base64.StdEncoding.EncodeToString(pki.client.Certificate[0])})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		adc         bool
		certificate map[string]any
	}{
		{"file, use_default_certificate_config", false, map[string]any{"use_default_certificate_config": true}},
		{"file, certificate_config_location", false, map[string]any{"certificate_config_location": certConfig}},
		{"ADC, use_default_certificate_config", true, map[string]any{"use_default_certificate_config": true}},
		{"ADC, certificate_config_location", true, map[string]any{"certificate_config_location": certConfig}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("HOME", t.TempDir())
			t.Setenv("CLOUDSDK_CONFIG", t.TempDir())
			if tc.certificate["use_default_certificate_config"] == true {
				t.Setenv("GOOGLE_API_CERTIFICATE_CONFIG", certConfig)
			} else {
				t.Setenv("GOOGLE_API_CERTIFICATE_CONFIG", filepath.Join(t.TempDir(), "absent.json"))
			}
			var stsCalls atomic.Int32
			sts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 || !r.TLS.PeerCertificates[0].Equal(pki.clientLeaf) ||
					r.FormValue("grant_type") != "urn:ietf:params:oauth:grant-type:token-exchange" ||
					r.FormValue("subject_token_type") != "urn:ietf:params:oauth:token-type:mtls" ||
					r.FormValue("subject_token") != string(wantSubject) || r.FormValue("audience") != poolAudience {
					t.Errorf("STS request %v", r.PostForm)
					http.Error(w, "bad exchange", http.StatusBadRequest)
					return
				}
				stsCalls.Add(1)
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"access_token":%q,"issued_token_type":"urn:ietf:params:oauth:token-type:access_token","token_type":"Bearer","expires_in":3600}`, iamfake.Token)
			}))
			sts.TLS = &tls.Config{Certificates: []tls.Certificate{pki.server}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pki.pool}
			sts.StartTLS()
			defer sts.Close()
			fake := iamfake.Start(t)
			fake.AddAccount(requester)
			creds := filepath.Join(t.TempDir(), "external-account.json")
			writeJSON(t, creds, map[string]any{
				"type":               "external_account",
				"audience":           poolAudience,
				"subject_token_type": "urn:ietf:params:oauth:token-type:mtls",
				"token_url":          sts.URL + "/v1/token",
				"credential_source":  map[string]any{"certificate": tc.certificate},
			})
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
			b := lease("x509", time.Hour)
			if err := g.Grant(context.Background(), b); err != nil {
				t.Fatal(err)
			}
			check(t, fake.Policy(requester).Bindings, want(b))
			if n := stsCalls.Load(); n != 1 {
				t.Errorf("STS called %d times, want 1", n)
			}
		})
	}
}

// runX509Child runs TestX509WorkloadIdentityFederation in a new process of this test binary
// that trusts only a test CA, and fails t with that process's output if it fails.
func runX509Child(t *testing.T) {
	switch runtime.GOOS {
	case "windows", "darwin", "ios", "android", "plan9", "js", "wasip1":
		t.Skipf("SSL_CERT_FILE does not set the system roots on %s", runtime.GOOS)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestX509WorkloadIdentityFederation$", "-test.count=1", "-test.v", "-test.timeout=90s")
	cmd.Env = append(os.Environ(), x509ChildEnv+"="+dir, "SSL_CERT_FILE="+filepath.Join(dir, "ca.pem"), "SSL_CERT_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the X.509 test process failed (%v):\n%s", err, out)
	}
	if n := strings.Count(string(out), "--- PASS: TestX509WorkloadIdentityFederation/"); n != 4 {
		t.Fatalf("the X.509 test process passed %d cases, want 4:\n%s", n, out)
	}
}

// testPKI is a CA, a server certificate for 127.0.0.1 and a client certificate it issued.
type testPKI struct {
	ca         *x509.Certificate
	pool       *x509.CertPool
	server     tls.Certificate
	client     tls.Certificate
	clientLeaf *x509.Certificate
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tfstackplan test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(serial int64, tmpl *x509.Certificate) (tls.Certificate, *x509.Certificate) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = ca.NotBefore, ca.NotAfter
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, leaf
	}
	server, _ := issue(2, &x509.Certificate{Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	client, clientLeaf := issue(3, &x509.Certificate{Subject: pkix.Name{CommonName: "workload"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return testPKI{ca: ca, pool: pool, server: server, client: client, clientLeaf: clientLeaf}
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
