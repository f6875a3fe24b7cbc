package job

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/plan"
)

// ResultVersion is the version of the result document's schema.
const ResultVersion = 1

// MaxTail bounds the tail of a result error.
const MaxTail = 4096

// Error kinds of a result document.
const (
	KindUsage     = "usage"     // bad flags or arguments
	KindConfig    = "config"    // tfstackplan.hcl, the environment or the server settings
	KindTerramate = "terramate" // terramate failed before or around the run (cycle, untracked files, ...)
	KindScript    = "script"    // a stack's script failed
	KindClassify  = "classify"  // a stack's plan could not be read
	KindGate      = "gate"      // the apply-time gate did not allow the apply
	KindCancelled = "cancelled" // a signal or the server cancelled the run
	KindInternal  = "internal"  // a bug (a recovered panic)
)

// Per-stack statuses of a result document.
const (
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
	StatusNotRun    = "not-run"
	StatusCancelled = "cancelled"
)

// Result is the machine-readable document every `run plan|apply|drift` writes (--result), success or
// failure. Its JSON form is the contract; field names never change within a ResultVersion.
type Result struct {
	Version     int    `json:"version"`
	Op          string `json:"op"`
	Execution   string `json:"execution,omitempty"`
	Environment string `json:"environment,omitempty"`
	// Status is succeeded, failed, cancelled or denied (the gate refused the apply).
	Status       string `json:"status"`
	DryRun       bool   `json:"dry_run,omitempty"`
	Server       string `json:"server,omitempty"`
	ExecutionURL string `json:"execution_url,omitempty"`
	PR           int    `json:"pr,omitempty"`
	SHA          string `json:"sha,omitempty"`
	Repo         string `json:"repo,omitempty"`
	Dir          string `json:"dir,omitempty"`

	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	DurationMS int64     `json:"duration_ms"`
	// Timings are the wall-clock milliseconds of each step (discover, plan, gate, apply, ...).
	Timings map[string]int64 `json:"timings"`

	Class          events.Class  `json:"class,omitempty"`
	HasChanges     bool          `json:"has_changes"`
	HasDestructive bool          `json:"has_destructive"`
	Counts         plan.Counts   `json:"counts"`
	Stacks         []StackEntry  `json:"stacks"`
	Edges          []events.Edge `json:"edges,omitempty"`
	// EdgesApproximate: run-graph was too slow and the edges come from stack metadata.
	EdgesApproximate bool `json:"edges_approximate,omitempty"`

	Gate *GateResult `json:"gate,omitempty"`
	// Gates is what the plan needs before its apply, as the server's policy says (run plan
	// only).
	Gates *GatesNeeded `json:"gates,omitempty"`
	// Conflicts are the other open pull requests that claim stacks this plan changes: its
	// apply is denied until they are applied or release them (run plan, with a server).
	Conflicts []Conflict `json:"conflicts,omitempty"`
	// Drift is what a drift run found (run drift only).
	Drift *DriftResult `json:"drift,omitempty"`
	Error *ResultError `json:"error"`
	// Warnings are problems that did not fail the run (the server could not be reached, logs
	// were lost, ...).
	Warnings []string `json:"warnings,omitempty"`

	// Matrix is the cut of a fan-out's matrix job (`--matrix N`).
	Matrix *Matrix `json:"matrix,omitempty"`
	// Shard is the shard ("K/N") a shard job ran.
	Shard string `json:"shard,omitempty"`
	// RerunOf is the earlier plan whose outcomes `--rerun-failed` carried.
	RerunOf string `json:"rerun_of,omitempty"`
	// Plans are a shard job's classified plans, for the merge to render: the JSON render of
	// its report (internal/plan JSON, sensitive values masked).
	Plans json.RawMessage `json:"plans,omitempty"`

	// Signal is the signal that ended the run, if any (not part of the document).
	Signal os.Signal `json:"-"`
}

// StackEntry is one stack of a result document.
type StackEntry struct {
	// Stack is the stack as terramate listed it, relative to the environment's directory.
	Stack string `json:"stack"`
	// Path is the stack relative to the repository root (what the server and `run tick` use).
	Path   string       `json:"path"`
	Status string       `json:"status"`
	Class  events.Class `json:"class,omitempty"`
	Counts plan.Counts  `json:"counts"`
	// PlanHash is the content hash of the stack's plan (see internal/plan: what it covers).
	PlanHash    string   `json:"plan_hash,omitempty"`
	Destructive []string `json:"destructive"`
	Why         []string `json:"why,omitempty"`
	Error       string   `json:"error,omitempty"`
	// Lock is set on a stack the run's interrupt caught in the middle of its script: the
	// state lock it may still hold.
	Lock *StateLock `json:"lock,omitempty"`
	// LogTail is the end of the log of a failed or cancelled stack (masked; at most
	// MaxLogTailLines lines and MaxLogTailBytes bytes).
	LogTail string `json:"log_tail,omitempty"`
	// Shard is the fan-out shard ("K/N") the stack belongs to.
	Shard string `json:"shard,omitempty"`
	// Drifted says whether the stack drifted (run drift only): it planned, and its plan has
	// changes or resource drift.
	Drifted *bool `json:"drifted,omitempty"`
}

// What GatesNeeded.Status says of where the gates come from.
const (
	GatesKnown       = "known"       // the server answered: Required is every gate the plan needs
	GatesOffline     = "offline"     // no server: nothing says which gates the plan needs
	GatesUnavailable = "unavailable" // the server did not answer
	GatesNoPolicy    = "no-policy"   // the server's policy has no such environment: nothing is gated
)

// GatesNeeded is what a plan needs before its apply, as the server said after its Finalize.
type GatesNeeded struct {
	// Status is GatesKnown, GatesOffline, GatesUnavailable or GatesNoPolicy.
	Status string `json:"status"`
	// Message says the same in a sentence (and why the server did not answer).
	Message string `json:"message"`
	// Blocked is why the server would approve or apply no part of this plan as it is.
	Blocked string `json:"blocked,omitempty"`
	// Required are the gates the plan requires (known only).
	Required []GateNeeded `json:"required"`
}

// GateNeeded is one gate a plan requires: a class of change on the stacks matching a glob.
type GateNeeded struct {
	Class string `json:"class"`
	// Target is the policy's stack glob.
	Target string `json:"target"`
	// Stacks are the plan's stacks (repository paths) the gate covers.
	Stacks    []string `json:"stacks"`
	Satisfied bool     `json:"satisfied"`
	// GrantID, GrantedBy and GrantedAt name the grant that satisfies the gate.
	GrantID   int64     `json:"grant_id,omitempty"`
	GrantedBy string    `json:"granted_by,omitempty"`
	GrantedAt time.Time `json:"granted_at,omitzero"`
	// ApproveURL is the execution's page, where an admin approves it.
	ApproveURL string `json:"approve_url,omitempty"`
	// Command is the CLI command that approves it (the reason left to the approver).
	Command string `json:"command,omitempty"`
}

// Conflict is another open pull request's claim on stacks a plan changes.
type Conflict struct {
	PR int `json:"pr"`
	// Execution is the plan of that PR that took the claims.
	Execution string `json:"execution,omitempty"`
	// Stacks are the claimed stacks (repository paths).
	Stacks []string `json:"stacks"`
}

// GateResult is the apply-time gate check's outcome.
type GateResult struct {
	Verdict   string `json:"verdict"`
	Allowed   bool   `json:"allowed"`
	Requester string `json:"requester,omitempty"`
	Message   string `json:"message,omitempty"`
	Revoked   bool   `json:"revoked,omitempty"`
}

// ResultError says why a run failed: its kind, the step that failed and a bounded tail.
type ResultError struct {
	Kind string `json:"kind"`
	Step string `json:"step"`
	Tail string `json:"tail"`
}

// Error returns the tail.
func (e *ResultError) Error() string { return e.Kind + " error in " + e.Step + ": " + e.Tail }

// newResultError builds a ResultError whose tail is msg's last MaxTail bytes (cut on a rune
// boundary).
func newResultError(kind, step, msg string) *ResultError {
	return &ResultError{Kind: kind, Step: step, Tail: tailOf(msg, MaxTail)}
}

func tailOf(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	for i := 0; i < len(s) && i < 4; i++ {
		if s[i]&0xC0 != 0x80 {
			return s[i:]
		}
	}
	return s
}

// WriteResult writes r to path atomically (a temporary file renamed over it), creating the
// directory when needed.
func WriteResult(path string, r *Result) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	return writeFileAtomic(path, b, 0o644)
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	cerr := f.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(tmp, mode)
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, werr)
	}
	return nil
}

// DefaultResultPath is where the result goes without --result: $RUNNER_TEMP in GitHub Actions,
// else the working directory.
func DefaultResultPath(getenv func(string) string) string {
	if d := getenv("RUNNER_TEMP"); d != "" && getenv("GITHUB_ACTIONS") == "true" {
		return filepath.Join(d, "tfstackplan-result.json")
	}
	return "tfstackplan-result.json"
}

// jsonMarshalNoHTML encodes v without HTML escaping and without a trailing newline.
func jsonMarshalNoHTML(v any) ([]byte, error) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return []byte(strings.TrimSuffix(b.String(), "\n")), nil
}
