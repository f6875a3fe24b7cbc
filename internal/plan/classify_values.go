package plan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	jsonv2 "github.com/go-json-experiment/json"
)

// What the classifier reads besides resource changes: output changes, the prior and planned
// values, and the configuration (sensitive values and the secrets they name).

func (c *classifier) outputChanges() error {
	var ch rawChange
	return c.object(func(name string) error {
		ch.reset()
		if err := c.decode(&ch); err != nil {
			return fmt.Errorf("output %s: %w", name, err)
		}
		if err := c.secrets.collectChange(&ch); err != nil {
			return fmt.Errorf("output %s: %w", name, err)
		}
		action, _, err := actionOf(ch.Actions, false, false)
		if err != nil {
			return fmt.Errorf("output %s: %w", name, err)
		}
		if action == ActionNoOp {
			return nil
		}
		if err := c.hash.outputChange(name, &ch); err != nil {
			return fmt.Errorf("output %s: %w", name, err)
		}
		c.s.OutputsChanged++
		if action == ActionDelete {
			c.s.OutputsDeleted++
		}
		if len(c.s.Outputs) >= MaxChanges {
			return nil
		}
		out := OutputChange{Name: name, Action: action}
		if ch.detailBytes() <= maxDetailBytes {
			out.Attributes, _, err = diffValues(name, ch.Before, ch.After, ch.AfterUnknown, ch.BeforeSensitive, ch.AfterSensitive)
			if err != nil {
				return fmt.Errorf("output %s: %w", name, err)
			}
		} else {
			out.ValueOmittedBytes = int64(max(len(ch.Before), len(ch.After), len(ch.AfterUnknown)))
		}
		c.s.Outputs = append(c.s.Outputs, out)
		return nil
	})
}

// stateValues reads planned_values or prior_state.values (prior): outputs and the module tree.
func (c *classifier) stateValues(prior bool) error {
	return c.object(func(key string) error {
		switch key {
		case "outputs":
			var outs map[string]struct {
				Sensitive bool            `json:"sensitive"`
				Value     json.RawMessage `json:"value"`
			}
			if err := c.decode(&outs); err != nil {
				return fmt.Errorf("outputs: %w", err)
			}
			for name, o := range outs {
				if o.Sensitive {
					if err := c.secrets.collectRaw(o.Value, json.RawMessage("true")); err != nil {
						return fmt.Errorf("output %s: %w", name, err)
					}
				}
			}
			return nil
		case "root_module":
			return c.module(prior)
		}
		return c.skip()
	})
}

// module reads one module of a state's module tree (of the prior state: prior), one resource
// at a time.
func (c *classifier) module(prior bool) error {
	return c.object(func(key string) error {
		switch key {
		case "resources":
			return c.array("resources", func() error {
				r := &c.res
				*r = rawResource{Values: r.Values[:0], SensitiveValues: r.SensitiveValues[:0]}
				if err := c.decode(r); err != nil {
					return err
				}
				if err := c.secrets.collectRaw(r.Values, r.SensitiveValues); err != nil {
					return fmt.Errorf("%s: %w", r.Address, err)
				}
				if prior && r.Mode == "managed" {
					c.stateObjects.add(c, r.Address)
				}
				return nil
			})
		case "child_modules":
			return c.array("child_modules", func() error { return c.module(prior) })
		}
		return c.skip()
	})
}

// configModule is the part of a configuration module this package reads: which variables
// are sensitive (and their defaults), and the modules it calls.
type configModule struct {
	Variables map[string]struct {
		Sensitive bool            `json:"sensitive"`
		Default   json.RawMessage `json:"default"`
	} `json:"variables"`
	ModuleCalls map[string]struct {
		Module configModule `json:"module"`
		// Expressions are the arguments of the call, by variable: an object, with
		// constant_value when the argument is a literal.
		Expressions map[string]json.RawMessage `json:"expressions"`
	} `json:"module_calls"`
}

// configuration reads which root variables are sensitive, and collects the defaults of
// sensitive variables of every module and the literals the calls pass them (a module's
// variable values are not in the plan's variables, but they may still reach an unflagged
// attribute through nonsensitive()).
func (c *classifier) configuration() error {
	var cfg struct {
		RootModule configModule `json:"root_module"`
	}
	if err := c.decode(&cfg); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	c.sensitiveVars = map[string]bool{}
	for name, v := range cfg.RootModule.Variables {
		c.sensitiveVars[name] = v.Sensitive
	}
	return c.collectDefaults(&cfg.RootModule, 0)
}

// maxModuleDepth bounds the module_calls recursion of a configuration.
const maxModuleDepth = 64

func (c *classifier) collectDefaults(m *configModule, depth int) error {
	if depth > maxModuleDepth {
		return fmt.Errorf("configuration: module calls nested deeper than %d", maxModuleDepth)
	}
	for name, v := range m.Variables {
		if v.Sensitive {
			if err := c.secrets.collectRaw(v.Default, json.RawMessage("true")); err != nil {
				return fmt.Errorf("configuration: variable %s: %w", strconv.Quote(name), err)
			}
		}
	}
	for callName, call := range m.ModuleCalls {
		// A literal passed to a sensitive variable of the module is as secret as its default.
		for name, v := range call.Module.Variables {
			expr := bytes.TrimSpace(call.Expressions[name])
			if !v.Sensitive || len(expr) == 0 || expr[0] != '{' {
				continue
			}
			var e struct {
				ConstantValue json.RawMessage `json:"constant_value"`
			}
			if err := unmarshalLegacy(expr, &e); err != nil {
				return fmt.Errorf("configuration: module %s: argument %s: %w", strconv.Quote(callName), strconv.Quote(name), err)
			}
			if err := c.secrets.collectRaw(e.ConstantValue, json.RawMessage("true")); err != nil {
				return fmt.Errorf("configuration: module %s: argument %s: %w", strconv.Quote(callName), strconv.Quote(name), err)
			}
		}
		if err := c.collectDefaults(&call.Module, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// unmarshalLegacy decodes raw into v as the classifier reads the plan (readAsV1).
func unmarshalLegacy(raw []byte, v any) error { return jsonv2.Unmarshal(raw, v, readAsV1...) }

// collectVariables adds the values of sensitive root variables to the secrets. Without a
// configuration the plan does not say which are sensitive, so every variable counts as one.
func (c *classifier) collectVariables() error {
	for name, v := range c.variables {
		if c.sensitiveVars != nil && !c.sensitiveVars[name] {
			continue
		}
		var pv struct {
			Value json.RawMessage `json:"value"`
		}
		if err := json.Unmarshal(v, &pv); err != nil {
			return fmt.Errorf("variable %s: %w", strconv.Quote(name), err)
		}
		if err := c.secrets.collectRaw(pv.Value, json.RawMessage("true")); err != nil {
			return fmt.Errorf("variable %s: %w", strconv.Quote(name), err)
		}
	}
	return nil
}
