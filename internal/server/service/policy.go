package service

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/granter"
)

// Policy says, per environment, which change classes on which stack globs need a grant before
// an apply, and which service account a satisfied gate leases. Example:
//
//	claim_ttl = "168h"
//	granter "gcp-iam" {
//	  credentials_file = "/etc/tfstackplan/granter.json" # optional: Application Default Credentials
//	}
//	environment "prod" {
//	  requester     = "deployer@project.iam.gserviceaccount.com"
//	  runner_member = "principalSet://iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/gh/attribute.repository/org/infra"
//	  lease_ttl     = "2h"
//	  gate {
//	    classes = ["destructive", "unclassified"]
//	    stacks  = ["**"]
//	  }
//	}
type Policy struct {
	// ClaimTTL is how long a plan's claims last (0: DefaultClaimTTL).
	ClaimTTL time.Duration
	// Environments by name.
	Environments map[string]EnvPolicy
	// Granter selects what makes a lease real: granter.KindNone (the default) or
	// granter.KindGCPIAM with GranterConfig.
	Granter       string
	GranterConfig granter.GCPIAMConfig
}

// EnvPolicy is one environment's rules.
type EnvPolicy struct {
	// Requester is the service account a satisfied gate leases.
	Requester string
	// RunnerMember is the runners' IAM identity the granter lets impersonate Requester
	// (e.g. "principalSet://iam.googleapis.com/..."); the gcp-iam granter needs it.
	RunnerMember string
	// LeaseTTL is how long a lease lasts (0: DefaultLeaseTTL).
	LeaseTTL time.Duration
	// Gates need a grant each.
	Gates []GateRule
}

// GateRule requires a grant when a stack matching one of Stacks has one of Classes.
type GateRule struct {
	Classes []api.Class
	Stacks  []string
}

// Defaults for durations the policy leaves unset.
const (
	DefaultClaimTTL = 7 * 24 * time.Hour
	DefaultLeaseTTL = 2 * time.Hour
)

type policyFile struct {
	ClaimTTL     string             `hcl:"claim_ttl,optional"`
	Granters     []policyGranterHCL `hcl:"granter,block"`
	Environments []policyEnvHCL     `hcl:"environment,block"`
}

type policyGranterHCL struct {
	Kind            string `hcl:"kind,label"`
	Endpoint        string `hcl:"endpoint,optional"`
	CredentialsFile string `hcl:"credentials_file,optional"`
}

type policyEnvHCL struct {
	Name         string          `hcl:"name,label"`
	Requester    string          `hcl:"requester,optional"`
	RunnerMember string          `hcl:"runner_member,optional"`
	LeaseTTL     string          `hcl:"lease_ttl,optional"`
	Gates        []policyGateHCL `hcl:"gate,block"`
}

type policyGateHCL struct {
	Classes []string `hcl:"classes"`
	Stacks  []string `hcl:"stacks"`
}

// LoadPolicy reads an HCL policy file; an empty path is the empty policy (nothing gated).
func LoadPolicy(path string) (*Policy, error) {
	if path == "" {
		return &Policy{Environments: map[string]EnvPolicy{}, Granter: granter.KindNone}, nil
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return ParsePolicy(path, src)
}

// ParsePolicy parses policy HCL; filename is used in messages.
func ParsePolicy(filename string, src []byte) (*Policy, error) {
	f, diags := hclparse.NewParser().ParseHCL(src, filename)
	if diags.HasErrors() {
		return nil, fmt.Errorf("policy: %s", diags.Error())
	}
	var pf policyFile
	if diags := gohcl.DecodeBody(f.Body, nil, &pf); diags.HasErrors() {
		return nil, fmt.Errorf("policy: %s", hcl.Diagnostics(diags).Error())
	}
	p := &Policy{Environments: map[string]EnvPolicy{}}
	var err error
	if p.ClaimTTL, err = parseTTL(filename, "claim_ttl", pf.ClaimTTL); err != nil {
		return nil, err
	}
	switch len(pf.Granters) {
	case 0:
		p.Granter = granter.KindNone
	case 1:
		g := pf.Granters[0]
		if g.Kind != granter.KindNone && g.Kind != granter.KindGCPIAM {
			return nil, fmt.Errorf("policy %s: granter %q is not %q or %q", filename, g.Kind, granter.KindNone, granter.KindGCPIAM)
		}
		p.Granter, p.GranterConfig = g.Kind, granter.GCPIAMConfig{Endpoint: g.Endpoint, CredentialsFile: g.CredentialsFile}
	default:
		return nil, fmt.Errorf("policy %s: %d granter blocks; give at most one", filename, len(pf.Granters))
	}
	for _, e := range pf.Environments {
		if _, dup := p.Environments[e.Name]; dup {
			return nil, fmt.Errorf("policy %s: environment %q is defined twice", filename, e.Name)
		}
		if p.Granter == granter.KindGCPIAM && e.Requester != "" && e.RunnerMember == "" {
			return nil, fmt.Errorf("policy %s: environment %q: the %s granter needs runner_member, the runners' IAM identity to let impersonate %s",
				filename, e.Name, granter.KindGCPIAM, e.Requester)
		}
		ep := EnvPolicy{Requester: e.Requester, RunnerMember: e.RunnerMember}
		if ep.LeaseTTL, err = parseTTL(filename, "environment "+e.Name+" lease_ttl", e.LeaseTTL); err != nil {
			return nil, err
		}
		for i, g := range e.Gates {
			rule := GateRule{Stacks: g.Stacks}
			if len(g.Classes) == 0 || len(g.Stacks) == 0 {
				return nil, fmt.Errorf("policy %s: environment %q gate %d needs classes and stacks", filename, e.Name, i+1)
			}
			for _, c := range g.Classes {
				if !api.Class(c).Valid() {
					return nil, fmt.Errorf("policy %s: environment %q gate %d: unknown class %q (want one of no-changes, additive, mutating, destructive, unclassified)", filename, e.Name, i+1, c)
				}
				rule.Classes = append(rule.Classes, api.Class(c))
			}
			for _, s := range g.Stacks {
				if err := checkGlob(s); err != nil {
					return nil, fmt.Errorf("policy %s: environment %q gate %d: %w", filename, e.Name, i+1, err)
				}
			}
			ep.Gates = append(ep.Gates, rule)
		}
		p.Environments[e.Name] = ep
	}
	return p, nil
}

func parseTTL(filename, what, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("policy %s: %s %q is not a positive duration like \"2h\"", filename, what, s)
	}
	return d, nil
}

// RequiredGates returns the gates a plan's stacks need in env: one per (class, glob) rule that
// matches at least one stack, with the stacks it covers.
func (p *Policy) RequiredGates(env string, classes map[string]events.Class) []api.Gate {
	ep, ok := p.Environments[env]
	if !ok {
		return nil
	}
	type key struct{ class, target string }
	found := map[key][]string{}
	for stack, class := range classes {
		for _, rule := range ep.Gates {
			for _, c := range rule.Classes {
				if c != class {
					continue
				}
				for _, glob := range rule.Stacks {
					if MatchGlob(glob, stack) {
						k := key{string(c), glob}
						found[k] = append(found[k], stack)
					}
				}
			}
		}
	}
	out := make([]api.Gate, 0, len(found))
	for k, stacks := range found {
		sort.Strings(stacks)
		out = append(out, api.Gate{Environment: env, Class: k.class, Target: k.target, Stacks: stacks})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Class != out[j].Class {
			return out[i].Class < out[j].Class
		}
		return out[i].Target < out[j].Target
	})
	return out
}

func checkGlob(g string) error {
	if g == "" {
		return fmt.Errorf("empty stack glob")
	}
	for _, seg := range strings.Split(g, "/") {
		if strings.Contains(seg, "**") && seg != "**" {
			return fmt.Errorf("stack glob %q: ** must be a whole path segment", g)
		}
	}
	return nil
}

// MatchGlob matches a slash-separated stack path against a glob where * matches within one
// segment, ? one character, and a ** segment any number of segments.
func MatchGlob(glob, name string) bool {
	return matchSegs(strings.Split(glob, "/"), strings.Split(strings.Trim(name, "/"), "/"))
}

func matchSegs(g, n []string) bool {
	for len(g) > 0 {
		if g[0] == "**" {
			for i := 0; i <= len(n); i++ {
				if matchSegs(g[1:], n[i:]) {
					return true
				}
			}
			return false
		}
		if len(n) == 0 || !matchSeg(g[0], n[0]) {
			return false
		}
		g, n = g[1:], n[1:]
	}
	return len(n) == 0
}

func matchSeg(g, s string) bool {
	if g == "" {
		return s == ""
	}
	switch g[0] {
	case '*':
		for i := 0; i <= len(s); i++ {
			if matchSeg(g[1:], s[i:]) {
				return true
			}
		}
		return false
	case '?':
		return s != "" && matchSeg(g[1:], s[1:])
	default:
		return s != "" && s[0] == g[0] && matchSeg(g[1:], s[1:])
	}
}
