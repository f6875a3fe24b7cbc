//go:build unix

package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// bigStacks is the size of the execution BenchmarkExecutionPage renders: the most stacks one
// execution may have (service.MaxStacks).
const bigStacks = 10_000

// seedBigExecution has the runner post an execution "big" of n stacks, each but the first
// depending on the stack of half its number (a tree 14 columns deep), every stack with two
// timed phase events and a final state: most succeeded, some failed, the rest still running.
func seedBigExecution(tb testing.TB, ts *testServer, n int) {
	tb.Helper()
	name := func(i int) string { return fmt.Sprintf("stacks/env-%d/service-%05d", i%7, i) }
	stacks := make([]string, n)
	var edges []map[string]string
	for i := range n {
		stacks[i] = name(i)
		if i > 0 {
			edges = append(edges, map[string]string{"from": name(i / 2), "to": name(i)})
		}
	}
	post := func(path string, body any) {
		if status, out := ts.post(tb, "runner", path, body); status != 200 {
			tb.Fatalf("%s: %d %v", path, status, out)
		}
	}
	post("/events/init", map[string]any{"execution_id": "big", "environment": "prod", "op": "plan", "pr": 1, "sha": "0123456789abcdef",
		"stacks": stacks, "edges": edges})
	start := time.Now().Add(-time.Hour).UTC()
	for from := 0; from < n; from += 500 {
		var phases, updates []map[string]any
		for i := from; i < min(from+500, n); i++ {
			at := start.Add(time.Duration(i) * time.Second)
			phases = append(phases,
				map[string]any{"execution_id": "big", "stack": name(i), "phase": "plan", "seq": 1, "at": at.Format(time.RFC3339Nano)},
				map[string]any{"execution_id": "big", "stack": name(i), "phase": "plan", "status": "ok", "seq": 2, "at": at.Add(41 * time.Second).Format(time.RFC3339Nano)})
			status, class := "succeeded", "mutating"
			switch {
			case i%97 == 0:
				status, class = "failed", ""
			case i%13 == 0:
				status, class = "running", ""
			}
			updates = append(updates, map[string]any{"execution_id": "big", "stack": name(i), "seq": 3, "status": status, "class": class,
				"plan_hash": fmt.Sprintf("v1:%064d", i), "counts": map[string]int{"update": 1 + i%5}})
		}
		post("/events/phases", map[string]any{"phases": phases})
		post("/events/updates", map[string]any{"updates": updates})
	}
}

// BenchmarkExecutionPage renders the page of an execution of 10,000 stacks, in the server alone
// (no network): server-ms is the time of one render, cpu-ms the CPU time the process spent on
// it (steadier than server-ms on a busy machine; the database's own, for PostgreSQL, is not
// counted), html-bytes the size of the page.
func BenchmarkExecutionPage(b *testing.B) {
	for _, be := range storetest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			ts := newTestServer(b, be.Open(b), func(c *Config) { c.RateLimit = 1e9 })
			seedBigExecution(b, ts, bigStacks)
			cookie := ts.session(b, tokenOf["viewer"])
			var size int
			b.ResetTimer()
			start, cpu := time.Now(), cpuTime()
			for range b.N {
				req := httptest.NewRequest("GET", "/ui/executions/big", nil)
				req.AddCookie(cookie)
				rec := httptest.NewRecorder()
				ts.srv.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("page: %d %.300s", rec.Code, rec.Body.String())
				}
				size = rec.Body.Len()
			}
			b.ReportMetric(float64(time.Since(start).Milliseconds())/float64(b.N), "server-ms")
			b.ReportMetric(float64((cpuTime()-cpu).Milliseconds())/float64(b.N), "cpu-ms")
			b.ReportMetric(float64(size), "html-bytes")
		})
	}
}

// post sends a JSON request as role and returns the status and body (call, for benchmarks too).
func (ts *testServer) post(tb testing.TB, role, path string, body any) (int, string) {
	tb.Helper()
	data, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", ts.URL+BasePath+path, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tokenOf[role])
	resp, err := ts.Client().Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// cpuTime is the CPU time (user and system) the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
