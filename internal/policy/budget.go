package policy

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sync/semaphore"
)

// Budget bounds the plan bytes being evaluated at once when several stacks evaluate in
// parallel: a plan's memory as a Rego value grows with its size, so the sum of the sizes in
// flight bounds the memory. A plan larger than the whole budget waits until it is alone.
//
// A plan read by ReadInput takes about five times its size in live heap while it is
// evaluated (BenchmarkEval: 510 MB for a plan of 105 MB, 34 MB for one of 7 MB), so a budget of
// a fifth of the memory set aside for policy checks (less the Go runtime's headroom, GOGC)
// keeps them within it.
type Budget struct {
	sem   *semaphore.Weighted
	total int64
}

// NewBudget returns a budget of total plan bytes at once (at least 1).
func NewBudget(total int64) *Budget {
	total = max(total, 1)
	return &Budget{sem: semaphore.NewWeighted(total), total: total}
}

// EvalFile evaluates s on the plan JSON at path once its size fits in the budget, and frees
// its share when done.
func (b *Budget) EvalFile(ctx context.Context, s *Set, path string) (*Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	weight := min(max(fi.Size(), 1), b.total)
	if err := b.sem.Acquire(ctx, weight); err != nil {
		return nil, err
	}
	defer b.sem.Release(weight)
	input, err := ReadInput(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s.Eval(ctx, input)
}
