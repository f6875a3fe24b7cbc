package runner

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
)

// BenchmarkDeadServer measures what a black-holed server (accepts connections, never answers)
// adds to a run of 500 best-effort events, against a disabled client in the same run. The
// events go out as a run sends them: a few at a time, in parallel, from several stacks.
func BenchmarkDeadServer(b *testing.B) {
	fs := rawFault(b, blackHole)

	run := func(c *Client) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		const workers, events_ = 8, 500
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := w; i < events_; i += workers {
					_ = c.Phase(context.Background(), events.PhaseEvent{ExecutionID: "bench", Stack: "s", Phase: "plan", Seq: int64(i)})
				}
			}(w)
		}
		wg.Wait()
		return time.Since(start)
	}
	var added float64
	for i := 0; i < b.N; i++ {
		dead, err := NewClient(fs.url)
		if err != nil {
			b.Fatal(err)
		}
		disabled, _ := NewClient("")
		added += (run(dead) - run(disabled)).Seconds()
	}
	b.ReportMetric(added/float64(b.N), "added-s/run")
}
