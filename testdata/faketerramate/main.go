// Command faketerramate is a stand-in for terramate 0.17.2 used by the tests of package runner
// (modelled on terramate's own e2etests/cmd/helper). Build it explicitly:
//
//	go build -o DIR/terramate ./testdata/faketerramate
//
// It is driven by a scenario file, .faketerramate.json, at the root of the project it runs in
// (found by walking up from the working directory, like terramate looks for the project root).
// The scenario declares the stacks (path, name, id, tags, before/after), the scripts, the run
// environment and which stacks changed and why; the fake derives everything else the way
// terramate 0.17.2 does and prints it byte for byte as the recorded transcripts in
// testdata/terramate/cases show: `version`, `list` (--changed, -B, --why, --run-order, --tags),
// the global --chdir, `experimental run-graph -l stack.dir|stack.name`, `debug show metadata`,
// `script list` and `script run` (--changed, --parallel N honouring the DAG, --continue-on-error, --no-recursive,
// stop at first failure, --dry-run, unknown script, untracked files, cycles).
//
// Scripts come from the scenario (argv lists) or, when the scenario declares none, from the
// project's own *.tm.hcl files ("HCL mode", see hcl.go): script blocks with their lets and
// commands, globals and terramate.config.run.env are parsed with hashicorp/hcl and evaluated
// per stack, so a real script library (scripts/terramate) runs through the fake unchanged.
//
// `script run` really executes each stack's commands in the stack directory with the scenario's
// run environment, so per-stack log files get written and anything the scripts call really runs.
// It refuses to run when git reports untracked files (other than the scenario file), like
// terramate; git-ignore what the scripts write.
//
// testdata/terramate/scenario.json is the scenario of the fixture project that
// testdata/terramate/make-project.sh lays out; package runner's tests (tmFixture, tmApplyCase)
// show how to build on it.
//
// Change detection is not terramate's: the fake does not read git, Terraform module sources,
// watch lists or .tmtriggers; `list --changed` (and `script run --changed`) report exactly the
// scenario's Changed (or ChangedByBase[-B]), and stack blocks, scripts aside, come from the
// scenario too, not from the *.tm.hcl files. A scenario must therefore follow the project it
// sits in: package runner's tmDeriveChanged derives the changed stacks of the fixture project
// from its git history (a stack's own committed files, trigger files) and keeps the module and
// watched-file reasons scenario.json states. TestTerramateContract (TFSTACKPLAN_TERRAMATE set)
// holds the result to a real terramate.
//
// Dense graphs: real `experimental run-graph` validates the DAG by enumerating paths, which is
// exponential on dense graphs (fixtures README: 200 stacks with 3 dependencies each take 16.6 s,
// 1000 never finish). The fake runs the same path enumeration and, once it has taken more than
// runGraphStepLimit steps, stops computing and sleeps (without burning CPU) as a run-graph that
// does not finish; the caller's time budget is expected to kill it.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ScenarioFile is the name of the scenario file at the project root.
const ScenarioFile = ".faketerramate.json"

const defaultRunGraphStepLimit = 2_000_000

// Scenario describes the project the fake pretends to see.
type Scenario struct {
	// Version is what `terramate version` prints (default 0.17.2).
	Version string `json:"version,omitempty"`
	// Stacks are the project's stacks; Path is root-relative without a leading slash.
	Stacks []Stack `json:"stacks"`
	// Scripts are the script blocks of the project. When there are none, `script list` and
	// `script run` read the project's *.tm.hcl files instead (HCL mode, see hcl.go).
	Scripts []Script `json:"scripts,omitempty"`
	// RunEnv is terramate.config.run.env: a value that names terramate.stack.path.relative,
	// terramate.stack.path.absolute, terramate.stack.name, terramate.stack.id or env.NAME is
	// evaluated per stack, anything else is a literal.
	RunEnv map[string]string `json:"runEnv,omitempty"`
	// Changed are the changed stacks against the default base, with the --why reason, as
	// given: the fake computes no change detection of its own.
	Changed []Change `json:"changed,omitempty"`
	// ChangedByBase overrides Changed for an explicit -B ref.
	ChangedByBase map[string][]Change `json:"changedByBase,omitempty"`
	// ParseError makes every project command fail as on an HCL syntax error.
	ParseError *ParseError `json:"parseError,omitempty"`
	// Untracked forces the untracked-files check to fail (it also fails when git reports
	// untracked files other than the scenario file).
	Untracked bool `json:"untracked,omitempty"`
	// RunGraphStepLimit bounds the run-graph path enumeration before it "hangs" (0: default).
	RunGraphStepLimit int `json:"runGraphStepLimit,omitempty"`
}

// Stack is one stack block.
type Stack struct {
	Path        string   `json:"path"`
	Name        string   `json:"name,omitempty"`
	ID          string   `json:"id,omitempty"`
	Description string   `json:"description,omitempty"`
	Tags        []string `json:"tags,omitempty"`
	After       []string `json:"after,omitempty"`
	Before      []string `json:"before,omitempty"`
}

// Script is one script block.
type Script struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Dir is the project directory the script is defined in ("/" by default); it applies to
	// the stacks under it.
	Dir string `json:"dir,omitempty"`
	// DefinedAt is the HCL range printed by script run, e.g. "/scripts.tm.hcl:1,1-9,2".
	DefinedAt string `json:"definedAt"`
	Jobs      []Job  `json:"jobs"`
}

// Job is one job of a script: commands run in order.
type Job struct {
	Commands [][]string `json:"commands"`
}

// Change is one changed stack and the reason `list --changed --why` prints.
type Change struct {
	Stack string `json:"stack"`
	Why   string `json:"why"`
}

// ParseError describes the HCL syntax error to report.
type ParseError struct {
	File    string `json:"file"`  // root-relative
	Range   string `json:"range"` // e.g. "2,10-3,1"
	Message string `json:"message"`
}

const notAProject = `Error: Terramate was unable to detect a project root.

Please ensure you run Terramate inside a Git repository or create a new one here by calling 'git init'.

Using Terramate together with Git is the recommended way. Git is required to be installed.

Alternatively you can create a Terramate config to make the current directory the project root.

Please see https://terramate.io/docs/cli/projects/configuration for details.

`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// cli is one invocation.
type cli struct {
	stdout, stderr io.Writer
	cwd            string
	root           string // absolute host path of the project root
	rel            string // cwd relative to root, "" at the root
	sc             *Scenario
	byPath         map[string]*Stack
	paths          []string // all stack paths, sorted
	noUntracked    bool
}

func run(args []string, stdout, stderr io.Writer) int {
	c := &cli{stdout: stdout, stderr: stderr}
	wd, err := os.Getwd()
	if err != nil {
		return c.fail(err.Error())
	}
	c.cwd = wd
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case "--chdir", "-C":
			if len(args) < 2 {
				return c.usage("--chdir needs a directory")
			}
			c.cwd = absJoin(c.cwd, args[1])
			args = args[2:]
		case "--disable-check-git-untracked":
			c.noUntracked = true
			args = args[1:]
		case "--disable-check-git-uncommitted":
			args = args[1:]
		default:
			if v, ok := strings.CutPrefix(args[0], "--chdir="); ok {
				c.cwd = absJoin(c.cwd, v)
				args = args[1:]
				continue
			}
			return c.usage("unknown flag " + args[0])
		}
	}
	if len(args) == 0 {
		return c.usage("no command")
	}
	if args[0] == "version" {
		c.sc = &Scenario{}
		if _, sc, ok := findProject(c.cwd); ok && sc != nil {
			c.sc = sc
		}
		v := c.sc.Version
		if v == "" {
			v = "0.17.2"
		}
		fmt.Fprintln(stdout, v)
		return 0
	}
	root, sc, ok := findProject(c.cwd)
	if !ok {
		fmt.Fprint(stderr, notAProject)
		return 1
	}
	if sc == nil {
		return c.fail("fake terramate: cannot read " + filepath.Join(root, ScenarioFile))
	}
	c.root, c.sc = root, sc
	if rc, done := c.load(); done {
		return rc
	}
	switch {
	case args[0] == "list":
		return c.list(args[1:])
	case len(args) >= 2 && args[0] == "experimental" && args[1] == "run-graph":
		return c.runGraph(args[2:])
	case len(args) >= 3 && args[0] == "debug" && args[1] == "show" && args[2] == "metadata":
		return c.metadata()
	case len(args) >= 2 && args[0] == "script" && args[1] == "list":
		return c.scriptList()
	case len(args) >= 2 && args[0] == "script" && args[1] == "run":
		return c.scriptRun(args[2:])
	}
	return c.usage("unsupported command: " + strings.Join(args, " "))
}

func absJoin(base, p string) string {
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join(base, p)
}

// findProject walks up from dir to the directory holding the scenario file. ok is false when
// there is none; sc is nil when the file cannot be read or parsed.
func findProject(dir string) (root string, sc *Scenario, ok bool) {
	for d := dir; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, ScenarioFile))
		if err == nil {
			var s Scenario
			if json.Unmarshal(b, &s) != nil {
				return d, nil, true
			}
			return d, &s, true
		}
		if filepath.Dir(d) == d {
			return "", nil, false
		}
	}
}

func (c *cli) fail(msg string, details ...string) int {
	fmt.Fprintf(c.stderr, "Error: %s\n", msg)
	for _, d := range details {
		fmt.Fprintf(c.stderr, "> %s\n", d)
	}
	return 1
}

func (c *cli) usage(msg string) int {
	fmt.Fprintf(c.stderr, "Error: fake terramate: %s\n", msg)
	return 2
}

// load validates the scenario and reports a configured parse error.
func (c *cli) load() (int, bool) {
	rel, err := filepath.Rel(c.root, c.cwd)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return c.fail(fmt.Sprintf("working directory %s is outside the project %s", c.cwd, c.root)), true
	}
	if rel == "." {
		rel = ""
	}
	c.rel = filepath.ToSlash(rel)
	if pe := c.sc.ParseError; pe != nil {
		file := path.Clean("/" + pe.File)
		var chain []string
		for d := path.Dir(file); d != "/"; d = path.Dir(d) {
			chain = append(chain, "loading from "+c.root+d)
		}
		slices.Reverse(chain)
		detail := fmt.Sprintf("%s%s:%s: HCL syntax error: %s: %s", c.root, file, pe.Range, strings.Join(chain, ": "), pe.Message)
		return c.fail("unable to parse configuration", detail), true
	}
	c.byPath = map[string]*Stack{}
	for i := range c.sc.Stacks {
		s := &c.sc.Stacks[i]
		p := path.Clean(strings.TrimPrefix(s.Path, "/"))
		if p == "." || p == ".." || strings.HasPrefix(p, "../") {
			return c.usage("bad stack path in scenario: " + s.Path), true
		}
		s.Path = p
		if _, dup := c.byPath[p]; dup {
			return c.usage("duplicate stack in scenario: " + p), true
		}
		c.byPath[p] = s
		c.paths = append(c.paths, p)
	}
	slices.Sort(c.paths)
	return 0, false
}

// underCwd reports whether the stack path p is inside the working directory.
func (c *cli) underCwd(p string) bool {
	return c.rel == "" || p == c.rel || strings.HasPrefix(p, c.rel+"/")
}

// display prints p relative to the working directory.
func (c *cli) display(p string) string {
	if c.rel == "" {
		return p
	}
	if p == c.rel {
		return "."
	}
	return strings.TrimPrefix(p, c.rel+"/")
}

func (c *cli) changes(base string) []Change {
	ch := c.sc.Changed
	if base != "" {
		if byBase, ok := c.sc.ChangedByBase[base]; ok {
			ch = byBase
		}
	}
	out := slices.Clone(ch)
	for i := range out {
		out[i].Stack = path.Clean(strings.TrimPrefix(out[i].Stack, "/"))
	}
	slices.SortFunc(out, func(a, b Change) int { return strings.Compare(a.Stack, b.Stack) })
	return out
}

// tagFilter reports whether tags satisfy a terramate tag filter: "a:b" is a AND b, "a,b" is
// a OR b.
func tagFilter(filter string, tags []string) bool {
	for alt := range strings.SplitSeq(filter, ",") {
		all := true
		for t := range strings.SplitSeq(alt, ":") {
			if !slices.Contains(tags, t) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

func (c *cli) list(args []string) int {
	var changed, why, runOrder bool
	var base, tags string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; a {
		case "--changed", "-c":
			changed = true
		case "--why":
			why = true
		case "--run-order":
			runOrder = true
		case "-B", "--git-change-base", "--tags":
			if i+1 >= len(args) {
				return c.usage(a + " needs a value")
			}
			i++
			if a == "--tags" {
				tags = args[i]
			} else {
				base = args[i]
			}
		default:
			return c.usage("unsupported list flag " + a)
		}
	}
	type entry struct{ path, why string }
	var entries []entry
	if changed {
		for _, ch := range c.changes(base) {
			entries = append(entries, entry{ch.Stack, ch.Why})
		}
	} else {
		for _, p := range c.paths {
			entries = append(entries, entry{path: p})
		}
	}
	var sel []entry
	for _, e := range entries {
		s := c.byPath[e.path]
		if !c.underCwd(e.path) || (tags != "" && (s == nil || !tagFilter(tags, s.Tags))) {
			continue
		}
		sel = append(sel, e)
	}
	if runOrder {
		g := c.graph(true)
		if reason, id, ok := g.cycle(); ok {
			return c.fail(fmt.Sprintf("cycle detected: Invalid stack configuration: %s: checking node id %q", reason, id))
		}
		level := g.levels()
		slices.SortStableFunc(sel, func(a, b entry) int {
			if d := level[a.path] - level[b.path]; d != 0 {
				return d
			}
			return strings.Compare(a.path, b.path)
		})
	}
	for _, e := range sel {
		if why && changed {
			fmt.Fprintf(c.stdout, "%s - %s\n", c.display(e.path), e.why)
		} else {
			fmt.Fprintln(c.stdout, c.display(e.path))
		}
	}
	return 0
}

// graph is the ordering DAG: deps[s] are the stacks s runs after.
type graph struct {
	nodes []string // sorted
	deps  map[string][]string
}

// targets resolves one before/after entry of stack s into stack paths: a tag filter selects
// the tagged stacks, a path (absolute or relative to s) selects the stack there, and either
// way every stack nested below a selected directory comes with it.
func (c *cli) targets(s *Stack, entry string) []string {
	var dirs []string
	if f, ok := strings.CutPrefix(entry, "tag:"); ok {
		for _, p := range c.paths {
			if tagFilter(f, c.byPath[p].Tags) {
				dirs = append(dirs, p)
			}
		}
	} else {
		abs := entry
		if !strings.HasPrefix(abs, "/") {
			abs = path.Join("/"+s.Path, abs)
		}
		dirs = append(dirs, strings.TrimPrefix(path.Clean(abs), "/"))
	}
	var out []string
	for _, p := range c.paths {
		if p == s.Path {
			continue
		}
		for _, d := range dirs {
			if d == "" || p == d || strings.HasPrefix(p, d+"/") {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// graph builds the DAG over all stacks. nested adds the implicit "parent stack before nested
// stack" ordering that run order honours but run-graph does not draw.
func (c *cli) graph(nested bool) *graph {
	g := &graph{nodes: c.paths, deps: map[string][]string{}}
	add := func(from, to string) { // from runs before to
		if !slices.Contains(g.deps[to], from) {
			g.deps[to] = append(g.deps[to], from)
		}
	}
	for _, p := range c.paths {
		s := c.byPath[p]
		for _, a := range s.After {
			for _, t := range c.targets(s, a) {
				add(t, p)
			}
		}
		for _, b := range s.Before {
			for _, t := range c.targets(s, b) {
				add(p, t)
			}
		}
		if nested {
			for d := path.Dir(p); d != "."; d = path.Dir(d) {
				if _, ok := c.byPath[d]; ok {
					add(d, p)
					break
				}
			}
		}
	}
	for _, n := range g.nodes {
		slices.Sort(g.deps[n])
	}
	return g
}

// sccs returns, for each node in a non-trivial strongly connected component, its component.
func (g *graph) sccs() map[string]int {
	index, low := map[string]int{}, map[string]int{}
	on := map[string]bool{}
	var stack []string
	comp := map[string]int{}
	next, ncomp := 0, 0
	var visit func(v string)
	visit = func(v string) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		on[v] = true
		for _, w := range g.deps[v] {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if on[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			var members []string
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				on[w] = false
				members = append(members, w)
				if w == v {
					break
				}
			}
			if len(members) > 1 {
				for _, m := range members {
					comp[m] = ncomp
				}
				ncomp++
			}
		}
	}
	for _, n := range g.nodes {
		if _, seen := index[n]; !seen {
			visit(n)
		}
	}
	return comp
}

// cycle reports terramate's cycle message (the first cyclic path found from the first node in
// sorted order, walking dependencies in sorted order) when the graph has a cycle.
func (g *graph) cycle() (reason, id string, ok bool) {
	comp := g.sccs()
	if len(comp) == 0 {
		return "", "", false
	}
	reaches := g.reachesCycle(comp)
	for _, n := range g.nodes {
		if !reaches[n] {
			continue
		}
		if r, found := g.hasCycle([]string{n}, g.deps[n], "/"+n+" ->", reaches, nil); found {
			return r, "/" + n, true
		}
	}
	return "", "", false
}

// reachesCycle marks the nodes from which a cyclic node is reachable.
func (g *graph) reachesCycle(comp map[string]int) map[string]bool {
	memo := map[string]bool{}
	done := map[string]bool{}
	var walk func(n string) bool
	walk = func(n string) bool {
		if done[n] {
			return memo[n]
		}
		done[n] = true
		_, r := comp[n]
		for _, d := range g.deps[n] {
			if walk(d) {
				r = true
			}
		}
		memo[n] = r
		return r
	}
	for _, n := range g.nodes {
		walk(n)
	}
	return memo
}

// hasCycle is terramate's path-enumerating cycle check: exponential on dense graphs. prune, when
// set, skips children that cannot reach a cycle; steps, when set, counts the work done and the
// enumeration gives up (found=false) past *steps reaching zero.
func (g *graph) hasCycle(branch, children []string, reason string, prune map[string]bool, steps *int) (string, bool) {
	for _, id := range branch {
		if slices.Contains(children, id) {
			return reason + " /" + id, true
		}
	}
	for _, child := range children {
		if prune != nil && !prune[child] {
			continue
		}
		if steps != nil {
			if *steps <= 0 {
				return "", false
			}
			*steps--
		}
		next := append(slices.Clip(branch), child)
		if r, found := g.hasCycle(next, g.deps[child], reason+" /"+child+" ->", prune, steps); found {
			return r, true
		}
	}
	return "", false
}

// levels is the longest dependency chain above each node (cycles must be excluded first).
func (g *graph) levels() map[string]int {
	level := map[string]int{}
	var walk func(n string) int
	walk = func(n string) int {
		if l, ok := level[n]; ok {
			return l
		}
		level[n] = 0
		l := 0
		for _, d := range g.deps[n] {
			l = max(l, walk(d)+1)
		}
		level[n] = l
		return l
	}
	for _, n := range g.nodes {
		walk(n)
	}
	return level
}

func (c *cli) runGraph(args []string) int {
	label := "stack.name"
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-l" || a == "--label":
			if i+1 >= len(args) {
				return c.usage(a + " needs a value")
			}
			i++
			label = args[i]
		case strings.HasPrefix(a, "--label="):
			label = strings.TrimPrefix(a, "--label=")
		default:
			return c.usage("unsupported run-graph flag " + a)
		}
	}
	if label != "stack.name" && label != "stack.dir" {
		return c.fail(`-label expects the values "stack.name" or "stack.dir"`)
	}
	g := c.graph(false)
	limit := c.sc.RunGraphStepLimit
	if limit <= 0 {
		limit = defaultRunGraphStepLimit
	}
	steps := limit
	for _, n := range g.nodes {
		g.hasCycle([]string{n}, g.deps[n], "/"+n+" ->", nil, &steps)
		if steps <= 0 {
			// The real enumeration would run for minutes or longer: behave like it.
			time.Sleep(10 * time.Minute)
			return c.fail("fake terramate: run-graph gave up")
		}
	}
	comp := g.sccs()

	var sel []string
	for _, n := range g.nodes {
		if c.underCwd(n) {
			sel = append(sel, n)
		}
	}
	num := map[string]int{}
	var visit func(n string)
	visit = func(n string) {
		if _, ok := num[n]; ok || !c.underCwd(n) {
			return
		}
		num[n] = len(num) + 1
		for _, d := range g.deps[n] {
			visit(d)
		}
	}
	for _, n := range sel {
		visit(n)
	}
	lbl := func(n string) string {
		if label == "stack.dir" {
			return "/" + n
		}
		return c.byPath[n].Name
	}
	var b strings.Builder
	b.WriteString("digraph  {\n\t\n")
	for _, n := range sel {
		fmt.Fprintf(&b, "\tn%d[label=%s];\n", num[n], dotQuote(lbl(n)))
	}
	dependents := map[string][]string{}
	for _, n := range sel {
		for _, d := range g.deps[n] {
			if c.underCwd(d) {
				dependents[d] = append(dependents[d], n)
			}
		}
	}
	for _, from := range sel {
		tos := dependents[from]
		slices.SortFunc(tos, func(a, b string) int { return num[a] - num[b] })
		for _, to := range tos {
			attr := ""
			if ca, ok := comp[from]; ok {
				if cb, ok := comp[to]; ok && ca == cb {
					attr = `[color="red"]`
				}
			}
			fmt.Fprintf(&b, "\tn%d->n%d%s;\n", num[from], num[to], attr)
		}
	}
	b.WriteString("\t\n}\n")
	io.WriteString(c.stdout, b.String())
	return 0
}

func dotQuote(s string) string {
	return `"` + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), `"`, `\"`) + `"`
}

func hclList(items []string) string {
	q := make([]string, len(items))
	for i, it := range items {
		q[i] = strconv.Quote(it)
	}
	return "[" + strings.Join(q, ",") + "]"
}

func (c *cli) metadata() int {
	var b strings.Builder
	b.WriteString("Available metadata:\n")
	for _, p := range c.paths {
		if !c.underCwd(p) {
			continue
		}
		s := c.byPath[p]
		toRoot := strings.TrimSuffix(strings.Repeat("../", strings.Count(p, "/")+1), "/")
		fmt.Fprintf(&b, "\nstack %q:\n", "/"+p)
		fmt.Fprintf(&b, "\tterramate.stack.id=%q\n", s.ID)
		fmt.Fprintf(&b, "\tterramate.stack.name=%q\n", s.Name)
		fmt.Fprintf(&b, "\tterramate.stack.description=%q\n", s.Description)
		fmt.Fprintf(&b, "\tterramate.stack.tags=%s\n", hclList(s.Tags))
		fmt.Fprintf(&b, "\tterramate.stack.before=%s\n", hclList(s.Before))
		fmt.Fprintf(&b, "\tterramate.stack.after=%s\n", hclList(s.After))
		b.WriteString("\tterramate.stack.wants=[]\n\tterramate.stack.wanted_by=[]\n")
		fmt.Fprintf(&b, "\tterramate.stack.path.absolute=%q\n", "/"+p)
		fmt.Fprintf(&b, "\tterramate.stack.path.basename=%q\n", path.Base(p))
		fmt.Fprintf(&b, "\tterramate.stack.path.relative=%q\n", p)
		fmt.Fprintf(&b, "\tterramate.stack.path.to_root=%q\n", toRoot)
	}
	io.WriteString(c.stdout, b.String())
	return 0
}

func (c *cli) scriptList() int {
	if len(c.sc.Scripts) == 0 {
		cfg, err := loadHCL(c.root)
		if err != nil {
			return c.hclFail(err)
		}
		return c.scriptListHCL(cfg)
	}
	scripts := slices.Clone(c.sc.Scripts)
	slices.SortStableFunc(scripts, func(a, b Script) int { return strings.Compare(a.Name, b.Name) })
	for _, s := range scripts {
		fmt.Fprintf(c.stdout, "%s\n  Description: %q\n  Defined at %s\n\n", s.Name, s.Description, scriptDir(s))
	}
	return 0
}

// hclFail reports a configuration error of HCL mode.
func (c *cli) hclFail(err error) int {
	var he *hclError
	if errors.As(err, &he) {
		return c.fail(he.msg, he.details...)
	}
	return c.fail("fake terramate: " + err.Error())
}

func scriptDir(s Script) string {
	if s.Dir == "" {
		return "/"
	}
	return path.Clean("/" + s.Dir)
}

// scriptRunOpts are the flags of `script run`.
type scriptRunOpts struct {
	changed, dryRun, continueOnError bool
	noRecursive                      bool // only the stack in the working directory
	base, tags                       string
	parallel                         int
	name                             string
}

func parseScriptRun(args []string) (scriptRunOpts, error) {
	o := scriptRunOpts{parallel: 1}
	var words []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch a {
		case "--changed", "-c":
			o.changed = true
		case "--dry-run":
			o.dryRun = true
		case "--continue-on-error":
			o.continueOnError = true
		case "--no-recursive":
			o.noRecursive = true
		case "-B", "--git-change-base", "--tags", "--parallel", "-j":
			if i+1 >= len(args) {
				return o, fmt.Errorf("%s needs a value", a)
			}
			i++
			switch a {
			case "--tags":
				o.tags = args[i]
			case "--parallel", "-j":
				n, err := strconv.Atoi(args[i])
				if err != nil || n < 1 {
					return o, fmt.Errorf("bad --parallel %q", args[i])
				}
				o.parallel = n
			default:
				o.base = args[i]
			}
		default:
			if strings.HasPrefix(a, "-") {
				return o, fmt.Errorf("unsupported script run flag %s", a)
			}
			words = append(words, a)
		}
	}
	if len(words) == 0 {
		return o, errors.New("script run needs a script name")
	}
	o.name = strings.Join(words, " ")
	return o, nil
}

// untracked lists the files git reports as untracked, apart from the scenario file.
func (c *cli) untracked() []string {
	if c.sc.Untracked {
		return []string{"(scenario)"}
	}
	if _, err := os.Stat(filepath.Join(c.root, ".git")); err != nil {
		return nil
	}
	cmd := exec.Command("git", "ls-files", "--others", "--exclude-standard")
	cmd.Dir = c.root
	out, err := cmd.Output()
	if err != nil {
		return nil
	}
	var files []string
	for f := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		if f != "" && f != ScenarioFile {
			files = append(files, f)
		}
	}
	return files
}

// scriptDef is one definition of the script being run: the directory whose stacks it covers
// and, per stack, its commands (per job, each command's argv).
type scriptDef struct {
	dir       string // root-relative, "" for the root
	definedAt string
	jobs      int
	commands  func(s *Stack) ([][][]string, error)
}

// stackPlan is what one stack runs: the index of its script definition and its commands.
type stackPlan struct {
	script int
	jobs   [][][]string
	env    []string // run.env, KEY=VALUE
}

// scriptDefs returns the definitions of the named script in terramate's order (depth first,
// children by name): from the scenario, or in HCL mode from the project's configuration.
func (c *cli) scriptDefs(name string) ([]scriptDef, func(*Stack) ([]string, error), error) {
	if len(c.sc.Scripts) > 0 {
		var defs []scriptDef
		for _, s := range c.sc.Scripts {
			if s.Name != name {
				continue
			}
			jobs := make([][][]string, len(s.Jobs))
			for i, j := range s.Jobs {
				jobs[i] = j.Commands
			}
			defs = append(defs, scriptDef{
				dir:       strings.TrimPrefix(scriptDir(s), "/"),
				definedAt: s.DefinedAt,
				jobs:      len(s.Jobs),
				commands:  func(*Stack) ([][][]string, error) { return jobs, nil },
			})
		}
		slices.SortStableFunc(defs, func(a, b scriptDef) int { return comparePaths(a.dir, b.dir) })
		return defs, func(s *Stack) ([]string, error) { return c.scenarioRunEnv(s, nil), nil }, nil
	}
	cfg, err := loadHCL(c.root)
	if err != nil {
		return nil, nil, err
	}
	version := c.sc.Version
	if version == "" {
		version = "0.17.2"
	}
	var defs []scriptDef
	for _, sc := range cfg.defs(strings.Fields(name)) {
		defs = append(defs, scriptDef{
			dir:       sc.dir,
			definedAt: sc.definedAt,
			jobs:      len(sc.jobs),
			commands: func(s *Stack) ([][][]string, error) {
				ctx, err := cfg.evalContext(c.root, version, s)
				if err != nil {
					return nil, err
				}
				return sc.eval(c.root, ctx)
			},
		})
	}
	env := func(s *Stack) ([]string, error) {
		ctx, err := cfg.evalContext(c.root, version, s)
		if err != nil {
			return nil, err
		}
		m, err := cfg.runEnv(ctx, s)
		if err != nil {
			return nil, err
		}
		return c.scenarioRunEnv(s, m), nil
	}
	return defs, env, nil
}

func (c *cli) scriptRun(args []string) int {
	o, err := parseScriptRun(args)
	if err != nil {
		return c.usage(err.Error())
	}
	if o.noRecursive && c.byPath[c.rel] == nil {
		return c.fail("--no-recursive provided but no stack found in the current directory")
	}
	var candidates []string
	if o.changed {
		for _, ch := range c.changes(o.base) {
			candidates = append(candidates, ch.Stack)
		}
	} else {
		candidates = c.paths
	}
	var sel []string
	for _, p := range candidates {
		s := c.byPath[p]
		if s == nil || !c.underCwd(p) || (o.tags != "" && !tagFilter(o.tags, s.Tags)) || (o.noRecursive && p != c.rel) {
			continue
		}
		sel = append(sel, p)
	}
	// Like terramate: the git safeguards (skipped on a dry run) come before the script lookup.
	if !o.dryRun && !c.noUntracked && len(c.untracked()) > 0 {
		return c.fail("repository has untracked files")
	}
	defs, runEnv, err := c.scriptDefs(o.name)
	if err != nil {
		return c.hclFail(err)
	}
	if len(defs) == 0 {
		return c.fail("script not found: " + o.name)
	}
	// Each stack takes the definition of the deepest directory above it.
	defOf := map[string]int{}
	for _, p := range sel {
		best := -1
		for i, d := range defs {
			if (d.dir == "" || p == d.dir || strings.HasPrefix(p, d.dir+"/")) &&
				(best < 0 || len(d.dir) > len(defs[best].dir)) {
				best = i
			}
		}
		if best >= 0 {
			defOf[p] = best
		}
	}
	sel = slices.DeleteFunc(sel, func(p string) bool { _, ok := defOf[p]; return !ok })

	if o.dryRun {
		fmt.Fprintln(c.stderr, "This is a dry run, commands will not be executed.")
	}
	plans := map[string]stackPlan{}
	for i, d := range defs {
		var stacks []string
		for _, p := range sel {
			if defOf[p] == i {
				stacks = append(stacks, p)
			}
		}
		if len(stacks) == 0 {
			continue // terramate prints only the definitions that run somewhere
		}
		fmt.Fprintf(c.stderr, "Script %d at %s having %d job(s)\n", i, d.definedAt, d.jobs)
		for _, p := range stacks {
			jobs, err := d.commands(c.byPath[p])
			if err != nil {
				return c.hclFail(err)
			}
			plans[p] = stackPlan{script: i, jobs: jobs}
		}
	}
	for _, p := range sel {
		env, err := runEnv(c.byPath[p])
		if err != nil {
			return c.hclFail(err)
		}
		pl := plans[p]
		pl.env = env
		plans[p] = pl
	}
	g := c.graph(true)
	if reason, id, ok := g.cycle(); ok {
		return c.fail("one or more commands failed", fmt.Sprintf("cycle detected: cycle detected: %s: checking node id %q", reason, id))
	}
	level := g.levels()
	slices.SortStableFunc(sel, func(a, b string) int {
		if d := level[a] - level[b]; d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	x := &executor{cli: c, opts: o, plans: plans, running: map[*exec.Cmd]struct{}{}}
	errs := x.run(sel, g.selectedDeps(sel))
	if len(errs) > 0 {
		return c.fail("one or more commands failed", errs...)
	}
	return 0
}

// selectedDeps restricts the DAG to the selected stacks, keeping orderings that pass through
// unselected ones.
func (g *graph) selectedDeps(sel []string) map[string][]string {
	in := map[string]bool{}
	for _, s := range sel {
		in[s] = true
	}
	out := map[string][]string{}
	for _, s := range sel {
		seen := map[string]bool{}
		var walk func(n string)
		walk = func(n string) {
			for _, d := range g.deps[n] {
				if seen[d] {
					continue
				}
				seen[d] = true
				if in[d] {
					out[s] = append(out[s], d)
				}
				walk(d)
			}
		}
		walk(s)
	}
	return out
}

// executor runs the selected stacks' script commands.
type executor struct {
	*cli
	opts  scriptRunOpts
	plans map[string]stackPlan

	mu       sync.Mutex // guards stderr lines, errs, stopping, running
	errs     []string
	stopping bool
	running  map[*exec.Cmd]struct{}
}

func (x *executor) run(sel []string, deps map[string][]string) []string {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		for sig := range sigs {
			x.mu.Lock()
			x.stopping = true
			for cmd := range x.running {
				_ = cmd.Process.Signal(sig)
			}
			x.mu.Unlock()
		}
	}()

	done := map[string]bool{}
	started := map[string]bool{}
	finished := make(chan string)
	active := 0
	for {
		x.mu.Lock()
		stop := x.stopping
		x.mu.Unlock()
		if !stop {
			for _, s := range sel {
				if active >= x.opts.parallel {
					break
				}
				if started[s] || !allDone(deps[s], done) {
					continue
				}
				started[s] = true
				active++
				go func() {
					x.stack(s)
					finished <- s
				}()
			}
		}
		if active == 0 {
			break
		}
		done[<-finished] = true
		active--
	}
	return x.errs
}

func allDone(deps []string, done map[string]bool) bool {
	for _, d := range deps {
		if !done[d] {
			return false
		}
	}
	return true
}

// stack runs one stack's jobs; a failing command ends the stack and, without
// --continue-on-error, the whole run.
func (x *executor) stack(p string) {
	pl := x.plans[p]
	env := append(os.Environ(), pl.env...)
	for j, job := range pl.jobs {
		for k, argv := range job {
			x.mu.Lock()
			if x.stopping {
				x.mu.Unlock()
				return
			}
			fmt.Fprintf(x.stderr, "/%s (script:%d job:%d.%d)> %s\n", p, pl.script, j, k, strings.Join(argv, " "))
			x.mu.Unlock()
			if len(argv) == 0 {
				continue
			}
			bin, err := lookPath(argv[0], env)
			if err != nil {
				// terramate: "executable file not found in $PATH: running `tfstackplan run
				// tick --phase init` in stack /stacks/a: tfstackplan", also on a dry run.
				msg, detail, _ := strings.Cut(err.Error(), ": ")
				if detail == "" {
					detail = argv[0]
				}
				err = fmt.Errorf("%s: running `%s` in stack /%s: %s", msg, strings.Join(argv, " "), p, detail)
			} else if !x.opts.dryRun {
				err = x.exec(p, bin, argv, env)
			}
			if err != nil {
				x.mu.Lock()
				x.errs = append(x.errs, err.Error())
				if !x.opts.continueOnError {
					x.stopping = true
				}
				x.mu.Unlock()
				return
			}
		}
	}
}

// lookPath resolves a command's executable as terramate does before running (and on a dry
// run): a name with a slash as given (relative to terramate's working directory), any other
// name on the PATH of the stack's environment, which run.env may change.
func lookPath(file string, env []string) (string, error) {
	check := func(p string) error {
		fi, err := os.Stat(p)
		switch {
		case err != nil:
			return err
		case fi.IsDir():
			return syscall.EISDIR
		case fi.Mode().Perm()&0o111 == 0:
			return syscall.EACCES
		}
		return nil
	}
	executable := func(p string) bool { return check(p) == nil }
	if strings.Contains(file, "/") {
		err := check(file)
		if err == nil {
			return file, nil
		}
		// terramate: "...: running `./x` in stack /s: ./x: stat ./x: no such file or directory"
		return "", fmt.Errorf("executable file not found in $PATH: %s: %w", file, err)
	}
	var pathVar string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathVar = v // the last one wins, as in exec
		}
	}
	for _, dir := range filepath.SplitList(pathVar) {
		if dir == "" {
			dir = "."
		}
		if p := filepath.Join(dir, file); executable(p) {
			return p, nil
		}
	}
	return "", errors.New("executable file not found in $PATH")
}

func (x *executor) exec(p, bin string, argv, env []string) error {
	cmd := exec.Command(bin, argv[1:]...)
	cmd.Dir = filepath.Join(x.root, filepath.FromSlash(p))
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = x.stdout, x.stderr
	x.mu.Lock()
	if err := cmd.Start(); err != nil {
		x.mu.Unlock()
		return fmt.Errorf("execution failed: running %s %s (in /%s): %w", bin, strings.Join(argv[1:], " "), p, err)
	}
	x.running[cmd] = struct{}{}
	x.mu.Unlock()
	err := cmd.Wait()
	x.mu.Lock()
	delete(x.running, cmd)
	x.mu.Unlock()
	if err != nil {
		return fmt.Errorf("execution failed: running %s %s (in /%s): %w", bin, strings.Join(argv[1:], " "), p, err)
	}
	return nil
}

// scenarioRunEnv returns the run environment of stack s: the HCL run.env values in hcl (HCL
// mode) plus the scenario's runEnv for the names hcl does not set. A scenario value that names
// terramate.stack.path.relative, terramate.stack.path.absolute, terramate.stack.name,
// terramate.stack.id or env.NAME is evaluated, anything else is a literal.
func (c *cli) scenarioRunEnv(s *Stack, hcl map[string]string) []string {
	vals := map[string]string{}
	for k, v := range c.sc.RunEnv {
		switch {
		case v == "terramate.stack.path.relative":
			v = s.Path
		case v == "terramate.stack.path.absolute":
			v = "/" + s.Path
		case v == "terramate.stack.name":
			v = s.Name
		case v == "terramate.stack.id":
			v = s.ID
		case strings.HasPrefix(v, "env."):
			v = os.Getenv(strings.TrimPrefix(v, "env."))
		}
		vals[k] = v
	}
	maps.Copy(vals, hcl)
	keys := slices.Sorted(maps.Keys(vals))
	env := make([]string, 0, len(keys))
	for _, k := range keys {
		env = append(env, k+"="+vals[k])
	}
	return env
}
