package runner

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/server"
	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// A runner started again after kill -9 finds other bytes stored where its log goes: the
// server answers 409 for that chunk, and the pump gives the chunk up with a warning (it does
// not resend it, nor fail) while the other stacks' logs, sent in the same batches, are stored;
// the stored log stays as it was. Against the real server, batched and chunk by chunk.
func TestPumpGivesUpAChunkTheServerHoldsOtherBytesOf(t *testing.T) {
	for _, noBatch := range []bool{false, true} {
		t.Run(map[bool]string{false: "batched", true: "single"}[noBatch], func(t *testing.T) {
			svc := service.New(storetest.OpenSQLite(t), nil)
			srv, err := server.New(server.Config{Service: svc, Auth: &auth.Authenticator{Insecure: true}})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			posts := map[string]int{} // requests carrying a chunk of each stack
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				peek := r.Clone(r.Context())
				peek.Body = io.NopCloser(bytes.NewReader(body))
				if chunks, err := pumpDecodeChunks(peek); err == nil {
					mu.Lock()
					for _, c := range chunks {
						posts[c.Stack]++
					}
					mu.Unlock()
				}
				srv.ServeHTTP(w, r)
			}))
			t.Cleanup(ts.Close)
			c, err := NewClient(ts.URL)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			const id = "exec-resent"
			if err := c.Init(ctx, events.Init{ExecutionID: id, Repo: "o/r", Environment: "prod", Op: events.OpPlan, Stacks: []string{"a", "b"}}); err != nil {
				t.Fatal(err)
			}
			// The killed runner's copy of stack a's log.
			if err := c.LogChunk(ctx, events.LogChunk{ExecutionID: id, Stack: "a", Data: []byte("hello WORLD\n")}); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			clear(posts)
			mu.Unlock()
			root := t.TempDir()
			for stack, text := range map[string]string{"a": "hello world\n", "b": "stack b's log\n"} {
				if err := os.MkdirAll(filepath.Join(root, stack), 0o755); err != nil {
					t.Fatal(err)
				}
				pumpWriteLog(t, filepath.Join(root, stack, "tfstackplan.log"), []byte(text))
			}
			pump := NewLogPump(c, root, "tfstackplan.log", id)
			for _, s := range []string{"a", "b"} {
				if err := pump.AddStack(s); err != nil {
					t.Fatal(err)
				}
			}
			if err := pump.SetOptions(PumpOptions{NoBatch: noBatch, Coalesce: time.Hour, RetryMin: time.Millisecond, RetryMax: time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			if err := pump.Start(ctx); err != nil {
				t.Fatal(err)
			}
			// Without the give-up the pump would resend stack a's chunk until the drain's deadline.
			dctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			rep := pump.Drain(dctx)
			if dctx.Err() != nil {
				t.Fatal("the drain ran out of time: the refused chunk was retried")
			}
			if len(rep.Errors) != 1 || !strings.Contains(rep.Errors[0], `stack "a"`) || !strings.Contains(rep.Errors[0], "409") ||
				!strings.Contains(rep.Errors[0], "offset 0") {
				t.Fatalf("errors %q, want one warning about stack a's chunk at offset 0", rep.Errors)
			}
			if rep.Complete || rep.LostBytes() != int64(len("hello world\n")) {
				t.Fatalf("report %+v: want stack a's bytes listed as not sent", rep)
			}
			mu.Lock()
			if posts["a"] > 2 {
				t.Errorf("stack a's chunk was posted %d times, want once (twice when its batch was split)", posts["a"])
			}
			mu.Unlock()
			for stack, want := range map[string]string{"a": "hello WORLD\n", "b": "stack b's log\n"} {
				got, err := svc.LogRead(ctx, service.Caller{Name: "test", Admin: true}, id, stack, 0, true, 0, 0)
				if err != nil || string(got.Data) != want {
					t.Errorf("stack %s's stored log: %q, %v; want %q", stack, got.Data, err, want)
				}
			}
		})
	}
}

// A 429 for a quota (the execution's logs reached what the server keeps of one) stops the
// posting; a 429 for the request rate is retried.
func TestPumpStopsAtTheLogQuota(t *testing.T) {
	permanent := PumpOptions{}.withDefaults(true).Permanent
	quota := &APIError{Op: "LogChunks", StatusCode: http.StatusTooManyRequests, CodeName: "RESOURCE_EXHAUSTED",
		Message: `quota exceeded: execution "e" has 1073741824 bytes of logs stored, the 1073741824 bytes an execution may have`}
	rate := &APIError{Op: "LogChunks", StatusCode: http.StatusTooManyRequests, CodeName: "RESOURCE_EXHAUSTED",
		Message: "rate limit exceeded for this principal; retry later"}
	if !permanent(quota) || permanent(rate) || permanent(&APIError{StatusCode: http.StatusConflict}) {
		t.Fatalf("permanent: quota %v, rate %v, conflict %v; want true, false, false", permanent(quota), permanent(rate), permanent(&APIError{StatusCode: http.StatusConflict}))
	}
}
