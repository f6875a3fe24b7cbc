package server

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// Benchmark shape: benchClients concurrent runner clients over loopback HTTP. Half stream one
// stack's log each in chunks of benchChunk bytes, one chunk per request (POST /events/log) or
// benchBatch per request (POST /events/logs); the other half post events (phase and update,
// alternating) as fast as they are answered. b.N counts requests of both kinds. The events-only
// variant has every client post events.
const (
	benchChunk   = 512
	benchClients = 16
	benchBatch   = 16
)

// BenchmarkIngest reports chunks/s, events/s and the p99 request latency in ms, over all
// requests (p99-ms) and per kind (event-p99-ms, log-p99-ms): log requests are a small share of
// the paced variant's requests, so the overall p99 alone would hide them. A paced log request's
// latency counts from when it was due, so log clients falling behind the pace show up in
// log-p99-ms (and in chunks/s) instead of being hidden by the sleep.
func BenchmarkIngest(b *testing.B) {
	for _, be := range storetest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			variants := []struct {
				name      string
				per, pace int
			}{
				{"chunk-per-request", 1, 0},
				{fmt.Sprintf("batches-of-%d", benchBatch), benchBatch, 0},
				{"events-only", 0, 0},
				// The runner's pump batches what is due (up to 128 chunks): log traffic held at
				// 20,000 chunks/s in batches of 64 while the event clients post flat out.
				{"paced-20k-chunks-batches-of-64", 64, 20000},
			}
			for _, v := range variants {
				b.Run(v.name, func(b *testing.B) {
					ts := newTestServer(b, be.Open(b), func(c *Config) { c.RateLimit = 1e9 })
					benchIngest(b, ts, v.per, v.pace)
				})
			}
		})
	}
}

// benchIngest runs the clients; per is chunks per log request (0: events only) and pace, when
// set, holds the log clients together to that many chunks per second.
func benchIngest(b *testing.B, ts *testServer, per, pace int) {
	transport := &http.Transport{MaxIdleConns: benchClients * 2, MaxIdleConnsPerHost: benchClients * 2, MaxConnsPerHost: benchClients * 2}
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	defer transport.CloseIdleConnections()
	post := func(path string, body []byte) error {
		req, _ := http.NewRequest("POST", ts.URL+BasePath+path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tokenOf["runner"])
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("%s: status %d", path, resp.StatusCode)
		}
		return nil
	}
	stacks := make([]string, benchClients)
	for i := range stacks {
		stacks[i] = fmt.Sprintf("stacks/s%02d", i)
	}
	init := fmt.Sprintf(`{"execution_id":"bench","environment":"prod","op":"plan","stacks":["%s"]}`, strings.Join(stacks, `","`))
	if err := post("/events/init", []byte(init)); err != nil {
		b.Fatal(err)
	}
	data := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("terraform output line ...\n"), benchChunk/26+1)[:benchChunk])
	var next atomic.Int64
	var chunks, evs atomic.Int64
	lat := make([][]time.Duration, benchClients)
	isLog := make([]bool, benchClients)
	var failed atomic.Value
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < benchClients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stack := stacks[c]
			var off, seq int64
			var body []byte
			var nextAt time.Time
			logClients := benchClients / 2
			interval := time.Duration(0)
			if pace > 0 {
				interval = time.Duration(float64(time.Second) * float64(per*logClients) / float64(pace))
			}
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				t0 := time.Now()
				var err error
				if c%2 == 1 || per == 0 {
					seq++
					if seq%2 == 0 {
						body = fmt.Appendf(body[:0], `{"execution_id":"bench","stack":%q,"phase":"plan","seq":%d}`, stack, seq)
						err = post("/events/phase", body)
					} else {
						body = fmt.Appendf(body[:0], `{"execution_id":"bench","stack":%q,"seq":%d,"status":"running"}`, stack, seq)
						err = post("/events/update", body)
					}
					evs.Add(1)
				} else if per == 1 {
					body = fmt.Appendf(body[:0], `{"execution_id":"bench","stack":%q,"generation":1,"offset":%d,"data":"%s"}`, stack, off, data)
					err = post("/events/log", body)
					off += benchChunk
					chunks.Add(1)
					isLog[c] = true
				} else {
					if interval > 0 {
						if nextAt.IsZero() {
							nextAt = time.Now()
						}
						time.Sleep(time.Until(nextAt))
						t0 = nextAt
						nextAt = nextAt.Add(interval)
					}
					body = append(body[:0], `{"chunks":[`...)
					for k := 0; k < per; k++ {
						if k > 0 {
							body = append(body, ',')
						}
						body = fmt.Appendf(body, `{"execution_id":"bench","stack":%q,"generation":1,"offset":%d,"data":"%s"}`, stack, off, data)
						off += benchChunk
					}
					body = append(body, "]}"...)
					err = post("/events/logs", body)
					chunks.Add(int64(per))
					isLog[c] = true
				}
				if err != nil {
					failed.Store(err)
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	var all, ev, logs []time.Duration
	for c, l := range lat {
		all = append(all, l...)
		if isLog[c] {
			logs = append(logs, l...)
		} else {
			ev = append(ev, l...)
		}
	}
	b.ReportMetric(float64(chunks.Load())/elapsed.Seconds(), "chunks/s")
	b.ReportMetric(float64(evs.Load())/elapsed.Seconds(), "events/s")
	b.ReportMetric(p99ms(all), "p99-ms")
	if per > 0 {
		b.ReportMetric(p99ms(ev), "event-p99-ms")
		b.ReportMetric(p99ms(logs), "log-p99-ms")
	}
}

// p99ms is the 99th percentile of ds in milliseconds (0 for none).
func p99ms(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return float64(ds[(len(ds)*99)/100].Microseconds()) / 1000
}
