// Package policy evaluates Rego policies on `tofu show -json` plans with the Open Policy Agent
// library, by conftest's conventions: in a policy's package (default "main") every rule named
// deny, violation, deny_*, or violation_* fails the plan and every rule named warn or warn_*
// warns; each rule is a set of strings, or of objects with a string "msg" whose other fields
// are kept as details. The input document is the plan as `show -json` prints it, so existing
// conftest policies work unchanged.
//
// A Set is compiled once from Definitions (the server's policy.hcl and tfstackplan.hcl fill
// them) and evaluated per stack plan. A policy that cannot be read or compiled stops Compile
// with an error naming the file and line; one whose evaluation fails counts as a failure of
// that policy (fail closed), never as a pass. A package without any of those rules, or no such
// package at all, reports nothing, as conftest does; Set.Rules tells which rules a policy has,
// so a caller can say so. A plan that cannot be read (ReadInput's error) is the caller's to
// count as a failure.
package policy

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/util"
)

// Enforcement says what a policy's deny and violation rules do.
type Enforcement string

// The enforcements a Definition accepts.
const (
	// EnforceDeny makes deny and violation results failures (the default).
	EnforceDeny Enforcement = "deny"
	// EnforceWarn reports deny and violation results as warnings: the policy never fails.
	EnforceWarn Enforcement = "warn"
)

// The Rego versions a Definition accepts.
const (
	// RegoV1 is the syntax of OPA 1.0 and later (`deny contains msg if { ... }`), the default.
	RegoV1 = "v1"
	// RegoV0 is the syntax before OPA 1.0 (`deny[msg] { ... }`).
	RegoV0 = "v0"
)

// DefaultPackage is the package a Definition without one evaluates, as conftest's default.
const DefaultPackage = "main"

// Definition is one named policy: Rego modules and data files, the package whose rules count,
// and what its failures do.
type Definition struct {
	// Name identifies the policy in results (and, later, the check `policy/<name>`).
	Name string
	// Files are paths or filepath.Match globs, relative to BaseDir unless absolute, of Rego
	// modules (.rego) and data documents (.json, .yaml, .yml). A path naming a directory takes
	// every such file below it. A pattern that matches nothing is an error.
	Files []string
	// BaseDir resolves relative Files (the directory of the file that defines the policy).
	BaseDir string
	// Package is the Rego package whose rules count, "main" when empty. Dots separate its
	// parts, as in the module's package line.
	Package string
	// Enforcement is EnforceDeny when empty.
	Enforcement Enforcement
	// RegoVersion is RegoV1 when empty.
	RegoVersion string
}

// normalized returns d with defaults filled in, or an error for a value it cannot use.
func (d Definition) normalized() (Definition, error) {
	if d.Name == "" {
		return d, errors.New("a policy needs a name")
	}
	if d.Package == "" {
		d.Package = DefaultPackage
	}
	if d.Enforcement == "" {
		d.Enforcement = EnforceDeny
	}
	if d.Enforcement != EnforceDeny && d.Enforcement != EnforceWarn {
		return d, fmt.Errorf("policy %q: enforcement must be %q or %q, not %q", d.Name, EnforceDeny, EnforceWarn, d.Enforcement)
	}
	if d.RegoVersion == "" {
		d.RegoVersion = RegoV1
	}
	if d.RegoVersion != RegoV1 && d.RegoVersion != RegoV0 {
		return d, fmt.Errorf("policy %q: rego_version must be %q or %q, not %q", d.Name, RegoV1, RegoV0, d.RegoVersion)
	}
	if len(d.Files) == 0 {
		return d, fmt.Errorf("policy %q: no files", d.Name)
	}
	return d, nil
}

// sourceFile is one file of a policy, read.
type sourceFile struct {
	rel  string // the name results and hashes use: relative to BaseDir when below it
	path string // where it was read
	data []byte
}

// isPolicyFile reports whether name is a file kind a policy reads.
func isPolicyFile(name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".rego", ".json", ".yaml", ".yml":
		return true
	}
	return false
}

// resolveFiles expands d's Files into the files they name, sorted by name, without duplicates.
func resolveFiles(d Definition) ([]sourceFile, error) {
	seen := map[string]bool{}
	var paths []string
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			paths = append(paths, p)
		}
	}
	for _, pattern := range d.Files {
		full := pattern
		if !filepath.IsAbs(full) {
			full = filepath.Join(d.BaseDir, pattern)
		}
		matches, err := filepath.Glob(full)
		if err != nil {
			return nil, fmt.Errorf("policy %q: files %q: %w", d.Name, pattern, err)
		}
		if len(matches) == 0 {
			return nil, fmt.Errorf("policy %q: files %q match nothing", d.Name, pattern)
		}
		for _, m := range matches {
			fi, err := os.Stat(m)
			if err != nil {
				return nil, fmt.Errorf("policy %q: %w", d.Name, err)
			}
			if !fi.IsDir() {
				if !isPolicyFile(m) {
					return nil, fmt.Errorf("policy %q: %s is neither a Rego module (.rego) nor a data file (.json, .yaml)", d.Name, m)
				}
				add(m)
				continue
			}
			err = filepath.WalkDir(m, func(p string, e fs.DirEntry, err error) error {
				if err == nil && !e.IsDir() && isPolicyFile(p) {
					add(p)
				}
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("policy %q: %w", d.Name, err)
			}
		}
	}
	files := make([]sourceFile, 0, len(paths))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("policy %q: %w", d.Name, err)
		}
		rel := p
		if r, err := filepath.Rel(d.BaseDir, p); err == nil && d.BaseDir != "" && !strings.HasPrefix(r, "..") {
			rel = r
		}
		files = append(files, sourceFile{rel: filepath.ToSlash(rel), path: p, data: data})
	}
	slices.SortFunc(files, func(a, b sourceFile) int { return strings.Compare(a.rel, b.rel) })
	return files, nil
}

// compiled is one policy ready to evaluate.
type compiled struct {
	def     Definition
	rules   []string // the deny/violation/warn rules of its package, sorted
	queries []rego.PreparedEvalQuery
}

// Set is a compiled set of policies, evaluated on any number of plans, concurrently if need
// be.
type Set struct {
	policies []*compiled
	hash     string
}

// Compile reads, parses and compiles defs and prepares their queries. An error names the
// policy, and for a Rego or data error the file and line.
func Compile(ctx context.Context, defs []Definition) (*Set, error) {
	s := &Set{}
	h := sha256.New()
	names := map[string]bool{}
	for _, d := range defs {
		d, err := d.normalized()
		if err != nil {
			return nil, err
		}
		if names[d.Name] {
			return nil, fmt.Errorf("policy %q is defined twice", d.Name)
		}
		names[d.Name] = true
		files, err := resolveFiles(d)
		if err != nil {
			return nil, err
		}
		hashDefinition(h, d, files)
		c, err := compilePolicy(ctx, d, files)
		if err != nil {
			return nil, err
		}
		s.policies = append(s.policies, c)
	}
	s.hash = "sha256:" + hex.EncodeToString(h.Sum(nil))
	return s, nil
}

// hashDefinition feeds the policy's settings and its files' names and bytes to h, each
// length-prefixed so that no two different policies feed the same bytes.
func hashDefinition(h io.Writer, d Definition, files []sourceFile) {
	field := func(b []byte) {
		_, _ = h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(b))))
		_, _ = h.Write(b)
	}
	for _, s := range []string{d.Name, d.Package, string(d.Enforcement), d.RegoVersion} {
		field([]byte(s))
	}
	field(binary.BigEndian.AppendUint64(nil, uint64(len(files))))
	for _, f := range files {
		field([]byte(f.rel))
		field(f.data)
	}
}

// Hash identifies the policy set's content: the policies' names and settings, in order, and
// their files' names (relative to each policy's BaseDir) and bytes. It is the same wherever the
// files are checked out, and changes with any byte of them.
func (s *Set) Hash() string { return s.hash }

// Rules returns, per policy name, the deny, violation and warn rules its package has; a policy
// with none reports nothing.
func (s *Set) Rules() map[string][]string {
	m := make(map[string][]string, len(s.policies))
	for _, c := range s.policies {
		m[c.def.Name] = slices.Clone(c.rules)
	}
	return m
}

// compilePolicy parses d's modules and data and prepares one query per rule of its package.
func compilePolicy(ctx context.Context, d Definition, files []sourceFile) (*compiled, error) {
	version := ast.RegoV1
	if d.RegoVersion == RegoV0 {
		version = ast.RegoV0
	}
	pkg, err := ast.ParseRef("data." + d.Package)
	if err != nil || !pkg.IsGround() {
		return nil, fmt.Errorf("policy %q: package %q is not a Rego package name", d.Name, d.Package)
	}
	modules := map[string]*ast.Module{}
	data := map[string]any{}
	for _, f := range files {
		if strings.EqualFold(filepath.Ext(f.rel), ".rego") {
			m, err := ast.ParseModuleWithOpts(f.rel, string(f.data), ast.ParserOptions{RegoVersion: version})
			if err != nil {
				return nil, fmt.Errorf("policy %q: %w", d.Name, err)
			}
			modules[f.rel] = m
			continue
		}
		var doc any
		if err := util.Unmarshal(f.data, &doc); err != nil {
			return nil, fmt.Errorf("policy %q: %s: %w", d.Name, f.rel, err)
		}
		obj, ok := doc.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("policy %q: %s: a data file must hold an object", d.Name, f.rel)
		}
		for k, v := range obj {
			if _, dup := data[k]; dup {
				return nil, fmt.Errorf("policy %q: %s: data key %q is also defined in another data file", d.Name, f.rel, k)
			}
			data[k] = v
		}
	}
	if len(modules) == 0 {
		return nil, fmt.Errorf("policy %q: no Rego module (.rego) among its files", d.Name)
	}
	compiler := ast.NewCompiler().WithDefaultRegoVersion(version)
	compiler.Compile(modules)
	if compiler.Failed() {
		return nil, fmt.Errorf("policy %q: %w", d.Name, compiler.Errors)
	}
	store := inmem.NewFromObjectWithOpts(data, inmem.OptRoundTripOnWrite(false))

	c := &compiled{def: d, rules: packageRules(compiler, pkg)}
	for _, rule := range c.rules {
		pq, err := rego.New(
			rego.Query(pkg.Append(ast.StringTerm(rule)).String()),
			rego.Compiler(compiler),
			rego.Store(store),
			rego.SetRegoVersion(version),
		).PrepareForEval(ctx)
		if err != nil {
			return nil, fmt.Errorf("policy %q: %w", d.Name, err)
		}
		c.queries = append(c.queries, pq)
	}
	return c, nil
}

// ruleKind returns what a rule named name is (deny, violation or warn), or false when the
// rule does not count.
func ruleKind(name string) (kind string, ok bool) {
	for _, k := range []string{"deny", "violation", "warn"} {
		if name == k || strings.HasPrefix(name, k+"_") {
			return k, true
		}
	}
	return "", false
}

// packageRules lists the deny, violation and warn rules that pkg's modules define.
func packageRules(compiler *ast.Compiler, pkg ast.Ref) []string {
	var rules []string
	for _, m := range compiler.Modules {
		if !m.Package.Path.Equal(pkg) {
			continue
		}
		for _, r := range m.Rules {
			ref := r.Head.Ref()
			if len(ref) == 0 {
				continue
			}
			v, ok := ref[0].Value.(ast.Var)
			if !ok {
				continue
			}
			if _, ok := ruleKind(string(v)); ok && !slices.Contains(rules, string(v)) {
				rules = append(rules, string(v))
			}
		}
	}
	slices.Sort(rules)
	return rules
}
