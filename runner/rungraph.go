package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tfstackplan/tfstackplan/events"
)

// Sources of RunGraphResult.
const (
	EdgeSourceRunGraph = "run-graph" // `terramate experimental run-graph -l stack.dir`
	EdgeSourceMetadata = "metadata"  // derived from `terramate debug show metadata`
)

// RunGraphResult is the stack dependency graph RunGraphDetailed found.
type RunGraphResult struct {
	// Edges run From before To; endpoints are root-relative with a leading slash
	// ("/stacks/nonprod/cluster/a"), sorted, without duplicates. NormalizeEdges maps them onto
	// the paths List returns.
	Edges []events.Edge
	// Approximate is true when run-graph exceeded its budget and the edges were derived from
	// the stacks' before/after metadata instead.
	Approximate bool
	// Source is EdgeSourceRunGraph or EdgeSourceMetadata.
	Source string
}

// RunGraph returns the stack dependency edges (From must run before To) from `terramate
// experimental run-graph -l stack.dir`, or, past RunGraphBudget, derived from `terramate debug
// show metadata` (see RunGraphDetailed). A cycle is a *StackCycleError naming its stacks.
func (t *Terramate) RunGraph(ctx context.Context) ([]events.Edge, error) {
	r, err := t.RunGraphDetailed(ctx)
	return r.Edges, err
}

// RunGraphDetailed is RunGraph telling where the edges came from. Real run-graph is
// exponential on dense graphs, so it runs under RunGraphBudget; past it the edges are derived
// from the before/after/tags metadata in linear time and marked approximate.
func (t *Terramate) RunGraphDetailed(ctx context.Context) (RunGraphResult, error) {
	budget := t.RunGraphBudget
	if budget <= 0 {
		budget = DefaultRunGraphBudget
	}
	gctx, cancel := context.WithTimeout(withHardKill(ctx), budget)
	out, err := t.output(gctx, "experimental", "run-graph", "-l", "stack.dir")
	overBudget := errors.Is(gctx.Err(), context.DeadlineExceeded)
	cancel()
	switch {
	case err == nil:
		edges, err := runGraphEdges(out)
		return RunGraphResult{Edges: edges, Source: EdgeSourceRunGraph}, err
	case ctx.Err() != nil:
		return RunGraphResult{}, ctx.Err()
	case !overBudget:
		return RunGraphResult{}, err
	}
	md, err := t.output(ctx, "debug", "show", "metadata")
	if err != nil {
		return RunGraphResult{}, err
	}
	stacks, err := parseMetadata(md)
	if err != nil {
		return RunGraphResult{}, err
	}
	edges := metadataEdges(stacks)
	r := RunGraphResult{Edges: edges, Approximate: true, Source: EdgeSourceMetadata}
	if cyc := cycleStacks(edges); cyc != nil {
		return r, &StackCycleError{Stacks: cyc}
	}
	return r, nil
}

type hardKillKey struct{}

// withHardKill asks tmRealExec to kill at once on cancellation rather than interrupt first: an
// over-budget run-graph has nothing to clean up.
func withHardKill(ctx context.Context) context.Context {
	return context.WithValue(ctx, hardKillKey{}, true)
}

// runGraphEdges turns run-graph's DOT into sorted label edges; red (cycle) edges, or any cycle,
// are a *StackCycleError. It works on node indices and sorts by label rank, so a 1000-stack
// graph costs a few milliseconds.
func runGraphEdges(dot []byte) ([]events.Edge, error) {
	g, err := parseDOT(dot)
	if err != nil {
		return nil, err
	}
	// Intern node ids, then rank their labels.
	index := make(map[string]int, len(g.labels))
	var labels []string
	intern := func(id string) int {
		if i, ok := index[id]; ok {
			return i
		}
		index[id] = len(labels)
		labels = append(labels, g.label(id))
		return len(labels) - 1
	}
	type pair struct{ from, to int }
	pairs := make([]pair, len(g.edges))
	redNodes := map[int]bool{}
	for i, e := range g.edges {
		pairs[i] = pair{intern(e.from), intern(e.to)}
		if e.red {
			redNodes[pairs[i].from], redNodes[pairs[i].to] = true, true
		}
	}
	order := make([]int, len(labels))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(labels[a], labels[b]) })
	rank := make([]int, len(labels))
	for r, v := range order {
		rank[v] = r
	}
	// Nodes with equal labels share the rank of the first, so their edges compact together.
	for r := 1; r < len(order); r++ {
		if labels[order[r]] == labels[order[r-1]] {
			rank[order[r]] = rank[order[r-1]]
		}
	}
	for i, p := range pairs {
		pairs[i] = pair{rank[p.from], rank[p.to]}
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		if a.from != b.from {
			return a.from - b.from
		}
		return a.to - b.to
	})
	pairs = slices.Compact(pairs)
	edges := make([]events.Edge, len(pairs))
	from := make([]int, len(pairs))
	to := make([]int, len(pairs))
	for i, p := range pairs {
		edges[i] = events.Edge{From: labels[order[p.from]], To: labels[order[p.to]]}
		from[i], to[i] = p.from, p.to
	}
	var cyc []string
	for v := range redNodes {
		cyc = append(cyc, labels[v])
	}
	for _, r := range cycleNodes(len(labels), from, to) {
		cyc = append(cyc, labels[order[r]])
	}
	if len(cyc) > 0 {
		slices.Sort(cyc)
		return edges, &StackCycleError{Stacks: slices.Compact(cyc)}
	}
	return edges, nil
}

// dotGraph is the part of a DOT digraph run-graph output needs: node labels and edges.
type dotGraph struct {
	labels map[string]string
	edges  []dotEdge
}

type dotEdge struct {
	from, to string
	red      bool
}

func (g *dotGraph) label(id string) string {
	if l, ok := g.labels[id]; ok {
		return l
	}
	return id
}

// parseDOT parses a DOT digraph: node statements with attribute lists, edge chains (a -> b ->
// c), quoted and HTML strings, comments, graph/node/edge attribute statements and subgraphs.
func parseDOT(src []byte) (*dotGraph, error) {
	toks, err := dotTokens(string(src))
	if err != nil {
		return nil, err
	}
	p := &dotParser{toks: toks, g: &dotGraph{labels: make(map[string]string, len(src)/64)}}
	if err := p.graph(); err != nil {
		return nil, fmt.Errorf("run-graph output is not a DOT digraph: %w", err)
	}
	return p.g, nil
}

type dotTok struct {
	kind byte // 'i' identifier or string, or the punctuation itself; '>' is "->", '-' is "--"
	text string
}

func dotTokens(s string) ([]dotTok, error) {
	toks := make([]dotTok, 0, len(s)/3+8)
	lineStart := true
	// "a" + "b" + ... grows one builder: adding to the token's string each time would copy
	// what it holds so far, its length squared in all.
	var cat strings.Builder
	catTok := -1
	concat := func(part string) {
		k := len(toks) - 2
		if catTok != k {
			cat = strings.Builder{}
			cat.WriteString(toks[k].text)
			catTok = k
		}
		cat.WriteString(part)
		toks[k].text = cat.String()
		toks = toks[:k+1]
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '\n':
			lineStart = true
			i++
			continue
		case c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v':
			i++
			continue
		case c == '#' && lineStart:
			for i < len(s) && s[i] != '\n' {
				i++
			}
			continue
		case strings.HasPrefix(s[i:], "//"):
			for i < len(s) && s[i] != '\n' {
				i++
			}
			continue
		case strings.HasPrefix(s[i:], "/*"):
			end := strings.Index(s[i+2:], "*/")
			if end < 0 {
				return nil, errors.New("unterminated /* comment")
			}
			i += 2 + end + 2
			continue
		}
		lineStart = false
		switch {
		case strings.HasPrefix(s[i:], "->"):
			toks = append(toks, dotTok{'>', "->"})
			i += 2
		case strings.HasPrefix(s[i:], "--"):
			toks = append(toks, dotTok{'-', "--"})
			i += 2
		case strings.IndexByte("{}[]=;,:", c) >= 0:
			toks = append(toks, dotTok{c, string(c)})
			i++
		case c == '"':
			if end := strings.IndexByte(s[i+1:], '"'); end >= 0 && strings.IndexByte(s[i+1:i+1+end], '\\') < 0 {
				// No escapes: the token is a substring, no copy.
				if n := len(toks); n > 0 && toks[n-1].kind == '+' {
					concat(s[i+1 : i+1+end])
				} else {
					toks = append(toks, dotTok{'i', s[i+1 : i+1+end]})
				}
				i += end + 2
				continue
			}
			var b strings.Builder
			j := i + 1
			for ; j < len(s) && s[j] != '"'; j++ {
				if s[j] == '\\' && j+1 < len(s) {
					switch s[j+1] {
					case '"', '\\':
						b.WriteByte(s[j+1])
						j++
						continue
					case '\n':
						j++
						continue
					}
				}
				b.WriteByte(s[j])
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated quoted string at byte %d", i)
			}
			i = j + 1
			// "a" + "b" concatenation.
			if n := len(toks); n > 0 && toks[n-1].kind == '+' {
				concat(b.String())
				continue
			}
			toks = append(toks, dotTok{'i', b.String()})
		case c == '+':
			if n := len(toks); n == 0 || toks[n-1].kind != 'i' {
				return nil, fmt.Errorf("unexpected '+' at byte %d", i)
			}
			toks = append(toks, dotTok{'+', "+"})
			i++
		case c == '<':
			depth, j := 0, i
			for ; j < len(s); j++ {
				if s[j] == '<' {
					depth++
				} else if s[j] == '>' {
					depth--
					if depth == 0 {
						break
					}
				}
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated HTML string at byte %d", i)
			}
			toks = append(toks, dotTok{'i', s[i+1 : j]})
			i = j + 1
		case isDOTIDByte(c):
			j := i
			for j < len(s) && isDOTIDByte(s[j]) {
				if s[j] == '-' && j+1 < len(s) && (s[j+1] == '>' || s[j+1] == '-') {
					break
				}
				j++
			}
			if j == i {
				return nil, fmt.Errorf("unexpected %q at byte %d", c, i)
			}
			toks = append(toks, dotTok{'i', s[i:j]})
			i = j
		default:
			return nil, fmt.Errorf("unexpected %q at byte %d", c, i)
		}
	}
	if n := len(toks); n > 0 && toks[n-1].kind == '+' {
		return nil, errors.New("dangling '+' at end of input")
	}
	return toks, nil
}

func isDOTIDByte(c byte) bool {
	return c == '_' || c == '.' || c == '-' || c >= 0x80 ||
		('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9')
}

type dotParser struct {
	toks  []dotTok
	pos   int
	depth int
	g     *dotGraph
}

// maxDOTDepth bounds subgraph nesting.
const maxDOTDepth = 100

// maxDOTEdges bounds the edges of a graph: an edge between two subgraphs stands for every
// pair of their nodes, so a few kilobytes could otherwise stand for billions.
const maxDOTEdges = 1 << 20

func (p *dotParser) peek() dotTok {
	if p.pos < len(p.toks) {
		return p.toks[p.pos]
	}
	return dotTok{}
}

func (p *dotParser) next() dotTok {
	t := p.peek()
	if p.pos < len(p.toks) {
		p.pos++
	}
	return t
}

func (p *dotParser) expect(kind byte) error {
	if t := p.next(); t.kind != kind {
		if t.kind == 0 {
			return fmt.Errorf("expected %q, got end of input", kind)
		}
		return fmt.Errorf("expected %q, got %q", kind, t.text)
	}
	return nil
}

func (p *dotParser) graph() error {
	t := p.next()
	if t.kind == 'i' && strings.EqualFold(t.text, "strict") {
		t = p.next()
	}
	if t.kind != 'i' || !strings.EqualFold(t.text, "digraph") {
		return fmt.Errorf("expected \"digraph\", got %q", t.text)
	}
	if p.peek().kind == 'i' {
		p.next()
	}
	if err := p.expect('{'); err != nil {
		return err
	}
	_, err := p.stmts()
	return err
}

// stmts parses statements up to and including the closing brace and returns the node ids
// they mention (for subgraphs used as edge operands).
func (p *dotParser) stmts() ([]string, error) {
	var ids []string
	for {
		t := p.peek()
		switch t.kind {
		case 0:
			return nil, errors.New("missing closing '}'")
		case '}':
			p.next()
			return ids, nil
		case ';', ',':
			p.next()
			continue
		}
		got, err := p.stmt()
		if err != nil {
			return nil, err
		}
		ids = append(ids, got...)
	}
}

func (p *dotParser) stmt() ([]string, error) {
	t := p.peek()
	if t.kind == 'i' {
		switch strings.ToLower(t.text) {
		case "graph", "node", "edge":
			if p.pos+1 < len(p.toks) && p.toks[p.pos+1].kind == '[' {
				p.next()
				_, err := p.attrs()
				return nil, err
			}
		}
		if p.pos+1 < len(p.toks) && p.toks[p.pos+1].kind == '=' {
			p.pos += 2
			if v := p.next(); v.kind != 'i' {
				return nil, fmt.Errorf("expected a value after %q=", t.text)
			}
			return nil, nil
		}
	}
	var buf [2]dotOperand
	chain := buf[:0]
	first, err := p.operand()
	if err != nil {
		return nil, err
	}
	chain = append(chain, first)
	for k := p.peek().kind; k == '>' || k == '-'; k = p.peek().kind {
		p.next()
		op, err := p.operand()
		if err != nil {
			return nil, err
		}
		chain = append(chain, op)
	}
	var attrs dotAttrs
	if p.peek().kind == '[' {
		if attrs, err = p.attrs(); err != nil {
			return nil, err
		}
	}
	var all []string
	if p.depth > 0 { // only subgraph operands need the ids their statements mention
		for _, op := range chain {
			all = append(all, op.ids()...)
		}
	}
	if len(chain) == 1 {
		if attrs.hasLabel && !first.isSub {
			p.g.labels[first.id] = attrs.label
		}
		return all, nil
	}
	red := false
	for c := range strings.SplitSeq(attrs.color, ":") {
		if strings.EqualFold(strings.TrimSpace(c), "red") {
			red = true
		}
	}
	for i := 1; i < len(chain); i++ {
		if !chain[i-1].isSub && !chain[i].isSub {
			if len(p.g.edges) >= maxDOTEdges {
				return nil, fmt.Errorf("more than %d edges", maxDOTEdges)
			}
			p.g.edges = append(p.g.edges, dotEdge{from: chain[i-1].id, to: chain[i].id, red: red})
			continue
		}
		froms, tos := chain[i-1].ids(), chain[i].ids()
		if len(froms)*len(tos) > maxDOTEdges-len(p.g.edges) {
			return nil, fmt.Errorf("more than %d edges", maxDOTEdges)
		}
		for _, from := range froms {
			for _, to := range tos {
				p.g.edges = append(p.g.edges, dotEdge{from: from, to: to, red: red})
			}
		}
	}
	return all, nil
}

// dotOperand is one side of an edge: a node id or the nodes of a subgraph.
type dotOperand struct {
	id    string
	sub   []string
	isSub bool
}

func (o dotOperand) ids() []string {
	if o.isSub {
		return o.sub
	}
	return []string{o.id}
}

// operand parses a node id (with an optional :port:compass) or a subgraph.
func (p *dotParser) operand() (dotOperand, error) {
	t := p.peek()
	if t.kind == '{' || (t.kind == 'i' && strings.EqualFold(t.text, "subgraph")) {
		if t.kind == 'i' {
			p.next()
			if p.peek().kind == 'i' {
				p.next()
			}
		}
		if err := p.expect('{'); err != nil {
			return dotOperand{}, err
		}
		if p.depth++; p.depth > maxDOTDepth {
			return dotOperand{}, errors.New("subgraphs nested too deeply")
		}
		defer func() { p.depth-- }()
		ids, err := p.stmts()
		return dotOperand{sub: ids, isSub: true}, err
	}
	if t.kind != 'i' {
		if t.kind == 0 {
			return dotOperand{}, errors.New("unexpected end of input")
		}
		return dotOperand{}, fmt.Errorf("unexpected %q", t.text)
	}
	p.next()
	for range 2 {
		if p.peek().kind != ':' {
			break
		}
		p.next()
		if p.next().kind != 'i' {
			return dotOperand{}, fmt.Errorf("expected a port after %q:", t.text)
		}
	}
	return dotOperand{id: t.text}, nil
}

// dotAttrs are the attributes run-graph output uses.
type dotAttrs struct {
	label, color string
	hasLabel     bool
}

// attrs parses one or more [k=v, ...] lists.
func (p *dotParser) attrs() (dotAttrs, error) {
	var out dotAttrs
	for p.peek().kind == '[' {
		p.next()
		for {
			t := p.next()
			switch t.kind {
			case ']':
			case ';', ',':
				continue
			case 'i':
				if p.peek().kind == '=' {
					p.next()
					v := p.next()
					if v.kind != 'i' {
						return dotAttrs{}, fmt.Errorf("expected a value for attribute %q", t.text)
					}
					switch t.text {
					case "label":
						out.label, out.hasLabel = v.text, true
					case "color":
						out.color = v.text
					}
				}
				continue
			case 0:
				return dotAttrs{}, errors.New("missing ']'")
			default:
				return dotAttrs{}, fmt.Errorf("unexpected %q in attribute list", t.text)
			}
			break
		}
	}
	return out, nil
}
