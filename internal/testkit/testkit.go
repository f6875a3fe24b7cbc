// Package testkit holds the helpers that the tests of several packages share: a buffer
// goroutines write while a test reads it, JSON Web Tokens signed or left unsigned, and an
// OpenID Connect issuer that mints them. Only _test.go files import it.
package testkit

import (
	"bytes"
	"crypto"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net"
	"sync"
	"testing"
)

// SyncBuffer is a bytes.Buffer that goroutines (a server, a command) may write while a test
// reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// B64JSON is v as JSON in unpadded base64url, a JWT segment.
func B64JSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// UnsignedJWT is a token of RS256 shape carrying claims and a signature nothing verifies: for
// code that only reads a token's claims (its expiry, say) and passes it on.
func UnsignedJWT(t testing.TB, claims map[string]any) string {
	t.Helper()
	return B64JSON(t, map[string]string{"alg": "RS256", "typ": "JWT"}) + "." + B64JSON(t, claims) + ".c2ln"
}

// SignRS256 is a JWT carrying claims, signed with key under the header {alg RS256, kid, typ JWT}.
func SignRS256(t testing.TB, key *rsa.PrivateKey, kid string, claims map[string]any) string {
	t.Helper()
	head := B64JSON(t, map[string]string{"alg": "RS256", "kid": kid, "typ": "JWT"}) + "." + B64JSON(t, claims)
	sum := sha256.Sum256([]byte(head))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return head + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// JWK is key's public half as an entry of a JSON Web Key Set, for RS256 signatures under kid.
func JWK(kid string, key *rsa.PublicKey) map[string]string {
	return map[string]string{
		"kty": "RSA", "alg": "RS256", "use": "sig", "kid": kid,
		"n": base64.RawURLEncoding.EncodeToString(key.N.Bytes()),
		"e": base64.RawURLEncoding.EncodeToString(big.NewInt(int64(key.E)).Bytes()),
	}
}

// SignHS256 is a JWT carrying claims, signed with HMAC-SHA256 under secret and the header
// {alg HS256, kid, typ JWT}: the shape of an algorithm-confusion attack when secret is an RSA
// public key's modulus.
func SignHS256(t testing.TB, secret []byte, kid string, claims map[string]any) string {
	t.Helper()
	head := B64JSON(t, map[string]string{"alg": "HS256", "kid": kid, "typ": "JWT"}) + "." + B64JSON(t, claims)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(head))
	return head + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// ClosedLoopbackAddr is a 127.0.0.1 address on which nothing listens (a port just released):
// for a metadata server or endpoint that must be unreachable without reaching any other host.
func ClosedLoopbackAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
