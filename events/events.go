// Package events holds the typed events the runner and the server exchange.
//
// Every type here is an alias of the type generated from api/openapi.yaml into internal/api, so
// there is exactly one schema: changing the OpenAPI file and running `make generate` changes
// these types too. The aliases give the runner and the server a stable, readable vocabulary
// without importing the generated package everywhere.
package events

import (
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/tfstackplan/tfstackplan/internal/api"
)

// Init announces an execution: who, what, which stacks, their edges and why they changed.
type Init = api.Init

// PhaseEvent reports that one stack entered a phase (sent by `run tick`).
type PhaseEvent = api.PhaseEvent

// Update reports one stack's status, classification, counts and plan hash.
type Update = api.Update

// LogChunk carries bytes appended to one stack's log, or records a gap of lost bytes.
type LogChunk = api.LogChunk

// Finalize ends an execution with its outcome and per-stack results.
type Finalize = api.Finalize

// StackResult is one stack's outcome inside Finalize.
type StackResult = api.StackResult

// GateCheck asks whether an apply may proceed.
type GateCheck = api.GateCheck

// StackPlan names a stack and the hash of the plan an apply would use.
type StackPlan = api.StackPlan

// GateLease is what a satisfied gate check returns: the requester to impersonate.
type GateLease = api.GateLease

// Heartbeat says that an execution's runner is still running it.
type Heartbeat = api.Heartbeat

// GateRevoke ends the lease a gate check granted.
type GateRevoke = api.GateRevoke

// Claim is an apply lock a PR's finalized plan holds on a stack in an environment.
type Claim = api.Claim

// Edge is a dependency between stacks: From runs before To.
type Edge = api.Edge

// ChangeReason says why terramate considers a stack changed.
type ChangeReason = api.ChangeReason

// Counts are resource changes by action.
type Counts = api.Counts

// Class is a change class: no-changes < additive < mutating < destructive, or unclassified.
type Class = api.Class

// StackStatus is the status of one stack in an execution.
type StackStatus = api.StackStatus

// ExecutionStatus is the status of an execution.
type ExecutionStatus = api.ExecutionStatus

// Ack is the server's answer to a runner event.
type Ack = api.Ack

// LogGap is a range of log bytes that was lost.
type LogGap = api.LogGap

// Change classes, in increasing order of risk (Unclassified: the plan could not be read).
const (
	ClassNoChanges    Class = api.NoChanges
	ClassAdditive     Class = api.Additive
	ClassMutating     Class = api.Mutating
	ClassDestructive  Class = api.Destructive
	ClassUnclassified Class = api.Unclassified
)

// Stack statuses.
const (
	StackPending   StackStatus = api.StackStatusPending
	StackRunning   StackStatus = api.StackStatusRunning
	StackSucceeded StackStatus = api.StackStatusSucceeded
	StackFailed    StackStatus = api.StackStatusFailed
	StackCancelled StackStatus = api.StackStatusCancelled
	StackSkipped   StackStatus = api.StackStatusSkipped
)

// Execution statuses.
const (
	ExecutionRunning   ExecutionStatus = api.ExecutionStatusRunning
	ExecutionSucceeded ExecutionStatus = api.ExecutionStatusSucceeded
	ExecutionFailed    ExecutionStatus = api.ExecutionStatusFailed
	ExecutionCancelled ExecutionStatus = api.ExecutionStatusCancelled
)

// Change-reason kinds produced by the terramate `--why` parser.
const (
	ReasonUnmerged         = "unmerged"
	ReasonWatchedFile      = "watched-file"
	ReasonModule           = "module"
	ReasonTrigger          = "trigger"
	ReasonTerragruntModule = "terragrunt-module"
	ReasonOther            = "other"
)

// The contract's bounds on one change reason (api/openapi.yaml, ChangeReason): each text
// (kind, detail, raw, a chain step) at most MaxReasonText bytes, at most MaxReasonChain steps.
const (
	MaxReasonText  = 1024
	MaxReasonChain = 64
)

// MaxNameLen bounds a name the control plane stores, in bytes: an execution id, an
// environment, a stack's path.
const MaxNameLen = 1024

// NameProblem says why the control plane refuses v as a name (an execution id, an
// environment, a stack's path, an edge's end): "is required", "is longer than 1024 bytes",
// "is not valid UTF-8", "contains a control character" or "contains a bidirectional formatting
// or line-separating character" (U+202E, U+2066..U+2069, U+2028, ...: shown, such a name would
// reorder or split the text around it); "" when it takes v. The server
// refuses a request naming such a name; the driver leaves the stacks whose paths it refuses
// out of what it reports.
func NameProblem(v string) string {
	switch {
	case v == "":
		return "is required"
	case len(v) > MaxNameLen:
		return "is longer than " + strconv.Itoa(MaxNameLen) + " bytes"
	case !utf8.ValidString(v):
		return "is not valid UTF-8"
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return "contains a control character"
		}
		if unicode.In(r, unicode.Bidi_Control, unicode.Zl, unicode.Zp) {
			return "contains a bidirectional formatting or line-separating character"
		}
	}
	return ""
}

// Operations.
const (
	OpPlan  = api.InitOpPlan
	OpApply = api.InitOpApply
	OpDrift = api.InitOpDrift
)

// classRank orders classes; Unclassified ranks above Destructive because it must never be
// mistaken for a harmless plan.
var classRank = map[Class]int{
	"":                0,
	ClassNoChanges:    0,
	ClassAdditive:     1,
	ClassMutating:     2,
	ClassDestructive:  3,
	ClassUnclassified: 4,
}

// ClassRank returns the order of c: higher is riskier. Unknown classes rank as unclassified.
func ClassRank(c Class) int {
	if r, ok := classRank[c]; ok {
		return r
	}
	return classRank[ClassUnclassified]
}

// MaxClass returns the riskier of a and b.
func MaxClass(a, b Class) Class {
	if ClassRank(b) > ClassRank(a) {
		return b
	}
	if a == "" {
		return ClassNoChanges
	}
	return a
}
