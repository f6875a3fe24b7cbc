package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// seedExecutions stores n executions of environment "prod", one second apart with one edge
// each: every other one of PR 7, the others of PRs 1 to 50 in turn.
func seedExecutions(b *testing.B, s store.Store, n int) {
	b.Helper()
	const perWrite = 5000
	for from := 0; from < n; from += perWrite {
		if err := s.Write(ctx, func(tx store.Tx) error {
			for i := from; i < min(from+perWrite, n); i++ {
				e := exec1(fmt.Sprintf("x%06d", i), t0.Add(time.Duration(i)*time.Second))
				e.PR = 7
				if i%2 == 1 {
					e.PR = 1 + i%50
				}
				if _, err := tx.CreateExecution(e); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExecutionsList lists the newest 50 executions of an environment, and of a PR in
// it, among n executions of that environment (all of them match the environment, half the
// PR): what the executions API and the filtered web list (on every execution
// change) ask for.
func BenchmarkExecutionsList(b *testing.B) {
	for _, be := range Backends() {
		for _, n := range []int{20000, 40000, 80000} {
			for _, f := range []struct {
				name string
				f    store.ExecutionFilter
			}{
				{"env", store.ExecutionFilter{Environment: "prod", Limit: 50}},
				{"env+pr", store.ExecutionFilter{Environment: "prod", PR: 7, Limit: 50}},
			} {
				b.Run(fmt.Sprintf("%s/%s/%d", be.Name, f.name, n), func(b *testing.B) {
					s := be.Open(b)
					seedExecutions(b, s, n)
					Analyze(b, s)
					for b.Loop() {
						if err := s.Read(ctx, func(tx store.Tx) error {
							got, err := tx.Executions(f.f)
							if err == nil && len(got) != 50 {
								err = fmt.Errorf("listed %d executions, want 50", len(got))
							}
							return err
						}); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
