package gauth

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

// An external_account whose credential_source is a client certificate (X.509 workload identity
// federation): the STS requires the certificate in the TLS handshake and takes the certificate
// chain as the subject token; its access token authenticates generateIdToken. Both ways of
// naming the certificate config are covered: use_default_certificate_config (the config file
// GOOGLE_API_CERTIFICATE_CONFIG names) and certificate_config_location. The test runs in a
// process that trusts the test CA (testkit.InX509Child).
func TestIDTokenFromExternalAccountX509(t *testing.T) {
	cases := []struct {
		name         string
		impersonated bool // the certificate signs in the source_credentials of an impersonated_service_account
		certificate  map[string]any
	}{
		{"use_default_certificate_config", false, map[string]any{"use_default_certificate_config": true}},
		{"certificate_config_location", false, map[string]any{"certificate_config_location": ""}},
		{"impersonated, use_default_certificate_config", true, map[string]any{"use_default_certificate_config": true}},
		{"impersonated, certificate_config_location", true, map[string]any{"certificate_config_location": ""}},
	}
	var names []string
	for _, tc := range cases {
		names = append(names, tc.name)
	}
	if !testkit.InX509Child(t, names...) {
		return
	}
	w := testkit.NewX509Workload(t)
	const aud, target = "tfstackplan-test", "x509@p.iam.gserviceaccount.com"
	for _, tc := range cases {
		certificate := tc.certificate
		if _, ok := certificate["certificate_config_location"]; ok {
			certificate["certificate_config_location"] = w.CertConfig
		}
		t.Run(tc.name, func(t *testing.T) {
			isolateADC(t)
			w.UseCertConfig(t, certificate)
			idTok := idTokenFor(t, aud)
			tokenURL, stsGranted := w.StartSTS(t, cloudPlatformScope, "x509-access-token")
			var iamMinted atomic.Int32
			iam := iamServer(t, target, func(w http.ResponseWriter, r *http.Request, req generateIDTokenRequest) {
				if r.Header.Get("Authorization") != "Bearer x509-access-token" || req.Audience != aud {
					t.Errorf("generateIdToken: Authorization %q, request %+v", r.Header.Get("Authorization"), req)
					http.Error(w, "bad request", http.StatusBadRequest)
					return
				}
				iamMinted.Add(1)
				fmt.Fprintf(w, `{"token":%q}`, idTok)
			})
			creds := w.ExternalAccount(tokenURL, certificate)
			impersonation := iam.URL + "/v1/projects/-/serviceAccounts/" + target + ":generateAccessToken"
			if tc.impersonated {
				creds = map[string]any{"type": "impersonated_service_account", "service_account_impersonation_url": impersonation, "source_credentials": creds}
			} else {
				creds["service_account_impersonation_url"] = impersonation
			}
			useCredentials(t, creds)

			tf, err := minter{iamBase: iam.URL}.tokenFunc(aud)
			if err != nil {
				t.Fatalf("tokenFunc: %v", err)
			}
			mintTwice(t, tf, idTok)
			if s, n := stsGranted.Load(), iamMinted.Load(); s != 1 || n != 1 {
				t.Errorf("STS called %d times, generateIdToken %d times; want 1 and 1", s, n)
			}
		})
	}
}
