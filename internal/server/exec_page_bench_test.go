//go:build unix

package server

import (
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

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

// cpuTime is the CPU time (user and system) the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
