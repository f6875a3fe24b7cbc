// Package httpcap bounds the answers an HTTP client reads: the operator commands' answers from
// the control plane, and the server's fetches of OIDC discovery documents and key sets, whose
// libraries read whole bodies into memory.
package httpcap

import (
	"fmt"
	"io"
	"net/http"
)

// Transport returns a RoundTripper that sends requests with next (nil: http.DefaultTransport)
// and fails an answer whose body exceeds max bytes: at once when its Content-Length says so,
// else at the read that goes past max.
func Transport(next http.RoundTripper, max int64) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return capping{next: next, max: max}
}

type capping struct {
	next http.RoundTripper
	max  int64
}

func (c capping) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	if resp.ContentLength > c.max {
		_ = resp.Body.Close()
		return nil, fmt.Errorf("%s: the answer of %d bytes exceeds %d bytes", r.URL.Redacted(), resp.ContentLength, c.max)
	}
	resp.Body = &cappedBody{ReadCloser: resp.Body, left: c.max, max: c.max}
	return resp, nil
}

// cappedBody fails a read past its limit rather than buffer an unbounded answer.
type cappedBody struct {
	io.ReadCloser
	left, max int64
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a body that is too long from one that ends exactly at the limit.
		var one [1]byte
		if n, err := b.ReadCloser.Read(one[:]); n == 0 {
			return 0, err
		}
		return 0, fmt.Errorf("the answer exceeds %d bytes", b.max)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}
