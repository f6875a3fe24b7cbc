package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// rawConn opens a TCP connection to ts (127.0.0.1) and writes head to it.
func (ts *testServer) rawConn(t *testing.T, head string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", ts.Listener.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	return c
}

// answerThenClose reads c's answer and then waits for the server to close c, all within limit;
// it returns the status line and the body.
func answerThenClose(t *testing.T, c net.Conn, limit time.Duration) (string, string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(limit))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer within %s: %v", limit, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("%s: the connection stayed open after the answer (%v)", resp.Status, err)
	}
	return resp.Status, string(body)
}

// TestRefusedBeforeTheBody: requests refused on their headers (no credentials, a body declared
// too large, not JSON, a sign-in without its anti-forgery cookie) are answered at once and their
// connection closed, without waiting for the body they announced.
func TestRefusedBeforeTheBody(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	post := func(path, auth, contentType string, length int) string {
		return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: %s\r\nContent-Length: %d\r\n\r\n{", path, auth, contentType, length)
	}
	bearer := "Authorization: Bearer " + tokenOf["runner"] + "\r\n"
	for name, tc := range map[string]struct{ head, status string }{
		"no credentials":             {post(BasePath+"/events/log", "", "application/json", 1<<20), "401"},
		"no credentials, small body": {post(BasePath+"/events/log", "", "application/json", 100), "401"},
		"bad credentials":            {post(BasePath+"/events/log", "Authorization: Bearer nope\r\n", "application/json", 1<<20), "401"},
		"declared too large":         {post(BasePath+"/events/phase", bearer, "application/json", MaxEventBody+1), "400"},
		"not JSON":                   {post(BasePath+"/events/phase", bearer, "text/plain", 100), "415"},
		"sign-in, no cookie":         {post("/ui/login", "", "application/x-www-form-urlencoded", 100), "403"},
		"sign-in, not a form":        {post("/ui/login", "", "application/json", 100), "415"},
	} {
		t.Run(name, func(t *testing.T) {
			status, body := answerThenClose(t, ts.rawConn(t, tc.head), 3*time.Second)
			if !strings.HasPrefix(status, tc.status) {
				t.Fatalf("status %q (%s), want %s", status, body, tc.status)
			}
		})
	}
}

// TestSlowBodiesAndHeadersAreCutOff: an authenticated body (and a sign-in form) that does not
// arrive within BodyTimeout is answered 408 and its connection closed; headers that do not
// arrive within HeaderTimeout close the connection.
func TestSlowBodiesAndHeadersAreCutOff(t *testing.T) {
	const bound = 300 * time.Millisecond
	ts := newTestServer(t, storetest.OpenSQLite(t), func(c *Config) { c.BodyTimeout, c.HeaderTimeout = bound, bound })
	csrf, cookie := ts.signInForm(t)
	heads := map[string]string{
		"API body": "POST " + BasePath + "/events/phase HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tokenOf["runner"] +
			"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"execution_id\":",
		"sign-in body": "POST /ui/login HTTP/1.1\r\nHost: x\r\nCookie: " + cookie.Name + "=" + cookie.Value +
			"\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\ncsrf=" + csrf,
	}
	for name, head := range heads {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			status, body := answerThenClose(t, ts.rawConn(t, head), 10*bound)
			if !strings.HasPrefix(status, "408") || time.Since(start) < bound {
				t.Fatalf("after %s: %s %s, want 408 after %s", time.Since(start), status, body, bound)
			}
		})
	}
	t.Run("headers", func(t *testing.T) {
		c := ts.rawConn(t, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
		_ = c.SetReadDeadline(time.Now().Add(10 * bound))
		if _, err := io.ReadAll(c); err != nil {
			t.Fatalf("connection with unfinished headers not closed within %s: %v", 10*bound, err)
		}
	})
}

// TestConnectionCapKeepsHealthzAnswering: a few hundred requests in progress (authenticated
// bodies that never arrive) fill the connection cap, and no connection is idle to give way;
// /healthz still answers ok, other requests get a prompt 503, the server never serves more
// connections than the cap, and it serves normally once they go.
func TestConnectionCapKeepsHealthzAnswering(t *testing.T) {
	const maxConns, attackers = 20, 300
	ts := newTestServer(t, storetest.OpenSQLite(t), func(c *Config) {
		c.MaxConns, c.ConnHeadroom, c.BodyTimeout = maxConns, 2*attackers, time.Minute
	})
	var mu sync.Mutex
	var slow []net.Conn
	var wg sync.WaitGroup
	for range attackers {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", ts.Listener.Addr().String(), 5*time.Second)
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "POST "+BasePath+"/events/phase HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+tokenOf["runner"]+
				"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
			mu.Lock()
			slow = append(slow, c)
			mu.Unlock()
		})
	}
	wg.Wait()
	closeSlow := sync.OnceFunc(func() {
		for _, c := range slow {
			_ = c.Close()
		}
	})
	defer closeSlow()
	if len(slow) < attackers/2 {
		t.Fatalf("only %d of %d slow connections opened", len(slow), attackers)
	}
	deadline := time.Now().Add(10 * time.Second)
	for gaugeValue(t, ts.srv, "tfstackplan_http_connections") < maxConns || gaugeValue(t, ts.srv, "tfstackplan_http_waiting_connections") > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the slow requests never filled the cap")
		}
		time.Sleep(10 * time.Millisecond)
	}
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 5 {
		resp, err := client.Get(ts.URL + "/healthz")
		if err != nil {
			t.Fatalf("healthz %d with the cap full: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "ok\n" {
			t.Fatalf("healthz %d with the cap full: %d %q", i, resp.StatusCode, body)
		}
	}
	resp, err := client.Get(ts.URL + BasePath + "/claims")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "connection limit") {
		t.Fatalf("API call with the cap full: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if n := gaugeValue(t, ts.srv, "tfstackplan_http_connections"); n > maxConns {
		t.Fatalf("%v connections served, cap %d", n, maxConns)
	}
	closeSlow()
	for i := 0; ; i++ {
		if status, _, _ := ts.call(t, "viewer", "GET", "/claims", nil); status == 200 {
			break
		}
		if i > 200 {
			t.Fatal("the server did not serve again after the slow connections closed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dialFrom opens a connection to ts from the loopback address local (any of 127.0.0.0/8).
func (ts *testServer) dialFrom(t *testing.T, local string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	c, err := d.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// healthzThenIdle asks c for /healthz, reads the answer and leaves c open, idle.
func healthzThenIdle(c net.Conn) error {
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// closedByServer reports whether the server closed c (within limit).
func closedByServer(c net.Conn, limit time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(limit))
	_, err := c.Read(make([]byte, 1))
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// TestIdleConnectionsDoNotShutOutCallers is the hostile client of the connection limits: 5,000
// connections, from 100 addresses, each send GET /healthz and then idle, more than the server
// serves at once. API calls with credentials still succeed, every one: a new connection takes
// the place of the oldest idle one.
func TestIdleConnectionsDoNotShutOutCallers(t *testing.T) {
	if testing.Short() {
		t.Skip("5,000 connections")
	}
	const attackers, addrs, maxConns = 5000, 100, 4096
	ts := newTestServer(t, storetest.OpenSQLite(t), func(c *Config) {
		c.MaxConns, c.UnauthIdleTimeout = maxConns, 10*time.Minute // eviction, not the idle timeout, is what is shown
	})
	var opened atomic.Int64
	var wg sync.WaitGroup
	work := make(chan int)
	for range 50 {
		wg.Go(func() {
			for i := range work {
				d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(1+i%addrs))}}
				c, err := d.Dial("tcp", ts.Listener.Addr().String())
				if err != nil {
					continue
				}
				t.Cleanup(func() { _ = c.Close() })
				if healthzThenIdle(c) == nil {
					opened.Add(1)
				}
			}
		})
	}
	for i := range attackers {
		work <- i
	}
	close(work)
	wg.Wait()
	if n := opened.Load(); n < attackers*9/10 {
		t.Fatalf("only %d of %d idle connections were answered", n, attackers)
	}
	if n := gaugeValue(t, ts.srv, "tfstackplan_http_connections"); n != maxConns {
		t.Fatalf("%v connections served after the attack, want the cap %d", n, maxConns)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 20 {
		req, _ := http.NewRequest("GET", ts.URL+BasePath+"/claims", nil)
		req.Header.Set("Authorization", "Bearer "+tokenOf["viewer"])
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("API call %d among 5,000 idle connections: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("API call %d among 5,000 idle connections: %d %s", i, resp.StatusCode, body)
		}
	}
	if n := counterValue(t, ts.srv, "tfstackplan_http_evicted_connections_total", "cap"); n < attackers-maxConns {
		t.Errorf("%v idle connections gave way, want at least %d", n, attackers-maxConns)
	}
}

// An address holds at most MaxConnsPerAddr unauthenticated connections: its next one takes the
// place of its oldest idle one. Another address is not touched.
func TestUnauthenticatedConnectionsPerAddress(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), func(c *Config) { c.MaxConnsPerAddr, c.UnauthIdleTimeout = 3, time.Minute })
	other := ts.dialFrom(t, "127.0.0.3")
	must(t, healthzThenIdle(other))
	var conns []net.Conn
	for range 3 {
		c := ts.dialFrom(t, "127.0.0.2")
		must(t, healthzThenIdle(c))
		conns = append(conns, c)
	}
	// The server marks a connection idle after its answer is out: wait until it saw all four.
	deadline := time.Now().Add(10 * time.Second)
	for gaugeValue(t, ts.srv, "tfstackplan_http_waiting_connections") < 4 {
		if time.Now().After(deadline) {
			t.Fatal("the connections never became idle")
		}
		time.Sleep(5 * time.Millisecond)
	}
	fourth := ts.dialFrom(t, "127.0.0.2")
	must(t, healthzThenIdle(fourth))
	if !closedByServer(conns[0], 5*time.Second) {
		t.Error("the address's oldest idle connection was not closed for its fourth")
	}
	for _, c := range append(conns[1:], other) {
		if closedByServer(c, 100*time.Millisecond) {
			t.Errorf("connection %s→%s was closed too", c.LocalAddr(), c.RemoteAddr())
		}
	}
}

// An unauthenticated connection may idle for UnauthIdleTimeout; one that carried an
// authenticated request keeps the longer IdleTimeout.
func TestUnauthenticatedIdleTimeout(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), func(c *Config) { c.UnauthIdleTimeout, c.IdleTimeout = 200*time.Millisecond, time.Minute })
	anon := ts.rawConn(t, "")
	must(t, healthzThenIdle(anon))
	authed := ts.rawConn(t, "")
	if _, err := io.WriteString(authed, "GET "+BasePath+"/claims HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+tokenOf["viewer"]+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(authed), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("authenticated request: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if !closedByServer(anon, 5*time.Second) {
		t.Error("an idle unauthenticated connection outlived UnauthIdleTimeout")
	}
	if closedByServer(authed, time.Second) {
		t.Error("an idle authenticated connection was closed after UnauthIdleTimeout")
	}
}

// A principal's requests in progress are bounded: bodies that never arrive take at most
// MaxRequestsPerPrincipal of them, its next request is answered 429, and another principal is
// served.
func TestSlowBodiesBoundedPerPrincipal(t *testing.T) {
	const limit = 3
	ts := newTestServer(t, storetest.OpenSQLite(t), func(c *Config) { c.MaxRequestsPerPrincipal, c.BodyTimeout = limit, time.Minute })
	for range limit {
		ts.rawConn(t, "POST "+BasePath+"/events/phase HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+tokenOf["runner"]+
			"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
	}
	deadline := time.Now().Add(30 * time.Second) // generous: a loaded CI machine reads the bodies' headers late
	for {
		status, body, hdr := ts.call(t, "runner", "GET", "/claims", nil)
		if status == 429 {
			if hdr.Get("Retry-After") == "" || !strings.Contains(fmt.Sprint(body["message"]), "in progress") {
				t.Errorf("429 without Retry-After or reason: %v %v", hdr, body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the runner's %d slow bodies never filled its share: %d %v", limit, status, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if status, body, _ := ts.call(t, "viewer", "GET", "/claims", nil); status != 200 {
		t.Fatalf("another principal: %d %v", status, body)
	}
}

// gaugeValue reads one unlabelled metric of s.
func gaugeValue(t *testing.T, s *Server, name string) float64 {
	t.Helper()
	mfs, err := s.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// counterValue reads the counter of s named name whose one label has value label.
func counterValue(t *testing.T, s *Server, name, label string) float64 {
	t.Helper()
	mfs, err := s.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
