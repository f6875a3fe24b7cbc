package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/open-policy-agent/opa/v1/ast"
)

// internMax is the longest string value the reader shares between its occurrences. A plan
// repeats its short strings many times (types, actions, names, each resource's values in
// planned_values, before, after and prior_state); long ones are mostly unique.
const internMax = 64

// ReadInput reads one JSON document from r straight into a Rego value, the input Set.Eval
// takes: no intermediate Go maps, no second conversion. Object keys and short strings are
// shared between their occurrences, so a large plan takes less memory as a value than as
// text decoded into Go values. A document that is not valid JSON (including an object with a
// key twice, or invalid UTF-8, which OpenTofu never writes) is an error.
func ReadInput(r io.Reader) (ast.Value, error) {
	rd := &inputReader{
		dec:     jsontext.NewDecoder(r),
		strings: map[string]*ast.Term{},
		numbers: map[string]*ast.Term{},
	}
	t, err := rd.value()
	if err != nil {
		return nil, fmt.Errorf("reading the plan JSON: %w", err)
	}
	if _, err := rd.dec.ReadToken(); err != io.EOF {
		return nil, errors.New("reading the plan JSON: unexpected data after the document")
	}
	return t.Value, nil
}

// inputReader builds Rego terms from a JSON token stream.
type inputReader struct {
	dec     *jsontext.Decoder
	strings map[string]*ast.Term
	numbers map[string]*ast.Term
	unquote []byte
	// elems and members are stacks of the arrays' and objects' terms being read, shared by
	// every level so that building a value allocates only its final slices.
	elems   []*ast.Term
	members [][2]*ast.Term
}

// value reads the next JSON value.
func (rd *inputReader) value() (*ast.Term, error) {
	switch rd.dec.PeekKind() {
	case '{':
		return rd.object()
	case '[':
		return rd.array()
	}
	raw, err := rd.dec.ReadValue()
	if err != nil {
		return nil, err
	}
	switch raw.Kind() {
	case 'n':
		return ast.InternedNullTerm, nil
	case 't':
		return ast.InternedTerm(true), nil
	case 'f':
		return ast.InternedTerm(false), nil
	case '"':
		return rd.string(raw, internMax)
	default: // '0': jsontext has checked the number's syntax
		if t, ok := rd.numbers[string(raw)]; ok {
			return t, nil
		}
		t := ast.NumberTerm(json.Number(raw))
		rd.numbers[string(t.Value.(ast.Number))] = t
		return t, nil
	}
}

// string returns the term of a quoted JSON string, shared with the string's earlier
// occurrences when it is at most limit bytes long.
func (rd *inputReader) string(raw jsontext.Value, limit int) (*ast.Term, error) {
	s := []byte(raw[1 : len(raw)-1])
	if bytes.IndexByte(s, '\\') >= 0 {
		var err error
		if rd.unquote, err = jsontext.AppendUnquote(rd.unquote[:0], raw); err != nil {
			return nil, err
		}
		s = rd.unquote
	}
	if len(s) > limit {
		return ast.StringTerm(string(s)), nil
	}
	if t, ok := rd.strings[string(s)]; ok {
		return t, nil
	}
	t := ast.StringTerm(string(s))
	rd.strings[string(t.Value.(ast.String))] = t
	return t, nil
}

func (rd *inputReader) object() (*ast.Term, error) {
	if _, err := rd.dec.ReadToken(); err != nil {
		return nil, err
	}
	base := len(rd.members)
	for rd.dec.PeekKind() != '}' {
		raw, err := rd.dec.ReadValue()
		if err != nil {
			return nil, err
		}
		// Keys are shared whatever their length: the same few names make up most of a plan.
		k, err := rd.string(raw, 1<<10)
		if err != nil {
			return nil, err
		}
		v, err := rd.value()
		if err != nil {
			return nil, err
		}
		rd.members = append(rd.members, [2]*ast.Term{k, v})
	}
	if _, err := rd.dec.ReadToken(); err != nil {
		return nil, err
	}
	members := rd.members[base:]
	rd.members = rd.members[:base]
	if len(members) == 0 {
		return ast.InternedEmptyObject, nil
	}
	return ast.NewTerm(ast.NewObject(members...)), nil
}

func (rd *inputReader) array() (*ast.Term, error) {
	if _, err := rd.dec.ReadToken(); err != nil {
		return nil, err
	}
	base := len(rd.elems)
	for rd.dec.PeekKind() != ']' {
		v, err := rd.value()
		if err != nil {
			return nil, err
		}
		rd.elems = append(rd.elems, v)
	}
	if _, err := rd.dec.ReadToken(); err != nil {
		return nil, err
	}
	elems := rd.elems[base:]
	rd.elems = rd.elems[:base]
	if len(elems) == 0 {
		return ast.InternedEmptyArray, nil
	}
	// NewArray keeps the slice it is given: give it its own.
	return ast.NewTerm(ast.NewArray(append([]*ast.Term(nil), elems...)...)), nil
}
