// Package plan classifies and renders Terraform/OpenTofu plans.
//
// Classify reads the output of `terraform show -json` / `tofu show -json` as a stream (one
// resource change at a time, never the whole document), counts changes per action, assigns the
// stack a change class (no-changes < additive < mutating < destructive, or unclassified when the
// plan cannot be read) and, in the same pass, computes the plan hash: a canonical hash of the
// change set (resource changes, output changes, drift), independent of timestamps, versions,
// key order, whitespace and entry order (PlanHashVersion says exactly what it covers). Every
// render (step summary, PR comment, terminal text, JSON) is built from the same model, a
// Report of Stacks.
//
// Secrets: the model never holds a sensitive value once Classify returns. Every value found in
// a sensitive position anywhere in the plan (sensitive root variables, sensitive outputs,
// attributes flagged in before_sensitive/after_sensitive, sensitive_values of planned and prior
// state) is collected, and any displayed value equal to one of them, or containing one of at
// least minSecretSubstring bytes, is replaced by "(sensitive value)". The plan's `variables`
// are never displayed.
package plan

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/tfstackplan/tfstackplan/events"
)

// Action is what a plan does to one resource instance, as counted and rendered.
type Action string

// Actions a resource change can have. A replace is delete-then-create, create-then-delete,
// forget-then-create or create-then-forget (with lifecycle destroy = false the old object is
// dropped from state, not destroyed; OpenTofu 1.12 plans ["forget","create"] whether or not
// create_before_destroy is set); it counts once, as replace. Import is an import with no other
// action; an import that also updates (or creates, replaces) is that action with Importing set,
// and counts both as that action and as an import, as tofu's "Plan: N to import, ..." line does.
// Move is a move (a `moved` block: previous_address differs from address) with no other action;
// a move that also updates (or anything else) is that action with PreviousAddress set, and
// counts only as that action.
const (
	ActionCreate  Action = "create"
	ActionUpdate  Action = "update"
	ActionReplace Action = "replace"
	ActionDelete  Action = "delete"
	ActionForget  Action = "forget"
	ActionImport  Action = "import"
	ActionRead    Action = "read"
	ActionMove    Action = "move"
	ActionNoOp    Action = "no-op"
)

// Destructive reports whether the action removes or recreates existing infrastructure, or
// drops it from state: delete, replace and forget.
func (a Action) Destructive() bool {
	return a == ActionDelete || a == ActionReplace || a == ActionForget
}

// Symbol is the one-character marker renders put before an action.
func (a Action) Symbol() string {
	switch a {
	case ActionCreate:
		return "+"
	case ActionUpdate:
		return "~"
	case ActionReplace:
		return "±"
	case ActionDelete:
		return "-"
	case ActionForget:
		return "⊘"
	case ActionImport:
		return "←"
	case ActionRead:
		return "≤"
	case ActionMove:
		return "→"
	}
	return " "
}

// Counts are resource changes by action. Every key but move is always present in JSON (move
// only when there are moves, so that documents of plans without moves keep their seven keys);
// a replace counts once, as replace; an import counts as import and, when it also changes the
// object, as that change too (see ActionImport); a move counts as move only when it is nothing
// else; no-op changes are not counted.
type Counts struct {
	Create  int `json:"create"`
	Update  int `json:"update"`
	Replace int `json:"replace"`
	Delete  int `json:"delete"`
	Forget  int `json:"forget"`
	Import  int `json:"import"`
	Read    int `json:"read"`
	Move    int `json:"move,omitempty"`
}

// Total is the sum of the counts: the number of counted changes, where an import that also
// changes the object counts twice.
func (c Counts) Total() int {
	return c.Create + c.Update + c.Replace + c.Delete + c.Forget + c.Import + c.Read + c.Move
}

// Destructive is the number of deletes, replaces and forgets.
func (c Counts) Destructive() int { return c.Replace + c.Delete + c.Forget }

// Add adds o to c.
func (c *Counts) Add(o Counts) {
	c.Create += o.Create
	c.Update += o.Update
	c.Replace += o.Replace
	c.Delete += o.Delete
	c.Forget += o.Forget
	c.Import += o.Import
	c.Read += o.Read
	c.Move += o.Move
}

// inc counts one change with action a; no-op is not counted.
func (c *Counts) inc(a Action) {
	switch a {
	case ActionCreate:
		c.Create++
	case ActionUpdate:
		c.Update++
	case ActionReplace:
		c.Replace++
	case ActionDelete:
		c.Delete++
	case ActionForget:
		c.Forget++
	case ActionImport:
		c.Import++
	case ActionRead:
		c.Read++
	case ActionMove:
		c.Move++
	}
}

// Events converts c to the wire type. The wire type has no move count: moves are not carried
// (a stack that only moves still has the class mutating).
func (c Counts) Events() events.Counts {
	return events.Counts{
		Create: c.Create, Update: c.Update, Replace: c.Replace, Delete: c.Delete,
		Forget: c.Forget, Import: c.Import, Read: c.Read,
	}
}

// ClassOf is the class of a stack with counts c and outputsChanged changed outputs, none of
// them deleted: see ClassOfOutputs.
func ClassOf(c Counts, outputsChanged int) events.Class {
	return ClassOfOutputs(c, outputsChanged, 0)
}

// ClassOfOutputs is the class of a stack with counts c and outputsChanged changed outputs, of
// which outputsDeleted are deleted: destructive if anything is deleted, replaced or forgotten;
// mutating if anything is updated in place or moved (a move changes the addresses in state,
// which whatever refers to the old address depends on), or an output is deleted (its
// consumers, e.g. terraform_remote_state readers, can break); additive if anything is created,
// imported or read, or outputs are only added or changed; otherwise no-changes.
func ClassOfOutputs(c Counts, outputsChanged, outputsDeleted int) events.Class {
	switch {
	case c.Destructive() > 0:
		return events.ClassDestructive
	case c.Update > 0 || c.Move > 0 || outputsDeleted > 0:
		return events.ClassMutating
	case c.Create+c.Import+c.Read > 0 || outputsChanged > 0:
		return events.ClassAdditive
	}
	return events.ClassNoChanges
}

// classOfRecordedDrift is the class of the drift an apply records in the state (see
// Stack.DriftRecorded), forgotten of it objects deleted outside: destructive when it forgets
// objects (as a forget: the state no longer manages them, and a wrong read, say of the wrong
// account, would orphan live ones), mutating when it only rewrites objects in the state (what
// reads them, such as terraform_remote_state, sees other values), else no-changes.
func classOfRecordedDrift(forgotten, recorded int) events.Class {
	switch {
	case forgotten > 0:
		return events.ClassDestructive
	case recorded > 0:
		return events.ClassMutating
	}
	return events.ClassNoChanges
}

// AttrDiff is one changed attribute (or output), with display values. Before or After is
// "(sensitive value)" when masked, "(known after apply)" when unknown, and "null" when absent.
type AttrDiff struct {
	Path   string `json:"path"`
	Before string `json:"before"`
	After  string `json:"after"`
	// Element is "removed" or "added" for an element of a list or set that only one side
	// holds: elements are matched by value, as tofu does, not by position.
	Element string `json:"element,omitempty"`
	// Lines is the line diff of a multi-line string that changes (Before and After are then
	// each side on one line, cut): every changed line, with unchanged ones around them.
	Lines []LineDiff `json:"lines,omitempty"`

	// beforeRaw/afterRaw are the leaf values before quoting, kept to compare with secrets;
	// beforeParts/afterParts the scalars (and keys) of a whole collection shown as one value.
	beforeRaw, afterRaw     string
	beforeParts, afterParts []string
}

// Ops of a LineDiff.
const (
	LineSame    = " " // a line both sides hold
	LineRemoved = "-" // a line of the old value only
	LineAdded   = "+" // a line of the new value only
	LineHidden  = "…" // unchanged lines left out: Text says how many
)

// LineDiff is one line of the diff of a multi-line string.
type LineDiff struct {
	Op   string `json:"op"`
	Text string `json:"text"`
}

// CheckResult is a check that failed (a `check` block's assertion, or another checkable
// object's condition): tofu warns of it and the plan goes on.
type CheckResult struct {
	Address  string   `json:"address"`
	Status   string   `json:"status"`
	Problems []string `json:"problems,omitempty"`
}

// Change is one resource instance change (or drift) as listed in renders.
type Change struct {
	Address string `json:"address"`
	// Deposed is the deposed key when the change is to a deposed object of Address (one a
	// create_before_destroy replace left behind), not to its current object.
	Deposed string `json:"deposed,omitempty"`
	Action  Action `json:"action"`
	// Order is "delete-then-create", "create-then-delete" or "create-then-forget" for a replace.
	Order string `json:"order,omitempty"`
	// Reason is the plan's action_reason, e.g. replace_because_cannot_update.
	Reason    string `json:"reason,omitempty"`
	Importing bool   `json:"importing,omitempty"`
	// Outside: the change was made outside tofu/terraform (a drift entry; or, in Destructive, a
	// forget of an object deleted outside, which the apply drops from the state).
	Outside bool `json:"outside,omitempty"`
	// PreviousAddress is the address the object had in state before a `moved` block moved
	// it, when it differs from Address.
	PreviousAddress string `json:"previous_address,omitempty"`
	// Attributes are the attribute-level differences, when the change is small enough to show.
	Attributes []AttrDiff `json:"attributes,omitempty"`
	// AttributesOmitted counts differences not kept in Attributes.
	AttributesOmitted int `json:"attributes_omitted,omitempty"`
	// AttributesOmittedBytes is the size of the values of the omitted attributes that were
	// too large to show (their JSON, the larger side of each), when known.
	AttributesOmittedBytes int64 `json:"attributes_omitted_bytes,omitempty"`
}

// OutputChange is one changed root output.
type OutputChange struct {
	Name       string     `json:"name"`
	Action     Action     `json:"action"`
	Attributes []AttrDiff `json:"attributes,omitempty"`
	// ValueOmittedBytes is the size of the value (its JSON, the larger side) when it is too
	// large to show.
	ValueOmittedBytes int64 `json:"value_omitted_bytes,omitempty"`
}

// Stack is one stack's classified plan: the per-stack model every render uses.
type Stack struct {
	// Name is the stack (its path in the project); File is the plan file read.
	Name string `json:"stack"`
	File string `json:"file,omitempty"`
	// Why says why the stack is part of the run (terramate change reasons), when known.
	Why []string `json:"why,omitempty"`

	Class  events.Class `json:"class"`
	Counts Counts       `json:"counts"`
	// PlanHash identifies the content of the plan's change set: "v1:" and the hex SHA-256 of
	// a canonical encoding of its resource changes, output changes and drift, and of nothing
	// else (not the timestamp, versions, key order, whitespace or entry order). The doc of
	// PlanHashVersion says exactly what it covers and ignores. Empty when the plan could not
	// be classified.
	PlanHash         string `json:"plan_hash,omitempty"`
	FormatVersion    string `json:"format_version,omitempty"`
	TerraformVersion string `json:"terraform_version,omitempty"`

	// Destructive lists every deleted, replaced and forgotten resource (without attribute
	// detail): Classify leaves none out, however many. DestructiveOmitted counts those a
	// report assembled elsewhere left out (the renders say "and N more").
	Destructive        []Change `json:"destructive"`
	DestructiveOmitted int      `json:"destructive_omitted,omitempty"`

	// Changes lists the counted changes in plan order, at most MaxChanges.
	Changes        []Change `json:"changes"`
	ChangesOmitted int      `json:"changes_omitted,omitempty"`

	OutputsChanged int `json:"outputs_changed"`
	// OutputsDeleted is how many of the changed outputs are deleted.
	OutputsDeleted int            `json:"outputs_deleted,omitempty"`
	Outputs        []OutputChange `json:"outputs,omitempty"`

	// DriftCount is the number of resource_drift entries; Drift lists at most MaxChanges.
	DriftCount int      `json:"drift"`
	Drift      []Change `json:"drift_changes,omitempty"`
	// DriftRecorded is how many of them no resource change covers: applying the plan (a
	// refresh-only plan above all) records those in the state as they are, and they count in
	// the class (see classOfRecordedDrift); the objects deleted outside are in Destructive, as
	// forgets. Drift a resource change covers is reported, not classified.
	DriftRecorded int `json:"drift_recorded,omitempty"`

	// Checks lists the checks that failed, their messages masked.
	Checks []CheckResult `json:"failed_checks,omitempty"`

	// Partial: the plan leaves out objects of the state (it was made with -target or
	// -exclude); Unplanned is how many it leaves out. Applying it changes only part of the
	// configuration.
	Partial   bool `json:"partial,omitempty"`
	Unplanned int  `json:"unplanned,omitempty"`

	// Error says why the plan could not be classified (Class is then unclassified).
	Error string `json:"error,omitempty"`

	secrets *secretSet
	// importsAlso counts the imports that also change the object (counted twice in Counts).
	importsAlso int
}

// Event returns the classification fields of the runner's per-stack update: stack, class,
// counts, plan hash, the first MaxDestructive destructive addresses (the server keeps fewer;
// the result document has them all), outputs changed, drift and error. The caller sets
// the execution id, status and sequence number.
func (s *Stack) Event() events.Update {
	return events.Update{
		Stack:          s.Name,
		Class:          s.Class,
		Counts:         s.Counts.Events(),
		PlanHash:       s.PlanHash,
		Destructive:    s.DestructiveAddresses()[:min(len(s.Destructive), MaxDestructive)],
		OutputsChanged: s.OutputsChanged,
		Drift:          s.DriftCount,
		Error:          s.Error,
	}
}

// DestructiveAddresses lists the addresses of Destructive, a deposed object's as tofu names
// it: "terraform_data.a (deposed object 1a2b3c4d)".
func (s *Stack) DestructiveAddresses() []string {
	out := make([]string, len(s.Destructive))
	for i, c := range s.Destructive {
		out[i] = c.Address
		if c.Deposed != "" {
			out[i] += " (deposed object " + c.Deposed + ")"
		}
	}
	return out
}

// Error is a plan that could not be classified; it names the stack and the file.
type Error struct {
	Stack string
	File  string
	Err   error

	// redacted is the message with the plan's secrets masked, when known.
	redacted string
}

// Error says which stack and file could not be classified, and why (secrets masked).
func (e *Error) Error() string {
	if e.redacted != "" {
		return e.redacted
	}
	return fmt.Sprintf("stack %q: plan file %q: %v", e.Stack, e.File, e.Err)
}

// Unwrap returns the cause, for errors.Is (ErrEmpty, ErrNotJSON, ...).
func (e *Error) Unwrap() error { return e.Err }

// Sentinel causes of an Error, for errors.Is.
var (
	ErrEmpty         = errors.New("empty plan file (expected the JSON output of `tofu show -json PLANFILE`)")
	ErrNotJSON       = errors.New("not a JSON plan")
	ErrFormatVersion = errors.New("unsupported plan format_version")
	ErrNotPlan       = errors.New("not a plan")
)

// Report is the model of one execution: its stacks, and where the server shows it.
type Report struct {
	Stacks []*Stack
	// ExecutionURL links to the server's execution page; empty when there is none.
	ExecutionURL string
	// Environment and Dir name what the report is of in its headings: the environment and its
	// directory relative to the repository's root ("" : the root). Without Environment the
	// headings name neither.
	Environment, Dir string
	// Notes are markdown sections the caller adds after the totals (what the plan needs before
	// its apply, why stacks failed, ...): every markdown render keeps them whole, so the caller
	// bounds their size. They are free text: the report's secrets are masked inside them.
	Notes []string

	// union is the last union of the stacks' secrets a render made, with its matcher: the
	// runner renders a report three times (Text, Comment, Markdown).
	union *reportSecrets
}

// reportSecrets is the union set of the secret sets from, in the order of the stacks.
type reportSecrets struct {
	from  []*secretSet
	sizes []int // how many values each of from had: sets only grow, so a new value shows here
	set   *secretSet
}

// reportSecretsMu guards Report.union: renders of one report may run at once.
var reportSecretsMu sync.Mutex

// Class is the highest class of any stack (unclassified ranks highest).
func (r *Report) Class() events.Class {
	c := events.ClassNoChanges
	for _, s := range r.Stacks {
		c = events.MaxClass(c, s.Class)
	}
	return c
}

// Totals sums the counts of every stack.
func (r *Report) Totals() Counts {
	var t Counts
	for _, s := range r.Stacks {
		t.Add(s.Counts)
	}
	return t
}

// OutputsChanged sums the changed outputs of every stack.
func (r *Report) OutputsChanged() int {
	n := 0
	for _, s := range r.Stacks {
		n += s.OutputsChanged
	}
	return n
}

// DriftCount sums the drift of every stack.
func (r *Report) DriftCount() int {
	n := 0
	for _, s := range r.Stacks {
		n += s.DriftCount
	}
	return n
}

// secrets is the union of every stack's sensitive values, with its matcher built. It is made
// again when the stacks' sets are not those of the last render, or one of them has grown
// since (a set never loses a value): a value added after a render is never missed.
func (r *Report) secrets() *secretSet {
	reportSecretsMu.Lock()
	defer reportSecretsMu.Unlock()
	from := make([]*secretSet, 0, len(r.Stacks))
	sizes := make([]int, 0, len(r.Stacks))
	for _, s := range r.Stacks {
		if s.secrets != nil && len(s.secrets.values) > 0 {
			from = append(from, s.secrets)
			sizes = append(sizes, len(s.secrets.values))
		}
	}
	if r.union != nil && slices.Equal(r.union.from, from) && slices.Equal(r.union.sizes, sizes) {
		return r.union.set
	}
	all := newSecretSet()
	for _, s := range from {
		all.merge(s)
	}
	if len(all.values) > 0 {
		all.matcher()
	}
	r.union = &reportSecrets{from: from, sizes: sizes, set: all}
	return all
}
