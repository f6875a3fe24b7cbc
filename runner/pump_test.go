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

func TestPumpMasksSecretsAcrossChunks(t *testing.T) {
	for _, poll := range []bool{false, true} {
		root := t.TempDir()
		pumpStackDir(t, root, "a")
		coll := newPumpCollector(1)
		pump := pumpSimple(t, root, coll, PumpOptions{MaxChunk: 512, Coalesce: time.Millisecond, Poll: poll, PollInterval: time.Millisecond}, "a")
		if err := pump.Masker().Add("hunter2-v1"); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(filepath.Join(root, "a", "tfstackplan.log"))
		if err != nil {
			t.Fatal(err)
		}
		var written []byte
		write := func(s string) {
			written = append(written, s...)
			if _, err := f.WriteString(s); err != nil {
				t.Fatal(err)
			}
			time.Sleep(3 * time.Millisecond)
		}
		// The secret is split across writes (and, at 512-byte chunks, across chunk limits).
		write(strings.Repeat("x", 508) + "hunt")
		write("er2-v1 and\n::add-")
		write("mask::tok")
		write("en-42\nnow token-42 and hunter2")
		write("-v1 again; tail ends with hunter2-v")
		f.Close()
		rep := pump.Drain(context.Background())
		got := pumpCollected(t, coll, "a", 0)
		want := strings.Repeat("x", 508) + "*** and\n::add-mask::***\nnow *** and *** again; tail ends with hunter2-v"
		if string(got) != want {
			t.Fatalf("poll=%v masked stream:\n got %q\nwant %q", poll, got, want)
		}
		if !rep.Complete || rep.Bytes != int64(len(written)) {
			t.Fatalf("report %+v, wrote %d bytes", rep, len(written))
		}
	}
}

func TestPumpDeadServerBoundsMemoryAndReportsGaps(t *testing.T) {
	root := t.TempDir()
	coll := newPumpCollector(2)
	coll.setFailure(0, 0, 0, true)
	var stacks []string
	for i := range 20 {
		stacks = append(stacks, fmt.Sprintf("s%d", i))
		pumpStackDir(t, root, stacks[i])
	}
	opts := PumpOptions{MaxChunk: 4096, MaxBuffered: 8 * 4096, Coalesce: time.Millisecond, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond}
	pump := pumpSimple(t, root, coll, opts, stacks...)
	block := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	for _, s := range stacks {
		pumpWriteLog(t, filepath.Join(root, s, "tfstackplan.log"), block)
	}
	// Let the pump fill its budget and retry against the dead server for a while.
	deadline := time.Now().Add(5 * time.Second)
	for pump.budgetUsed() < opts.MaxBuffered-int64(opts.MaxChunk) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	if used := pump.budgetUsed(); used > opts.MaxBuffered {
		t.Fatalf("pump holds %d bytes with a budget of %d", used, opts.MaxBuffered)
	}
	// Every log is rewritten while the server is down: what was not read is lost, and said so.
	for _, s := range stacks {
		pumpWaitObserved(t, pump, s, 0, int64(len(block)))
		pumpWriteLog(t, filepath.Join(root, s, "tfstackplan.log"), []byte("second generation\n"))
	}
	for _, s := range stacks {
		pumpWaitObserved(t, pump, s, 1, -1)
	}
	coll.setFailure(0, 0, 0, false) // the server comes back
	rep := pump.Drain(context.Background())
	if !rep.Complete {
		t.Fatalf("drain after recovery incomplete: %+v", rep)
	}
	var lost int64
	for _, g := range rep.Gaps {
		if g.Generation != 0 || g.Unsent || !g.Reported {
			t.Fatalf("unexpected gap %+v", g)
		}
		lost += g.To - g.From
	}
	if lost == 0 || lost+rep.Bytes != int64(len(stacks)*(len(block)+len("second generation\n"))) {
		t.Fatalf("lost %d + sent %d bytes != written", lost, rep.Bytes)
	}
	for _, s := range stacks {
		if got := pumpCollected(t, coll, s, 1); string(got) != "second generation\n" {
			t.Fatalf("stack %s generation 1 = %q", s, got)
		}
	}
}

func TestPumpDrainGivesUpOnDeadServer(t *testing.T) {
	root := t.TempDir()
	pumpWriteLog(t, pumpStackDir(t, root, "a"), []byte("hello, nobody\n"))
	coll := newPumpCollector(3)
	coll.setFailure(0, 0, 0, true)
	pump := pumpSimple(t, root, coll, PumpOptions{}, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	rep := pumpDrainOrHang(t, pump, ctx)
	if rep.Complete || len(rep.Gaps) != 1 || !rep.Gaps[0].Unsent || rep.Gaps[0].From != 0 || rep.Gaps[0].To != 14 {
		t.Fatalf("report %+v", rep)
	}
}

func TestPumpStopsOnCancelledExecution(t *testing.T) {
	root := t.TempDir()
	pumpWriteLog(t, pumpStackDir(t, root, "a"), []byte("cancelled\n"))
	var calls atomic.Int64
	poster := pumpFuncPoster(func(ctx context.Context, lc events.LogChunk) error {
		calls.Add(1)
		return fmt.Errorf("log chunk: %w", ErrCancelRequested)
	})
	pump := pumpSimple(t, root, poster, PumpOptions{Coalesce: time.Millisecond}, "a")
	rep := pump.Drain(context.Background())
	if !errors.Is(rep.Stopped, ErrCancelRequested) || rep.Complete || calls.Load() != 1 {
		t.Fatalf("report %+v after %d calls", rep, calls.Load())
	}
}

// A server that refuses the runner the execution's logs (403: another principal announced it)
// stops posting for good, as a cancel does: one refusal, not a retry every few seconds until
// the drain gives up. Other refusals are retried.
func TestPumpStopsWhenRefused(t *testing.T) {
	for _, c := range []struct {
		status int
		stops  bool
	}{{http.StatusForbidden, true}, {http.StatusServiceUnavailable, false}} {
		root := t.TempDir()
		pumpWriteLog(t, pumpStackDir(t, root, "a"), []byte("refused\n"))
		var calls atomic.Int64
		refusal := &APIError{Op: "LogChunk", StatusCode: c.status}
		poster := pumpFuncPoster(func(ctx context.Context, lc events.LogChunk) error {
			calls.Add(1)
			return refusal
		})
		pump := pumpSimple(t, root, poster, PumpOptions{Coalesce: time.Millisecond, RetryMin: time.Millisecond, RetryMax: time.Millisecond}, "a")
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		rep := pump.Drain(ctx)
		cancel()
		if stopped := errors.Is(rep.Stopped, refusal); stopped != c.stops || rep.Complete {
			t.Errorf("%d: report %+v, want stopped %v", c.status, rep, c.stops)
		}
		if c.stops && calls.Load() != 1 {
			t.Errorf("%d: %d posts, want 1", c.status, calls.Load())
		}
		if !c.stops && calls.Load() < 2 {
			t.Errorf("%d: %d posts, want it retried", c.status, calls.Load())
		}
	}
}

// pumpFuncPoster adapts a function to LogPoster.
type pumpFuncPoster func(ctx context.Context, lc events.LogChunk) error

func (f pumpFuncPoster) LogChunk(ctx context.Context, lc events.LogChunk) error { return f(ctx, lc) }

func TestPumpRefusesEscapingStacks(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "root")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(root, "ok"), filepath.Join(root, "linkfile"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pumpWriteLog(t, filepath.Join(outside, "tfstackplan.log"), []byte("TOP SECRET\n"))
	if err := os.Symlink(outside, filepath.Join(root, "linkdir")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "tfstackplan.log"), filepath.Join(root, "linkfile", "tfstackplan.log")); err != nil {
		t.Fatal(err)
	}
	coll := newPumpCollector(4)
	pump := NewLogPump(coll, root, "tfstackplan.log", "exec-1")
	for _, bad := range []string{"../outside", "/etc", "linkdir", "linkfile", "ok/../../outside", ""} {
		if err := pump.AddStack(bad); err == nil {
			t.Errorf("AddStack(%q) accepted a path escaping the root", bad)
		}
	}
	if err := pump.AddStack("ok"); err != nil {
		t.Fatal(err)
	}
	if err := pump.AddStack("ok"); err == nil {
		t.Error("a stack added twice was accepted")
	}
	if err := pump.SetOptions(PumpOptions{Poll: true, PollInterval: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := pump.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The log file turns into a link pointing outside after the stack was accepted.
	if err := os.Symlink(filepath.Join(outside, "tfstackplan.log"), filepath.Join(root, "ok", "tfstackplan.log")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	rep := pump.Drain(context.Background())
	coll.mu.Lock()
	defer coll.mu.Unlock()
	if len(coll.data) != 0 || rep.Bytes != 0 {
		t.Fatalf("bytes from outside the root were posted: %v", coll.data)
	}
	if len(rep.Errors) != 1 || !strings.Contains(rep.Errors[0], `"ok"`) {
		t.Fatalf("refusal not reported: %v", rep.Errors)
	}
}

// A stack directory that does not exist yet is looked at cheaply while it is absent; when it
// appears as a link pointing outside the root, the log inside is refused, and a log appearing
// in a real directory is read.
func TestPumpRefusesADirectoryThatAppearsAsALink(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "root")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{root, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pumpWriteLog(t, filepath.Join(outside, "tfstackplan.log"), []byte("TOP SECRET\n"))
	coll := newPumpCollector(5)
	pump := NewLogPump(coll, root, "tfstackplan.log", "exec-1")
	for _, st := range []string{"later/link", "later/real"} {
		if err := pump.AddStack(st); err != nil {
			t.Fatal(err)
		}
	}
	if err := pump.SetOptions(PumpOptions{Poll: true, PollInterval: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := pump.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // both looked at while absent
	if err := os.MkdirAll(filepath.Join(root, "later", "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "later", "link")); err != nil {
		t.Fatal(err)
	}
	pumpWriteLog(t, filepath.Join(root, "later", "real", "tfstackplan.log"), []byte("fine\n"))
	time.Sleep(20 * time.Millisecond)
	rep := pump.Drain(context.Background())
	coll.mu.Lock()
	defer coll.mu.Unlock()
	for st, chunks := range coll.data {
		for _, data := range chunks {
			if strings.Contains(string(data), "SECRET") {
				t.Fatalf("stack %v posted bytes from outside the root: %q", st, data)
			}
		}
	}
	if rep.Bytes != int64(len("fine\n")) {
		t.Fatalf("%d bytes posted, want the real stack's 5: %+v", rep.Bytes, rep)
	}
	if len(rep.Errors) != 1 || !strings.Contains(rep.Errors[0], `"later/link"`) {
		t.Fatalf("refusal not reported: %v", rep.Errors)
	}
}

// A stack reached through a link inside the root: the link is repointed before the log is
// written, and the log is read where the link points now (the cheap look at a missing log
// follows the link as it is, not as it was first resolved).
func TestPumpFollowsARepointedLinkToAMissingLog(t *testing.T) {
	for _, poll := range []bool{true, false} {
		root := t.TempDir()
		for _, d := range []string{"gen1/a", "gen2/a"} {
			if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink("gen1", filepath.Join(root, "cur")); err != nil {
			t.Fatal(err)
		}
		coll := newPumpCollector(6)
		pump := NewLogPump(coll, root, "tfstackplan.log", "exec-1")
		if err := pump.AddStack("cur/a"); err != nil {
			t.Fatal(err)
		}
		if err := pump.SetOptions(PumpOptions{Poll: poll, PollInterval: time.Millisecond, SafetyPoll: 5 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		if err := pump.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // looked at while missing
		if err := os.Symlink("gen2", filepath.Join(root, "cur.new")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(root, "cur.new"), filepath.Join(root, "cur")); err != nil {
			t.Fatal(err)
		}
		pumpWriteLog(t, filepath.Join(root, "cur", "a", "tfstackplan.log"), []byte("hello\n"))
		time.Sleep(20 * time.Millisecond)
		if rep := pump.Drain(context.Background()); rep.Bytes != 6 || len(rep.Errors) != 0 {
			t.Fatalf("poll %v: %+v, want the 6 bytes of the log behind the repointed link", poll, rep)
		}
	}
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

func TestPumpRandomizedMasking(t *testing.T) {
	secrets := []string{"hunter2-v1", "hunter2", "s3cr3t-token", "ab"}
	for run := range 200 {
		rng := rand.New(rand.NewPCG(uint64(run), 9))
		root := t.TempDir()
		pumpStackDir(t, root, "a")
		coll := newPumpCollector(uint64(run))
		coll.setFailure(0.1, 0.1, 0, false)
		pump := pumpSimple(t, root, coll, PumpOptions{
			MaxChunk: 64 + rng.IntN(200), Coalesce: time.Duration(rng.IntN(2)) * time.Millisecond,
			Poll: run%2 == 0, PollInterval: time.Millisecond, RetryMin: time.Millisecond, RetryMax: 2 * time.Millisecond,
		}, "a")
		for _, v := range secrets {
			if err := pump.Masker().Add(v); err != nil {
				t.Fatal(err)
			}
		}
		f, err := os.Create(filepath.Join(root, "a", "tfstackplan.log"))
		if err != nil {
			t.Fatal(err)
		}
		var written []byte
		for range 5 + rng.IntN(30) {
			var piece []byte
			for range rng.IntN(6) {
				piece = append(piece, "plain text a b\n"[:1+rng.IntN(15)]...)
				piece = append(piece, secrets[rng.IntN(len(secrets))]...)
			}
			// Writes split anywhere, secrets included.
			for len(piece) > 0 {
				n := 1 + rng.IntN(len(piece))
				if _, err := f.Write(piece[:n]); err != nil {
					t.Fatal(err)
				}
				written = append(written, piece[:n]...)
				piece = piece[n:]
				if rng.IntN(4) == 0 {
					time.Sleep(time.Duration(rng.IntN(1500)) * time.Microsecond)
				}
			}
		}
		f.Close()
		coll.setFailure(0.1, 0.1, 0, false)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		rep := pump.Drain(ctx)
		cancel()
		if !rep.Complete || rep.Bytes != int64(len(written)) {
			t.Fatalf("run %d: report %+v, wrote %d", run, rep, len(written))
		}
		got := pumpCollected(t, coll, "a", 0)
		if want := NewMasker(secrets...).Mask(written); !bytes.Equal(got, want) {
			t.Fatalf("run %d: streamed masking differs from masking the whole log:\n got %q\nwant %q", run, got, want)
		}
		for _, v := range secrets[:3] {
			if bytes.Contains(got, []byte(v)) {
				t.Fatalf("run %d: %q leaked", run, v)
			}
		}
	}
}

func TestPumpLateStackDirectoryIsPolled(t *testing.T) {
	root := t.TempDir()
	coll := newPumpCollector(5)
	pump := pumpSimple(t, root, coll, PumpOptions{Coalesce: time.Millisecond, PollInterval: time.Millisecond}, "later/stack")
	pump.mu.Lock()
	polled := pump.byName["later/stack"].polled.Load()
	pump.mu.Unlock()
	if !polled {
		t.Fatal("a stack whose directory does not exist yet is not polled")
	}
	pumpWriteLog(t, pumpStackDir(t, root, "later", "stack"), []byte("late\n"))
	pumpWaitObserved(t, pump, "later/stack", 0, 5)
	rep := pump.Drain(context.Background())
	if got := pumpCollected(t, coll, "later/stack", 0); string(got) != "late\n" || !rep.Complete {
		t.Fatalf("got %q, report %+v", got, rep)
	}
}

func TestPumpFallsBackToPollingWhenTheWatcherFails(t *testing.T) {
	root := t.TempDir()
	pumpStackDir(t, root, "a")
	coll := newPumpCollector(6)
	// A safety poll longer than the test: only the fallback can find the bytes in time.
	pump := pumpWatching(t, pumpNew(t, root, coll, PumpOptions{Coalesce: time.Millisecond, PollInterval: time.Millisecond, SafetyPoll: time.Hour}, "a"))
	_ = pump.watcher.Close() // the watcher dies
	pumpWriteLog(t, filepath.Join(root, "a", "tfstackplan.log"), []byte("still here\n"))
	pumpWaitObserved(t, pump, "a", 0, 11)
	rep := pump.Drain(context.Background())
	if got := pumpCollected(t, coll, "a", 0); string(got) != "still here\n" || !rep.Complete {
		t.Fatalf("got %q, report %+v", got, rep)
	}
}

// *Client is the production LogPoster.
var _ LogPoster = (*Client)(nil)

func TestPumpThroughClientOverLoopback(t *testing.T) {
	root := t.TempDir()
	pumpStackDir(t, root, "a")
	coll := newPumpCollector(7)
	var cancelled atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunks, err := pumpDecodeChunks(r)
		if err != nil {
			http.Error(w, `{"code":"INVALID_ARGUMENT","message":"bad chunk"}`, http.StatusBadRequest)
			return
		}
		for _, lc := range chunks {
			_ = coll.LogChunk(r.Context(), lc)
		}
		w.Header().Set("Content-Type", "application/json")
		if cancelled.Load() {
			_, _ = w.Write([]byte(`{"cancel":true,"reason":"stopped by an admin"}`))
			return
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	client, err := NewClient(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	pump := pumpSimple(t, root, client, PumpOptions{Coalesce: time.Millisecond}, "a")
	path := filepath.Join(root, "a", "tfstackplan.log")
	pumpWriteLog(t, path, []byte("before the cancel\n"))
	pumpWaitObserved(t, pump, "a", 0, 18)
	deadline := time.Now().Add(10 * time.Second)
	for len(pumpCollected(t, coll, "a", 0)) < 18 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancelled.Store(true)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("after the cancel\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep := pump.Drain(ctx)
	if !errors.Is(rep.Stopped, ErrCancelRequested) {
		t.Fatalf("the pump did not stop on the server's cancel: %+v", rep)
	}
	if got := pumpCollected(t, coll, "a", 0); !bytes.HasPrefix(got, []byte("before the cancel\n")) {
		t.Fatalf("collected %q", got)
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

func TestPumpReadsBeforeCoalescingSoTruncationLosesNothing(t *testing.T) {
	root := t.TempDir()
	path := pumpStackDir(t, root, "a")
	coll := newPumpCollector(8)
	// A long coalescing delay: the next command truncates the log before the pump posts.
	pump := pumpSimple(t, root, coll, PumpOptions{Coalesce: 300 * time.Millisecond}, "a")
	last := []byte("Plan: 1 to add, 0 to change, 0 to destroy.\n")
	pumpWriteLog(t, path, last)
	pump.mu.Lock()
	st := pump.byName["a"]
	pump.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for st.obsRead.Load() < int64(len(last)) || st.obsGen.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the pump did not read the appended bytes")
		}
		time.Sleep(100 * time.Microsecond)
	}
	pumpWriteLog(t, path, []byte("next command\n")) // tee without -a
	pumpWaitObserved(t, pump, "a", 1, -1)
	rep := pump.Drain(context.Background())
	if len(rep.Gaps) != 0 || !rep.Complete {
		t.Fatalf("bytes read before the truncation were lost: %+v", rep)
	}
	if got := pumpCollected(t, coll, "a", 0); !bytes.Equal(got, last) {
		t.Fatalf("generation 0 = %q", got)
	}
	if got := pumpCollected(t, coll, "a", 1); string(got) != "next command\n" {
		t.Fatalf("generation 1 = %q", got)
	}
}

// A watched stack directory that is renamed away, or removed, and made again loses its watch:
// the stack is polled from then on, and the log written in the new directory arrives as a new
// generation. (A removal sends no event for the directory while the pump has the old log
// inside it open: the log's own removal, and the directory found missing, make it polled.)
func TestPumpStackDirectoryReplaced(t *testing.T) {
	for _, how := range []string{"renamed", "removed"} {
		t.Run(how, func(t *testing.T) {
			root := t.TempDir()
			log := pumpStackDir(t, root, "a")
			coll := newPumpCollector(27)
			// A safety poll longer than the test: only the watch's end can make a poll.
			pump := pumpWatching(t, pumpNew(t, root, coll, PumpOptions{Coalesce: time.Millisecond, PollInterval: time.Millisecond, SafetyPoll: time.Hour}, "a"))
			pumpWriteLog(t, log, []byte("one\n"))
			pumpWaitObserved(t, pump, "a", 0, 4)
			dir := filepath.Dir(log)
			var err error
			if how == "removed" {
				err = os.RemoveAll(dir)
			} else {
				err = os.Rename(dir, dir+".old")
			}
			if err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for pump.npolled.Load() == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the stack is not polled after its directory was %s", how)
				}
				time.Sleep(time.Millisecond)
			}
			pumpWriteLog(t, pumpStackDir(t, root, "a"), []byte("two\n"))
			pumpWaitObserved(t, pump, "a", 1, 4)
			rep := pump.Drain(context.Background())
			if g0, g1 := pumpCollected(t, coll, "a", 0), pumpCollected(t, coll, "a", 1); string(g0) != "one\n" || string(g1) != "two\n" || !rep.Complete {
				t.Fatalf("generations %q and %q, report %+v", g0, g1, rep)
			}
		})
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
