package plan

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"

	"github.com/tfstackplan/tfstackplan/events"
)

// Bounds on what one stack keeps; counts are always exact.
const (
	// MaxChanges is the number of changes (and of drift entries) listed per stack.
	MaxChanges = 1000
	// MaxDetailed is the number of changes per stack that get attribute-level diffs.
	MaxDetailed = 100
	// MaxDestructive is the number of destructive changes per stack the text and markdown
	// renders and the server event list; Stack.Destructive, the JSON render and the result
	// document keep every one.
	MaxDestructive = 1000
	// maxDetailBytes: a change whose before, after and after_unknown JSON is larger gets no
	// attribute diff (every path of after_unknown is a path of the diff).
	maxDetailBytes = 16 << 10
)

// supportedMajor is the plan format_version major this package reads (tfjson reads >= 0.1,
// < 2.0; 0.x plans have the same shape for what is read here).
var supportedMajor = map[string]bool{"0": true, "1": true}

// ClassifyFile reads and classifies the plan JSON at path for stack. It always returns a
// Stack: on error it is unclassified, carries the error text, and the error is an *Error
// naming the stack and the file.
func ClassifyFile(stack, path string) (*Stack, error) {
	f, err := os.Open(path)
	if err != nil {
		return failed(stack, path, err, newSecretSet())
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return failed(stack, path, err, newSecretSet())
	}
	if fi.IsDir() {
		return failed(stack, path, errors.New("is a directory, not a plan file"), newSecretSet())
	}
	return classify(stack, path, f, bufferFor(fi.Size()))
}

// maxReadBuffer is the read buffer for plans of unknown or large size.
const maxReadBuffer = 256 << 10

// readBufferSize fits the read buffer to r's size when r can tell it: most plans are a few
// kilobytes, and a 256 KiB buffer allocated and zeroed per plan cost more than reading them.
func readBufferSize(r io.Reader) int {
	var n int64 = -1
	switch v := r.(type) {
	case interface{ Len() int }: // bytes.Reader, strings.Reader, bytes.Buffer
		n = int64(v.Len())
	case interface{ Stat() (os.FileInfo, error) }: // *os.File
		if fi, err := v.Stat(); err == nil && fi.Mode().IsRegular() {
			n = fi.Size()
		}
	}
	return bufferFor(n)
}

// bufferFor is the read buffer for a plan of n bytes (n < 0: unknown).
func bufferFor(n int64) int {
	if n < 0 || n >= maxReadBuffer {
		return maxReadBuffer
	}
	return max(int(n)+1, 4<<10) // +1: a file that grew since does not need a second buffer fill to be read whole
}

// Classify reads the plan JSON from r (named file in messages) for stack, in one streaming
// pass that also computes the plan hash of its change set (see PlanHashVersion). See
// ClassifyFile for the error contract.
func Classify(stack, file string, r io.Reader) (*Stack, error) {
	return classify(stack, file, r, readBufferSize(r))
}

// classify is Classify with a read buffer of bufSize bytes.
func classify(stack, file string, r io.Reader, bufSize int) (*Stack, error) {
	br := bufio.NewReaderSize(r, bufSize)
	c := &classifier{
		s:       &Stack{Name: stack, File: file, Class: events.ClassUnclassified, Destructive: []Change{}, Changes: []Change{}},
		secrets: newSecretSet(),
		hash:    newPlanHasher(),
	}
	c.s.secrets = c.secrets
	if err := c.run(br); err != nil {
		// The error may quote an address or key holding a secret: mask what was seen so far,
		// and the variables read so far (all of them, when the configuration was not reached).
		_ = c.collectVariables()
		return failed(stack, file, err, c.secrets)
	}
	c.s.PlanHash = c.hash.sum()
	forgotten := len(c.s.Destructive)
	c.recordDrift()
	forgotten = len(c.s.Destructive) - forgotten
	c.s.Class = ClassOfOutputs(c.s.Counts, c.s.OutputsChanged, c.s.OutputsDeleted)
	c.s.Class = events.MaxClass(c.s.Class, classOfRecordedDrift(forgotten, c.s.DriftRecorded))
	c.s.Unplanned = c.unplanned()
	c.s.Partial = c.s.Unplanned > 0
	c.s.redact()
	c.secrets.release()
	return c.s, nil
}

func failed(stack, file string, err error, sec *secretSet) (*Stack, error) {
	e := &Error{Stack: stack, File: file, Err: err}
	e.redacted = sec.redactText(e.Error())
	sec.release()
	return &Stack{
		Name: stack, File: file, Class: events.ClassUnclassified,
		Destructive: []Change{}, Changes: []Change{}, Error: e.Error(), secrets: sec,
	}, e
}

type classifier struct {
	s       *Stack
	secrets *secretSet
	hash    *planHasher
	dec     *jsontext.Decoder

	detailed int
	// variables holds the root variables' values until the configuration says which are
	// sensitive; sensitiveVars is nil when the plan has no configuration.
	variables     map[string]json.RawMessage
	sensitiveVars map[string]bool
	sawPlanned    bool
	sawState      bool
	errored       bool

	// Drift that no resource change covers (see recordDrift): the objects' keys (objectKey) in
	// plan order and their drift; and the hashes of the keys of the resource changes read before
	// resource_drift (tofu and terraform write it first; `jq -S` does not), a hash per change
	// rather than a string, since most plans have no drift at all.
	sawDrift     bool
	driftOrder   []string
	uncovered    map[string]Change
	changedFirst map[uint64]struct{}
	seed         maphash.Seed

	// The hashes of the addresses of the resource changes (no-ops too) and of the managed
	// objects of the prior state: a state object with no change means a partial plan.
	planned, stateObjects addressSet

	rc  rawResourceChange // reused for every resource change
	res rawResource       // reused for every state resource
}

// rawChange is tfjson.Change with the (possibly large) values kept as raw JSON: they are only
// decoded for small diffs and when a sensitivity mask flags something, and canonicalized for
// the plan hash.
type rawChange struct {
	Actions         actionList      `json:"actions"`
	Before          json.RawMessage `json:"before"`
	After           json.RawMessage `json:"after"`
	AfterUnknown    json.RawMessage `json:"after_unknown"`
	BeforeSensitive json.RawMessage `json:"before_sensitive"`
	AfterSensitive  json.RawMessage `json:"after_sensitive"`
	// Importing is the importing object (tfjson.Importing), raw for the plan hash.
	Importing json.RawMessage `json:"importing"`
}

// reset empties c for the next decode, keeping its buffers.
func (c *rawChange) reset() {
	*c = rawChange{
		Actions: c.Actions[:0], Before: c.Before[:0], After: c.After[:0],
		AfterUnknown: c.AfterUnknown[:0], BeforeSensitive: c.BeforeSensitive[:0], AfterSensitive: c.AfterSensitive[:0],
		Importing: c.Importing[:0],
	}
}

// detailBytes is the size of what an attribute diff of the change reads: before, after and
// after_unknown.
func (c *rawChange) detailBytes() int { return len(c.Before) + len(c.After) + len(c.AfterUnknown) }

// importing reports whether the change imports: its importing is an object (not absent or
// null).
func (c *rawChange) importing() (bool, error) {
	v := bytes.TrimLeft(c.Importing, " \t\r\n")
	switch {
	case len(v) == 0 || v[0] == 'n':
		return false, nil
	case v[0] == '{':
		return true, nil
	}
	return false, fmt.Errorf("importing: expected an object, got %s", firstBytes(v, 20))
}

// firstBytes is at most n bytes of b, for messages.
func firstBytes(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// resourceHead is the part of a resource change the classifier and the plan hash read.
type resourceHead struct {
	Address         string `json:"address"`
	PreviousAddress string `json:"previous_address"`
	DeposedKey      string `json:"deposed"`
	ActionReason    string `json:"action_reason"`
}

// rawResourceChange is one element of resource_changes or resource_drift, its values raw.
type rawResourceChange struct {
	resourceHead
	Change rawChange `json:"change"`
}

// rawResource is a resource of planned_values or prior_state, values kept raw.
type rawResource struct {
	Address         string          `json:"address"`
	Mode            string          `json:"mode"`
	Values          json.RawMessage `json:"values"`
	SensitiveValues json.RawMessage `json:"sensitive_values"`
}

// readAsV1 makes the classifier read a plan as encoding/json reads it, which the plan hash's
// definition (PlanHashVersion) relies on: a key that appears twice counts with its last value
// (a map entry is replaced, not merged into; a null after a value leaves the value as it was),
// invalid UTF-8 and unpaired surrogates become U+FFFD, and struct fields match keys without
// regard to case (an exact match first). The reader is json v2's, which reads every byte once
// (encoding/json's Decoder scans each value twice, and a plan is mostly values it skips).
var readAsV1 = []jsonv2.Options{
	jsontext.AllowDuplicateNames(true),
	jsontext.AllowInvalidUTF8(true),
	jsonv2.MatchCaseInsensitiveNames(true),
	jsonv1.MatchCaseSensitiveDelimiter(true),
	jsonv1.MergeWithLegacySemantics(true),
}

// savedPlanMagic starts a saved plan file (`plan -out`), a zip archive.
const savedPlanMagic = "PK\x03\x04"

func (c *classifier) run(br *bufio.Reader) error {
	first, err := firstByte(br)
	if err == io.EOF {
		return ErrEmpty
	}
	if err != nil {
		return err
	}
	if first != '{' {
		if magic, _ := br.Peek(len(savedPlanMagic)); string(magic) == savedPlanMagic {
			return fmt.Errorf("%w: this is a saved plan file (a zip archive, as written by `tofu plan -out=PLANFILE`), "+
				"not its JSON: pass the output of `tofu show -json PLANFILE` (or terraform)", ErrNotJSON)
		}
		if first == '[' || first == '"' {
			return fmt.Errorf("%w: the document is not a JSON object", ErrNotJSON)
		}
		return fmt.Errorf("%w: it starts with %q; this looks like human-readable plan output, "+
			"pass the output of `tofu show -json PLANFILE` (or terraform)", ErrNotJSON, first)
	}
	c.dec = jsontext.NewDecoder(br, readAsV1...)
	if err := c.object(c.topLevel); err != nil {
		return jsonError(err)
	}
	if _, err := c.dec.ReadToken(); err != io.EOF {
		return fmt.Errorf("%w: unexpected data after the plan object", ErrNotJSON)
	}
	if c.s.FormatVersion == "" {
		return fmt.Errorf("%w: no format_version (expected the output of `tofu show -json PLANFILE`)", ErrNotPlan)
	}
	if !c.sawPlanned {
		if c.sawState {
			return fmt.Errorf("%w: this is a state (`show -json` without a plan file), it has no planned_values", ErrNotPlan)
		}
		return fmt.Errorf("%w: no planned_values", ErrNotPlan)
	}
	if c.errored {
		return errors.New("the plan errored (errored: true), it is incomplete")
	}
	return c.collectVariables()
}

// jsonError turns decoder errors into messages that say what is wrong with the file.
func jsonError(err error) error {
	var se *jsontext.SyntacticError
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return fmt.Errorf("%w: truncated JSON (unexpected end of file)", ErrNotJSON)
	case errors.As(err, &se) && se.JSONPointer != "":
		return fmt.Errorf("%w: invalid JSON at byte %d (in %s): %v", ErrNotJSON, se.ByteOffset, truncate(string(se.JSONPointer)), se.Err)
	case errors.As(err, &se):
		return fmt.Errorf("%w: invalid JSON at byte %d: %v", ErrNotJSON, se.ByteOffset, se.Err)
	}
	return err
}

// typeError names a value of the wrong type by where it is in the plan (a JSON pointer) and what
// was expected there, instead of by the Go types it was to be read into; other errors are
// returned as they are.
func typeError(err error) error {
	var se *jsonv2.SemanticError
	if !errors.As(err, &se) || se.Err != nil || se.GoType == nil || se.JSONKind == 0 {
		return err
	}
	where := truncate(string(se.JSONPointer)) // the names on the way are the plan's, however long
	if where == "" {
		where = "/"
	}
	return fmt.Errorf("at %s: expected %s, got %s", where, expectedJSON(se.GoType), jsonKindName(se.JSONKind))
}

// expectedJSON is what JSON a value of type t is read from.
func expectedJSON(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Pointer:
		return expectedJSON(t.Elem())
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "another value"
}

// jsonKindName names a JSON kind for messages.
func jsonKindName(k jsontext.Kind) string {
	switch k {
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	case '"':
		return "a string"
	case '0':
		return "a number"
	case '{':
		return "an object"
	case '[':
		return "an array"
	}
	return "an invalid value"
}

func firstByte(br *bufio.Reader) (byte, error) {
	for {
		b, err := br.ReadByte()
		if err != nil {
			return 0, err
		}
		switch b {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return b, br.UnreadByte()
	}
}

// object reads one JSON object, calling field for each key with the decoder positioned at
// its value; field must consume the value.
func (c *classifier) object(field func(key string) error) error {
	if err := c.delim('{'); err != nil {
		return err
	}
	return eachMember(c.dec, field)
}

// array reads one JSON array (or null), calling elem with the decoder positioned at each
// element; elem must consume it.
func (c *classifier) array(what string, elem func() error) error {
	tok, err := c.dec.ReadToken()
	if err != nil {
		return err
	}
	switch tok.Kind() {
	case 'n':
		return nil
	case '[':
	default:
		return fmt.Errorf("%s: expected an array, got %s", what, tok)
	}
	return eachElement(c.dec, elem)
}

// eachMember calls field for each member of the object whose '{' dec has just read, with dec
// positioned at the member's value (field must consume it), then reads the '}'. A syntax
// error stops the loop (PeekKind says 0) and is reported by the read that follows.
func eachMember(dec *jsontext.Decoder, field func(name string) error) error {
	for dec.PeekKind() == '"' {
		tok, err := dec.ReadToken()
		if err != nil {
			return err
		}
		if err := field(tok.String()); err != nil { // the name is copied before field reads on
			return err
		}
	}
	_, err := dec.ReadToken()
	return err
}

// eachElement calls elem for each element of the array whose '[' dec has just read (elem must
// consume it), then reads the ']'.
func eachElement(dec *jsontext.Decoder, elem func() error) error {
	for dec.PeekKind() != ']' {
		if err := elem(); err != nil {
			return err
		}
	}
	_, err := dec.ReadToken()
	return err
}

func (c *classifier) delim(want jsontext.Kind) error {
	tok, err := c.dec.ReadToken()
	if err != nil {
		return err
	}
	if tok.Kind() != want {
		return fmt.Errorf("%w: expected %q, got %s", ErrNotJSON, want, tok)
	}
	return nil
}

func (c *classifier) skip() error { return c.dec.SkipValue() }

// decode reads the next value into v.
func (c *classifier) decode(v any) error { return typeError(jsonv2.UnmarshalDecode(c.dec, v)) }

func (c *classifier) topLevel(key string) error {
	switch key {
	case "format_version":
		if err := c.decode(&c.s.FormatVersion); err != nil {
			return fmt.Errorf("format_version: %w", err)
		}
		major, _, _ := strings.Cut(c.s.FormatVersion, ".")
		if !supportedMajor[major] {
			return fmt.Errorf("%w %q (this tfstackplan reads format versions 0.x and 1.x)", ErrFormatVersion, c.s.FormatVersion)
		}
		return nil
	case "terraform_version":
		return c.decode(&c.s.TerraformVersion)
	case "variables":
		return c.decode(&c.variables)
	case "planned_values":
		c.sawPlanned = true
		return c.stateValues(false)
	case "values":
		c.sawState = true
		return c.skip()
	case "prior_state":
		return c.object(func(key string) error {
			if key == "values" {
				return c.stateValues(true)
			}
			return c.skip()
		})
	case "resource_changes":
		return c.array("resource_changes", func() error { return c.resourceChange(false) })
	case "resource_drift":
		c.sawDrift = true
		return c.array("resource_drift", func() error { return c.resourceChange(true) })
	case "output_changes":
		return c.outputChanges()
	case "configuration":
		return c.configuration()
	case "errored":
		return c.decode(&c.errored)
	case "checks":
		return c.checks()
	}
	return c.skip()
}

// rawCheck is an element of the plan's checks: a checkable object (a check block, or a
// resource or output with conditions) and the status of each of its instances.
type rawCheck struct {
	Address   checkAddress `json:"address"`
	Status    string       `json:"status"`
	Instances []struct {
		Address  checkAddress `json:"address"`
		Status   string       `json:"status"`
		Problems []struct {
			Message string `json:"message"`
		} `json:"problems"`
	} `json:"instances"`
}

type checkAddress struct {
	ToDisplay string `json:"to_display"`
}

// failedCheck reports whether a check status is a failure: "fail" (a condition is false) or
// "error" (it could not be evaluated).
func failedCheck(status string) bool { return status == "fail" || status == "error" }

// checks reads the plan's checks and keeps the failed ones: a failed check block is only a
// warning, and the plan goes on.
func (c *classifier) checks() error {
	var checks []rawCheck
	if err := c.decode(&checks); err != nil {
		return fmt.Errorf("checks: %w", err)
	}
	for _, ch := range checks {
		if !failedCheck(ch.Status) {
			continue
		}
		found := false
		for _, in := range ch.Instances {
			if !failedCheck(in.Status) {
				continue
			}
			res := CheckResult{Address: in.Address.ToDisplay, Status: in.Status}
			if res.Address == "" {
				res.Address = ch.Address.ToDisplay
			}
			for _, p := range in.Problems {
				res.Problems = append(res.Problems, p.Message)
			}
			c.s.Checks = append(c.s.Checks, res)
			found = true
		}
		if !found {
			c.s.Checks = append(c.s.Checks, CheckResult{Address: ch.Address.ToDisplay, Status: ch.Status})
		}
	}
	return nil
}

// actionOf maps a change's actions to the one action it counts as; importing and moved (its
// previous_address differs from its address) make a no-op an import or a move.
func actionOf(a actionList, importing, moved bool) (Action, string, error) {
	switch {
	case a.NoOp():
		switch {
		case importing:
			return ActionImport, "", nil
		case moved:
			return ActionMove, "", nil
		}
		return ActionNoOp, "", nil
	case a.Create():
		return ActionCreate, "", nil
	case a.Update():
		return ActionUpdate, "", nil
	case a.Delete():
		return ActionDelete, "", nil
	case a.Forget():
		return ActionForget, "", nil
	case a.Read():
		return ActionRead, "", nil
	case a.DestroyBeforeCreate():
		return ActionReplace, "delete-then-create", nil
	case a.CreateBeforeDestroy():
		return ActionReplace, "create-then-delete", nil
	case len(a) == 2 && a[0] == actForget && a[1] == actCreate:
		// A replace whose old object is forgotten, not destroyed (lifecycle destroy = false),
		// as OpenTofu 1.12 plans it with or without create_before_destroy: a new object
		// replaces the one in state, so it is as destructive as a replace.
		return ActionReplace, "forget-then-create", nil
	case len(a) == 2 && a[0] == actCreate && a[1] == actForget:
		// The same in the other order.
		return ActionReplace, "create-then-forget", nil
	}
	return "", "", fmt.Errorf("unknown actions %q", a)
}

func (c *classifier) resourceChange(drift bool) error {
	rc := &c.rc
	rc.Change.reset()
	rc.resourceHead = resourceHead{}
	if err := c.decode(rc); err != nil {
		return err
	}
	ch := &rc.Change
	if err := c.secrets.collectChange(ch); err != nil {
		return fmt.Errorf("resource %s: %w", rc.Address, err)
	}
	if !drift {
		c.planned.add(c, rc.Address)
	}
	importing, err := ch.importing()
	if err != nil {
		return fmt.Errorf("resource %s: %w", rc.Address, err)
	}
	moved := !drift && rc.PreviousAddress != "" && rc.PreviousAddress != rc.Address
	action, order, err := actionOf(ch.Actions, importing, moved)
	if err != nil {
		return fmt.Errorf("resource %s: %w", rc.Address, err)
	}
	s := c.s
	if drift {
		if action == ActionNoOp {
			return nil
		}
		if err := c.hash.drift(rc); err != nil {
			return fmt.Errorf("resource %s: %w", rc.Address, err)
		}
		s.DriftCount++
		out := Change{Address: rc.Address, Deposed: rc.DeposedKey, Action: action, Order: order, Reason: rc.ActionReason, Outside: true}
		if _, covered := c.changedFirst[c.keyHash(rc)]; !covered {
			key := objectKey(rc)
			if c.uncovered == nil {
				c.uncovered = map[string]Change{}
			}
			if _, dup := c.uncovered[key]; !dup {
				c.driftOrder = append(c.driftOrder, key)
			}
			c.uncovered[key] = out
		}
		if len(s.Drift) >= MaxChanges {
			return nil
		}
		if err := c.detail(&out, ch); err != nil {
			return fmt.Errorf("resource %s: %w", rc.Address, err)
		}
		s.Drift = append(s.Drift, out)
		return nil
	}
	// A change to a drifted object covers its drift: the apply acts on the object as planned.
	if len(c.uncovered) > 0 {
		delete(c.uncovered, objectKey(rc))
	}
	if !c.sawDrift {
		if c.changedFirst == nil {
			c.changedFirst = map[uint64]struct{}{}
			if c.seed == (maphash.Seed{}) {
				c.seed = maphash.MakeSeed()
			}
		}
		c.changedFirst[c.keyHash(rc)] = struct{}{}
	}
	if action == ActionNoOp {
		return nil
	}
	if err := c.hash.resourceChange(rc); err != nil {
		return fmt.Errorf("resource %s: %w", rc.Address, err)
	}
	s.Counts.inc(action)
	if importing && action != ActionImport {
		// tofu counts it "to import" too.
		s.Counts.Import++
		s.importsAlso++
	}
	out := Change{Address: rc.Address, Deposed: rc.DeposedKey, Action: action, Order: order, Reason: rc.ActionReason, Importing: importing}
	if moved {
		out.PreviousAddress = rc.PreviousAddress
	}
	if action.Destructive() {
		s.Destructive = append(s.Destructive, out)
	}
	if len(s.Changes) >= MaxChanges {
		s.ChangesOmitted++
		return nil
	}
	if err := c.detail(&out, ch); err != nil {
		return fmt.Errorf("resource %s: %w", rc.Address, err)
	}
	s.Changes = append(s.Changes, out)
	return nil
}

// detail sets the attribute differences of out, the change ch, while fewer than MaxDetailed
// changes (and drift entries) have them and ch is small enough.
func (c *classifier) detail(out *Change, ch *rawChange) error {
	if c.detailed >= MaxDetailed {
		return nil
	}
	c.detailed++
	before, after, unknown := ch.Before, ch.After, ch.AfterUnknown
	if ch.detailBytes() > maxDetailBytes {
		var err error
		before, after, unknown, out.AttributesOmitted, out.AttributesOmittedBytes, err = shownAttributes(ch)
		if err != nil || before == nil && after == nil {
			return err
		}
	}
	var omitted int
	var err error
	out.Attributes, omitted, err = diffValues("", before, after, unknown, ch.BeforeSensitive, ch.AfterSensitive)
	out.AttributesOmitted += omitted
	return err
}

// shownAttributes is the part of a change too large to show whole (over maxDetailBytes) that
// can be shown: its top-level attributes that change, the smallest first while they fit in
// maxDetailBytes together, as before, after and after_unknown objects. omitted counts the
// others and omittedBytes is their size (the largest of before, after and after_unknown). A change whose values are
// not objects gets nothing shown (nil values) and counts as one attribute.
func shownAttributes(ch *rawChange) (before, after, unknown json.RawMessage, omitted int, omittedBytes int64, err error) {
	var b, a, u map[string]json.RawMessage
	for _, d := range []struct {
		raw json.RawMessage
		dst *map[string]json.RawMessage
	}{{ch.Before, &b}, {ch.After, &a}, {ch.AfterUnknown, &u}} {
		v := bytes.TrimSpace(d.raw)
		if len(v) == 0 || v[0] == 'n' {
			continue
		}
		if v[0] != '{' {
			return nil, nil, nil, 1, int64(max(len(ch.Before), len(ch.After))), nil
		}
		if err := unmarshalLegacy(v, d.dst); err != nil {
			return nil, nil, nil, 0, 0, err
		}
	}
	type attr struct {
		name string
		size int
	}
	var changed []attr
	seen := map[string]bool{}
	for _, m := range []map[string]json.RawMessage{b, a, u} {
		for k := range m {
			if seen[k] {
				continue
			}
			seen[k] = true
			if _, unk := u[k]; !unk && bytes.Equal(b[k], a[k]) {
				continue
			}
			changed = append(changed, attr{k, len(b[k]) + len(a[k]) + len(u[k])})
		}
	}
	slices.SortFunc(changed, func(x, y attr) int { return cmp.Or(cmp.Compare(x.size, y.size), strings.Compare(x.name, y.name)) })
	sb, sa, su := map[string]json.RawMessage{}, map[string]json.RawMessage{}, map[string]json.RawMessage{}
	total := 0
	for _, at := range changed {
		if total+at.size > maxDetailBytes {
			omitted++
			omittedBytes += int64(max(len(b[at.name]), len(a[at.name]), len(u[at.name])))
			continue
		}
		total += at.size
		for _, x := range []struct{ from, to map[string]json.RawMessage }{{b, sb}, {a, sa}, {u, su}} {
			if v, ok := x.from[at.name]; ok {
				x.to[at.name] = v
			}
		}
	}
	// A side that is null (a create, a delete) stays null: the change lists its attributes.
	if b != nil {
		before, _ = json.Marshal(sb)
	}
	if a != nil {
		after, _ = json.Marshal(sa)
	}
	unknown, _ = json.Marshal(su)
	return before, after, unknown, omitted, omittedBytes, nil
}

// addressSet is a set of addresses, by their hashes (a plan may hold hundreds of thousands).
type addressSet map[uint64]struct{}

func (s *addressSet) add(c *classifier, address string) {
	if *s == nil {
		*s = addressSet{}
	}
	(*s)[c.addressHash(address)] = struct{}{}
}

// addressHash is the hash of an address with the classifier's seed.
func (c *classifier) addressHash(address string) uint64 {
	if c.seed == (maphash.Seed{}) {
		c.seed = maphash.MakeSeed()
	}
	return maphash.String(c.seed, address)
}

// unplanned counts the managed objects of the prior state that no resource change is about:
// the plan was made with -target or -exclude. A plan without resource changes (refresh-only)
// plans no object, and leaves none out.
func (c *classifier) unplanned() int {
	if len(c.planned) == 0 {
		return 0
	}
	n := 0
	for h := range c.stateObjects {
		if _, ok := c.planned[h]; !ok {
			n++
		}
	}
	return n
}

// objectKey names the object a resource change or drift entry is about: its address and
// deposed key.
func objectKey(rc *rawResourceChange) string { return rc.Address + "\x00" + rc.DeposedKey }

// keyHash is the hash of objectKey(rc), without making the string; 0 before any change was
// hashed (changedFirst is then empty).
func (c *classifier) keyHash(rc *rawResourceChange) uint64 {
	if c.changedFirst == nil {
		return 0
	}
	var h maphash.Hash
	h.SetSeed(c.seed)
	h.WriteString(rc.Address)
	h.WriteByte(0)
	h.WriteString(rc.DeposedKey)
	return h.Sum64()
}

// recordDrift counts the drift that no resource change covers: the apply records it in the
// state as it is (a refresh-only plan has no resource changes at all; a normal plan has none for
// an object gone from both the configuration and, refreshed, the state). An object deleted
// outside is then forgotten, and listed as destructive; one changed outside is rewritten.
func (c *classifier) recordDrift() {
	s := c.s
	for _, key := range c.driftOrder {
		d, ok := c.uncovered[key]
		if !ok {
			continue
		}
		s.DriftRecorded++
		if d.Action == ActionDelete {
			s.Destructive = append(s.Destructive, Change{Address: d.Address, Deposed: d.Deposed, Action: ActionForget, Outside: true})
		}
	}
	c.driftOrder, c.uncovered, c.changedFirst = nil, nil, nil
}
