// Package gcreds answers questions about Google credentials JSON that decide how the
// credentials must be loaded, for the packages that load them (internal/gauth for ID tokens,
// the gcp-iam granter for IAM calls).
package gcreds

import "encoding/json"

// X509Source reports whether the credentials JSON b signs in with a client certificate (X.509
// workload identity federation): an external_account whose credential_source is a
// certificate, or an impersonated_service_account whose source_credentials is one.
//
// Such credentials must be loaded without an HTTP client of the caller's: given one, Google's
// library sends the STS exchange of a use_default_certificate_config source through it, with
// no certificate to present; given none, it makes its own mTLS client from the certificate
// config. That client follows redirects. The STS exchange it posts holds the public
// certificate chain only (the private key proves itself in the TLS handshake), but with
// service account impersonation it also sends generateAccessToken the federated access token,
// which Go's client keeps on a redirect within the same domain and drops on any other.
func X509Source(b []byte) bool {
	var f struct {
		Type             string `json:"type"`
		CredentialSource *struct {
			Certificate *struct{} `json:"certificate"`
		} `json:"credential_source"`
		SourceCredentials json.RawMessage `json:"source_credentials"`
	}
	if json.Unmarshal(b, &f) != nil {
		return false
	}
	switch f.Type {
	case "external_account":
		return f.CredentialSource != nil && f.CredentialSource.Certificate != nil
	case "impersonated_service_account":
		return len(f.SourceCredentials) > 0 && X509Source(f.SourceCredentials)
	}
	return false
}
