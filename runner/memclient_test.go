package runner

import "testing"

// memClient starts a memServer and returns it with a client of it.
func memClient(t *testing.T) (*memServer, *Client) {
	t.Helper()
	m := newMemServer()
	c, err := NewClient(m.start(t).URL)
	if err != nil {
		t.Fatal(err)
	}
	return m, c
}
