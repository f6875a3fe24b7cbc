package service

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/granter"
	"github.com/tfstackplan/tfstackplan/internal/server/notify"
	"github.com/tfstackplan/tfstackplan/internal/textfit"
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
//	  runner_member = "principalSet://iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/gh/attribute.run_id/{run_id}"
//	  lease_ttl     = "2h"
//	  apply_from {
//	    repositories = ["acme/infra"] # optional: the repositories whose gates this may check
//	    refs         = ["refs/heads/main"]
//	    workflows    = ["acme/infra/.github/workflows/apply.yml@refs/heads/main"]
//	    environments = ["prod"]
//	    principals   = ["deployer"] # static-token and Google principals, by name
//	  }
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
	// Notify are the notify blocks' receivers (docs/notifications.md).
	Notify []notify.Target
}

// EnvPolicy is one environment's rules.
type EnvPolicy struct {
	// Requester is the service account a satisfied gate leases.
	Requester string
	// RunnerMember is the runners' IAM identity the granter lets impersonate Requester
	// (e.g. "principalSet://iam.googleapis.com/..."); the gcp-iam granter needs it. It may name
	// claims of the GitHub Actions job that passed the gate, {run_id} for one, filled in when
	// the lease is granted (MemberFor), so that the lease is usable by that run alone.
	RunnerMember string
	// ApplyFrom, when set, is who may check the gate (and so take the lease); nil: any runner,
	// except GitHub Actions jobs, which need it.
	ApplyFrom *ApplyFrom
	// LeaseTTL is how long a lease lasts (0: DefaultLeaseTTL).
	LeaseTTL time.Duration
	// Gates need a grant each.
	Gates []GateRule
}

// ApplyFrom says which callers may check an environment's gate. A GitHub Actions job must
// match every one of Refs, Workflows and Environments that is given (its ref, its
// job_workflow_ref, its GitHub environment: exact strings), and Workflows must be given: a
// job_workflow_ref names both the workflow file and the ref it was read from, so that only that
// file as it is on that ref (reviewed, merged code) can reach the lease, never another workflow
// of the repository or a branch's edit of it. Any other principal must be named in Principals.
//
// Environments are shared by every repository of the server. Repositories, when given, limits
// every caller to checks of these repositories' gates (canonical owner/name). Without it a
// GitHub Actions job passes only through a workflow of its own repository: job_workflow_ref
// names a reusable workflow's repository, and any repository may call acme/infra's apply.yml as
// a reusable workflow, which would otherwise pass its jobs through an entry meant for
// acme/infra's own.
type ApplyFrom struct {
	Repositories []string
	Refs         []string
	Workflows    []string
	Environments []string
	Principals   []string
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
	Notify       []notify.Block     `hcl:"notify,block"`
}

type policyGranterHCL struct {
	Kind            string `hcl:"kind,label"`
	Endpoint        string `hcl:"endpoint,optional"`
	CredentialsFile string `hcl:"credentials_file,optional"`
}

type policyEnvHCL struct {
	Name         string               `hcl:"name,label"`
	Requester    string               `hcl:"requester,optional"`
	RunnerMember string               `hcl:"runner_member,optional"`
	LeaseTTL     string               `hcl:"lease_ttl,optional"`
	ApplyFrom    []policyApplyFromHCL `hcl:"apply_from,block"`
	Gates        []policyGateHCL      `hcl:"gate,block"`
}

type policyApplyFromHCL struct {
	Repositories []string `hcl:"repositories,optional"`
	Refs         []string `hcl:"refs,optional"`
	Workflows    []string `hcl:"workflows,optional"`
	Environments []string `hcl:"environments,optional"`
	Principals   []string `hcl:"principals,optional"`
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
	if p.Notify, err = notify.Parse(filename, pf.Notify, os.Getenv); err != nil {
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
		if err := checkMemberTemplate(e.RunnerMember); err != nil {
			return nil, fmt.Errorf("policy %s: environment %q runner_member: %w", filename, e.Name, err)
		}
		switch len(e.ApplyFrom) {
		case 0:
		case 1:
			a := e.ApplyFrom[0]
			if len(a.Refs)+len(a.Workflows)+len(a.Environments)+len(a.Principals) == 0 {
				return nil, fmt.Errorf("policy %s: environment %q apply_from names nothing: give refs, workflows and environments (GitHub Actions jobs) or principals", filename, e.Name)
			}
			if len(a.Refs)+len(a.Environments) > 0 && len(a.Workflows) == 0 {
				return nil, fmt.Errorf("policy %s: environment %q apply_from gives refs or environments but no workflows: a GitHub Actions job is matched by its workflow first (job_workflow_ref, e.g. \"owner/repo/.github/workflows/apply.yml@refs/heads/main\"); give workflows", filename, e.Name)
			}
			ep.ApplyFrom = &ApplyFrom{Refs: a.Refs, Workflows: a.Workflows, Environments: a.Environments, Principals: a.Principals}
			for _, r := range a.Repositories {
				canon, err := events.CanonicalRepo(r)
				if err != nil {
					return nil, fmt.Errorf("policy %s: environment %q apply_from repositories: %w", filename, e.Name, err)
				}
				ep.ApplyFrom.Repositories = append(ep.ApplyFrom.Repositories, canon)
			}
		default:
			return nil, fmt.Errorf("policy %s: environment %q has %d apply_from blocks; give at most one", filename, e.Name, len(e.ApplyFrom))
		}
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

// maxTTL bounds a policy's durations: a lease or claim ending past MaxTime would not fit the
// stores' nanoseconds, and wrap around to an end in the past.
const maxTTL = 10 * 365 * 24 * time.Hour

func parseTTL(filename, what, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("policy %s: %s %q is not a positive duration like \"2h\"", filename, what, s)
	}
	if d > maxTTL {
		return 0, fmt.Errorf("policy %s: %s %q is longer than ten years (%s)", filename, what, s, maxTTL)
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
// segment, ? one character, and a ** segment any number of segments. Case does not matter: on a
// filesystem that ignores it, "Stacks/prod/db" is the stack "stacks/prod/db", and a gate on it
// must not be passed by spelling it so.
func MatchGlob(glob, name string) bool {
	return matchSegs(strings.Split(strings.ToLower(glob), "/"), strings.Split(strings.ToLower(strings.Trim(name, "/")), "/"))
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

// memberClaims are the placeholders a runner_member template may name, each filled with the
// claim of the GitHub Actions job that passed the gate.
var memberClaims = map[string]func(*GitHubJob) string{
	"repository":       func(j *GitHubJob) string { return j.Repository },
	"repository_owner": func(j *GitHubJob) string { owner, _, _ := strings.Cut(j.Repository, "/"); return owner },
	"ref":              func(j *GitHubJob) string { return j.Ref },
	"job_workflow_ref": func(j *GitHubJob) string { return j.JobWorkflowRef },
	"environment":      func(j *GitHubJob) string { return j.Environment },
	"run_id":           func(j *GitHubJob) string { return j.RunID },
	"run_attempt":      func(j *GitHubJob) string { return j.RunAttempt },
	"sha":              func(j *GitHubJob) string { return j.SHA },
	"actor":            func(j *GitHubJob) string { return j.Actor },
}

// templateParts splits a runner_member template into its literal text and its placeholders:
// parts alternate literal, name, literal, ... (always an odd count).
func templateParts(t string) ([]string, error) {
	var parts []string
	for {
		i := strings.IndexAny(t, "{}")
		if i < 0 {
			return append(parts, t), nil
		}
		if t[i] == '}' {
			return nil, fmt.Errorf("a %q without its %q", "}", "{")
		}
		j := strings.IndexByte(t[i:], '}')
		if j < 0 {
			return nil, fmt.Errorf("a %q without its %q", "{", "}")
		}
		name := t[i+1 : i+j]
		if _, ok := memberClaims[name]; !ok {
			names := make([]string, 0, len(memberClaims))
			for n := range memberClaims {
				names = append(names, "{"+n+"}")
			}
			sort.Strings(names)
			return nil, fmt.Errorf("unknown placeholder {%s} (want one of %s)", name, strings.Join(names, ", "))
		}
		parts = append(parts, t[:i], name)
		t = t[i+j+1:]
	}
}

func checkMemberTemplate(t string) error {
	_, err := templateParts(t)
	return err
}

// memberValueOK reports whether a claim may be put into an IAM member: letters, digits and the
// punctuation of refs, repositories and ids, nothing that could end the attribute or start
// another.
func memberValueOK(v string) bool {
	if v == "" || len(v) > 512 {
		return false
	}
	for _, r := range v {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./@:", r)) {
			return false
		}
	}
	return true
}

// MemberFor is the IAM member a lease of env is bound to for caller: RunnerMember with its
// placeholders filled from caller's GitHub Actions claims. A template that names claims needs a
// GitHub Actions caller with each of them set to a value an IAM member can hold; otherwise no
// member is made and the error says why.
func (ep EnvPolicy) MemberFor(caller Caller) (string, error) {
	parts, err := templateParts(ep.RunnerMember)
	if err != nil {
		return "", err
	}
	if len(parts) == 1 {
		return parts[0], nil
	}
	if caller.GitHub == nil {
		return "", fmt.Errorf("runner_member names claims of a GitHub Actions job, and %s is not one", caller.Name)
	}
	var b strings.Builder
	for i, p := range parts {
		if i%2 == 0 {
			b.WriteString(p)
			continue
		}
		v := memberClaims[p](caller.GitHub)
		if !memberValueOK(v) {
			return "", fmt.Errorf("runner_member: the job's %s claim %q cannot be put into an IAM member", p, textfit.Prefix(textfit.Sanitize(v), 100))
		}
		b.WriteString(v)
	}
	return b.String(), nil
}

// MayCheckGate says why caller may not check the gate of an environment with policy ep in
// repository repo ("" when it may): a GitHub Actions job must match apply_from, which the
// environment must have, through a workflow of its own repository unless apply_from's
// repositories name it; another principal must be named in apply_from's principals when the
// environment has apply_from. Either must act in one of apply_from's repositories when it names
// some.
func (ep EnvPolicy) MayCheckGate(env, repo string, caller Caller) string {
	a := ep.ApplyFrom
	if a != nil && len(a.Repositories) > 0 && !slices.Contains(a.Repositories, repo) {
		return fmt.Sprintf("repository %s is not among the repositories of environment %q's apply_from", repo, env)
	}
	if caller.GitHub == nil {
		if a == nil || slices.Contains(a.Principals, caller.Name) {
			return ""
		}
		return fmt.Sprintf("%s is not among the principals of environment %q's apply_from", caller.Name, env)
	}
	j := caller.GitHub
	switch {
	case a == nil:
		return fmt.Sprintf("environment %q has no apply_from block: no GitHub Actions job may check its gate", env)
	case len(a.Workflows) == 0:
		return fmt.Sprintf("environment %q's apply_from names no workflows: no GitHub Actions job may check its gate", env)
	case len(a.Refs) > 0 && !slices.Contains(a.Refs, j.Ref):
		return fmt.Sprintf("the job's ref %q is not among apply_from's refs of environment %q", j.Ref, env)
	case len(a.Workflows) > 0 && !slices.Contains(a.Workflows, j.JobWorkflowRef):
		return fmt.Sprintf("the job's workflow %q is not among apply_from's workflows of environment %q", j.JobWorkflowRef, env)
	case len(a.Environments) > 0 && !slices.Contains(a.Environments, j.Environment):
		return fmt.Sprintf("the job's GitHub environment %q is not among apply_from's environments of environment %q", j.Environment, env)
	case len(a.Repositories) == 0 && !strings.HasPrefix(strings.ToLower(j.JobWorkflowRef), j.Repository+"/"):
		return fmt.Sprintf("the job's workflow %q is not of its repository %s: a job of one repository passes through another's workflow only when environment %q's apply_from names its repository in repositories",
			j.JobWorkflowRef, j.Repository, env)
	}
	return ""
}
