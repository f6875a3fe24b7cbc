package runner

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/gauth"
)

// faultServer is a loopback server that misbehaves in one way.
type faultServer struct {
	url  string
	hits atomic.Int32
}

// rawFault serves each accepted connection with handle, on 127.0.0.1.
func rawFault(t testing.TB, handle func(net.Conn)) *faultServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := &faultServer{url: "http://" + ln.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fs.hits.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); handle(c) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return fs
}

// readRequest consumes one HTTP request from c.
func readRequest(c net.Conn) {
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err == nil && req.Body != nil {
		_, _ = req.Body.Read(make([]byte, 1<<16))
	}
}

// blackHole accepts and reads, never answers, until the connection is closed.
func blackHole(c net.Conn) { _, _ = io.Copy(io.Discard, c) }

func httpFault(t *testing.T, h func(w http.ResponseWriter, r *http.Request, hit int32)) *faultServer {
	t.Helper()
	fs := &faultServer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h(w, r, fs.hits.Add(1))
	}))
	t.Cleanup(srv.Close)
	fs.url = srv.URL
	return fs
}

func jsonAnswer(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

func grpcError(status int, code string) func(http.ResponseWriter, *http.Request, int32) {
	return func(w http.ResponseWriter, _ *http.Request, _ int32) {
		jsonAnswer(w, status, fmt.Sprintf(`{"code":%q,"message":"test says %s"}`, code, code))
	}
}

// goodAnswer answers a well-formed 200 for whatever was asked.
func goodAnswer(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, "/gates/check") {
		jsonAnswer(w, 200, `{"requester":"sa@example.iam"}`)
		return
	}
	jsonAnswer(w, 200, `{}`)
}

type faultCase struct {
	name      string
	start     func(t *testing.T) *faultServer
	verdict   VerdictKind
	eventOK   bool // the best-effort call succeeds (e.g. a same-host redirect to a 200)
	minHits   int32
	maxHits   int32
	code      string
	httpsOnly bool
}

func faultCases() []faultCase {
	return []faultCase{
		{name: "connection refused", verdict: VerdictUnreachable, start: func(t *testing.T) *faultServer {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			return &faultServer{url: "http://" + addr}
		}},
		{name: "reset mid-response", verdict: VerdictUnreachable, minHits: 1, start: func(t *testing.T) *faultServer {
			return rawFault(t, func(c net.Conn) {
				readRequest(c)
				_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"requ"))
				if tc, ok := c.(*net.TCPConn); ok {
					_ = tc.SetLinger(0) // RST, not FIN
				}
				c.Close()
			})
		}},
		{name: "black hole", verdict: VerdictUnreachable, minHits: 1, start: func(t *testing.T) *faultServer {
			return rawFault(t, blackHole)
		}},
		{name: "slow drip", verdict: VerdictUnreachable, minHits: 1, start: func(t *testing.T) *faultServer {
			return rawFault(t, func(c net.Conn) {
				readRequest(c)
				_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"))
				for i := 0; i < 100; i++ {
					if _, err := c.Write([]byte(" ")); err != nil {
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			})
		}},
		{name: "500", verdict: VerdictNotSatisfied, code: "INTERNAL", minHits: 2, start: func(t *testing.T) *faultServer {
			return httpFault(t, grpcError(500, "INTERNAL"))
		}},
		{name: "502 html", verdict: VerdictNotSatisfied, minHits: 2, start: func(t *testing.T) *faultServer {
			return httpFault(t, func(w http.ResponseWriter, _ *http.Request, _ int32) {
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(502)
				_, _ = w.Write([]byte("<html>bad gateway</html>"))
			})
		}},
		{name: "503 with Retry-After then recovers", verdict: VerdictSatisfied, eventOK: true, minHits: 2, start: func(t *testing.T) *faultServer {
			return httpFault(t, func(w http.ResponseWriter, r *http.Request, hit int32) {
				if hit%2 == 1 {
					w.Header().Set("Retry-After", "0")
					jsonAnswer(w, 503, `{"code":"UNAVAILABLE","message":"restarting"}`)
					return
				}
				goodAnswer(w, r)
			})
		}},
		{name: "503 with Retry-After beyond the budget", verdict: VerdictUnconfirmable, code: "UNAVAILABLE", minHits: 1, maxHits: 1, start: func(t *testing.T) *faultServer {
			return httpFault(t, func(w http.ResponseWriter, _ *http.Request, _ int32) {
				w.Header().Set("Retry-After", "120")
				jsonAnswer(w, 503, `{"code":"UNAVAILABLE","message":"down for maintenance"}`)
			})
		}},
		{name: "429", verdict: VerdictNotSatisfied, code: "RESOURCE_EXHAUSTED", minHits: 2, start: func(t *testing.T) *faultServer {
			return httpFault(t, func(w http.ResponseWriter, _ *http.Request, _ int32) {
				w.Header().Set("Retry-After", "0")
				jsonAnswer(w, 429, `{"code":"RESOURCE_EXHAUSTED","message":"slow down"}`)
			})
		}},
		{name: "401", verdict: VerdictNotSatisfied, code: "UNAUTHENTICATED", minHits: 1, maxHits: 1, start: func(t *testing.T) *faultServer {
			return httpFault(t, grpcError(401, "UNAUTHENTICATED"))
		}},
		{name: "404", verdict: VerdictNotSatisfied, code: "NOT_FOUND", minHits: 1, maxHits: 1, start: func(t *testing.T) *faultServer {
			return httpFault(t, grpcError(404, "NOT_FOUND"))
		}},
		{name: "failed precondition", verdict: VerdictNotClassified, code: "FAILED_PRECONDITION", maxHits: 1, start: func(t *testing.T) *faultServer {
			return httpFault(t, grpcError(412, "FAILED_PRECONDITION"))
		}},
		{name: "permission denied", verdict: VerdictNotSatisfied, code: "PERMISSION_DENIED", maxHits: 1, start: func(t *testing.T) *faultServer {
			return httpFault(t, grpcError(403, "PERMISSION_DENIED"))
		}},
		{name: "deadline exceeded", verdict: VerdictUnconfirmable, code: "DEADLINE_EXCEEDED", start: func(t *testing.T) *faultServer {
			return httpFault(t, grpcError(504, "DEADLINE_EXCEEDED"))
		}},
		{name: "aborted", verdict: VerdictUnconfirmable, code: "ABORTED", start: func(t *testing.T) *faultServer {
			return httpFault(t, grpcError(409, "ABORTED"))
		}},
		{name: "unknown code", verdict: VerdictNotSatisfied, code: "SOMETHING_NEW", start: func(t *testing.T) *faultServer {
			return httpFault(t, grpcError(418, "SOMETHING_NEW"))
		}},
		{name: "3xx to another host", verdict: VerdictNotSatisfied, start: func(t *testing.T) *faultServer {
			other := httpFault(t, func(w http.ResponseWriter, r *http.Request, _ int32) { goodAnswer(w, r) })
			fs := httpFault(t, func(w http.ResponseWriter, r *http.Request, _ int32) {
				http.Redirect(w, r, other.url+r.URL.Path, http.StatusTemporaryRedirect)
			})
			t.Cleanup(func() {
				if n := other.hits.Load(); n != 0 {
					t.Errorf("the other host was contacted %d times", n)
				}
			})
			return fs
		}},
		{name: "3xx to the same host", verdict: VerdictSatisfied, eventOK: true, start: func(t *testing.T) *faultServer {
			return httpFault(t, func(w http.ResponseWriter, r *http.Request, _ int32) {
				if !strings.HasPrefix(r.URL.Path, "/moved") {
					http.Redirect(w, r, "/moved"+r.URL.Path, http.StatusPermanentRedirect)
					return
				}
				goodAnswer(w, r)
			})
		}},
		{name: "200 malformed body", verdict: VerdictNotSatisfied, start: func(t *testing.T) *faultServer {
			return httpFault(t, func(w http.ResponseWriter, _ *http.Request, _ int32) { jsonAnswer(w, 200, `{"requester": "sa@x", `) })
		}},
		{name: "200 without requester", verdict: VerdictNotSatisfied, eventOK: true, start: func(t *testing.T) *faultServer {
			return httpFault(t, func(w http.ResponseWriter, _ *http.Request, _ int32) { jsonAnswer(w, 200, `{"requester": ""}`) })
		}},
		{name: "200 array", verdict: VerdictNotSatisfied, start: func(t *testing.T) *faultServer {
			return httpFault(t, func(w http.ResponseWriter, _ *http.Request, _ int32) { jsonAnswer(w, 200, `["sa@x"]`) })
		}},
		{name: "204 no content", verdict: VerdictNotSatisfied, start: func(t *testing.T) *faultServer {
			return httpFault(t, func(w http.ResponseWriter, _ *http.Request, _ int32) { w.WriteHeader(204) })
		}},
		{name: "200 huge body", verdict: VerdictNotSatisfied, start: func(t *testing.T) *faultServer {
			return httpFault(t, func(w http.ResponseWriter, _ *http.Request, _ int32) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"requester":"sa@x","pad":"`))
				chunk := []byte(strings.Repeat("x", 64<<10))
				for i := 0; i < 64; i++ { // 4 MiB
					if _, err := w.Write(chunk); err != nil {
						return
					}
				}
				_, _ = w.Write([]byte(`"}`))
			})
		}},
		{name: "wrong content type", verdict: VerdictNotSatisfied, start: func(t *testing.T) *faultServer {
			return httpFault(t, func(w http.ResponseWriter, _ *http.Request, _ int32) {
				w.Header().Set("Content-Type", "text/html")
				_, _ = w.Write([]byte(`{"requester":"sa@x"}`))
			})
		}},
		{name: "TLS handshake failure", verdict: VerdictUnreachable, start: func(t *testing.T) *faultServer {
			srv := httptest.NewTLSServer(http.HandlerFunc(goodAnswer)) // certificate the client does not trust
			t.Cleanup(srv.Close)
			return &faultServer{url: srv.URL}
		}},
	}
}

// fastClient shortens the gate budget so the matrix runs quickly; best-effort budgets stay
// at their real values because they are what the matrix checks.
func fastClient(t *testing.T, url string) *Client {
	t.Helper()
	c, err := NewClientTokenSource(url, gauth.Static("secret-token"))
	if err != nil {
		t.Fatal(err)
	}
	c.gateBudget = 2 * time.Second
	c.gateAttempt = 700 * time.Millisecond
	return c
}

func TestFaultMatrix(t *testing.T) {
	for _, tc := range faultCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fs := tc.start(t)
			gateClient := fastClient(t, fs.url)
			v := gateClient.GateCheck(context.Background(), events.GateCheck{ExecutionID: "apply-1", Environment: "prod", PR: 1})
			if v.Kind != tc.verdict {
				t.Fatalf("GateCheck verdict %v, want %v", v, tc.verdict)
			}
			if v.Allowed() != (tc.verdict == VerdictSatisfied) {
				t.Fatalf("Allowed() = %v for %v", v.Allowed(), v)
			}
			if tc.code != "" && (v.Err == nil || !strings.Contains(v.Err.Error(), tc.code)) {
				t.Errorf("verdict error %v does not carry code %s", v.Err, tc.code)
			}
			if v.Kind != VerdictSatisfied && v.Requester != "" {
				t.Errorf("requester %q leaked on a denial", v.Requester)
			}
			if n := fs.hits.Load(); tc.minHits > 0 && n < tc.minHits || tc.maxHits > 0 && n > tc.maxHits {
				t.Errorf("server hit %d times, want between %d and %d", n, tc.minHits, tc.maxHits)
			}

			// Best-effort: bounded, never panics, error unless the server really said OK.
			c := fastClient(t, fs.url)
			start := time.Now()
			err := c.Phase(context.Background(), events.PhaseEvent{ExecutionID: "e", Stack: "s", Phase: "plan"})
			elapsed := time.Since(start)
			if bound := CallBudget + 500*time.Millisecond; elapsed > bound {
				t.Errorf("best-effort call took %v, bound %v", elapsed, bound)
			}
			if tc.eventOK != (err == nil) {
				t.Errorf("best-effort call error = %v, want success=%v", err, tc.eventOK)
			}
		})
	}
}

// TestDeadServerCostsBoundedTime: after the breaker opens, hundreds of events fail fast.
func TestDeadServerCostsBoundedTime(t *testing.T) {
	fs := rawFault(t, blackHole)
	c, _ := NewClient(fs.url)
	start := time.Now()
	var wg sync.WaitGroup
	var failures atomic.Int32
	for i := 0; i < 300; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if c.Phase(context.Background(), events.PhaseEvent{ExecutionID: "e", Stack: fmt.Sprint(i), Phase: "plan"}) != nil {
				failures.Add(1)
			}
		}(i)
	}
	wg.Wait()
	if failures.Load() != 300 {
		t.Fatalf("%d of 300 events failed against a black hole", failures.Load())
	}
	if elapsed := time.Since(start); elapsed > 2*CallBudget {
		t.Errorf("300 events against a black hole took %v", elapsed)
	}
	if hits := fs.hits.Load(); hits > 2*MaxInFlight {
		t.Errorf("the breaker let %d connections through", hits)
	}
}

// TestBearerOnlyToConfiguredHost: the token reaches the configured host (also across a
// same-host redirect) and never another one.
func TestBearerOnlyToConfiguredHost(t *testing.T) {
	var mu sync.Mutex
	seen := map[string][]string{}
	record := func(who string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen[who] = append(seen[who], r.Header.Get("Authorization")+"|"+r.Header.Get("User-Agent"))
			mu.Unlock()
			goodAnswer(w, r)
		}
	}
	other := httptest.NewServer(record("other"))
	defer other.Close()
	var home *httptest.Server
	home = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/events/phase"):
			http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
		case strings.HasSuffix(r.URL.Path, "/events/update") && !strings.HasPrefix(r.URL.Path, "/again"):
			http.Redirect(w, r, "/again"+r.URL.Path, http.StatusTemporaryRedirect)
		default:
			record("home")(w, r)
		}
	}))
	defer home.Close()

	c, err := NewClientTokenSource(home.URL, gauth.Static("tok-123"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Init(ctx, events.Init{ExecutionID: "e", Environment: "prod", Op: events.OpPlan}); err != nil {
		t.Fatal(err)
	}
	if err := c.Phase(ctx, events.PhaseEvent{ExecutionID: "e", Stack: "s", Phase: "p"}); err == nil {
		t.Error("a redirect to another host must fail the call")
	}
	if err := c.Update(ctx, events.Update{ExecutionID: "e", Stack: "s", Status: events.StackRunning}); err != nil {
		t.Errorf("same-host redirect: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen["other"]) != 0 {
		t.Fatalf("another host received requests: %v", seen["other"])
	}
	if len(seen["home"]) != 2 {
		t.Fatalf("home saw %v", seen["home"])
	}
	for _, h := range seen["home"] {
		if !strings.HasPrefix(h, "Bearer tok-123|tfstackplan/") {
			t.Errorf("home request headers %q lack the bearer or the User-Agent", h)
		}
	}
}

// TestTokenErrorDoesNotReachServer: a token that cannot be minted fails the call locally and
// makes the gate unconfirmable, without sending an unauthenticated request.
func TestTokenErrorDoesNotReachServer(t *testing.T) {
	fs := httpFault(t, func(w http.ResponseWriter, r *http.Request, _ int32) { goodAnswer(w, r) })
	c, _ := NewClientTokenSource(fs.url, func(context.Context) (string, error) { return "", fmt.Errorf("adc broke") })
	if err := c.Phase(context.Background(), events.PhaseEvent{ExecutionID: "e", Stack: "s", Phase: "p"}); err == nil || !strings.Contains(err.Error(), "adc broke") {
		t.Errorf("Phase with a broken token = %v", err)
	}
	if v := c.GateCheck(context.Background(), events.GateCheck{ExecutionID: "a", Environment: "p", PR: 1}); v.Kind != VerdictUnconfirmable {
		t.Errorf("gate with a broken token = %v", v)
	}
	if n := fs.hits.Load(); n != 0 {
		t.Errorf("server was hit %d times without a token", n)
	}
}

// A log post is given time for its size: a server that takes a second to take one in (as
// over a slow uplink) gets a 400 KB post, whose attempts allow for 256 KB/s on top of
// AttemptTimeout, while a small post to it times out on each attempt as any other call does.
func TestLogPostTimeGrowsWithItsSize(t *testing.T) {
	posts, c := slowServer(t)
	big := events.LogChunk{ExecutionID: "e", Stack: "a", Data: bytes.Repeat([]byte("x"), 300<<10)}
	if err := c.LogChunks(context.Background(), []events.LogChunk{big}); err != nil {
		t.Fatalf("a 400 KB post to a server that takes a second: %v", err)
	}
	if n := posts.Load(); n != 1 {
		t.Errorf("%d attempts, want 1", n)
	}
	small := events.LogChunk{ExecutionID: "e", Stack: "a", Data: []byte("x")}
	var te *TransportError
	if err := c.LogChunks(context.Background(), []events.LogChunk{small}); !errors.As(err, &te) {
		t.Fatalf("a small post to a server that takes a second: %v, want a transport error", err)
	}
}

// An Init or a Finalize of thousands of stacks is megabytes: it gets time for its size too.
func TestInitAndFinalizeTimeGrowsWithTheirSize(t *testing.T) {
	posts, c := slowServer(t)
	var stacks []string
	var results []events.StackResult
	for i := range 8000 {
		stacks = append(stacks, fmt.Sprintf("stacks/platform/team-%03d/service-%05d", i%300, i))
		results = append(results, events.StackResult{Stack: stacks[i], Status: "succeeded"})
	}
	if err := c.Init(context.Background(), events.Init{ExecutionID: "e", Environment: "prod", Op: "plan", Stacks: stacks}); err != nil {
		t.Fatalf("a 330 KB Init to a server that takes a second: %v", err)
	}
	if err := c.Finalize(context.Background(), events.Finalize{ExecutionID: "e", Status: "succeeded", Stacks: results}); err != nil {
		t.Fatalf("a 500 KB Finalize to a server that takes a second: %v", err)
	}
	if n := posts.Load(); n != 2 {
		t.Errorf("%d attempts, want 2", n)
	}
	var te *TransportError
	if err := c.Init(context.Background(), events.Init{ExecutionID: "e2", Environment: "prod", Op: "plan", Stacks: stacks[:1]}); !errors.As(err, &te) {
		t.Fatalf("a small Init to a server that takes a second: %v, want a transport error", err)
	}
}

// slowServer answers every request after a second; it counts the requests.
func slowServer(t *testing.T) (*atomic.Int32, *Client) {
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-time.After(time.Second):
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}")
	}))
	t.Cleanup(srv.Close)
	c, err := NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return &posts, c
}

// A gate check of thousands of stacks is megabytes: each attempt gets time for its size too.
// A server taking 1.2 s answers a 400 KB check within its attempt (700 ms + the upload time),
// while a small check still times out: fail-closed, as unreachable.
func TestGateCheckTimeGrowsWithItsSize(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-time.After(1200 * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"requester":"deployer@example.iam.gserviceaccount.com"}`)
	}))
	t.Cleanup(srv.Close)
	c := fastClient(t, srv.URL)
	var stacks []events.StackPlan
	for i := range 4000 {
		stacks = append(stacks, events.StackPlan{Stack: fmt.Sprintf("stacks/platform/service-%05d", i), PlanHash: "v1:" + strings.Repeat("0", 64), Class: "mutating"})
	}
	if v := c.GateCheck(context.Background(), events.GateCheck{ExecutionID: "a", Environment: "prod", PR: 1, SHA: "s", Stacks: stacks}); v.Kind != VerdictSatisfied {
		t.Fatalf("a 400 KB check to a server taking 1.2 s: %v", v)
	}
	if v := c.GateCheck(context.Background(), events.GateCheck{ExecutionID: "a", Environment: "prod", PR: 1, SHA: "s", Stacks: stacks[:1]}); v.Kind != VerdictUnreachable {
		t.Fatalf("a small check to a server taking 1.2 s: %v, want unreachable", v)
	}
}
