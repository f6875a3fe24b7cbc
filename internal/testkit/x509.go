package testkit

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

// X509PoolAudience is the workload identity pool provider the X.509 STS expects as audience.
const X509PoolAudience = "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/onprem/providers/x509"

// x509ChildEnv, in the environment of a test binary InX509Child re-executes, names the
// directory that holds the test CA SSL_CERT_FILE names.
const x509ChildEnv = "TFSTACKPLAN_TESTKIT_X509_DIR"

// InX509Child runs the test t (a top-level test) again in a new process of the test binary
// whose system roots are a test CA only, and reports whether t is that process. Google's
// library verifies an STS with the system roots, which a process loads once, at its first TLS
// connection: the child's SSL_CERT_FILE names a file NewX509Workload writes before that. The
// parent fails t with the child's output unless the child passed every name in wantPass (its
// subtests, as t.Run was given them). On systems where SSL_CERT_FILE does not set the roots, t is skipped.
func InX509Child(t *testing.T, wantPass ...string) bool {
	t.Helper()
	if os.Getenv(x509ChildEnv) != "" {
		return true
	}
	switch runtime.GOOS {
	case "windows", "darwin", "ios", "android", "plan9", "js", "wasip1":
		t.Skipf("SSL_CERT_FILE does not set the system roots on %s", runtime.GOOS)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v", "-test.timeout=90s")
	cmd.Env = append(os.Environ(), x509ChildEnv+"="+dir, "SSL_CERT_FILE="+filepath.Join(dir, "ca.pem"), "SSL_CERT_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the X.509 test process failed (%v):\n%s", err, out)
	}
	for _, sub := range wantPass {
		// go test writes a subtest's spaces as underscores.
		if !strings.Contains(string(out), "--- PASS: "+t.Name()+"/"+strings.ReplaceAll(sub, " ", "_")) {
			t.Fatalf("the X.509 test process did not pass %s:\n%s", sub, out)
		}
	}
	return false
}

// X509Workload is a test CA, a server certificate for 127.0.0.1 and a workload's client
// certificate, as files of a certificate config (the format Google's library reads).
type X509Workload struct {
	// CertConfig is the certificate config file naming the workload's certificate and key.
	CertConfig string

	server     tls.Certificate
	pool       *x509.CertPool
	clientLeaf *x509.Certificate
}

// NewX509Workload makes the certificates and writes them to the directory InX509Child gave
// the process, the CA where SSL_CERT_FILE points. Call it only in the child (InX509Child
// returned true).
func NewX509Workload(t *testing.T) *X509Workload {
	t.Helper()
	dir := os.Getenv(x509ChildEnv)
	if dir == "" {
		t.Fatal("NewX509Workload outside the process InX509Child starts")
	}
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
	issue := func(serial int64, tmpl *x509.Certificate) tls.Certificate {
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
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	}
	w := &X509Workload{
		server: issue(2, &x509.Certificate{Subject: pkix.Name{CommonName: "127.0.0.1"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}),
		pool:       x509.NewCertPool(),
		CertConfig: filepath.Join(dir, "certificate_config.json"),
	}
	w.pool.AddCert(ca)
	client := issue(3, &x509.Certificate{Subject: pkix.Name{CommonName: "workload"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	w.clientLeaf = client.Leaf
	keyDER, err := x509.MarshalPKCS8PrivateKey(client.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "workload.pem"), filepath.Join(dir, "workload-key.pem")
	writeFile(t, filepath.Join(dir, "ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))
	writeFile(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: client.Certificate[0]}))
	writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	config, err := json.Marshal(map[string]any{"cert_configs": map[string]any{"workload": map[string]string{"cert_path": certFile, "key_path": keyFile}}})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, w.CertConfig, config)
	return w
}

// StartSTS starts an STS on 127.0.0.1, closed when t ends, that requires the workload's
// certificate in the TLS handshake and exchanges it (the subject token is its certificate
// chain) for accessToken, for X509PoolAudience and, when scope is not empty, that scope. It
// returns the token URL and the count of exchanges it granted; it fails t on any other request.
func (w *X509Workload) StartSTS(t *testing.T, scope, accessToken string) (tokenURL string, granted *atomic.Int32) {
	t.Helper()
	subject, err := json.Marshal([]string{base64.StdEncoding.EncodeToString(w.clientLeaf.Raw)})
	if err != nil {
		t.Fatal(err)
	}
	granted = new(atomic.Int32)
	sts := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 || !r.TLS.PeerCertificates[0].Equal(w.clientLeaf) ||
			r.FormValue("grant_type") != "urn:ietf:params:oauth:grant-type:token-exchange" ||
			r.FormValue("subject_token_type") != "urn:ietf:params:oauth:token-type:mtls" ||
			r.FormValue("subject_token") != string(subject) || r.FormValue("audience") != X509PoolAudience ||
			(scope != "" && r.FormValue("scope") != scope) {
			t.Errorf("STS request %v", r.PostForm)
			http.Error(rw, "bad exchange", http.StatusBadRequest)
			return
		}
		granted.Add(1)
		rw.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(rw, `{"access_token":%q,"issued_token_type":"urn:ietf:params:oauth:token-type:access_token","token_type":"Bearer","expires_in":3600}`, accessToken)
	}))
	sts.TLS = w.ServerTLS()
	sts.StartTLS()
	t.Cleanup(sts.Close)
	return sts.URL + "/v1/token", granted
}

// ServerTLS is the TLS configuration of a server on 127.0.0.1 that the child process trusts and
// that requires the workload's client certificate.
func (w *X509Workload) ServerTLS() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{w.server}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: w.pool}
}

// ExternalAccount returns an external_account credentials object signing in at tokenURL with
// the workload's certificate, which certificate (the credential_source's certificate object)
// names.
func (w *X509Workload) ExternalAccount(tokenURL string, certificate map[string]any) map[string]any {
	return map[string]any{
		"type":               "external_account",
		"audience":           X509PoolAudience,
		"subject_token_type": "urn:ietf:params:oauth:token-type:mtls",
		"token_url":          tokenURL,
		"credential_source":  map[string]any{"certificate": certificate},
	}
}

// UseCertConfig points GOOGLE_API_CERTIFICATE_CONFIG, for the rest of t, at the workload's
// certificate config when certificate asks for the default one, else at a file that does not
// exist, so that only certificate_config_location can find it.
func (w *X509Workload) UseCertConfig(t *testing.T, certificate map[string]any) {
	if certificate["use_default_certificate_config"] == true {
		t.Setenv("GOOGLE_API_CERTIFICATE_CONFIG", w.CertConfig)
	} else {
		t.Setenv("GOOGLE_API_CERTIFICATE_CONFIG", filepath.Join(t.TempDir(), "absent.json"))
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
