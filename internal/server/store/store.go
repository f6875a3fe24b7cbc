// Package store is the persistence layer of the control plane: the Store interface the service
// uses, the rows it reads and writes, and the domain sentinels every store maps its driver
// errors to.
package store

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
)

// Domain sentinels. Stores and the service wrap them with %w; the HTTP layer maps them to a
// status and a grpc code name in one place.
var (
	// ErrNotFound: the named thing does not exist.
	ErrNotFound = errors.New("not found")
	// ErrInvalid: the request is malformed.
	ErrInvalid = errors.New("invalid argument")
	// ErrConflict: the write collides with an existing row.
	ErrConflict = errors.New("already exists")
	// ErrPrecondition: the system is not in the state the operation needs.
	ErrPrecondition = errors.New("failed precondition")
	// ErrDenied: the operation is understood but not allowed.
	ErrDenied = errors.New("permission denied")
	// ErrUnavailable: a dependency (the database) failed; retrying may help.
	ErrUnavailable = errors.New("unavailable")
	// ErrStale: the request is about a state that has moved on (an approval of a plan that is no
	// longer the PR's latest); the client must look again before it asks again.
	ErrStale = errors.New("stale")
	// ErrMismatch: the write carries data that differs from what is stored where it would go
	// (log bytes that differ from the stored bytes at their offset); the stored data stays.
	ErrMismatch = errors.New("differs from the stored data")
	// ErrQuota: the caller used up a quota; retrying later may succeed.
	ErrQuota = errors.New("quota exceeded")
)

// Execution is one stored execution (stacks are read separately).
type Execution struct {
	api.Execution
	// Finalized is set by the first Finalize.
	Finalized bool
	// Cancelled is set by an administrator's cancel.
	Cancelled bool
}

// Stack is one stack's stored state in an execution.
type Stack struct {
	api.StackState
	// Seq is the highest Update seq applied.
	Seq int64
	// PhaseSeq is the seq of the phase event shown in Phase.
	PhaseSeq int64
}

// Phase is one stored phase event.
type Phase struct {
	ExecutionID, Stack, Phase, Status, Message string
	Seq                                        int64
	At                                         time.Time
}

// LogChunk is one stored log chunk or gap record.
type LogChunk struct {
	ExecutionID, Stack string
	Generation, Offset int64
	Data               []byte
	GapLength          int64
}

// End is the offset just past the chunk, saturating at math.MaxInt64 (rows stored before
// offsets were bounded may reach past it).
func (c LogChunk) End() int64 {
	n := int64(len(c.Data))
	if c.GapLength > 0 {
		n = c.GapLength
	}
	if c.Offset > math.MaxInt64-n {
		return math.MaxInt64
	}
	return c.Offset + n
}

// LogSummary describes one stack's latest log generation.
type LogSummary struct {
	Stack      string
	Generation int64
	// Bytes is the offset just past the generation's last chunk (the one that starts last).
	Bytes int64
	// Gaps are the generation's first gap records by offset, as many as LogSummaries was asked
	// for; GapsTruncated reports that it has more.
	Gaps          []api.LogGap
	GapsTruncated bool
}

// PRKey names one pull request of one repository in one environment: what claims, gates,
// grants, checks and a PR's latest plan are keyed by. Two repositories never share a PR.
type PRKey struct {
	// Repo is the repository, owner/name lowercased.
	Repo        string
	Environment string
	PR          int
}

// Lease is the requester a satisfied gate check leased to an apply execution.
type Lease struct {
	// Repo is the repository of the PR the lease was granted for.
	Repo                                         string
	ExecutionID, Environment, Requester, Outcome string
	PR                                           int
	GrantedAt, ExpiresAt, RevokedAt              time.Time
	// Principal is who the lease was granted to; only it (or an admin) may revoke it.
	Principal string
	// SHA is the commit the apply named; PlanID the plan execution the gate decided over.
	SHA, PlanID string
	// GrantIDs are the grants the decision used; the revoke ends exactly these.
	GrantIDs []int64
	// Member is the runner identity the granter bound to the requester.
	Member string
	// Bound reports a granter binding that is (or may still be) in place and must be removed.
	Bound bool
	// UnbindAttempts counts failed removals; UnbindError is the last failure.
	UnbindAttempts int
	UnbindError    string
}

// Span is when a stack's first and last phase events happened.
type Span struct{ First, Last time.Time }

// Session is a signed-in web session. The session id itself is only in the browser's cookie:
// the store keeps its SHA-256, so reading the table does not sign anyone in.
type Session struct {
	// IDHash is the hex SHA-256 of the session id.
	IDHash string
	// Principal is the name of the principal signed in; PrincipalJSON the whole principal, as
	// the web layer encodes it (new fields of the principal carry over).
	Principal, PrincipalJSON string
	// CreatedAt is when the session was made, ExpiresAt when it ends, RevokedAt when it was
	// signed out (zero while it was not).
	CreatedAt, ExpiresAt, RevokedAt time.Time
}

// ExecutionFilter selects a page of executions, newest first: by started_at, then by id, both
// descending, so that executions started at the same instant keep one order.
type ExecutionFilter struct {
	// Repo, Environment and PR select (zero values: any).
	Repo        string
	Environment string
	PR          int
	// Limit > 0 keeps only the first Limit executions (0: 50).
	Limit int
	// BeforeID, when set, keeps only the executions that come after the execution (Before,
	// BeforeID) in the list's order, its started_at and its id: started before Before, or at
	// Before with a lower id. The zero Before there is the zero started_at, as listed.
	BeforeID string
	// Before without BeforeID, when not zero, keeps only the executions started before it: a
	// time alone, which leaves out the executions of the previous page's last instant that
	// page did not list (the old paging, which clients without BeforeID still ask for).
	Before time.Time
}

// GrantFilter selects grants, newest (highest id) first; zero values select everything.
type GrantFilter struct {
	Repo        string
	Environment string
	PR          int
	Class       string
	Target      string
	// ActiveAt non-zero keeps only grants active at that time.
	ActiveAt time.Time
	// Before > 0 keeps only grants with a lower id: the page after grant Before.
	Before int64
	// Limit > 0 keeps only the first Limit grants (0: all of them).
	Limit int
}

// ListFilter selects a page of a list of gates or checks, newest first; zero values select
// everything.
type ListFilter struct {
	Repo        string
	Environment string
	PR          int
	// Limit > 0 keeps only the first Limit rows (0: all of them).
	Limit int
	// After, when set, keeps only the rows that come after it in the list's order: the page
	// after the row After stands for. It must be a row the filter selects (its Repo,
	// Environment and PR those of the filter, where the filter gives them).
	After *RowKey
}

// RowKey is a gate's or a check's place in its list. A list is ordered newest first by At (when
// a gate was required, when a check was concluded), then by Repo, Environment, PR and Names (a
// gate's class and target, a check's name), all descending: rows of the same time keep one
// order.
type RowKey struct {
	At          time.Time
	Repo        string
	Environment string
	PR          int
	Names       []string
}

// EventState is the part of an execution every runner event looks at.
type EventState struct {
	Cancelled    bool
	CancelReason string
	Finalized    bool
}

// Tx is one unit of work. Every method runs inside the transaction the Store opened.
type Tx interface {
	// CreateExecution stores e unless its id exists; created reports which. An id retention
	// deleted (PruneExecutions) is never stored again: ErrPrecondition.
	CreateExecution(e *Execution) (created bool, err error)
	// Execution returns one execution, without its edges (ExecutionEdges has them; its
	// EdgesApproximate is set), or ErrNotFound. Inside Write it locks the row until the
	// transaction ends, so read-modify-write of an execution (and its stacks) is serialized.
	Execution(id string) (*Execution, error)
	// ExecutionEdges returns the run-graph edges of one execution, or ErrNotFound. They can
	// number tens of thousands: only the execution's detail reads them.
	ExecutionEdges(id string) ([]api.Edge, error)
	// ExecutionCancel returns whether an execution was cancelled and why, or ErrNotFound,
	// without locking the row: the check gate checks make. Runner events read it through
	// ApplyUpdate, AddPhaseEvent and AddLogBatch.
	ExecutionCancel(id string) (cancelled bool, reason string, err error)
	// EventState returns what a runner event needs of its execution (cancelled and why,
	// finalized) or ErrNotFound. Inside Write it locks the row like Execution, reading only
	// those columns.
	EventState(id string) (EventState, error)
	// SaveExecution writes the mutable fields of an existing execution.
	SaveExecution(e *Execution) error
	// Executions lists executions newest first, without their edges (ExecutionEdges has them).
	Executions(f ExecutionFilter) ([]Execution, error)
	// LatestPlan returns the plan execution of a PR the server received last, without its
	// edges, or ErrNotFound. The order is the server's (StampExecution), never a client's clock.
	LatestPlan(k PRKey) (*Execution, error)
	// StampExecution records the principal that announced an execution and when the server
	// received it.
	StampExecution(id, principal string, at time.Time) error
	// ExecutionPrincipal returns the principal that announced an execution and its
	// repository, or ErrNotFound.
	ExecutionPrincipal(id string) (principal, repo string, err error)

	// Stacks lists an execution's stacks, sorted by name.
	Stacks(execID string) ([]Stack, error)
	// PlanHashes returns the plan hash of every stack of the listed executions, by execution
	// id and stack name, in a few queries whatever their number (an execution without stacks
	// has no entry).
	PlanHashes(execIDs []string) (map[string]map[string]string, error)
	// StackSpans returns, per stack of an execution that has timed phase events, the times of
	// its first and last one: of every stack, or only of stacks when it is not nil.
	StackSpans(execID string, stacks []string) (map[string]Span, error)
	// Stack returns one stack or ErrNotFound (locked until the transaction ends inside Write).
	Stack(execID, stack string) (*Stack, error)
	// SaveStack inserts or replaces one stack's state.
	SaveStack(execID string, s *Stack) error
	// AddPhase stores a phase event once; added reports whether it was new.
	AddPhase(p Phase) (added bool, err error)

	// AddLogChunk stores a chunk once per (execution, stack, generation, offset).
	AddLogChunk(c LogChunk) (added bool, err error)
	// AddLogChunks stores several chunks, each once; it returns how many were new.
	AddLogChunks(cs []LogChunk) (added int64, err error)
	// LogChunks returns chunks of one generation ordered by offset: the one that starts last
	// before from when it reaches past from, then those that start at from or later, stopping at
	// the chunk that brings their data to maxBytes or more, or at maxRows chunks. It seeks to
	// from: the chunks before it cost nothing, nor does the data of the chunks after the last.
	LogChunks(execID, stack string, generation, from int64, maxBytes, maxRows int) ([]LogChunk, error)
	// LogChunksAfter is LogChunks for the chunks that start after offset after (a read going on
	// from the last chunk it was given).
	LogChunksAfter(execID, stack string, generation, after int64, maxBytes, maxRows int) ([]LogChunk, error)
	// LatestGeneration returns the highest generation logged for a stack (0 when none).
	LatestGeneration(execID, stack string) (int64, error)
	// LogSummaries describes the latest log generation of each stack of an execution, with at
	// most maxGaps of its gap records each, sorted by stack.
	LogSummaries(execID string, maxGaps int) ([]LogSummary, error)

	// Claims lists claims not expired at now (repo and env empty: all of them).
	Claims(repo, env string, now time.Time) ([]api.Claim, error)
	// ClaimsOn lists the claims in k's repository and environment not expired at now that are
	// on one of stacks or, when k.PR is not 0, that PR k.PR holds, sorted by stack: the claims
	// a decision over those stacks for that PR needs, read through indexes in a few queries
	// however many claims the environment has.
	ClaimsOn(k PRKey, stacks []string, now time.Time) ([]api.Claim, error)
	// PutClaim inserts or replaces the claim on (repo, environment, stack).
	PutClaim(c api.Claim) error
	// ReleaseClaims deletes a PR's claims (one stack when stack is non-empty).
	ReleaseClaims(k PRKey, stack string) (int64, error)
	// ReleaseExecutionClaims deletes the claims one execution took in env (one stack when
	// stack is non-empty).
	ReleaseExecutionClaims(env, execID, stack string) (int64, error)

	// ReplaceGates replaces the gates a PR requires (each required at its RequiredAt).
	ReplaceGates(k PRKey, gates []api.Gate) error
	// Gates lists required gates in their list's order (RowKey: At is RequiredAt, Names the
	// class and the target).
	Gates(f ListFilter) ([]api.Gate, error)

	// AddGrant stores a grant and returns its id.
	AddGrant(g api.Grant) (int64, error)
	// Grants lists grants, newest (highest id) first.
	Grants(f GrantFilter) ([]api.Grant, error)
	// ReleaseGrants ends the PR's grants active at `at` of (class, target).
	ReleaseGrants(k PRKey, class, target, by string, at time.Time) (int64, error)
	// ReleaseGrantIDs ends the listed grants still active at `at`.
	ReleaseGrantIDs(ids []int64, by string, at time.Time) (int64, error)

	// Lease returns the lease of an apply execution or ErrNotFound.
	Lease(execID string) (*Lease, error)
	// LeasesOfPlans returns the leases whose gate check decided over one of the plan
	// executions (Lease.PlanID): the applies that used those plans' approvals.
	LeasesOfPlans(planIDs []string) ([]Lease, error)
	// PutLease inserts or replaces a lease.
	PutLease(l Lease) error
	// LeasesToUnbind lists up to limit leases whose granter binding is still in place although
	// they were revoked or expired at now, fewest failed attempts first.
	LeasesToUnbind(now time.Time, limit int) ([]Lease, error)

	// PutCheck inserts or replaces a check conclusion.
	PutCheck(c api.Check) error
	// Check returns one check of a PR or ErrNotFound.
	Check(k PRKey, name string) (*api.Check, error)
	// Checks lists checks in their list's order (RowKey: At is UpdatedAt, Names the check's
	// name).
	Checks(f ListFilter) ([]api.Check, error)

	// AddAudit appends an audit entry and returns its id.
	AddAudit(e api.AuditEntry) (int64, error)
	// Audit lists entries newest first (of one repository when repo is not empty), ids below
	// before when before > 0.
	Audit(repo string, limit int, before int64) ([]api.AuditEntry, error)

	// CreateSession stores a new session; ErrConflict when its IDHash exists.
	CreateSession(s Session) error
	// Session returns the session of an IDHash, ended or not, or ErrNotFound.
	Session(idHash string) (*Session, error)
	// RevokeSession marks a session revoked at `at` unless it already was; revoked reports
	// whether this call did (false also for an unknown IDHash).
	RevokeSession(idHash string, at time.Time) (revoked bool, err error)
	// SessionsSince counts the sessions of a principal created at since or later.
	SessionsSince(principal string, since time.Time) (int, error)
	// PruneSessions deletes up to limit sessions that expired at or before `at` and returns
	// how many it deleted.
	PruneSessions(at time.Time, limit int) (int64, error)

	// SeeExecution records that the server heard from an execution's runner at `at` (unless it
	// recorded a later time).
	SeeExecution(id string, at time.Time) error
	// StaleExecutions lists up to limit executions, oldest first, that are running and not
	// finalized or cancelled, and that the server has heard nothing of since before: neither
	// their Init (StampExecution) nor anything SeeExecution recorded.
	StaleExecutions(before time.Time, limit int) ([]string, error)

	// PruneExecutions deletes up to limit finished executions (finalized, or no longer running)
	// that the server received (StampExecution) and that finished before `before`, with their stacks, phases, logs and drift checks
	// (not a stack's latest, LatestDrift), and returns how many it deleted. It keeps every execution something live still needs at now:
	// a claim not expired, a gate, an active grant or a lease (in force, or whose granter
	// binding is still to be removed) naming it, and the latest plan of each PR (what a gate
	// check decides over).
	PruneExecutions(before, now time.Time, limit int) (int64, error)
	// LogBytes returns the bytes of data stored in an execution's logs (every stack and
	// generation; gap records not counted).
	LogBytes(execID string) (int64, error)
	// ExecutionsSince counts the executions a principal announced at since or later, up to
	// limit, and returns when the first of them was received (zero when none).
	ExecutionsSince(principal string, since time.Time, limit int) (n int, first time.Time, err error)
	// RepoExecutionsSince is ExecutionsSince of every principal whose name starts with prefix
	// (the runs of one repository's GitHub Actions jobs), counting their executions of repo.
	RepoExecutionsSince(repo, prefix string, since time.Time, limit int) (n int, first time.Time, err error)

	// AddDriftChecks records the drift checks of a drift execution: each in its stack's history
	// (once per stack and execution) and as its stack's latest, unless the latest recorded is
	// of a later time.
	AddDriftChecks(cs []api.DriftCheck) error
	// LatestDrift lists each stack's latest drift check in environment env of repo (of every
	// repository when repo is ""), by repository and stack.
	LatestDrift(repo, env string) ([]api.DriftCheck, error)
	// DriftHistory lists one stack's drift checks, newest first, at most limit.
	DriftHistory(repo, env, stack string, limit int) ([]api.DriftCheck, error)

	// LockEnvironment serializes claim, gate and grant decisions on a repository's environment
	// until the transaction ends (a database lock, so it holds across replicas).
	LockEnvironment(repo, env string) error
	// Notify tells every replica, after commit, that the execution changed.
	Notify(execID string) error

	// ApplyUpdate stores a runner's update of one stack: it takes the execution row in share
	// mode (events of one execution run concurrently, while finalize and cancel, which lock it
	// exclusively through Execution, wait for them and they for those; the execution is always
	// locked before its stacks) and, unless the execution is finalized, writes the fields an
	// update sets (Status, Class, Counts, PlanHash, Destructive, Error, Seq, UpdatedAt),
	// creating the stack when missing, unless the stored Seq is higher. It returns the
	// execution's state and whether the stack was written, or ErrNotFound. One statement where
	// the backend allows.
	ApplyUpdate(execID string, s *Stack) (state EventState, applied bool, err error)
	// ApplyUpdates applies the updates ss of execution execID as ApplyUpdate would one after
	// the other, in a few statements whatever their number, and returns the execution's state
	// and how many stacks were written (0 when none was).
	ApplyUpdates(execID string, ss []*Stack) (state EventState, applied int64, err error)
	// AddPhaseEvent stores a runner's phase event: it locks the execution as ApplyUpdate does,
	// stores p in the history once (added reports whether it was new) and, when it is new and
	// the execution not finalized, shows `shown` as the stack's current phase at p.Seq (updated
	// at now) unless a newer one is shown: a missing stack is created running, a pending one
	// becomes running. It returns the execution's state, or ErrNotFound. One statement where
	// the backend allows.
	AddPhaseEvent(p Phase, shown string, now time.Time) (state EventState, added bool, err error)
	// AddPhaseEvents stores the phase events ps of execution execID (shown[i] is ps[i]'s shown
	// phase) as AddPhaseEvent would one after the other, in a few statements whatever their
	// number, and returns the execution's state and how many events were new.
	AddPhaseEvents(execID string, ps []Phase, shown []string, now time.Time) (state EventState, added int, err error)
	// AddLogBatch stores chunks of one execution, each once per (execution, stack, generation,
	// offset) as AddLogChunks does, unless some chunk names a stack the execution has none of:
	// it returns the execution's state (read without locking), the names of the missing stacks
	// (sorted, once each: nothing is stored then) and how many chunks it stored, or ErrNotFound.
	// Unlike AddLogChunks it checks every chunk against the stored log and the rest of the
	// batch: a chunk whose bytes (or gap record) differ from those stored over its range (as
	// far as the stored chunk starting last before its end and those after it tell) stores
	// nothing of the batch and fails with ErrMismatch naming the stack, generation and offset.
	// A chunk that repeats stored bytes and goes on (a resend that read further) has its bytes
	// past them stored, as chunks of their own: the chunks it stores never overlap each other or
	// those stored before. Consecutive chunks of a stack may be stored together, as one row
	// (readers go by offset; each still counts in added). One statement where the backend
	// allows, unless some chunk overlaps the stored log.
	AddLogBatch(execID string, cs []LogChunk) (state EventState, missing []string, added int64, err error)
}

// Store opens units of work and runs housekeeping.
type Store interface {
	// Write runs fn in a read-write transaction; fn's error rolls it back and is returned.
	Write(ctx context.Context, fn func(Tx) error) error
	// Read runs fn in a read-only transaction.
	Read(ctx context.Context, fn func(Tx) error) error
	// Ping checks the database answers.
	Ping(ctx context.Context) error
	// PruneLogs deletes log chunks of executions started before cutoff; it returns the count.
	PruneLogs(ctx context.Context, cutoff time.Time) (int64, error)
	// Listen calls fn with the id of every execution any replica notified, until ctx ends.
	Listen(ctx context.Context, fn func(execID string)) error
	// Kind names the backend ("sqlite", "postgres").
	Kind() string
	// Close releases the database.
	Close() error
}
