package service

import (
	"errors"
	"fmt"
	"slices"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Fan-out applies: the shards of one apply execution each report their own stacks' results, and
// `run merge` finalizes the execution. What the shards recorded stands: the merge may not
// rewrite it, and the execution says which of its plan's changed stacks no shard applied.

// contradicts says how finalize result r contradicts stack st's recorded result ("" when it
// does not): a stack whose own update ended it succeeded keeps that status, its class and its
// plan hash, and one an update ended failed is not made a success. A merge that says otherwise
// would override what the shards applied. (A failed stack finalized cancelled, say, is no
// contradiction: it did not succeed either way.)
// notKnown says whether finalize result r only says that its sender does not know how stack st
// ended (skipped: `run merge` without that shard's result) while an update of the stack's own
// job already recorded how it ended. The recorded result then stands and r changes nothing: a
// merge that lost a shard's result file neither fails on that nor hides what the shard did.
func notKnown(st store.Stack, r api.StackResult) bool {
	return st.Seq != 0 && r.Status == events.StackSkipped &&
		(st.Status == events.StackSucceeded || st.Status == events.StackFailed)
}

func contradicts(st store.Stack, r api.StackResult) string {
	switch {
	case st.Seq == 0:
		return ""
	case st.Status == events.StackFailed && r.Status == events.StackSucceeded,
		st.Status == events.StackSucceeded && r.Status != events.StackSucceeded:
		return fmt.Sprintf("it ended %s, the finalize says %s", st.Status, r.Status)
	case st.Status != events.StackSucceeded:
		return ""
	case r.Class != "" && st.Class != "" && r.Class != st.Class:
		return fmt.Sprintf("its class is %s, the finalize says %s", st.Class, r.Class)
	case r.PlanHash != "" && st.PlanHash != "" && r.PlanHash != st.PlanHash:
		return "its plan hash differs from the finalize's"
	}
	return ""
}

// unapplied returns, for apply execution e (with its stacks) that passed the gate, the stacks
// the plan its lease was decided over changes that e did not apply (none of its results for them
// succeeded), sorted: what none of a fan-out's shards applied. Nil for another op, an apply
// without a lease, or one that applied every changed stack.
func unapplied(tx store.Tx, e *store.Execution, stacks []store.Stack) ([]string, error) {
	if e.Op != api.ExecutionOp(events.OpApply) {
		return nil, nil
	}
	l, err := tx.Lease(e.ExecutionID)
	if errors.Is(err, store.ErrNotFound) || err == nil && l.PlanID == "" {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	planned, err := tx.Stacks(l.PlanID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	applied := map[string]bool{}
	for _, st := range stacks {
		applied[st.Stack] = st.Status == events.StackSucceeded
	}
	var out []string
	for _, st := range planned {
		if changed(st.Class) && !applied[st.Stack] {
			out = append(out, st.Stack)
		}
	}
	slices.Sort(out)
	return out, nil
}
