package httpcap

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

func TestTransport(t *testing.T) {
	const max = 1000
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		if r.URL.Query().Get("declare") == "" {
			w.Header().Set("Transfer-Encoding", "chunked") // no Content-Length to refuse it by
		}
		_, _ = w.Write([]byte(strings.Repeat("x", n)))
	}))
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: Transport(nil, max)}
	for _, tc := range []struct {
		query string
		want  string // "" : read whole
	}{
		{"n=0", ""},
		{"n=999", ""},
		{"n=1000", ""},
		{"n=1001", "the answer exceeds 1000 bytes"},
		{"n=100000", "the answer exceeds 1000 bytes"},
		{"n=1000&declare=1", ""},
		{"n=1001&declare=1", "the answer of 1001 bytes exceeds 1000 bytes"},
	} {
		resp, err := client.Get(srv.URL + "?" + tc.query)
		if err == nil {
			var body []byte
			body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && len(body) > max {
				t.Fatalf("%s: read %d bytes", tc.query, len(body))
			}
		}
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.query, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: err %v, want %q", tc.query, err, tc.want)
		}
	}
}
