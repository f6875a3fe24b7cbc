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

// TestConnectionCapKeepsHealthzAnswering: a few hundred connections that never finish their
// headers fill the connection cap; /healthz still answers ok, other requests get a prompt 503,
// the server never serves more connections than the cap, and it serves normally once they go.
func TestConnectionCapKeepsHealthzAnswering(t *testing.T) {
	const maxConns, attackers = 20, 300
	ts := newTestServer(t, storetest.OpenSQLite(t), func(c *Config) {
		c.MaxConns, c.ConnHeadroom, c.HeaderTimeout = maxConns, 2*attackers, time.Minute
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
			_, _ = io.WriteString(c, "POST "+BasePath+"/events/log HTTP/1.1\r\nHost: x\r\n")
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
	for gaugeValue(t, ts.srv, "tfstackplan_http_connections") < maxConns {
		if time.Now().After(deadline) {
			t.Fatalf("the slow connections never filled the cap")
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
