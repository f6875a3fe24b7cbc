package gauth

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
)

// x509ChildEnv, in the environment of a re-executed test binary, names the directory where
// TestIDTokenFromExternalAccountX509 writes its test CA, the file SSL_CERT_FILE names.
const x509ChildEnv = "TFSTACKPLAN_GAUTH_X509_TEST_DIR"

// An external_account whose credential_source is a client certificate (X.509 workload identity
// federation): the STS requires the certificate in the TLS handshake and takes the certificate
// chain as the subject token; its access token authenticates generateIdToken. Both ways of
// naming the certificate config are covered: use_default_certificate_config (the config file
// GOOGLE_API_CERTIFICATE_CONFIG names) and certificate_config_location.
//
// The library's mTLS client verifies the STS with the system roots, which a process loads once:
// the test runs in a re-executed test binary whose SSL_CERT_FILE is the test CA, written before
// that process makes its first TLS connection.
func TestIDTokenFromExternalAccountX509(t *testing.T) {
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

	const aud, target = "tfstackplan-test", "x509@p.iam.gserviceaccount.com"
	const poolAudience = "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/onprem/providers/x509"
	wantSubject, err := json.Marshal([]string{base64.StdEncoding.EncodeToString(pki.client.Certificate[0])})
	if err != nil {
		t.Fatal(err)
	}
	for name, certificate := range map[string]map[string]any{
		"use_default_certificate_config": {"use_default_certificate_config": true},
		"certificate_config_location":    {"certificate_config_location": certConfig},
	} {
		t.Run(name, func(t *testing.T) {
			isolateADC(t)
			if certificate["use_default_certificate_config"] == true {
				t.Setenv("GOOGLE_API_CERTIFICATE_CONFIG", certConfig)
			} else {
				t.Setenv("GOOGLE_API_CERTIFICATE_CONFIG", filepath.Join(t.TempDir(), "absent.json"))
			}
			idTok := idTokenFor(t, aud)
			var stsCalls, iamMinted atomic.Int32
			sts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 || !r.TLS.PeerCertificates[0].Equal(pki.clientLeaf) ||
					r.FormValue("grant_type") != "urn:ietf:params:oauth:grant-type:token-exchange" ||
					r.FormValue("subject_token_type") != "urn:ietf:params:oauth:token-type:mtls" ||
					r.FormValue("subject_token") != string(wantSubject) || r.FormValue("audience") != poolAudience ||
					r.FormValue("scope") != cloudPlatformScope {
					t.Errorf("STS request %v", r.PostForm)
					http.Error(w, "bad exchange", http.StatusBadRequest)
					return
				}
				stsCalls.Add(1)
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, `{"access_token":"x509-access-token","issued_token_type":"urn:ietf:params:oauth:token-type:access_token","token_type":"Bearer","expires_in":3600}`)
			}))
			sts.TLS = &tls.Config{Certificates: []tls.Certificate{pki.server}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pki.pool}
			sts.StartTLS()
			defer sts.Close()
			iam := iamServer(t, target, func(w http.ResponseWriter, r *http.Request, req generateIDTokenRequest) {
				if r.Header.Get("Authorization") != "Bearer x509-access-token" || req.Audience != aud {
					t.Errorf("generateIdToken: Authorization %q, request %+v", r.Header.Get("Authorization"), req)
					http.Error(w, "bad request", http.StatusBadRequest)
					return
				}
				iamMinted.Add(1)
				fmt.Fprintf(w, `{"token":%q}`, idTok)
			})
			useCredentials(t, map[string]any{
				"type":                              "external_account",
				"audience":                          poolAudience,
				"subject_token_type":                "urn:ietf:params:oauth:token-type:mtls",
				"token_url":                         sts.URL + "/v1/token",
				"credential_source":                 map[string]any{"certificate": certificate},
				"service_account_impersonation_url": iam.URL + "/v1/projects/-/serviceAccounts/" + target + ":generateAccessToken",
			})

			tf, err := minter{iamBase: iam.URL}.tokenFunc(aud)
			if err != nil {
				t.Fatalf("tokenFunc: %v", err)
			}
			mintTwice(t, tf, idTok)
			if s, n := stsCalls.Load(), iamMinted.Load(); s != 1 || n != 1 {
				t.Errorf("STS called %d times, generateIdToken %d times; want 1 and 1", s, n)
			}
		})
	}
}

// runX509Child runs TestIDTokenFromExternalAccountX509 in a new process of this test binary
// that trusts only a test CA, and fails t with that process's output if it fails.
func runX509Child(t *testing.T) {
	switch runtime.GOOS {
	case "windows", "darwin", "ios", "android", "plan9", "js", "wasip1":
		t.Skipf("SSL_CERT_FILE does not set the system roots on %s", runtime.GOOS)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestIDTokenFromExternalAccountX509$", "-test.count=1", "-test.v", "-test.timeout=90s")
	cmd.Env = append(os.Environ(), x509ChildEnv+"="+dir, "SSL_CERT_FILE="+filepath.Join(dir, "ca.pem"), "SSL_CERT_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the X.509 test process failed (%v):\n%s", err, out)
	}
	for _, sub := range []string{"use_default_certificate_config", "certificate_config_location"} {
		if !strings.Contains(string(out), "--- PASS: TestIDTokenFromExternalAccountX509/"+sub) {
			t.Fatalf("the X.509 test process did not pass %s:\n%s", sub, out)
		}
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
