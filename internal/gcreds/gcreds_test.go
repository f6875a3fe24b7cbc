package gcreds

import "testing"

func TestX509Source(t *testing.T) {
	const x509 = `{"type":"external_account","credential_source":{"certificate":{"use_default_certificate_config":true}}}`
	for _, tc := range []struct {
		json string
		want bool
	}{
		{x509, true},
		{`{"type":"external_account","credential_source":{"certificate":{}}}`, true},
		{`{"type":"impersonated_service_account","source_credentials":` + x509 + `}`, true},
		{`{"type":"impersonated_service_account","source_credentials":{"type":"impersonated_service_account","source_credentials":` + x509 + `}}`, true},
		{`{"type":"external_account","credential_source":{"url":"http://127.0.0.1/token"}}`, false},
		{`{"type":"external_account","credential_source":{"certificate":null}}`, false},
		{`{"type":"external_account"}`, false},
		{`{"type":"service_account","credential_source":{"certificate":{}}}`, false},
		{`{"type":"impersonated_service_account","source_credentials":{"type":"service_account"}}`, false},
		{`{"type":"impersonated_service_account"}`, false},
		{`not json`, false},
		{``, false},
	} {
		if got := X509Source([]byte(tc.json)); got != tc.want {
			t.Errorf("X509Source(%s) = %v, want %v", tc.json, got, tc.want)
		}
	}
}
