package gauth

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestParseServerURL(t *testing.T) {
	for raw, want := range map[string]string{
		"https://cp.example.com":         "",
		"http://127.0.0.1:8080/base/":    "",
		"ftp://cp.example.com":           "scheme must be http or https",
		"https://":                       "has no host",
		"https://user:pw@cp.example.com": "must not carry credentials",
		"https://cp.example.com/?a=1":    "must not have a query or fragment",
		"https://cp.example.com/#x":      "must not have a query or fragment",
		"http://[::1":                    "malformed",
	} {
		_, err := ParseServerURL(raw)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("ParseServerURL(%q) = %v, want %q", raw, err, want)
		}
	}
}

// The token goes to the configured origin only; a token that cannot be minted sends nothing.
func TestTransportSendsTheTokenOnlyToItsOrigin(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Host+" "+r.Header.Get("Authorization"))
	}))
	defer srv.Close()
	origin, err := ParseServerURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	other := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1) // same server, another origin
	c := &http.Client{Transport: &Transport{Origin: origin, Token: Static("s3cret"), Next: http.DefaultTransport}}
	for _, u := range []string{srv.URL + "/a", other + "/b"} {
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if len(got) != 2 || !strings.HasSuffix(got[0], "Bearer s3cret") || strings.Contains(got[1], "s3cret") {
		t.Fatalf("requests seen %q", got)
	}
	failing := &http.Client{Transport: &Transport{Origin: origin, Next: http.DefaultTransport,
		Token: func(context.Context) (string, error) { return "", errors.New("no credentials") }}}
	_, err = failing.Get(srv.URL + "/c")
	var te *TokenError
	if !errors.As(err, &te) || len(got) != 2 {
		t.Fatalf("err %v, requests %q", err, got)
	}
}
