package policy

import (
	"context"
	"fmt"
	"maps"
	"sort"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

// RuleError is the Finding.Rule of a policy that could not be evaluated.
const RuleError = "error"

// Finding is one message of one policy about one plan.
type Finding struct {
	// Policy is the Definition's name.
	Policy string `json:"policy"`
	// Rule is the rule that produced it (deny, violation, warn or one of their _suffixed
	// forms), or RuleError when the policy could not be evaluated.
	Rule string `json:"rule"`
	// Message is the rule's string, or the object's "msg", or the evaluation error.
	Message string `json:"message"`
	// Details are the object's other fields, when the rule gave an object.
	Details map[string]any `json:"details,omitempty"`
}

// Result is what a Set says about one plan.
type Result struct {
	// Failures are the deny and violation findings of policies enforced as EnforceDeny, and
	// their evaluation errors: any failure fails the plan.
	Failures []Finding `json:"failures,omitempty"`
	// Warnings are the warn findings of every policy, and the deny, violation and error
	// findings of policies enforced as EnforceWarn.
	Warnings []Finding `json:"warnings,omitempty"`
}

// Failed reports whether a policy failed the plan.
func (r *Result) Failed() bool { return len(r.Failures) > 0 }

// Eval evaluates every policy of s on input, the plan as a Rego value (see ReadInput). A policy
// whose evaluation fails, or whose rule gives something other than strings and objects with a
// string "msg", yields a RuleError finding in place of its results: a failure for a deny
// policy, never a pass. Only ctx's end stops it early, with ctx's error.
func (s *Set) Eval(ctx context.Context, input ast.Value) (*Result, error) {
	r := &Result{}
	for _, c := range s.policies {
		findings, err := c.eval(ctx, input)
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		if err != nil {
			findings = []Finding{{Policy: c.def.Name, Rule: RuleError, Message: err.Error()}}
		}
		for _, f := range findings {
			kind, _ := ruleKind(f.Rule)
			if kind == "warn" || c.def.Enforcement == EnforceWarn {
				r.Warnings = append(r.Warnings, f)
			} else {
				r.Failures = append(r.Failures, f)
			}
		}
	}
	return r, nil
}

// eval runs c's rule queries on input and returns their findings, rule by rule, each rule's
// sorted by message.
func (c *compiled) eval(ctx context.Context, input ast.Value) ([]Finding, error) {
	var out []Finding
	for i, pq := range c.queries {
		rule := c.rules[i]
		rs, err := pq.Eval(ctx, rego.EvalParsedInput(input))
		if err != nil {
			return nil, err
		}
		if len(rs) == 0 || len(rs[0].Expressions) == 0 {
			continue // undefined: a complete rule whose body did not hold
		}
		findings, err := ruleFindings(c.def.Name, rule, rs[0].Expressions[0].Value)
		if err != nil {
			return nil, err
		}
		out = append(out, findings...)
	}
	return out, nil
}

// ruleFindings converts one rule's value, a set of strings and of objects with a string "msg".
// Anything else is an error: conftest skips such values, which would let a mistaken policy pass.
func ruleFindings(policy, rule string, value any) ([]Finding, error) {
	items, ok := value.([]any)
	if !ok {
		return nil, fmt.Errorf("rule %s gave %s, not a set of strings or of objects with \"msg\"", rule, describe(value))
	}
	findings := make([]Finding, 0, len(items))
	for _, it := range items {
		f := Finding{Policy: policy, Rule: rule}
		switch v := it.(type) {
		case string:
			f.Message = v
		case map[string]any:
			msg, ok := v["msg"].(string)
			if !ok {
				return nil, fmt.Errorf("rule %s gave an object without a string \"msg\": %v", rule, v)
			}
			f.Message = msg
			if len(v) > 1 {
				f.Details = maps.Clone(v)
				delete(f.Details, "msg")
			}
		default:
			return nil, fmt.Errorf("rule %s gave %s in its set, not a string or an object with \"msg\"", rule, describe(it))
		}
		findings = append(findings, f)
	}
	sort.SliceStable(findings, func(i, j int) bool { return findings[i].Message < findings[j].Message })
	return findings, nil
}

// describe names a JSON value's kind and shows it, shortened.
func describe(v any) string {
	kind := "a value"
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		kind = "a boolean"
	case string:
		kind = "a string"
	case map[string]any:
		kind = "an object"
	case []any:
		kind = "an array"
	default:
		kind = "a number"
	}
	s := fmt.Sprint(v)
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return kind + " (" + s + ")"
}
