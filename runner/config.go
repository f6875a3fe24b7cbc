package runner

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"

	"github.com/tfstackplan/tfstackplan/internal/gauth"
)

// ConfigFileName is the runner's configuration file, at the repository root.
const ConfigFileName = "tfstackplan.hcl"

// Defaults of an environment block.
const (
	DefaultPlanScript   = "plan"
	DefaultApplyScript  = "apply"
	DefaultLogFile      = "tfstackplan.log"
	DefaultPlanJSONFile = "tfstackplan.plan.json"
)

// Config is tfstackplan.hcl: one block per deployment environment.
//
//	environment "prod" {
//	  server       = "https://tfstackplan.example.com"
//	  audience     = "tfstackplan"
//	  auth         = "github-actions"  # or "google" (the default)
//	  dir          = "stacks/prod"     # the terramate directory (tier) it covers
//	  plan_script  = "plan"            # terramate script names
//	  apply_script = "apply"
//	  log_file     = "tfstackplan.log" # per-stack log, tailed by the pump
//	  plan_json    = "tfstackplan.plan.json"
//	  gated        = true              # no server => applies are denied
//	}
type Config struct {
	// File is the path the configuration was read from.
	File         string
	Environments []Environment
}

// Environment is one `environment` block.
type Environment struct {
	Name        string `hcl:"name,label"`
	Server      string `hcl:"server,optional"`
	Audience    string `hcl:"audience,optional"`
	Auth        string `hcl:"auth,optional"`
	Dir         string `hcl:"dir,optional"`
	PlanScript  string `hcl:"plan_script,optional"`
	ApplyScript string `hcl:"apply_script,optional"`
	LogFile     string `hcl:"log_file,optional"`
	PlanJSON    string `hcl:"plan_json,optional"`
	Gated       bool   `hcl:"gated,optional"`

	// Range is where the block starts, for messages.
	Range hcl.Range
}

type configFile struct {
	Environments []Environment `hcl:"environment,block"`
}

// ConfigError is a configuration problem with its file:line position.
type ConfigError struct {
	Diags hcl.Diagnostics
}

// Error lists each problem as file:line,column: summary: detail.
func (e *ConfigError) Error() string {
	var b strings.Builder
	for i, d := range e.Diags {
		if i > 0 {
			b.WriteString("; ")
		}
		if d.Subject != nil {
			fmt.Fprintf(&b, "%s:%d,%d: ", d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column)
		}
		b.WriteString(d.Summary)
		if d.Detail != "" {
			b.WriteString(": " + d.Detail)
		}
	}
	return b.String()
}

// LoadConfig reads and validates a tfstackplan.hcl file.
func LoadConfig(file string) (*Config, error) {
	src, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	return ParseConfig(file, src)
}

// ParseConfig parses and validates configuration source; file names it in messages.
func ParseConfig(file string, src []byte) (*Config, error) {
	p := hclparse.NewParser()
	f, diags := p.ParseHCL(src, file)
	if diags.HasErrors() {
		return nil, &ConfigError{Diags: diags}
	}
	var cf configFile
	if diags := gohcl.DecodeBody(f.Body, nil, &cf); diags.HasErrors() {
		return nil, &ConfigError{Diags: diags}
	}
	// gohcl does not expose block ranges: take them from the syntax tree.
	content, _, _ := f.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "environment", LabelNames: []string{"name"}}}})
	for i := range cf.Environments {
		if content != nil && i < len(content.Blocks) {
			cf.Environments[i].Range = content.Blocks[i].DefRange
		}
	}
	cfg := &Config{File: file, Environments: cf.Environments}
	if diags := cfg.validate(); diags.HasErrors() {
		return nil, &ConfigError{Diags: diags}
	}
	for i := range cfg.Environments {
		cfg.Environments[i].ApplyDefaults()
	}
	return cfg, nil
}

func (c *Config) validate() hcl.Diagnostics {
	var diags hcl.Diagnostics
	seen := map[string]bool{}
	bad := func(env Environment, summary, detail string) {
		r := env.Range
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: &r})
	}
	for _, env := range c.Environments {
		if strings.TrimSpace(env.Name) == "" {
			bad(env, "empty environment name", "")
		}
		if seen[env.Name] {
			bad(env, "duplicate environment", fmt.Sprintf("environment %q is defined more than once", env.Name))
		}
		seen[env.Name] = true
		if env.Server != "" {
			if _, err := gauth.ParseServerURL(env.Server); err != nil {
				bad(env, "invalid server", err.Error())
			}
		}
		if err := checkAuthMode(env.Auth); err != nil {
			bad(env, "invalid auth", err.Error())
		}
		if env.Dir != "" {
			if err := checkRelPath(env.Dir); err != nil {
				bad(env, "invalid dir", err.Error())
			}
		}
		for name, v := range map[string]string{"log_file": env.LogFile, "plan_json": env.PlanJSON} {
			if v != "" && (strings.ContainsAny(v, `/\`) || v == "." || v == "..") {
				bad(env, "invalid "+name, fmt.Sprintf("%q must be a plain file name inside each stack directory", v))
			}
		}
		for name, v := range map[string]string{"plan_script": env.PlanScript, "apply_script": env.ApplyScript} {
			// A script's labels are words separated by single spaces ("tfstackplan plan" for
			// `script "tfstackplan" "plan"`), as terramate script run takes them.
			if v != "" && (strings.ContainsAny(v, "\t\n\r") || strings.Join(strings.Fields(v), " ") != v) {
				bad(env, "invalid "+name, fmt.Sprintf("%q is not a terramate script name (labels separated by single spaces)", v))
			}
		}
	}
	return diags
}

// checkRelPath refuses paths that leave the directory they are relative to.
func checkRelPath(p string) error {
	if filepath.IsAbs(p) || strings.HasPrefix(p, "/") || strings.HasPrefix(p, `\`) {
		return fmt.Errorf("%q must be relative to the repository root", p)
	}
	clean := path.Clean(filepath.ToSlash(p))
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return fmt.Errorf("%q leaves the repository root", p)
	}
	return nil
}

// ApplyDefaults fills the settings e leaves empty with the defaults. The job calls it for an
// environment that no tfstackplan.hcl names (a repository without one).
func (e *Environment) ApplyDefaults() {
	if e.PlanScript == "" {
		e.PlanScript = DefaultPlanScript
	}
	if e.ApplyScript == "" {
		e.ApplyScript = DefaultApplyScript
	}
	if e.LogFile == "" {
		e.LogFile = DefaultLogFile
	}
	if e.PlanJSON == "" {
		e.PlanJSON = DefaultPlanJSONFile
	}
	if e.Dir == "" {
		e.Dir = "."
	}
}

// Environment returns the named environment block.
func (c *Config) Environment(name string) (Environment, error) {
	for _, e := range c.Environments {
		if e.Name == name {
			return e, nil
		}
	}
	names := make([]string, 0, len(c.Environments))
	for _, e := range c.Environments {
		names = append(names, e.Name)
	}
	sort.Strings(names)
	return Environment{}, fmt.Errorf("environment %q is not defined in %s (defined: %s)", name, c.File, strings.Join(names, ", "))
}

// FindRepoRoot walks up from dir to the directory holding .git; dir itself when none does.
func FindRepoRoot(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return dir
	}
	for d := abs; ; {
		if _, err := os.Stat(filepath.Join(d, ".git")); err == nil {
			return d
		}
		parent := filepath.Dir(d)
		if parent == d {
			return abs
		}
		d = parent
	}
}

// LoadRepoConfig loads tfstackplan.hcl at the repository root containing dir. A missing file is
// not an error: it returns nil, nil.
func LoadRepoConfig(dir string) (*Config, error) {
	file := filepath.Join(FindRepoRoot(dir), ConfigFileName)
	cfg, err := LoadConfig(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return cfg, err
}

// ClientForEnvironment builds the Client for env: TFSTACKPLAN_SERVER wins when set; otherwise
// the server of env's block in tfstackplan.hcl at the repository root. No server anywhere
// gives a disabled client, which denies applies when the block says `gated = true`.
// Authentication is chosen as RunClient chooses it.
func ClientForEnvironment(env string) (*Client, error) {
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	cfg, err := LoadRepoConfig(wd)
	if err != nil {
		return nil, err
	}
	return clientForEnvironment(cfg, env, os.Getenv)
}

func clientForEnvironment(cfg *Config, env string, getenv func(string) string) (*Client, error) {
	var block Environment
	if cfg != nil && env != "" {
		b, err := cfg.Environment(env)
		if err != nil {
			return nil, err
		}
		block = b
	}
	server := getenv(EnvServer)
	if strings.TrimSpace(server) == "" {
		server = block.Server
	}
	c, err := clientFor(server, AuthFor(block, getenv), getenv, os.Stderr)
	if err != nil {
		return nil, err
	}
	c.gated = block.Gated
	return c, nil
}

// Ways of authenticating to the server with ID tokens for an audience: the environment
// block's `auth` attribute, TFSTACKPLAN_AUTH, the operator commands' --auth.
const (
	// AuthGoogle sends Google ID tokens minted from Application Default Credentials: the
	// default when an audience is set.
	AuthGoogle = "google"
	// AuthGitHubActions sends the GitHub Actions job's own OIDC tokens (the job needs
	// `permissions: id-token: write`).
	AuthGitHubActions = "github-actions"
)

// checkAuthMode refuses a way of authenticating that is neither "" nor a known one.
func checkAuthMode(mode string) error {
	switch mode {
	case "", AuthGoogle, AuthGitHubActions:
		return nil
	}
	return fmt.Errorf("%q is not a way to authenticate: want %q or %q", mode, AuthGoogle, AuthGitHubActions)
}

// ErrAmbiguousAuth is returned when both a static token and an ID-token audience are
// configured: the runner will not pick one silently.
var ErrAmbiguousAuth = errors.New("both TFSTACKPLAN_TOKEN and an ID-token audience are set; configure one way to authenticate")

// ServerAuth says how a client authenticates to the server: with a static bearer token, or
// with ID tokens for an audience minted the way Mode says, never both.
type ServerAuth struct {
	// Mode is AuthGoogle or AuthGitHubActions; "" means AuthGoogle when Audience is set.
	Mode string
	// Audience is the audience of the ID tokens ("" : no ID tokens).
	Audience string
	// Token is a static bearer token (TFSTACKPLAN_TOKEN).
	Token string
}

// AuthFor returns the authentication of a run in the environment block: TFSTACKPLAN_TOKEN,
// TFSTACKPLAN_AUDIENCE (else the block's audience) and TFSTACKPLAN_AUTH (else the block's
// auth), read through getenv.
func AuthFor(block Environment, getenv func(string) string) ServerAuth {
	a := ServerAuth{
		Mode:     strings.TrimSpace(getenv(EnvAuth)),
		Audience: strings.TrimSpace(getenv(EnvAudience)),
		Token:    strings.TrimSpace(getenv(EnvToken)),
	}
	if a.Audience == "" {
		a.Audience = block.Audience
	}
	if a.Mode == "" {
		a.Mode = block.Auth
	}
	return a
}

// Check returns what is wrong with a before any token is minted: an unknown mode, a static
// token together with an audience (ErrAmbiguousAuth), a mode without an audience.
func (a ServerAuth) Check() error {
	if err := checkAuthMode(a.Mode); err != nil {
		return fmt.Errorf("auth %w", err)
	}
	switch {
	case a.Token != "" && a.Audience != "":
		return ErrAmbiguousAuth
	case a.Mode != "" && a.Audience == "":
		return fmt.Errorf("auth %q needs an audience (the environment's audience, TFSTACKPLAN_AUDIENCE or --audience)", a.Mode)
	}
	return nil
}

// Resolved returns a's mode as it is used: AuthGoogle for "" when an audience is set.
func (a ServerAuth) Resolved() string {
	if a.Mode == "" && a.Audience != "" {
		return AuthGoogle
	}
	return a.Mode
}

// TokenFunc checks a and returns its bearer source: the static token, ID tokens for the
// audience (Google's from Application Default Credentials, or the GitHub Actions job's, read
// through getenv), or nil for neither. ID tokens must be obtainable: one is minted here, within
// gauth.DiscoveryTimeout, and the error (gauth.ErrNoCredentials, gauth.ErrNoGitHubToken) says
// why none could be.
func (a ServerAuth) TokenFunc(getenv func(string) string) (TokenFunc, error) {
	if err := a.Check(); err != nil {
		return nil, err
	}
	switch {
	case a.Token != "":
		return StaticToken(a.Token), nil
	case a.Audience == "":
		return nil, nil
	case a.Resolved() == AuthGitHubActions:
		return gauth.GitHubActionsTokenFunc(a.Audience, getenv)
	default:
		return APITokenFunc(a.Audience)
	}
}

// RunClient builds the client of a run for the environment block: TFSTACKPLAN_SERVER (read
// through getenv) wins over the block's server; no server anywhere gives a disabled client
// (which denies applies when the block says `gated = true`). Requests are authenticated as
// AuthFor says: with TFSTACKPLAN_TOKEN (a static bearer, for a server using a tokens file) or
// with ID tokens for TFSTACKPLAN_AUDIENCE (else the block's audience), Google's or, with
// TFSTACKPLAN_AUTH (else the block's auth) github-actions, the GitHub Actions job's; never
// both. The error says why a configured server cannot be used: a malformed URL, both ways of
// authenticating, an unknown way, or ID tokens that cannot be obtained; callers decide (a plan
// may go on unreported, an apply is denied).
func RunClient(block Environment, getenv func(string) string) (*Client, error) {
	server := strings.TrimSpace(getenv(EnvServer))
	if server == "" {
		server = block.Server
	}
	if server == "" {
		c, _ := NewClient("")
		c.gated = block.Gated
		return c, nil
	}
	a := AuthFor(block, getenv)
	tok, err := a.TokenFunc(getenv)
	if err != nil {
		return nil, err
	}
	c, err := NewClientTokenSource(server, tok)
	if err != nil {
		return nil, err
	}
	c.setAuth(a)
	c.gated = block.Gated
	return c, nil
}
