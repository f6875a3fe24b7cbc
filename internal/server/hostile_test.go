package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// atoi is the status code of a status line ("400 Bad Request").
func atoi(status string) int {
	n, _ := strconv.Atoi(strings.Fields(status)[0])
	return n
}

// TestHostileRequests: oversized headers, bodies past each route's limit (declared or streamed),
// bodies that are not JSON, JSON nested without end and unknown paths are each refused with a
// 4xx that says why, and no answer carries more than its message.
func TestHostileRequests(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	send := func(method, path, contentType string, body io.Reader, length int64, header map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, body)
		req.ContentLength = length
		req.Header.Set("Authorization", "Bearer "+tokenOf["admin"])
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	expect := func(what string, status int, body string, want int, mention string) {
		t.Helper()
		if status != want || !strings.Contains(body, mention) || strings.Contains(body, "goroutine") || strings.Contains(body, ".go:") {
			t.Errorf("%s: %d %.300s, want %d mentioning %q", what, status, body, want, mention)
		}
	}

	status, body := send("GET", BasePath+"/claims", "", nil, 0, map[string]string{"X-Big": strings.Repeat("a", MaxHeaderBytes+4096)})
	expect("oversized header", status, body, 431, "Header")
	status, body = send("GET", BasePath+"/claims?environment="+strings.Repeat("a", MaxHeaderBytes+4096), "", nil, 0, nil)
	expect("oversized query", status, body, 431, "Header")

	for key, rt := range routes {
		method, path, _ := strings.Cut(key, " ")
		if rt.body == nil {
			continue
		}
		path = BasePath + path
		limit := fmt.Sprintf("limit for %s is %d bytes", rt.op, rt.limit)
		// Refused on its headers: the answer comes before the body is sent.
		line, body := answerThenClose(t, ts.rawConn(t, fmt.Sprintf("%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"+
			"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n", method, path, tokenOf["admin"], rt.limit+1)), 5*time.Second)
		expect(key+" declared past its limit", atoi(line), body, 400, limit)
		huge := bytes.Repeat([]byte(" "), int(rt.limit)+1)
		status, body = send(method, path, "application/json", io.MultiReader(bytes.NewReader(huge), strings.NewReader("{}")), -1, nil)
		expect(key+" streamed past its limit", status, body, 400, limit)
		for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/json-seq"} {
			status, body = send(method, path, ct, strings.NewReader("{}"), 2, nil)
			expect(fmt.Sprintf("%s as %q", key, ct), status, body, 415, "application/json")
		}
		deep := strings.Repeat("[", 20000) + strings.Repeat("]", 20000)
		status, body = send(method, path, "application/json; charset=utf-8", strings.NewReader(deep), int64(len(deep)), nil)
		expect(key+" nested JSON", status, body, 400, "INVALID_ARGUMENT")
	}
	status, body = send("POST", "/ui/login", "application/x-www-form-urlencoded", bytes.NewReader(make([]byte, 128<<10)), 128<<10, nil)
	expect("sign-in form without its cookie", status, body, 403, "expired")

	status, body = send("GET", BasePath+"/nope", "", nil, 0, nil)
	expect("unknown API path", status, body, 404, "")
	status, body = send("DELETE", BasePath+"/claims", "", nil, 0, nil)
	expect("unknown method", status, body, 405, "")
	// Pages may not be framed by another site (clickjacking the sign-in form).
	resp, err := ts.Client().Get(ts.URL + "/ui/claims")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !strings.Contains(resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'") || resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Errorf("sign-in page may be framed: %v", resp.Header)
	}
	if status, _ := ts.page(t, BasePath+"/nope", ""); status != 401 {
		t.Errorf("unknown API path without credentials: %d, want 401", status)
	}
}

// slowPingStore counts pings and holds each until release is closed.
type slowPingStore struct {
	store.Store
	pings   *atomic.Int32
	release chan struct{}
}

func (s slowPingStore) Ping(ctx context.Context) error {
	s.pings.Add(1)
	select {
	case <-s.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestHealthChecksShareOnePing: a flood of unauthenticated readiness and health checks costs
// the database one ping at a time, not one per check.
func TestHealthChecksShareOnePing(t *testing.T) {
	const checks = 40
	st := slowPingStore{Store: storetest.OpenSQLite(t), pings: &atomic.Int32{}, release: make(chan struct{})}
	ts := newTestServer(t, st, nil)
	var wg sync.WaitGroup
	statuses := make(chan int, checks)
	for i := range checks {
		path := "/readyz"
		if i%2 == 1 {
			path = BasePath + "/health"
		}
		wg.Go(func() {
			status, _ := ts.page(t, path, "")
			statuses <- status
		})
	}
	time.Sleep(300 * time.Millisecond) // every check is waiting on the held ping by now
	close(st.release)
	wg.Wait()
	close(statuses)
	for status := range statuses {
		if status != 200 {
			t.Fatalf("check answered %d", status)
		}
	}
	if n := st.pings.Load(); n > 2 {
		t.Fatalf("%d concurrent checks cost %d pings", checks, n)
	}
}
