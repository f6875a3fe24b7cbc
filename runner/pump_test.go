package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
)

// pumpKey names one generation of one stack's log.
type pumpKey struct {
	stack string
	gen   int64
}

// pumpCollector is an in-process LogPoster standing in for the server: it stores chunks with
// the server's dedup rule (first write of a key wins), checks that a retried key carries the
// same bytes and that new keys arrive in order per stack, and fails on demand.
type pumpCollector struct {
	mu       sync.Mutex
	rng      *rand.Rand
	data     map[pumpKey]map[int64][]byte
	gaps     map[pumpKey]map[int64]int64
	last     map[string][2]int64 // last new (generation, offset) per stack
	recv     map[pumpKey]map[int64]time.Time
	errs     []string
	failP    float64 // probability a call fails before storing
	lostAckP float64 // probability a call stores and still fails (a lost answer)
	outage   int     // calls left in the current outage
	outageP  float64 // probability a call starts an outage
	dead     bool
	calls    int
}

func newPumpCollector(seed uint64) *pumpCollector {
	return &pumpCollector{
		rng:  rand.New(rand.NewPCG(seed, 7)),
		data: map[pumpKey]map[int64][]byte{}, gaps: map[pumpKey]map[int64]int64{},
		last: map[string][2]int64{}, recv: map[pumpKey]map[int64]time.Time{},
	}
}

// pumpBatchCollector takes batches too, as the real client and server do. A failure part-way
// leaves earlier chunks stored and reports an error, which is harsher than the server's
// all-or-nothing batches: the pump must resend exactly the same chunks.
type pumpBatchCollector struct{ *pumpCollector }

func (b pumpBatchCollector) LogChunks(ctx context.Context, chunks []events.LogChunk) error {
	for _, lc := range chunks {
		if err := b.LogChunk(ctx, lc); err != nil {
			return err
		}
	}
	return nil
}

// pumpConnRefused is what a dead server looks like to a poster.
var pumpConnRefused = &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}

func (c *pumpCollector) LogChunk(ctx context.Context, lc events.LogChunk) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.dead {
		return pumpConnRefused
	}
	if c.outage > 0 {
		c.outage--
		return pumpConnRefused
	}
	if c.outageP > 0 && c.rng.Float64() < c.outageP {
		c.outage = 1 + c.rng.IntN(30)
		return pumpConnRefused
	}
	if c.failP > 0 && c.rng.Float64() < c.failP {
		return pumpConnRefused
	}
	c.store(lc)
	if c.lostAckP > 0 && c.rng.Float64() < c.lostAckP {
		return errors.New("response lost")
	}
	return nil
}

// store applies one chunk with the server's idempotency rule. c.mu is held.
func (c *pumpCollector) store(lc events.LogChunk) {
	k := pumpKey{lc.Stack, lc.Generation}
	if lc.ExecutionID == "" || lc.Offset < 0 || lc.GapLength < 0 || (lc.GapLength > 0 && len(lc.Data) > 0) {
		c.errs = append(c.errs, fmt.Sprintf("malformed chunk %+v", lc))
		return
	}
	if lc.GapLength > 0 {
		if c.gaps[k] == nil {
			c.gaps[k] = map[int64]int64{}
		}
		if old, ok := c.gaps[k][lc.Offset]; ok {
			if old != lc.GapLength {
				c.errs = append(c.errs, fmt.Sprintf("gap %v@%d retried with another length", k, lc.Offset))
			}
			return
		}
		c.gaps[k][lc.Offset] = lc.GapLength
	} else {
		if c.data[k] == nil {
			c.data[k] = map[int64][]byte{}
			c.recv[k] = map[int64]time.Time{}
		}
		if old, ok := c.data[k][lc.Offset]; ok {
			if !bytes.Equal(old, lc.Data) {
				c.errs = append(c.errs, fmt.Sprintf("chunk %v@%d retried with other bytes", k, lc.Offset))
			}
			return
		}
		c.data[k][lc.Offset] = bytes.Clone(lc.Data)
		c.recv[k][lc.Offset] = time.Now()
	}
	pos := [2]int64{lc.Generation, lc.Offset}
	if last, ok := c.last[lc.Stack]; ok && (pos[0] < last[0] || (pos[0] == last[0] && pos[1] <= last[1])) {
		c.errs = append(c.errs, fmt.Sprintf("stack %s: chunk at %v arrived after %v", lc.Stack, pos, last))
	}
	c.last[lc.Stack] = pos
}

func (c *pumpCollector) setFailure(failP, lostAckP, outageP float64, dead bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failP, c.lostAckP, c.outageP, c.dead = failP, lostAckP, outageP, dead
	if dead || outageP == 0 {
		c.outage = 0
	}
}

// pumpDecodeChunks reads the chunks of a /events/log (one) or /events/logs (a batch) request.
func pumpDecodeChunks(r *http.Request) ([]events.LogChunk, error) {
	switch r.URL.Path {
	case "/api/v1/events/logs":
		var batch api.LogChunks
		err := json.NewDecoder(io.LimitReader(r.Body, 16<<20)).Decode(&batch)
		return batch.Chunks, err
	case "/api/v1/events/log":
		var lc events.LogChunk
		err := json.NewDecoder(io.LimitReader(r.Body, 4<<20)).Decode(&lc)
		return []events.LogChunk{lc}, err
	}
	return nil, fmt.Errorf("no endpoint %s", r.URL.Path)
}

// pumpHTTPPoster posts chunks as JSON to a collector over real loopback HTTP.
type pumpHTTPPoster struct {
	url    string
	client *http.Client
}

func (h *pumpHTTPPoster) LogChunk(ctx context.Context, lc events.LogChunk) error {
	body, err := json.Marshal(lc)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url+"/api/v1/events/log", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("log chunk: HTTP %d", resp.StatusCode)
	}
	return nil
}

// pumpHTTPServer serves /api/v1/events/log over loopback, decoding events.LogChunk JSON into c. A
// collector failure becomes a 503.
func pumpHTTPServer(t testing.TB, c LogPoster) (*httptest.Server, *pumpHTTPPoster) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/api/v1/events/log" {
			http.Error(w, `{"code":"NOT_FOUND","message":"no such endpoint"}`, http.StatusNotFound)
			return
		}
		var lc events.LogChunk
		dec := json.NewDecoder(io.LimitReader(r.Body, 4<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&lc); err != nil {
			http.Error(w, `{"code":"INVALID_ARGUMENT","message":"bad chunk"}`, http.StatusBadRequest)
			return
		}
		if err := c.LogChunk(r.Context(), lc); err != nil {
			http.Error(w, `{"code":"UNAVAILABLE","message":"try again"}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	tr := &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return srv, &pumpHTTPPoster{url: srv.URL, client: &http.Client{Transport: tr, Timeout: 5 * time.Second}}
}

// pumpWriter plays one stack's writer: appends, truncations, deletions and recreations, and
// remembers every generation's bytes.
type pumpWriter struct {
	t     testing.TB
	pump  *LogPump
	stack string
	path  string
	rng   *rand.Rand
	gens  [][]byte
	f     *os.File
	gone  bool // deleted, not yet recreated
}

// sync waits until the pump has observed the current generation at its current size. Real
// writers leave the pump that moment between commands; without it a truncation could destroy
// bytes the pump never even saw, which nobody can report.
func (w *pumpWriter) sync() {
	w.t.Helper()
	pumpWaitObserved(w.t, w.pump, w.stack, int64(len(w.gens)-1), int64(len(w.gens[len(w.gens)-1])))
}

// pumpWaitObserved waits (boundedly) until the pump observed stack at generation gen and size
// size; a negative size accepts any.
func pumpWaitObserved(t testing.TB, pump *LogPump, stack string, gen, size int64) {
	t.Helper()
	pump.mu.Lock()
	s := pump.byName[stack]
	pump.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, n := s.observed()
		if g == gen && (size < 0 || n == size) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stack %s: pump observed generation %d size %d, want %d size %d", stack, g, n, gen, size)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// randomBytes returns n bytes: binary, text lines, or one long line.
func (w *pumpWriter) randomBytes(n int) []byte {
	b := make([]byte, n)
	switch w.rng.IntN(3) {
	case 0:
		for i := range b {
			b[i] = byte(w.rng.UintN(256))
		}
	case 1:
		for i := range b {
			b[i] = "abcdefgh ij\n"[w.rng.IntN(12)]
		}
	default:
		for i := range b {
			b[i] = byte('a' + w.rng.IntN(26))
		}
	}
	return b
}

// startGeneration begins a new generation whose first write is at least 16 random bytes (the
// way a new command's first output differs from the previous one's).
func (w *pumpWriter) startGeneration(flag int) {
	w.t.Helper()
	f, err := os.OpenFile(w.path, flag, 0o644)
	if err != nil {
		w.t.Fatal(err)
	}
	if w.f != nil {
		w.f.Close()
	}
	w.f = f
	first := make([]byte, 16+w.rng.IntN(48))
	for i := range first {
		first[i] = byte(w.rng.UintN(256))
	}
	w.gens = append(w.gens, nil)
	w.write(first)
}

func (w *pumpWriter) write(b []byte) {
	w.t.Helper()
	if _, err := w.f.Write(b); err != nil {
		w.t.Fatal(err)
	}
	w.gens[len(w.gens)-1] = append(w.gens[len(w.gens)-1], b...)
}

// step performs one random operation.
func (w *pumpWriter) step(huge bool) {
	w.t.Helper()
	switch {
	case w.f == nil || w.gone:
		w.startGeneration(os.O_CREATE | os.O_WRONLY | os.O_TRUNC)
		w.gone = false
	case w.rng.IntN(10) < 6:
		n := 1 + w.rng.IntN(300)
		if huge && w.rng.IntN(8) == 0 {
			n = 1 + w.rng.IntN(150<<10)
		}
		w.write(w.randomBytes(n))
	case w.rng.IntN(3) == 0:
		w.sync()
		if err := os.Remove(w.path); err != nil {
			w.t.Fatal(err)
		}
		w.gone = true
	case w.rng.IntN(2) == 0:
		w.sync()
		w.startGeneration(os.O_WRONLY | os.O_TRUNC)
	default:
		time.Sleep(time.Duration(w.rng.IntN(2000)) * time.Microsecond)
	}
}

// pumpRunConfig is one randomized scenario.
type pumpRunConfig struct {
	seed   uint64
	poll   bool
	stacks int
	ops    int
	huge   bool
	poster func(*pumpCollector) LogPoster
}

// pumpRandomRun runs one scenario and checks the collector against the writers. It returns an
// error instead of failing so that many runs can share one test.
func pumpRandomRun(t *testing.T, cfg pumpRunConfig) {
	t.Helper()
	rng := rand.New(rand.NewPCG(cfg.seed, 11))
	root := t.TempDir()
	coll := newPumpCollector(cfg.seed)
	coll.setFailure(rng.Float64()*0.2, rng.Float64()*0.1, rng.Float64()*0.02, false)
	var poster LogPoster = coll
	if cfg.poster != nil {
		poster = cfg.poster(coll)
	}
	pump := NewLogPump(poster, root, "tfstackplan.log", "exec-1")
	opts := PumpOptions{
		MaxChunk:     []int{512, 4096, 64 << 10}[rng.IntN(3)],
		Coalesce:     time.Duration(rng.IntN(3)) * time.Millisecond,
		MaxInFlight:  1 + rng.IntN(4),
		Poll:         cfg.poll,
		PollInterval: time.Millisecond,
		RetryMin:     time.Millisecond,
		RetryMax:     4 * time.Millisecond,
	}
	if rng.IntN(3) == 0 {
		opts.MaxBuffered = int64(opts.MaxChunk) // one chunk for all stacks: exercises the budget queue
	}
	if err := pump.SetOptions(opts); err != nil {
		t.Fatal(err)
	}
	writers := make([]*pumpWriter, cfg.stacks)
	for i := range writers {
		stack := fmt.Sprintf("stacks/s%d", i)
		pumpStackDir(t, root, stack)
		writers[i] = &pumpWriter{t: t, pump: pump, stack: stack, path: filepath.Join(root, stack, "tfstackplan.log"),
			rng: rand.New(rand.NewPCG(cfg.seed, uint64(i)))}
		if rng.IntN(2) == 0 {
			writers[i].step(false) // the file exists before the pump starts
		}
		if err := pump.AddStack(stack); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := pump.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, w := range writers {
		wg.Go(func() {
			for range cfg.ops {
				w.step(cfg.huge)
			}
			if w.f != nil {
				w.f.Close()
			}
		})
	}
	wg.Wait()
	drainFor := 20 * time.Second
	switch rng.IntN(5) {
	case 0: // the server died for good: Drain gives up and reports what it could not send
		coll.setFailure(0, 0, 0, true)
		drainFor = time.Duration(rng.IntN(20)) * time.Millisecond
	default: // the server recovers
		coll.setFailure(rng.Float64()*0.1, rng.Float64()*0.05, 0, false)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), drainFor)
	rep := pump.Drain(dctx)
	dcancel()
	pumpCheck(t, cfg, coll, writers, rep, drainFor == 20*time.Second)
}

// pumpCheck asserts that, per stack and generation, the collector holds exactly the written
// bytes except for exactly the gaps the pump reported.
func pumpCheck(t *testing.T, cfg pumpRunConfig, coll *pumpCollector, writers []*pumpWriter, rep DrainReport, recovered bool) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d poll=%v: %s", cfg.seed, cfg.poll, fmt.Sprintf(format, args...))
	}
	coll.mu.Lock()
	defer coll.mu.Unlock()
	if len(coll.errs) > 0 {
		fail("collector saw protocol errors: %v", coll.errs)
	}
	if len(rep.Errors) > 0 {
		fail("report errors: %v", rep.Errors)
	}
	gapsOf := map[pumpKey][]StackGap{}
	for _, g := range rep.Gaps {
		if g.From >= g.To {
			fail("empty or inverted gap %+v", g)
		}
		k := pumpKey{g.Stack, g.Generation}
		gapsOf[k] = append(gapsOf[k], g)
		if recovered && g.Unsent {
			fail("server recovered, yet %+v was left unsent", g)
		}
		// A record whose answer was lost may be stored without the pump knowing.
		if got, ok := coll.gaps[k][g.From]; g.Reported && !(ok && got == g.To-g.From) {
			fail("gap %+v: reported, but the collector has %v", g, coll.gaps[k])
		}
	}
	for k, m := range coll.gaps {
		for off, n := range m {
			if !slices.ContainsFunc(gapsOf[k], func(g StackGap) bool { return g.From == off && g.To == off+n }) {
				fail("collector has gap %v@%d+%d the report does not list", k, off, n)
			}
		}
	}
	known := map[pumpKey]bool{}
	for _, w := range writers {
		for gen, content := range w.gens {
			k := pumpKey{w.stack, int64(gen)}
			known[k] = true
			type span struct {
				from, to int64
				lost     bool
			}
			var spans []span
			for off, d := range coll.data[k] {
				end := off + int64(len(d))
				if end > int64(len(content)) || !bytes.Equal(d, content[off:end]) {
					fail("%v: chunk at %d (%d bytes) differs from what was written (%d bytes)", k, off, len(d), len(content))
				}
				spans = append(spans, span{off, end, false})
			}
			for _, g := range gapsOf[k] {
				spans = append(spans, span{g.From, g.To, !g.Unsent})
			}
			sort.Slice(spans, func(i, j int) bool { return spans[i].from < spans[j].from })
			var covered int64
			for i, s := range spans {
				if s.from > covered {
					fail("%v: bytes [%d,%d) of %d neither delivered nor reported (spans %v)", k, covered, s.from, len(content), spans)
				}
				if s.lost {
					for _, o := range spans[:i] {
						if !o.lost && o.to > s.from {
							fail("%v: data delivered inside the lost range %v", k, s)
						}
					}
				}
				covered = max(covered, s.to)
			}
			if covered != int64(len(content)) {
				fail("%v: covered %d bytes of %d (spans %v)", k, covered, len(content), spans)
			}
		}
	}
	for k := range coll.data {
		if !known[k] {
			fail("collector has a generation nobody wrote: %v", k)
		}
	}
}

func TestPumpRandomizedWriters(t *testing.T) {
	runs := 1000
	if testing.Short() {
		runs = 200
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 8 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(runs) || t.Failed() {
					return
				}
				r := rand.New(rand.NewPCG(uint64(i), 3))
				cfg := pumpRunConfig{
					seed: uint64(i), poll: i%2 == 1,
					stacks: 1 + r.IntN(3), ops: 5 + r.IntN(25), huge: r.IntN(10) == 0,
				}
				if i%3 == 2 {
					cfg.poster = func(c *pumpCollector) LogPoster { return pumpBatchCollector{c} }
				}
				pumpRandomRun(t, cfg)
			}
		})
	}
	wg.Wait()
	t.Logf("%d randomized runs (half polling, half fsnotify; a third batched) in %v", runs, time.Since(start).Round(time.Millisecond))
}

func TestPumpRandomizedOverLoopbackHTTP(t *testing.T) {
	for i := range 30 {
		r := rand.New(rand.NewPCG(uint64(i), 5))
		pumpRandomRun(t, pumpRunConfig{
			seed: 100000 + uint64(i), poll: i%2 == 0, stacks: 1 + r.IntN(3), ops: 5 + r.IntN(20), huge: i%5 == 0,
			poster: func(c *pumpCollector) LogPoster {
				_, p := pumpHTTPServer(t, c)
				return p
			},
		})
	}
}

// pumpSimple starts a pump over root with the given collector and options.
func pumpSimple(t testing.TB, root string, p LogPoster, o PumpOptions, stacks ...string) *LogPump {
	t.Helper()
	pump := pumpNew(t, root, p, o, stacks...)
	if err := pump.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return pump
}

// pumpNew is pumpSimple without the Start.
func pumpNew(t testing.TB, root string, p LogPoster, o PumpOptions, stacks ...string) *LogPump {
	t.Helper()
	pump := NewLogPump(p, root, "tfstackplan.log", "exec-1")
	if err := pump.SetOptions(o); err != nil {
		t.Fatal(err)
	}
	for _, s := range stacks {
		if err := pump.AddStack(s); err != nil {
			t.Fatal(err)
		}
	}
	return pump
}

// pumpWatching starts pump, watching with fsnotify; it skips the test when there is no
// directory watcher.
func pumpWatching(t *testing.T, pump *LogPump) *LogPump {
	t.Helper()
	if err := pump.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if pump.watcher == nil {
		t.Skip("no directory watcher here")
	}
	return pump
}

// pumpCollected concatenates a generation's data chunks in offset order, checking that they
// tile it (each starts where the previous one's data ended) as the server assumes.
func pumpCollected(t *testing.T, c *pumpCollector, stack string, gen int64) []byte {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.data[pumpKey{stack, gen}]
	offs := make([]int64, 0, len(m))
	for o := range m {
		offs = append(offs, o)
	}
	slices.Sort(offs)
	var out []byte
	for _, o := range offs {
		if o != int64(len(out)) {
			t.Fatalf("%s generation %d: chunk at %d, previous data ends at %d", stack, gen, o, len(out))
		}
		out = append(out, m[o]...)
	}
	return out
}

func TestPumpDisabledPosterReadsNothing(t *testing.T) {
	pump := NewLogPump(nil, t.TempDir(), "tfstackplan.log", "exec-1")
	if err := pump.AddStack("a"); err != nil {
		t.Fatal(err)
	}
	if err := pump.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rep := pump.Drain(context.Background()); !rep.Complete || rep.Stacks != 1 || len(rep.Gaps) != 0 {
		t.Fatalf("report %+v", rep)
	}
}

func TestPumpStartContextStopsEverything(t *testing.T) {
	root := t.TempDir()
	pumpWriteLog(t, pumpStackDir(t, root, "a"), []byte("never acknowledged\n"))
	block := make(chan struct{})
	defer close(block)
	poster := pumpFuncPoster(func(ctx context.Context, lc events.LogChunk) error {
		select { // a server that never answers
		case <-ctx.Done():
			return ctx.Err()
		case <-block:
			return nil
		}
	})
	pump := NewLogPump(poster, root, "tfstackplan.log", "exec-1")
	if err := pump.AddStack("a"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := pump.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pumpWaitObserved(t, pump, "a", 0, 19)
	cancel()
	if rep := pumpDrainOrHang(t, pump, context.Background()); rep.Complete || rep.Bytes != 0 || len(rep.Gaps) != 1 || !rep.Gaps[0].Unsent {
		t.Fatalf("report %+v", rep)
	}
}

// pumpDrainOrHang drains the pump, failing (instead of hanging the test binary) when Drain does
// not return: with a dead server it must give up when its context or Start's ends.
func pumpDrainOrHang(t *testing.T, pump *LogPump, ctx context.Context) DrainReport {
	t.Helper()
	done := make(chan DrainReport, 1)
	go func() { done <- pump.Drain(ctx) }()
	select {
	case rep := <-done:
		return rep
	case <-time.After(30 * time.Second):
		t.Fatal("Drain hung: it ignored its context")
		return DrainReport{}
	}
}

// pumpStackDir creates a stack directory under root and returns its log file's path.
func pumpStackDir(t testing.TB, root string, stack ...string) string {
	t.Helper()
	dir := filepath.Join(append([]string{root}, stack...)...)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "tfstackplan.log")
}

// pumpWriteLog (re)writes a log file, truncating it as `tee` without -a does.
func pumpWriteLog(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// MaxInFlight's default depends on how chunks travel: 64 in flight for a batching poster (a
// few requests carry them), 16 for one posting chunk by chunk (each is a request) or told not
// to batch; a value given is kept either way.
func TestPumpInFlightDefaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		poster LogPoster
		opts   PumpOptions
		want   int
	}{
		{"batching", pumpBatchCollector{newPumpCollector(1)}, PumpOptions{}, defaultInFlightBatched},
		{"chunk by chunk", newPumpCollector(1), PumpOptions{}, defaultInFlightSingle},
		{"batching refused", pumpBatchCollector{newPumpCollector(1)}, PumpOptions{NoBatch: true}, defaultInFlightSingle},
		{"given", pumpBatchCollector{newPumpCollector(1)}, PumpOptions{MaxInFlight: 3}, 3},
	} {
		pump := pumpNew(t, t.TempDir(), tc.poster, tc.opts)
		ctx, cancel := context.WithCancel(context.Background())
		if err := pump.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if got := cap(pump.sem); got != tc.want {
			t.Errorf("%s: %d chunks in flight, want %d", tc.name, got, tc.want)
		}
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		pump.Drain(dctx)
		dcancel()
		cancel()
	}
}

// With Fresh, the logs stacks have when they are added are an earlier run's: nothing of them
// is posted while they stay as they were (a log that is a link to a file inside the root
// included), and their first change starts generation 0 from the first byte, whatever bytes it
// shares with the earlier log. NextGenerations tells a later pump of the same execution where
// each stack's log goes on, and FirstGenerations makes it go on there; the log the first pump
// posted is, to the second, an earlier run's.
func TestPumpFreshLogsAndGenerationsAcrossPumps(t *testing.T) {
	root := t.TempDir()
	a, b, c := pumpStackDir(t, root, "a"), pumpStackDir(t, root, "b"), pumpStackDir(t, root, "c")
	pumpStackDir(t, root, "d")
	pumpWriteLog(t, a, []byte("same start, then the earlier run\n"))
	pumpWriteLog(t, c, []byte("c: an earlier run, never run again\n"))
	shared := filepath.Join(root, "shared.log")
	pumpWriteLog(t, shared, []byte("shared: an earlier run\n"))
	if err := os.Symlink(shared, b); err != nil {
		t.Fatal(err)
	}
	coll := newPumpCollector(41)
	first := pumpNew(t, root, coll, PumpOptions{Fresh: true, Coalesce: time.Millisecond}, "a", "b", "c", "d")
	if err := first.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	pumpWriteLog(t, a, []byte("same start, then this run\n"))
	pumpWriteLog(t, b, []byte("shared: this run\n"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if rep := first.Drain(ctx); !rep.Complete || len(rep.Errors) > 0 {
		t.Fatalf("first drain: %+v", rep)
	}
	want := map[pumpKey]string{{"a", 0}: "same start, then this run\n", {"b", 0}: "shared: this run\n"}
	if got := pumpAllCollected(t, coll); !reflect.DeepEqual(got, want) {
		t.Errorf("first pump posted %v, want %v", got, want)
	}
	next := first.NextGenerations()
	if want := map[string]int64{"a": 1, "b": 1, "c": 0, "d": 0}; !reflect.DeepEqual(next, want) {
		t.Fatalf("NextGenerations %v, want %v", next, want)
	}

	second := pumpNew(t, root, coll, PumpOptions{Fresh: true, FirstGenerations: next, Coalesce: time.Millisecond}, "a", "d")
	if err := second.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	pumpWriteLog(t, a, []byte("apply: this run\n"))
	pumpWriteLog(t, pumpStackDir(t, root, "d"), []byte("apply: d\n"))
	if rep := second.Drain(ctx); !rep.Complete || len(rep.Errors) > 0 {
		t.Fatalf("second drain: %+v", rep)
	}
	want[pumpKey{"a", 1}], want[pumpKey{"d", 0}] = "apply: this run\n", "apply: d\n"
	if got := pumpAllCollected(t, coll); !reflect.DeepEqual(got, want) {
		t.Errorf("after the second pump, posted %v, want %v", got, want)
	}
	if want := map[string]int64{"a": 2, "d": 1}; !reflect.DeepEqual(second.NextGenerations(), want) {
		t.Errorf("second NextGenerations %v, want %v", second.NextGenerations(), want)
	}
}

// pumpAllCollected is every generation the collector holds, each as one string.
func pumpAllCollected(t *testing.T, c *pumpCollector) map[pumpKey]string {
	t.Helper()
	c.mu.Lock()
	keys := slices.Collect(maps.Keys(c.data))
	c.mu.Unlock()
	out := map[pumpKey]string{}
	for _, k := range keys {
		out[k] = string(pumpCollected(t, c, k.stack, k.gen))
	}
	return out
}

// Bytes appended while the drain's post of a stack's last chunk is in flight are posted too:
// the watcher no longer wakes the stack during a drain, so the stack looks at its log again
// after each post before it decides that it is done. (Drain is meant for after the writers;
// a straggler, such as a grandchild of the scripts outliving terramate, still loses nothing.)
func TestPumpDrainReadsWhatCameDuringItsLastPost(t *testing.T) {
	root := t.TempDir()
	path := pumpStackDir(t, root, "a")
	var mu sync.Mutex
	var got strings.Builder
	inFlight, release := make(chan struct{}, 1), make(chan struct{})
	poster := pumpFuncPoster(func(ctx context.Context, lc events.LogChunk) error {
		select {
		case inFlight <- struct{}{}:
		default:
		}
		if strings.Contains(string(lc.Data), "one") {
			<-release
		}
		mu.Lock()
		defer mu.Unlock()
		got.Write(lc.Data)
		return nil
	})
	pump := pumpWatching(t, pumpNew(t, root, poster, PumpOptions{Coalesce: time.Hour, SafetyPoll: time.Hour}, "a"))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("one\n"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drained := make(chan DrainReport, 1)
	go func() { drained <- pump.Drain(ctx) }()
	select {
	case <-inFlight: // the drain posts "one" (held until release)
	case <-ctx.Done():
		t.Fatal("the drain posted nothing")
	}
	if _, err := f.WriteString("two\n"); err != nil {
		t.Fatal(err)
	}
	close(release)
	rep := <-drained
	mu.Lock()
	defer mu.Unlock()
	if got.String() != "one\ntwo\n" || !rep.Complete {
		t.Errorf("posted %q, complete %v, gaps %v; want both lines", got.String(), rep.Complete, rep.Gaps)
	}
}
