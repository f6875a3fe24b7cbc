// Package service holds the control plane's domain rules: executions and their stacks, logs,
// claims, gates and grants, checks, cancellation and the audit log. It sits between the HTTP
// handlers and the store; every rule that must hold across replicas runs inside one store
// transaction.
package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/granter"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/textfit"
)

// Limits on what the service stores.
const (
	MaxNameLen        = events.MaxNameLen // execution ids, stack names, environments
	MaxLogChunk       = 1_500_000         // bytes of data in one log chunk (the contract's maxLength)
	MaxDestructive    = 200               // destructive addresses kept per stack
	MaxTextLen        = 16 << 10          // error messages, reasons
	MaxShortLen       = 256               // repo, sha, base, actor, plan hashes
	MaxURLLen         = 2048              // run_url
	MaxReasons        = 10_000            // change reasons in one Init
	MaxStacks         = 10_000            // stacks one request names (Init, Finalize, GateCheck)
	MaxEdges          = 50_000            // run-order edges of one execution
	DefaultLogReadMax = 1 << 20           // bytes one log read returns when the request does not say
	MaxLogReadLimit   = 4 << 20           // the most bytes one log read may ask for
	MaxLogReadRows    = 16 << 10          // log chunks one read looks at (bounds the work of a read of many tiny chunks)
	MaxLogReadGaps    = 1000              // gap records one log read lists (the contract's maxItems)
	MaxStackGaps      = 100               // gap records an execution lists per stack (the contract's maxItems)
)

// Service implements the domain rules over a store.
type Service struct {
	Store  store.Store
	Policy *Policy
	// Now is the clock (tests replace it).
	Now func() time.Time
	// Hub receives "execution changed" signals from every replica.
	Hub *Hub
	// Granter makes a satisfied gate's lease real (nil: granter.None, the lease is a record).
	Granter granter.Granter

	// Quotas bound what one principal may make the server store (zero: unbounded).
	Quotas Quotas
	// ExternalURL is the server's address as browsers reach it, for the links notifications carry.
	ExternalURL string

	owners owners    // who announced each execution (checkOwner)
	seen   seenCache // when this replica last recorded hearing from each execution (noteSeen)
	// logBytes counts each execution's log bytes for Quotas.LogBytesPerExecution.
	logBytes logCounter
}

// New returns a service over s with policy p (nil: nothing gated).
func New(s store.Store, p *Policy) *Service {
	if p == nil {
		p = &Policy{Environments: map[string]EnvPolicy{}}
	}
	return &Service{Store: s, Policy: p, Now: func() time.Time { return time.Now().UTC() }, Hub: NewHub()}
}

// Run relays store notifications (from this and every other replica) to the hub until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	return s.Store.Listen(ctx, s.Hub.Publish)
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{store.ErrInvalid}, a...)...)
}

// checkName validates an identifier-like field: non-empty, bounded, printable
// (events.NameProblem, the rule the driver applies too). A bounded value is quoted.
func checkName(field, v string) error {
	switch p := events.NameProblem(v); {
	case p == "":
		return nil
	case v == "" || len(v) > MaxNameLen:
		return invalid("%s %s", field, p)
	default:
		return invalid("%s %q %s", field, v, p)
	}
}

// checkText validates a bounded text field: valid UTF-8, no NUL byte, at most max bytes. One
// rule for every store: PostgreSQL refuses NUL in text, so no store may accept it.
func checkText(field, v string, max int) error {
	switch {
	case len(v) > max:
		return invalid("%s is longer than %d bytes", field, max)
	case !utf8.ValidString(v):
		return invalid("%s is not valid UTF-8", field)
	case strings.IndexByte(v, 0) >= 0:
		return invalid("%s contains a NUL byte", field)
	}
	return nil
}

// checkTexts checks (field, value) pairs with checkText and one bound.
func checkTexts(max int, pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if err := checkText(pairs[i], pairs[i+1], max); err != nil {
			return err
		}
	}
	return nil
}

// checkShort checks a short field a runner reports and a terminal or a page shows as it is (a
// sha, a base, an actor, a plan hash) with checkText and MaxShortLen, and refuses control
// characters in it: an escape sequence in a sha would reach the approver's terminal.
func checkShort(field, v string) error {
	if err := checkText(field, v, MaxShortLen); err != nil {
		return err
	}
	if i := strings.IndexFunc(v, unicode.IsControl); i >= 0 {
		return invalid("%s contains the control character %U", field, []rune(v[i:])[0])
	}
	return nil
}

// interleave pairs one field name with each value, for checkTexts.
func interleave(field string, values []string) []string {
	out := make([]string, 0, 2*len(values))
	for _, v := range values {
		out = append(out, field, v)
	}
	return out
}

// checkStack validates a stack's path: a name (checkName) in its one canonical spelling
// (events.StackPathProblem), so that a policy glob or a claim sees every stack one way.
func checkStack(field, v string) error {
	switch p := events.StackPathProblem(v); {
	case p == "":
		return nil
	case v == "" || len(v) > MaxNameLen:
		return invalid("%s %s", field, p)
	default:
		return invalid("%s %q %s", field, v, p)
	}
}

// checkNames checks (field, value) pairs with checkName.
func checkNames(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if err := checkName(pairs[i], pairs[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// clip makes free text (messages, errors) storable in every store and cuts it to at most n
// bytes, on a rune boundary: invalid UTF-8 and NUL bytes become U+FFFD. Free text is shown,
// never matched, so it is repaired rather than refused.
func clip(s string, n int) string { return textfit.Prefix(textfit.Sanitize(s), n) }

func (s *Service) ttl(env string, lease bool) time.Duration {
	if lease {
		if d := s.Policy.Environments[env].LeaseTTL; d > 0 {
			return d
		}
		return DefaultLeaseTTL
	}
	if s.Policy.ClaimTTL > 0 {
		return s.Policy.ClaimTTL
	}
	return DefaultClaimTTL
}

// minTime is the earliest time a client may send (1970): the stores keep Unix nanoseconds,
// which start in 1678, and no runner reports a time before 1970.
var minTime = time.Unix(0, 0).UTC()

// checkTime refuses t, a time a client sent in field, when it is outside minTime to MaxTime,
// where the stores' nanoseconds would wrap around (a time in 9999 would read as one in 1816).
// The zero time is a field left out, and passes.
func checkTime(field string, t time.Time) error {
	if t.IsZero() || !t.Before(minTime) && !t.After(MaxTime) {
		return nil
	}
	return invalid("%s %s is outside %s to %s, the times the server stores", field,
		clip(t.UTC().Format(time.RFC3339Nano), 40), minTime.Format(time.DateOnly), MaxTime.Format(time.DateOnly))
}

// orNow is t, a time a client sent (checked by checkTime), in UTC; now when it was left out.
func orNow(t, now time.Time) time.Time {
	if t.IsZero() {
		return now
	}
	return t.UTC()
}

func ackOf(e *store.Execution) api.Ack { return cancelAck(e.Cancelled, e.CancelReason) }

func cancelAck(cancelled bool, reason string) api.Ack {
	if !cancelled {
		return api.Ack{}
	}
	if reason == "" {
		reason = "cancelled by an administrator"
	}
	return api.Ack{Cancel: true, Reason: reason}
}

// audit records an action of caller in repo. A GitHub Actions job's verified claims go with
// the detail, so that the log says which job of the repository acted. Its texts carry what
// requests and tokens said (a reason, a sha, a claim): each is made inert (textfit.Inert), so
// that no newline, control or bidirectional formatting character in them can forge an entry or
// reorder one where the log is shown.
func audit(tx store.Tx, at time.Time, caller Caller, repo, action, target, reason, outcome, detail string) error {
	if caller.GitHub != nil && caller.GitHub.Claims != "" {
		detail = strings.TrimSpace(detail + " [" + caller.GitHub.Claims + "]")
	}
	_, err := tx.AddAudit(api.AuditEntry{At: at, Principal: inert(caller.Name, MaxTextLen), Repo: repo, Action: action,
		Target: inert(target, MaxTextLen), Reason: inert(reason, MaxTextLen), Outcome: inert(outcome, MaxShortLen),
		Detail: inert(detail, MaxTextLen)})
	return err
}

// inert is clip of textfit.Inert of s: free text fit to be shown on a line of its own.
func inert(s string, n int) string { return clip(textfit.Inert(s), n) }

func checkInit(in *api.Init) error {
	if err := checkNames("execution_id", in.ExecutionID, "environment", in.Environment); err != nil {
		return err
	}
	if !in.Op.Valid() {
		return invalid("op %q is not plan, apply or drift", in.Op)
	}
	if in.PR < 0 {
		return invalid("pr %d is negative (0: no pull request)", in.PR)
	}
	if api.ExecutionOp(in.Op) == OpDrift && in.PR != 0 {
		return invalid("pr %d: a drift execution is of no pull request", in.PR)
	}
	for _, f := range [][2]string{{"sha", in.SHA}, {"base", in.Base}, {"actor", in.Actor}} {
		if err := checkShort(f[0], f[1]); err != nil {
			return err
		}
	}
	if err := checkText("run_url", in.RunURL, MaxURLLen); err != nil {
		return err
	}
	if err := checkStackNames(len(in.Stacks), func(i int) string { return in.Stacks[i] }); err != nil {
		return err
	}
	if len(in.Edges) > MaxEdges {
		return invalid("%d edges, more than %d", len(in.Edges), MaxEdges)
	}
	for _, e := range in.Edges {
		if err := checkStack("edge from", e.From); err != nil {
			return err
		}
		if err := checkStack("edge to", e.To); err != nil {
			return err
		}
	}
	if len(in.Reasons) > MaxReasons {
		return invalid("%d change reasons, more than %d", len(in.Reasons), MaxReasons)
	}
	for i := range in.Reasons {
		r := &in.Reasons[i]
		if err := checkStack("reason stack", r.Stack); err != nil {
			return err
		}
		if err := checkTexts(events.MaxReasonText, "reason kind", r.Kind, "reason detail", r.Detail, "reason raw", r.Raw); err != nil {
			return err
		}
		if len(r.Chain) > events.MaxReasonChain {
			return invalid("reason chain of %d steps, more than %d", len(r.Chain), events.MaxReasonChain)
		}
		if err := checkTexts(events.MaxReasonText, interleave("reason chain", r.Chain)...); err != nil {
			return err
		}
	}
	return nil
}

// checkStackNames checks the n stack names name(i) of one request: at most MaxStacks, each a
// valid name, none twice (a repeated stack would be stored and shown once per copy).
func checkStackNames(n int, name func(i int) string) error {
	if n > MaxStacks {
		return invalid("%d stacks, more than %d", n, MaxStacks)
	}
	seen := make(map[string]bool, n)
	for i := range n {
		st := name(i)
		if err := checkStack("stack", st); err != nil {
			return err
		}
		if seen[st] {
			return invalid("stack %q is named twice", st)
		}
		seen[st] = true
	}
	return nil
}

// MaxStartAge and MaxStartAhead are how far an Init's started_at may be behind and ahead of
// the server's clock; one further off is replaced by the server's clock. Ahead, only clock
// skew: a runner sending later times would keep its executions atop the list until then.
const (
	MaxStartAge   = 7 * 24 * time.Hour
	MaxStartAhead = 5 * time.Minute
)

// Init starts (or re-announces) an execution of a repository the caller may act in; the first
// stored copy wins. The principal that first announced it owns it (see ReleaseClaims and
// checkOwner; another principal's Init of the same id is refused), and the server's clock at
// that moment orders it among the PR's plans.
func (s *Service) Init(ctx context.Context, caller Caller, in *api.Init) (api.Ack, error) {
	if err := checkInit(in); err != nil {
		return api.Ack{}, err
	}
	if err := checkTime("started_at", in.StartedAt); err != nil {
		return api.Ack{}, err
	}
	repo, err := caller.writeRepo(in.Repo)
	if err != nil {
		return api.Ack{}, err
	}
	if why := s.mayAnnounce(caller, repo, in.Environment, string(in.Op), in.PR); why != "" {
		return api.Ack{}, fmt.Errorf("%w: %s", store.ErrDenied, why)
	}
	principal := caller.Name
	now := s.Now()
	e := &store.Execution{}
	e.ExecutionID, e.Repo, e.PR, e.SHA, e.Base = in.ExecutionID, repo, in.PR, in.SHA, in.Base
	e.Environment, e.Op, e.Actor, e.RunURL = in.Environment, api.ExecutionOp(in.Op), in.Actor, in.RunURL
	e.Status, e.Edges, e.EdgesApproximate = events.ExecutionRunning, in.Edges, in.EdgesApproximate
	e.StartedAt = in.StartedAt.UTC()
	if in.StartedAt.IsZero() || e.StartedAt.Before(now.Add(-MaxStartAge)) || e.StartedAt.After(now.Add(MaxStartAhead)) {
		// A time that far off is a broken clock or made up: listed as it came, it would stay
		// at the top of the executions list for good, or not fit the store's nanoseconds.
		e.StartedAt = now
	}
	reasons := map[string][]api.ChangeReason{}
	for _, r := range in.Reasons {
		reasons[r.Stack] = append(reasons[r.Stack], r)
	}
	var ack api.Ack
	err = s.Store.Write(ctx, func(tx store.Tx) error {
		created, err := tx.CreateExecution(e)
		if err != nil {
			return err
		}
		if !created {
			// A re-announcement (a retried Init) is acknowledged; the same id from another
			// principal is refused, so that its runner learns at once that none of its events
			// will be taken (see checkOwner) rather than at every one of them.
			owner, _, err := tx.ExecutionPrincipal(e.ExecutionID)
			if err != nil {
				return err
			}
			if owner != principal {
				return fmt.Errorf("%w: execution %s was announced by another principal; choose another execution id", store.ErrDenied, e.ExecutionID)
			}
			cur, err := tx.Execution(e.ExecutionID)
			if err != nil {
				return err
			}
			ack = ackOf(cur)
			return nil
		}
		if err := s.checkExecutionQuota(tx, caller, repo, now); err != nil {
			return err // the execution just created goes with the transaction
		}
		if err := tx.StampExecution(e.ExecutionID, principal, now); err != nil {
			return err
		}
		for _, name := range in.Stacks {
			st := &store.Stack{}
			st.StackState.Stack, st.Status, st.Reasons, st.UpdatedAt = name, events.StackPending, reasons[name], now
			if err := tx.SaveStack(e.ExecutionID, st); err != nil {
				return err
			}
		}
		return tx.Notify(e.ExecutionID)
	})
	return ack, err
}

// CheckName is the check a PR's executions of op conclude.
func CheckName(op api.ExecutionOp) string { return "tfstackplan/" + string(op) }

func conclusion(status api.ExecutionStatus) string {
	switch status {
	case events.ExecutionSucceeded:
		return "success"
	case events.ExecutionCancelled:
		return "cancelled"
	default:
		return "failure"
	}
}

func changed(c api.Class) bool { return c != "" && c != events.ClassNoChanges }

// Finalize ends an execution (the first finalize wins); only the principal that announced it,
// or an admin, may. A successful plan of a PR claims its changed stacks in the environment and
// records the gates they need; a successful apply releases the PR's claims; either concludes
// the PR's check. A drift execution records its stacks' drift checks.
func (s *Service) Finalize(ctx context.Context, caller Caller, in *api.Finalize) (api.Ack, error) {
	if err := checkName("execution_id", in.ExecutionID); err != nil {
		return api.Ack{}, err
	}
	if !in.Status.Valid() || in.Status == events.ExecutionRunning {
		return api.Ack{}, invalid("status %q is not a final execution status", in.Status)
	}
	if err := checkTime("finished_at", in.FinishedAt); err != nil {
		return api.Ack{}, err
	}
	if in.Class != "" && !in.Class.Valid() {
		return api.Ack{}, invalid("class %q is not a change class", in.Class)
	}
	if err := checkStackNames(len(in.Stacks), func(i int) string { return in.Stacks[i].Stack }); err != nil {
		return api.Ack{}, err
	}
	for _, r := range in.Stacks {
		if !r.Status.Valid() || (r.Class != "" && !r.Class.Valid()) {
			return api.Ack{}, invalid("stack %q: bad status %q or class %q", r.Stack, r.Status, r.Class)
		}
		if err := checkShort("plan_hash", r.PlanHash); err != nil {
			return api.Ack{}, err
		}
	}
	if err := s.checkOwner(ctx, caller, in.ExecutionID); err != nil {
		return api.Ack{}, err
	}
	now := s.Now()
	var ack api.Ack
	err := s.Store.Write(ctx, func(tx store.Tx) error {
		e, err := tx.Execution(in.ExecutionID)
		if err != nil {
			return err
		}
		ack = ackOf(e)
		if e.Finalized {
			return nil
		}
		e.Finalized, e.Status, e.Counts, e.Error = true, in.Status, in.Counts, clip(in.Error, MaxTextLen)
		if e.Cancelled {
			e.Status = events.ExecutionCancelled // a cancelled execution never concludes as a success
		}
		e.FinishedAt = notAfter(orNow(in.FinishedAt, now), now)
		// The execution row is locked (tx.Execution), so no event changes its stacks meanwhile:
		// they are read once, and only those the finalize changes are written.
		stacks, err := tx.Stacks(e.ExecutionID)
		if err != nil {
			return err
		}
		index := make(map[string]int, len(stacks))
		for i := range stacks {
			index[stacks[i].Stack] = i
		}
		for _, r := range in.Stacks {
			i, ok := index[r.Stack]
			if !ok {
				st := store.Stack{}
				st.StackState.Stack, st.Status = r.Stack, events.StackPending
				i = len(stacks)
				index[r.Stack] = i
				stacks = append(stacks, st)
			}
			if ok && notKnown(stacks[i], r) {
				continue
			}
			if why := contradicts(stacks[i], r); ok && why != "" {
				return fmt.Errorf("%w: the finalize of execution %s contradicts the result recorded for stack %q: %s", store.ErrMismatch, e.ExecutionID, r.Stack, why)
			}
			st := stacks[i]
			st.Status = r.Status
			if r.Class != "" {
				st.Class = r.Class
			}
			if r.Counts != (api.Counts{}) {
				st.Counts = r.Counts
			}
			if r.PlanHash != "" {
				st.PlanHash = r.PlanHash
			}
			if ok && st.Status == stacks[i].Status && st.Class == stacks[i].Class && st.Counts == stacks[i].Counts && st.PlanHash == stacks[i].PlanHash {
				continue
			}
			st.UpdatedAt = now
			if err := tx.SaveStack(e.ExecutionID, &st); err != nil {
				return err
			}
			stacks[i] = st
		}
		// In byte order whatever the database's collation, so that the stack named below as
		// unsettled is the same on every store.
		slices.SortFunc(stacks, func(a, b store.Stack) int { return strings.Compare(a.Stack, b.Stack) })
		if e.Status == events.ExecutionSucceeded {
			if why := unsettled(e.Op, stacks); why != "" {
				// A success over a stack that did not succeed would be applicable: it is not.
				e.Status = events.ExecutionFailed
				e.Error = clip(strings.TrimSpace("finalized succeeded, but "+why+"; "+e.Error), MaxTextLen)
			}
		}
		e.Class = in.Class
		if e.Class == "" {
			for _, st := range stacks {
				e.Class = events.MaxClass(e.Class, st.Class)
			}
		}
		if err := tx.SaveExecution(e); err != nil {
			return err
		}
		if e.Op == OpDrift {
			if err := tx.AddDriftChecks(driftChecks(e, in)); err != nil {
				return err
			}
		}
		if e.PR != 0 {
			if err := s.settlePR(tx, e, stacks, now); err != nil {
				return err
			}
		}
		if err := s.notifyFinalized(tx, e, stacks, now); err != nil {
			return err
		}
		return tx.Notify(e.ExecutionID)
	})
	return ack, err
}

// unsettled names the first stack that keeps an execution of op from having succeeded: one
// that failed, was cancelled or never finished, and for a plan also one skipped or without a
// class (a plan is applicable only when every stack planned and was classified).
func unsettled(op api.ExecutionOp, stacks []store.Stack) string {
	for _, st := range stacks {
		switch st.Status {
		case events.StackSucceeded:
			if op == api.ExecutionOp(events.OpPlan) && (st.Class == "" || st.Class == events.ClassUnclassified) {
				return fmt.Sprintf("stack %q is unclassified", st.Stack)
			}
		case events.StackSkipped:
			if op == api.ExecutionOp(events.OpPlan) {
				return fmt.Sprintf("stack %q was not planned", st.Stack)
			}
		default:
			return fmt.Sprintf("stack %q ended %s", st.Stack, st.Status)
		}
	}
	return ""
}

// planner is who stands behind a plan as far as its PR's claims go: its principal, except that
// the GitHub Actions jobs of one repository ("github:owner/name:run:ID") are one planner. Each
// run of a pull request's workflow is a principal of its own, and Init let each of them report
// only its pull request, so a later run's plan replaces an earlier run's claims.
func planner(principal string) string {
	if rest, ok := strings.CutPrefix(principal, "github:"); ok {
		repo, _, _ := strings.Cut(rest, ":run:")
		return "github:" + repo
	}
	return principal
}

// settlePR applies a finalized execution's consequences for its PR: claims, gates and the check.
func (s *Service) settlePR(tx store.Tx, e *store.Execution, stacks []store.Stack, now time.Time) error {
	key := store.PRKey{Repo: e.Repo, Environment: e.Environment, PR: e.PR}
	if err := tx.LockEnvironment(e.Repo, e.Environment); err != nil {
		return err
	}
	switch {
	case e.Op == api.ExecutionOp(events.OpPlan) && e.Status == events.ExecutionSucceeded:
		classes := map[string]events.Class{}
		for _, st := range stacks {
			if changed(st.Class) {
				classes[st.Stack] = st.Class
			}
		}
		changedStacks := make([]string, 0, len(classes))
		for stack := range classes {
			changedStacks = append(changedStacks, stack)
		}
		// Only the PR's own claims and those on the stacks it changed matter: reading all of the
		// environment's would cost, inside the write transaction, in proportion to every claim.
		claims, err := tx.ClaimsOn(key, changedStacks, now)
		if err != nil {
			return err
		}
		// A plan frees only the claims of plans its own planner announced: another
		// principal's plan naming this PR must not unlock its stacks for other PRs.
		owners := map[string]string{}
		ownerOf := func(execID string) (string, error) {
			if o, ok := owners[execID]; ok {
				return o, nil
			}
			o, _, err := tx.ExecutionPrincipal(execID)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return "", err
			}
			owners[execID] = planner(o)
			return owners[execID], nil
		}
		planner, err := ownerOf(e.ExecutionID)
		if err != nil {
			return err
		}
		for _, c := range claims {
			if c.PR != e.PR {
				continue
			}
			if _, still := classes[c.Stack]; still {
				continue
			}
			owner, err := ownerOf(c.ExecutionID)
			if err != nil {
				return err
			}
			if owner != planner {
				continue
			}
			if _, err := tx.ReleaseClaims(key, c.Stack); err != nil {
				return err
			}
		}
		held := map[string]int{}
		for _, c := range claims {
			held[c.Stack] = c.PR
		}
		for stack := range classes {
			if pr, ok := held[stack]; ok && pr != e.PR {
				continue // another PR holds it; that PR's apply or release frees it
			}
			if err := tx.PutClaim(api.Claim{Repo: e.Repo, Environment: e.Environment, Stack: stack, PR: e.PR,
				ExecutionID: e.ExecutionID, SHA: e.SHA, ClaimedAt: now, ExpiresAt: now.Add(s.ttl(e.Environment, false))}); err != nil {
				return err
			}
		}
		gates := s.Policy.RequiredGates(e.Environment, classes)
		for i := range gates {
			gates[i].Repo, gates[i].PR, gates[i].ExecutionID, gates[i].RequiredAt = e.Repo, e.PR, e.ExecutionID, now
		}
		if err := tx.ReplaceGates(key, gates); err != nil {
			return err
		}
	case e.Op == api.ExecutionOp(events.OpApply) && e.Status == events.ExecutionSucceeded:
		// Only an apply that passed the PR's gate ends the PR's claims: any runner can announce
		// an apply naming any PR, and must not free another PR's stacks that way.
		l, err := tx.Lease(e.ExecutionID)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return err
		case l.Repo == e.Repo && l.Environment == e.Environment && l.PR == e.PR:
			if _, err := tx.ReleaseClaims(key, ""); err != nil {
				return err
			}
		}
	}
	return tx.PutCheck(api.Check{Repo: e.Repo, Environment: e.Environment, PR: e.PR, Check: CheckName(e.Op),
		Conclusion: conclusion(e.Status), UpdatedAt: now})
}

// Checks lists a page of check conclusions, newest first (store.RowKey); before is the Cursor of
// the previous page's last check (empty: the newest page).
func (s *Service) Checks(ctx context.Context, caller Caller, p Page, before string) ([]api.Check, error) {
	f, err := p.after(caller, before, 1)
	if err != nil {
		return nil, err
	}
	var out []api.Check
	if err := s.Store.Read(ctx, func(tx store.Tx) (err error) { out, err = tx.Checks(f); return }); err != nil {
		return nil, err
	}
	for i, c := range out {
		out[i].Cursor = cursorOf(store.RowKey{At: c.UpdatedAt, Repo: c.Repo, Environment: c.Environment, PR: c.PR, Names: []string{c.Check}})
	}
	return out, nil
}

// OverrideCheck sets a check's conclusion by hand until the PR's next execution concludes it.
func (s *Service) OverrideCheck(ctx context.Context, caller Caller, in *api.ChecksOverride) (api.Ack, error) {
	if err := checkNames("environment", in.Environment, "check", in.Check); err != nil {
		return api.Ack{}, err
	}
	repo, err := caller.writeRepo(in.Repo)
	if err != nil {
		return api.Ack{}, err
	}
	key := store.PRKey{Repo: repo, Environment: in.Environment, PR: in.PR}
	if in.PR <= 0 {
		return api.Ack{}, invalid("pr must be a positive pull request number")
	}
	if !in.Conclusion.Valid() {
		return api.Ack{}, invalid("conclusion %q is not a check conclusion", in.Conclusion)
	}
	if strings.TrimSpace(in.Reason) == "" {
		return api.Ack{}, invalid("reason is required")
	}
	now := s.Now()
	return api.Ack{}, s.Store.Write(ctx, func(tx store.Tx) error {
		cur, err := tx.Check(key, in.Check)
		if err == nil && cur.Overridden && cur.Conclusion == string(in.Conclusion) && cur.Reason == in.Reason {
			return nil
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if err := tx.PutCheck(api.Check{Repo: repo, Environment: in.Environment, PR: in.PR, Check: in.Check,
			Conclusion: string(in.Conclusion), Overridden: true, Reason: clip(in.Reason, MaxTextLen), UpdatedAt: now}); err != nil {
			return err
		}
		return audit(tx, now, caller, repo, "checks.override", fmt.Sprintf("%s %s", target(key), in.Check), in.Reason, string(in.Conclusion), "")
	})
}

// CancelExecution marks an execution cancelled; the runner learns it from its next event's Ack.
func (s *Service) CancelExecution(ctx context.Context, caller Caller, in *api.ExecutionsCancel) (api.Ack, error) {
	if err := checkName("execution_id", in.ExecutionID); err != nil {
		return api.Ack{}, err
	}
	if strings.TrimSpace(in.Reason) == "" {
		return api.Ack{}, invalid("reason is required")
	}
	now := s.Now()
	var ack api.Ack
	err := s.Store.Write(ctx, func(tx store.Tx) error {
		e, err := tx.Execution(in.ExecutionID)
		if err != nil {
			return err
		}
		if !caller.allows(e.Repo) {
			return fmt.Errorf("%w: execution %q", store.ErrNotFound, in.ExecutionID)
		}
		if e.Cancelled {
			ack = ackOf(e)
			return nil
		}
		e.Cancelled, e.CancelReason = true, clip(in.Reason, MaxTextLen)
		if !e.Finalized {
			e.Status = events.ExecutionCancelled
		}
		if err := tx.SaveExecution(e); err != nil {
			return err
		}
		ack = ackOf(e)
		if err := audit(tx, now, caller, e.Repo, "executions.cancel", in.ExecutionID, in.Reason, "cancelled", ""); err != nil {
			return err
		}
		return tx.Notify(e.ExecutionID)
	})
	return ack, err
}

// Executions lists a page of executions newest first (store.ExecutionFilter; a request's paging:
// ExecutionsAfter), without their stacks and edges.
func (s *Service) Executions(ctx context.Context, caller Caller, f store.ExecutionFilter) ([]api.Execution, error) {
	if f.Limit <= 0 || f.Limit > MaxExecutionsLimit {
		f.Limit = DefaultExecutionsLimit
	}
	var err error
	if f.Repo, err = caller.ReadRepo(f.Repo); err != nil {
		return nil, err
	}
	if err := checkPRFilter(f.Repo, f.PR); err != nil {
		return nil, err
	}
	var rows []store.Execution
	if err := s.Store.Read(ctx, func(tx store.Tx) (err error) { rows, err = tx.Executions(f); return }); err != nil {
		return nil, err
	}
	out := make([]api.Execution, 0, len(rows))
	for _, r := range rows {
		out = append(out, r.Execution)
	}
	return out, nil
}

// Execution returns one execution with its stacks, edges, log summaries and the durations of
// the stacks that ended; an execution of a repository the caller may not read is not found.
func (s *Service) Execution(ctx context.Context, caller Caller, id string) (*api.Execution, error) {
	var out *api.Execution
	err := s.Store.Read(ctx, func(tx store.Tx) (err error) {
		if out, err = execution(tx, caller, id); err != nil {
			return err
		}
		spans, err := tx.StackSpans(id, nil)
		fillDurations(out.Stacks, spans)
		return err
	})
	return out, err
}

// fillDurations sets the duration of each stack that ended (succeeded, failed, cancelled) and
// has timed phase events: from its first phase event to its last. A stack pending or running
// has none yet, and a skipped one did not run.
func fillDurations(stacks []api.StackState, spans map[string]store.Span) {
	for i := range stacks {
		st := &stacks[i]
		sp, ok := spans[st.Stack]
		switch {
		case !ok || sp.First.IsZero() || sp.Last.Before(sp.First):
			continue
		case st.Status == api.StackStatusSucceeded || st.Status == api.StackStatusFailed || st.Status == api.StackStatusCancelled:
			ms := sp.Last.Sub(sp.First).Milliseconds()
			st.DurationMS = &ms
		}
	}
}

// execution reads execution id with its edges, stacks and logs' summaries in tx, for caller.
func execution(tx store.Tx, caller Caller, id string) (*api.Execution, error) {
	e, err := readExecution(tx, caller, id)
	if err != nil {
		return nil, err
	}
	if e.Edges, err = tx.ExecutionEdges(id); err != nil {
		return nil, err
	}
	stacks, err := tx.Stacks(id)
	if err != nil {
		return nil, err
	}
	logs, err := tx.LogSummaries(id, MaxStackGaps)
	if err != nil {
		return nil, err
	}
	byStack := map[string]store.LogSummary{}
	for _, l := range logs {
		byStack[l.Stack] = l
	}
	x := e.Execution
	for _, st := range stacks {
		state := st.StackState
		if l, ok := byStack[st.Stack]; ok {
			state.LogGeneration, state.LogBytes, state.Gaps, state.GapsTruncated = l.Generation, l.Bytes, l.Gaps, l.GapsTruncated
		}
		x.Stacks = append(x.Stacks, state)
	}
	if x.Unapplied, err = unapplied(tx, e, stacks); err != nil {
		return nil, err
	}
	return &x, nil
}

// readExecution reads execution id for caller: one of a repository the caller may not read is
// not found, as an unknown one is.
func readExecution(tx store.Tx, caller Caller, id string) (*store.Execution, error) {
	e, err := tx.Execution(id)
	if err != nil {
		return nil, err
	}
	if !caller.allows(e.Repo) {
		return nil, fmt.Errorf("%w: execution %q", store.ErrNotFound, id)
	}
	return e, nil
}

// Audit lists audit entries newest first, of one repository (repo, or the caller's one) or,
// for a caller limited to none, of every repository.
func (s *Service) Audit(ctx context.Context, caller Caller, repo string, limit int, before int64) ([]api.AuditEntry, error) {
	if before < 0 {
		return nil, invalid("before %d is negative (0: the newest entries)", before)
	}
	repo, err := caller.ReadRepo(repo)
	if err != nil {
		return nil, err
	}
	if limit <= 0 || limit > MaxAuditLimit {
		limit = DefaultAuditLimit
	}
	var out []api.AuditEntry
	err = s.Store.Read(ctx, func(tx store.Tx) (err error) { out, err = tx.Audit(repo, limit, before); return })
	return out, err
}

// Ping reports whether the store answers.
func (s *Service) Ping(ctx context.Context) error { return s.Store.Ping(ctx) }
