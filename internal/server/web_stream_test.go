package server

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// openStream opens a live stream as role; it returns the answer (the caller reads and closes it).
func (ts *testServer) openStream(t *testing.T, ctx context.Context, role, path string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+tokenOf[role])
	req.Header.Set("Accept", "text/event-stream")
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// waitLine reads sc until a line containing what; it reports whether one came.
func waitLine(sc *bufio.Scanner, what string) bool {
	for sc.Scan() {
		if strings.Contains(sc.Text(), what) {
			return true
		}
	}
	return false
}

// TestStreamsShareOneRender: many viewers of one execution get every update, rendered once per
// change, not once per viewer.
func TestStreamsShareOneRender(t *testing.T) {
	const viewers = 30
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	ts.seed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	streams := make([]*bufio.Scanner, viewers)
	for i := range streams {
		resp := ts.openStream(t, ctx, "viewer", "/ui/stream/executions/web-1")
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("stream %d: %d", i, resp.StatusCode)
		}
		streams[i] = bufio.NewScanner(resp.Body)
		streams[i].Buffer(make([]byte, 1<<20), 1<<20)
	}
	waitAll := func(what string) {
		t.Helper()
		var wg sync.WaitGroup
		missed := make(chan int, viewers)
		for i, sc := range streams {
			wg.Go(func() {
				if !waitLine(sc, what) {
					missed <- i
				}
			})
		}
		wg.Wait()
		close(missed)
		for i := range missed {
			t.Fatalf("stream %d never showed %q", i, what)
		}
	}
	waitAll(`net says \u003cb\u003ehi\u003c/b\u003e`)
	before := ts.srv.ui.Renders()
	if status, out, _ := ts.call(t, "runner", "POST", "/events/update", map[string]any{"execution_id": "web-1", "stack": "app", "seq": 1,
		"status": "succeeded", "class": "additive", "counts": map[string]int{"create": 7}}); status != 200 {
		t.Fatalf("update: %d %v", status, out)
	}
	waitAll("+7")
	if status, out, _ := ts.call(t, "runner", "POST", "/events/log", map[string]any{"execution_id": "web-1", "stack": "app",
		"generation": 1, "offset": 0, "data": b64("shared line\n")}); status != 200 {
		t.Fatalf("log: %d %v", status, out)
	}
	waitAll("shared line")
	t.Logf("renders: %d in all, %d after the first", ts.srv.ui.Renders(), ts.srv.ui.Renders()-before)
	// One feed: a render when the streams opened and one per change (a refresh may add one).
	if total, changes := ts.srv.ui.Renders(), ts.srv.ui.Renders()-before; total > 5 || changes > 3 {
		t.Fatalf("%d viewers cost %d renders in all, %d for two changes", viewers, total, changes)
	}
}

// TestStreamCaps: live streams are capped per principal and in all; past a cap the answer is 429
// saying which, and a closed stream frees its place.
func TestStreamCaps(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), func(c *Config) { c.MaxStreams, c.MaxStreamsPerPrincipal = 3, 2 })
	ts.seed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	open := func(role string) (*http.Response, context.CancelFunc) {
		sctx, scancel := context.WithCancel(ctx)
		resp := ts.openStream(t, sctx, role, "/ui/stream/executions")
		t.Cleanup(func() { scancel(); resp.Body.Close() })
		return resp, scancel
	}
	refused := func(role, want string) {
		t.Helper()
		resp, _ := open(role)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), want) {
			t.Fatalf("%s past the cap: %d %v %s", role, resp.StatusCode, resp.Header, body)
		}
	}
	first, closeFirst := open("viewer")
	if second, _ := open("viewer"); first.StatusCode != 200 || second.StatusCode != 200 {
		t.Fatalf("streams within the cap: %d %d", first.StatusCode, second.StatusCode)
	}
	refused("viewer", "too many live streams for viewer")
	if resp, _ := open("runner"); resp.StatusCode != 200 {
		t.Fatalf("another principal's stream: %d", resp.StatusCode)
	}
	refused("admin", "too many live streams on this server")
	closeFirst()
	for i := 0; ; i++ {
		resp, _ := open("viewer")
		if resp.StatusCode == 200 {
			break
		}
		if i > 100 {
			t.Fatalf("a closed stream never freed its place: %d", resp.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
