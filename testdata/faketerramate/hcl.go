package main

// HCL mode: when the scenario declares no scripts, `script list` and `script run` read the
// project's terramate configuration instead, so the tests can run a real script library (such
// as scripts/terramate) through the fake. What is read, from every *.tm.hcl and *.tm file of
// every directory (skipping dot-files, dot-directories and directories holding a .tmskip file,
// like terramate):
//
//   - `script "label" ... { description, lets {...}, job { command | commands } }` blocks: the
//     block's real range is printed as terramate does ("Script 0 at /f.tm.hcl:1,1-9,2 having 1
//     job(s)"), the stack takes the definition of the deepest directory above it, and the lets
//     and commands are evaluated per stack; a command's trailing options object (sync_* etc.) is
//     dropped;
//   - unlabelled `globals { ... }` blocks: a stack sees the globals of every directory from the
//     root down to its own, the deeper directory winning, evaluated in dependency order;
//   - `terramate { config { experiments = [...], run { env { ... } } } }`: scripts need the
//     "scripts" experiment (the error is terramate's); run.env is evaluated
//     per stack from the stack's directory up to the root, the closest definition winning, and
//     `unset` / null skip a variable. Scenario runEnv entries are added for names the HCL does
//     not set.
//
// Expressions see `terramate.stack.{name,id,description,tags,path.{absolute,relative,basename,
// to_root}}`, `terramate.root.path.fs.{absolute,basename}`, `terramate.version`, `global.*`,
// `env.*` and (in scripts) `let.*`, and the functions tm_try, tm_can, tm_join, tm_concat,
// tm_format, tm_replace, tm_upper, tm_lower and tm_trimspace.
//
// Checked against terramate 0.17.2 (runner/scriptlib_real_test.go and by hand): the "Script N
// at" and command lines, a missing "scripts" experiment, an executable not found (also on a
// dry run), an error evaluating a job's command(s), `script list`.
//
// Where it cannot follow terramate: stacks still come from the scenario (stack blocks are not
// read); labelled globals, `import` blocks, `generate_*`, `assert` and the other tm_* functions
// are not supported (an unsupported global or function fails the evaluation); other errors
// (HCL syntax, schema, globals, lets, run.env) have terramate's first line ("Error: unable to
// parse configuration", "Error: failed to eval script") but approximate details; other
// commands (list, run-graph, ...) do not parse the HCL, so a syntax error only shows in
// `script` commands.

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/tryfunc"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
)

// hclConfig is the terramate configuration read from the project's files.
type hclConfig struct {
	dirs        map[string]*hclDir // by root-relative directory, "" for the root
	experiments []string
}

// hclDir is the configuration of one directory.
type hclDir struct {
	scripts []*hclScript
	globals []*hclsyntax.Attribute
	runEnv  []*hclsyntax.Attribute
}

// hclScript is one script block.
type hclScript struct {
	dir       string
	labels    []string
	definedAt string // the block's range, root-relative: "/scripts.tm.hcl:1,1-9,2"
	header    string // the range of its `script "label"` header, root-relative
	desc      hclsyntax.Expression
	descSrc   string // the description expression's source text (script list prints it)
	lets      []*hclsyntax.Attribute
	jobs      []hclJob
}

// hclJob is one job block: command or commands.
type hclJob struct {
	command, commands hclsyntax.Expression
}

// hclError is a configuration or evaluation error: terramate's message and its details (the
// "> ..." lines).
type hclError struct {
	msg     string
	details []string
}

func (e *hclError) Error() string { return e.msg + ": " + strings.Join(e.details, "; ") }

func newHCLError(msg string, detail string) *hclError { return &hclError{msg, []string{detail}} }

func diagErr(msg string, diags hcl.Diagnostics) *hclError {
	var parts []string
	for _, d := range diags {
		if d.Severity != hcl.DiagError {
			continue
		}
		s := d.Summary
		if d.Detail != "" {
			s += ": " + d.Detail
		}
		if d.Subject != nil {
			s = d.Subject.String() + ": " + s
		}
		parts = append(parts, s)
	}
	return &hclError{msg, parts}
}

// loadHCL reads the terramate configuration under root.
func loadHCL(root string) (*hclConfig, error) {
	cfg := &hclConfig{dirs: map[string]*hclDir{}}
	var walk func(rel string) error
	walk = func(rel string) error {
		host := filepath.Join(root, filepath.FromSlash(rel))
		entries, err := os.ReadDir(host)
		if err != nil {
			return err
		}
		if rel != "" && slices.ContainsFunc(entries, func(e os.DirEntry) bool { return e.Name() == ".tmskip" }) {
			return nil
		}
		d := &hclDir{}
		cfg.dirs[rel] = d
		for _, e := range entries { // sorted by name
			name := e.Name()
			if strings.HasPrefix(name, ".") {
				continue
			}
			if e.IsDir() {
				if err := walk(path.Join(rel, name)); err != nil {
					return err
				}
				continue
			}
			if strings.HasSuffix(name, ".tm.hcl") || strings.HasSuffix(name, ".tm") {
				src, err := os.ReadFile(filepath.Join(host, name))
				if err != nil {
					return err
				}
				if err := cfg.parseFile(d, rel, "/"+path.Join(rel, name), src); err != nil {
					var he *hclError
					if errors.As(err, &he) {
						for i := range he.details { // terramate names files by host path here
							he.details[i] = root + he.details[i]
						}
					}
					return err
				}
			}
		}
		return nil
	}
	if err := walk(""); err != nil {
		return nil, err
	}
	if !slices.Contains(cfg.experiments, "scripts") {
		// terramate reports every script block, by its host path and header range.
		he := &hclError{msg: "unable to parse configuration"}
		for _, rel := range cfg.sortedDirs() {
			for _, sc := range cfg.dirs[rel].scripts {
				he.details = append(he.details, root+sc.header+`: terramate schema error: unrecognized block "script" (script is an experimental feature, it must be enabled before usage with `+
					"`terramate.config.experiments = [\"scripts\"]`)")
			}
		}
		if len(he.details) > 0 {
			return nil, he
		}
	}
	return cfg, nil
}

// sortedDirs lists the directories in terramate's traversal order: a directory, then its
// children by name, depth first.
func (cfg *hclConfig) sortedDirs() []string {
	dirs := make([]string, 0, len(cfg.dirs))
	for d := range cfg.dirs {
		dirs = append(dirs, d)
	}
	slices.SortFunc(dirs, comparePaths)
	return dirs
}

// comparePaths orders root-relative paths component by component ("a/b" before "a-c"), which
// is the depth-first order of a tree walked with children sorted by name.
func comparePaths(a, b string) int {
	if a == b {
		return 0
	}
	if a == "" {
		return -1
	}
	if b == "" {
		return 1
	}
	return slices.Compare(strings.Split(a, "/"), strings.Split(b, "/"))
}

// sortedAttrs returns a body's attributes sorted by name.
func sortedAttrs(b *hclsyntax.Body) []*hclsyntax.Attribute {
	attrs := make([]*hclsyntax.Attribute, 0, len(b.Attributes))
	for _, a := range b.Attributes {
		attrs = append(attrs, a)
	}
	slices.SortFunc(attrs, func(x, y *hclsyntax.Attribute) int { return strings.Compare(x.Name, y.Name) })
	return attrs
}

func schemaErr(rng hcl.Range, format string, args ...any) *hclError {
	return newHCLError("unable to parse configuration", rng.String()+": terramate schema error: "+fmt.Sprintf(format, args...))
}

// parseFile reads the blocks the fake understands from one file; fname is root-relative with a
// leading slash, as terramate prints ranges.
func (cfg *hclConfig) parseFile(d *hclDir, rel, fname string, src []byte) error {
	f, diags := hclsyntax.ParseConfig(src, fname, hcl.InitialPos)
	if diags.HasErrors() {
		return diagErr("unable to parse configuration", diags)
	}
	for _, b := range f.Body.(*hclsyntax.Body).Blocks {
		switch b.Type {
		case "script":
			sc, err := parseScript(b, rel, src)
			if err != nil {
				return err
			}
			for _, other := range d.scripts {
				if slices.Equal(other.labels, sc.labels) {
					return schemaErr(b.DefRange(), "(script): multiple script blocks with same labels in the same directory")
				}
			}
			d.scripts = append(d.scripts, sc)
		case "globals":
			if len(b.Labels) > 0 {
				return schemaErr(b.DefRange(), "fake terramate: labelled globals blocks are not supported")
			}
			d.globals = append(d.globals, sortedAttrs(b.Body)...)
		case "terramate":
			for _, cb := range b.Body.Blocks {
				if cb.Type != "config" {
					continue
				}
				if a, ok := cb.Body.Attributes["experiments"]; ok {
					v, diags := a.Expr.Value(nil)
					if diags.HasErrors() {
						return diagErr("unable to parse configuration", diags)
					}
					if !v.CanIterateElements() {
						return schemaErr(a.Range(), "terramate.config.experiments must be a list of strings")
					}
					for it := v.ElementIterator(); it.Next(); {
						if _, e := it.Element(); e.Type() == cty.String && e.IsKnown() && !e.IsNull() {
							cfg.experiments = append(cfg.experiments, e.AsString())
						}
					}
				}
				for _, rb := range cb.Body.Blocks {
					if rb.Type != "run" {
						continue
					}
					for _, eb := range rb.Body.Blocks {
						if eb.Type == "env" {
							d.runEnv = append(d.runEnv, sortedAttrs(eb.Body)...)
						}
					}
				}
			}
		}
	}
	return nil
}

func parseScript(b *hclsyntax.Block, rel string, src []byte) (*hclScript, error) {
	sc := &hclScript{dir: rel, labels: b.Labels, definedAt: b.Range().String(), header: b.DefRange().String()}
	if len(b.Labels) == 0 {
		return nil, schemaErr(b.TypeRange, "(script): must provide at least one label")
	}
	for _, a := range sortedAttrs(b.Body) {
		switch a.Name {
		case "description":
			sc.desc = a.Expr
			sc.descSrc = string(a.Expr.Range().SliceBytes(src))
		case "name":
		default:
			return nil, schemaErr(a.NameRange, "(script): unrecognized attribute")
		}
	}
	for _, nb := range b.Body.Blocks {
		switch nb.Type {
		case "lets":
			sc.lets = append(sc.lets, sortedAttrs(nb.Body)...)
		case "job":
			var j hclJob
			for _, a := range sortedAttrs(nb.Body) {
				switch a.Name {
				case "command":
					j.command = a.Expr
				case "commands":
					j.commands = a.Expr
				case "name", "description":
				default:
					return nil, schemaErr(a.NameRange, "(script.job): unrecognized attribute")
				}
			}
			if (j.command == nil) == (j.commands == nil) {
				return nil, schemaErr(nb.DefRange(), "(script): missing command or commands")
			}
			sc.jobs = append(sc.jobs, j)
		default:
			return nil, schemaErr(nb.TypeRange, "(script): unrecognized block")
		}
	}
	if len(sc.jobs) == 0 {
		return nil, schemaErr(b.Range(), "(script): missing or invalid job")
	}
	return sc, nil
}

// accessorName is how terramate names a script in `script list`.
func (sc *hclScript) accessorName() string {
	words := make([]string, len(sc.labels))
	for i, l := range sc.labels {
		if strings.Contains(l, " ") {
			l = `"` + l + `"`
		}
		words[i] = l
	}
	return strings.Join(words, " ")
}

// defs returns the definitions of the script with the given labels, in terramate's order.
func (cfg *hclConfig) defs(labels []string) []*hclScript {
	var out []*hclScript
	for _, rel := range cfg.sortedDirs() {
		for _, sc := range cfg.dirs[rel].scripts {
			if slices.Equal(sc.labels, labels) {
				out = append(out, sc)
			}
		}
	}
	return out
}

// chain returns the configured directories from the root down to dir.
func (cfg *hclConfig) chain(dir string) []*hclDir {
	var out []*hclDir
	for d := dir; ; d = path.Dir(d) {
		if d == "." {
			d = ""
		}
		if c, ok := cfg.dirs[d]; ok {
			out = append(out, c)
		}
		if d == "" {
			break
		}
	}
	slices.Reverse(out)
	return out
}

var hclFuncs = map[string]function.Function{
	"tm_try":       tryfunc.TryFunc,
	"tm_can":       tryfunc.CanFunc,
	"tm_join":      stdlib.JoinFunc,
	"tm_concat":    stdlib.ConcatFunc,
	"tm_format":    stdlib.FormatFunc,
	"tm_replace":   stdlib.ReplaceFunc,
	"tm_upper":     stdlib.UpperFunc,
	"tm_lower":     stdlib.LowerFunc,
	"tm_trimspace": stdlib.TrimSpaceFunc,
}

func strList(items []string) cty.Value {
	if len(items) == 0 {
		return cty.ListValEmpty(cty.String)
	}
	vals := make([]cty.Value, len(items))
	for i, s := range items {
		vals[i] = cty.StringVal(s)
	}
	return cty.ListVal(vals)
}

// evalContext is the evaluation context of stack s: terramate.*, env.* and global.*.
func (cfg *hclConfig) evalContext(root, version string, s *Stack) (*hcl.EvalContext, error) {
	env := map[string]cty.Value{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = cty.StringVal(v)
		}
	}
	toRoot := strings.TrimSuffix(strings.Repeat("../", strings.Count(s.Path, "/")+1), "/")
	tm := cty.ObjectVal(map[string]cty.Value{
		"version": cty.StringVal(version),
		"root": cty.ObjectVal(map[string]cty.Value{"path": cty.ObjectVal(map[string]cty.Value{
			"fs": cty.ObjectVal(map[string]cty.Value{
				"absolute": cty.StringVal(root),
				"basename": cty.StringVal(filepath.Base(root)),
			}),
		})}),
		"stack": cty.ObjectVal(map[string]cty.Value{
			"name":        cty.StringVal(s.Name),
			"id":          cty.StringVal(s.ID),
			"description": cty.StringVal(s.Description),
			"tags":        strList(s.Tags),
			"path": cty.ObjectVal(map[string]cty.Value{
				"absolute": cty.StringVal("/" + s.Path),
				"relative": cty.StringVal(s.Path),
				"basename": cty.StringVal(path.Base(s.Path)),
				"to_root":  cty.StringVal(toRoot),
			}),
		}),
	})
	ctx := &hcl.EvalContext{
		Variables: map[string]cty.Value{"terramate": tm, "env": cty.ObjectVal(env), "global": cty.EmptyObjectVal},
		Functions: hclFuncs,
	}
	defs := map[string]hcl.Expression{}
	for _, d := range cfg.chain(s.Path) {
		for _, a := range d.globals {
			defs[a.Name] = a.Expr // a deeper directory overrides
		}
	}
	if _, err := resolve(ctx, "global", defs); err != nil {
		return nil, err
	}
	return ctx, nil
}

// resolve evaluates named expressions that may refer to one another as ns.NAME, in dependency
// order, and sets ctx.Variables[ns] to the result.
func resolve(ctx *hcl.EvalContext, ns string, defs map[string]hcl.Expression) (map[string]cty.Value, error) {
	vals := map[string]cty.Value{}
	pending := make([]string, 0, len(defs))
	for n := range defs {
		pending = append(pending, n)
	}
	slices.Sort(pending)
	ctx.Variables[ns] = cty.EmptyObjectVal
	for len(pending) > 0 {
		var next []string
		for _, n := range pending {
			ready := true
			for _, tr := range defs[n].Variables() {
				if tr.RootName() != ns || len(tr) < 2 {
					continue
				}
				if a, ok := tr[1].(hcl.TraverseAttr); ok && a.Name != n {
					if _, defined := defs[a.Name]; defined {
						if _, done := vals[a.Name]; !done {
							ready = false
						}
					}
				}
			}
			if !ready {
				next = append(next, n)
				continue
			}
			v, diags := defs[n].Value(ctx)
			if diags.HasErrors() {
				return nil, diagErr("failed to eval script", diags)
			}
			vals[n] = v
			ctx.Variables[ns] = cty.ObjectVal(vals)
		}
		if len(next) == len(pending) {
			return nil, newHCLError("failed to eval script", fmt.Sprintf("%s.%s: cycle between %s values %v", ns, next[0], ns, next))
		}
		pending = next
	}
	return vals, nil
}

// eval evaluates the script's lets and commands for one stack: per job, the argv of each
// command.
func (sc *hclScript) eval(root string, parent *hcl.EvalContext) ([][][]string, error) {
	ctx := &hcl.EvalContext{Variables: map[string]cty.Value{}, Functions: parent.Functions}
	for k, v := range parent.Variables {
		ctx.Variables[k] = v
	}
	lets := map[string]hcl.Expression{}
	for _, a := range sc.lets {
		lets[a.Name] = a.Expr
	}
	if _, err := resolve(ctx, "let", lets); err != nil {
		return nil, err
	}
	var jobs [][][]string
	for _, j := range sc.jobs {
		expr, single := j.commands, false
		if j.command != nil {
			expr, single = j.command, true
		}
		v, diags := expr.Value(ctx)
		if diags.HasErrors() {
			// terramate: "Error: <file>:8,15-36: script config has an invalid schema: failed to
			// eval script: evaluating command: <file>:8,30-35: eval expression: <detail>"
			attr := "commands"
			if single {
				attr = "command"
			}
			d := diags.Errs()[0].(*hcl.Diagnostic)
			subject := expr.Range()
			if d.Subject != nil {
				subject = *d.Subject
			}
			return nil, &hclError{msg: fmt.Sprintf("%s%s: script config has an invalid schema: failed to eval script: evaluating %s: %s%s: eval expression: %s",
				root, expr.Range(), attr, root, subject, d.Detail)}
		}
		rng := expr.Range()
		var cmds [][]string
		if single {
			argv, err := toArgv(v, rng)
			if err != nil {
				return nil, err
			}
			cmds = [][]string{argv}
		} else {
			if !isList(v) || v.LengthInt() == 0 {
				return nil, newHCLError("failed to eval script", rng.String()+": commands must be a non-empty list of lists")
			}
			for it := v.ElementIterator(); it.Next(); {
				_, e := it.Element()
				argv, err := toArgv(e, rng)
				if err != nil {
					return nil, err
				}
				cmds = append(cmds, argv)
			}
		}
		jobs = append(jobs, cmds)
	}
	return jobs, nil
}

func isList(v cty.Value) bool {
	return v.IsKnown() && !v.IsNull() && (v.Type().IsTupleType() || v.Type().IsListType())
}

// toArgv converts one command: strings, optionally followed by an options object (dropped).
func toArgv(v cty.Value, rng hcl.Range) ([]string, error) {
	bad := func(why string) error {
		return newHCLError("failed to eval script", rng.String()+": "+why)
	}
	if !isList(v) || v.LengthInt() == 0 {
		return nil, bad("a command must be a non-empty list of strings")
	}
	var argv []string
	last := v.LengthInt() - 1
	i := 0
	for it := v.ElementIterator(); it.Next(); i++ {
		_, e := it.Element()
		switch {
		case !e.IsKnown() || e.IsNull():
			return nil, bad(fmt.Sprintf("command element %d is null or unknown", i))
		case e.Type() == cty.String:
			argv = append(argv, e.AsString())
		case i == last && e.Type().IsObjectType():
			// command options (sync_deployment, ...): nothing the fake acts on
		default:
			return nil, bad(fmt.Sprintf("command must be a list(string), but element %d has type %s", i, e.Type().FriendlyName()))
		}
	}
	if len(argv) == 0 {
		return nil, bad("command has no arguments")
	}
	return argv, nil
}

// runEnv evaluates terramate.config.run.env for stack s from its directory up to the root, the
// closest definition winning.
func (cfg *hclConfig) runEnv(ctx *hcl.EvalContext, s *Stack) (map[string]string, error) {
	env := map[string]string{}
	skip := map[string]bool{}
	chain := cfg.chain(s.Path)
	slices.Reverse(chain)
	for _, d := range chain {
		for _, a := range d.runEnv {
			if skip[a.Name] {
				continue
			}
			if tr, diags := hcl.AbsTraversalForExpr(a.Expr); !diags.HasErrors() && len(tr) == 1 && tr.RootName() == "unset" {
				skip[a.Name] = true
				continue
			}
			v, diags := a.Expr.Value(ctx)
			if diags.HasErrors() {
				return nil, diagErr("failed to load run environment", diags)
			}
			if v.IsNull() {
				skip[a.Name] = true
				continue
			}
			if v.Type() != cty.String || !v.IsKnown() {
				return nil, newHCLError("failed to load run environment", a.Range().String()+": attr has type "+v.Type().FriendlyName()+" but must be string")
			}
			if _, ok := env[a.Name]; !ok {
				env[a.Name] = v.AsString()
			}
		}
	}
	return env, nil
}

// scriptListHCL prints `script list` from the configuration, as terramate does from the
// working directory: its own and its parents' scripts (the topmost definition shown), then
// its children's (counted as more definitions when the name is already known).
func (c *cli) scriptListHCL(cfg *hclConfig) int {
	type entry struct {
		sc    *hclScript
		count int
	}
	entries := map[string]*entry{}
	for d := c.rel; ; d = path.Dir(d) {
		if d == "." {
			d = ""
		}
		if dc, ok := cfg.dirs[d]; ok {
			for _, sc := range dc.scripts {
				n := sc.accessorName()
				count := 1
				if old := entries[n]; old != nil {
					count = old.count + 1
				}
				entries[n] = &entry{sc, count}
			}
		}
		if d == "" {
			break
		}
	}
	for _, d := range cfg.sortedDirs() {
		if d == c.rel || (c.rel != "" && !strings.HasPrefix(d, c.rel+"/")) {
			continue
		}
		for _, sc := range cfg.dirs[d].scripts {
			n := sc.accessorName()
			if old := entries[n]; old != nil {
				old.count++
				continue
			}
			entries[n] = &entry{sc, 1}
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		e := entries[n]
		b.WriteString(n + "\n")
		if e.sc.desc != nil {
			b.WriteString("  Description: " + e.sc.descSrc + "\n")
		}
		fmt.Fprintf(&b, "  Defined at %s\n", "/"+e.sc.dir)
		if e.count > 1 {
			fmt.Fprintf(&b, "    (+%d more)\n", e.count-1)
		}
		b.WriteString("\n")
	}
	fmt.Fprint(c.stdout, b.String())
	return 0
}
