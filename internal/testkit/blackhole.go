package testkit

import (
	"net"
	"sync"
)

// BlackHole listens on 127.0.0.1 and accepts connections it never answers, until the function
// it hands to cleanup (t.Cleanup, testscript's Defer) runs; it returns the address. A client
// of it waits until its own deadline: a server that is up but hangs.
func BlackHole(cleanup func(func())) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String(), nil
}
