// Package web serves the control plane's pages: server-rendered HTML (html/template, go:embed)
// with Server-Sent Events for live updates and no JavaScript build step.
package web

import (
	"bytes"
	"cmp"
	"embed"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/throttle"
	"github.com/tfstackplan/tfstackplan/internal/textfit"
)

//go:embed templates/*.html
var templateFS embed.FS

// pages are the parsed templates, parsed on first use: every tfstackplan process (each `run
// tick` included) would otherwise pay for the parse at start-up.
var pages = sync.OnceValue(func() *template.Template {
	return parsePages()
})

func parsePages() *template.Template {
	return template.Must(template.New("").Funcs(template.FuncMap{
		"short": func(s string, n int) string {
			if len(s) <= n {
				return s
			}
			return textfit.Prefix(s, n) + "…" // never half a character
		},
		"when": func(t time.Time) string {
			if t.IsZero() {
				return ""
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		},
		"join":   func(s []string) string { return strings.Join(s, ", ") },
		"usedBy": usedBy,
		"bytes": func(n int64) string {
			switch {
			case n >= 1<<20:
				return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
			case n >= 1<<10:
				return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
			}
			return fmt.Sprintf("%d B", n)
		},
	}).ParseFS(templateFS, "templates/*.html"))
}

// UI serves the pages.
type UI struct {
	Service *service.Service
	// Auth verifies the token the sign-in form posts.
	Auth *auth.Authenticator
	// Done ends live streams (server shutdown).
	Done <-chan struct{}
	// Fail maps an error to the status and message a page answers with; only it decides which
	// error text a client may see (nil: 500 and a generic message).
	Fail func(error) (status int, message string)
	// MaxStreams caps live streams in all (0: DefaultMaxStreams), MaxStreamsPerPrincipal those of
	// one principal (0: DefaultMaxStreamsPerPrincipal).
	MaxStreams             int
	MaxStreamsPerPrincipal int

	// SessionTTL is how long a sign-in lasts (0: DefaultSessionTTL), SignInsPerMinute how many
	// sessions one principal may start a minute (0: DefaultSignInsPerMinute).
	SessionTTL       time.Duration
	SignInsPerMinute int
	// Throttle refuses the clients and principals whose authentication failed too often, and
	// counts the failures of the sign-in form and of session forms (nil: none).
	Throttle *throttle.Auth
	// Now is the sessions' clock (nil: time.Now).
	Now func() time.Time

	streams streamCaps
	feeds   feeds
}

// Register adds the pages to mux; guard authenticates each page (not the login form).
func (u *UI) Register(mux *http.ServeMux, guard func(http.Handler) http.Handler) {
	pages() // parse the templates when the server starts, not on the first page
	if u.Fail == nil {
		u.Fail = func(error) (int, string) { return http.StatusInternalServerError, "internal error" }
	}
	u.streams = streamCaps{max: cmp.Or(u.MaxStreams, DefaultMaxStreams),
		maxPer: cmp.Or(u.MaxStreamsPerPrincipal, DefaultMaxStreamsPerPrincipal), per: map[string]int{}}
	u.feeds = feeds{m: map[string]*feed{}}
	u.SessionTTL = cmp.Or(u.SessionTTL, DefaultSessionTTL)
	u.SignInsPerMinute = cmp.Or(u.SignInsPerMinute, DefaultSignInsPerMinute)
	g := func(f http.HandlerFunc) http.Handler { return guard(f) }
	mux.Handle("GET /{$}", g(u.list))
	mux.Handle("GET /ui/executions/{id}", g(u.execution))
	mux.Handle("GET /ui/claims", g(u.claims))
	mux.Handle("GET /ui/gates", g(u.gates))
	mux.Handle("GET /ui/audit", g(u.audit))
	mux.Handle("GET /ui/drift", g(u.drift))
	mux.Handle("GET /ui/notifications", g(u.notifications))
	mux.Handle("GET /ui/stream/executions", g(u.streamList))
	mux.Handle("GET /ui/stream/executions/{id}", g(u.streamExecution))
	mux.HandleFunc("POST /ui/login", u.login)
	mux.HandleFunc("POST /ui/logout", u.logout)
	mux.HandleFunc("POST /ui/executions/{id}/approve", u.approve)
	mux.HandleFunc("POST /ui/executions/{id}/revoke", u.revoke)
	mux.HandleFunc("POST /ui/notifications/{id}/redeliver", u.redeliver)
}

// render renders a page; one a session reads shows its sign-out form.
func render(w http.ResponseWriter, r *http.Request, name string, p page) {
	if s := SessionFrom(r.Context()); s != nil {
		p.SignOut = s.CSRF
	}
	renderStatus(w, http.StatusOK, name, p)
}

func renderStatus(w http.ResponseWriter, status int, name string, data any) {
	var buf bytes.Buffer
	if err := execute(&buf, name, data); err != nil {
		http.Error(w, "rendering failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

// execute renders template name of data into buf with each bidirectional formatting character
// (U+202A..U+202E, U+2066..U+2069, U+200E, U+200F, U+061C) replaced by U+FFFD: what runners
// report (a sha, an actor, an error, a stack's change reasons) is shown as it came, and html/template
// escapes markup but not these, which would reorder what the page shows around them.
func execute(buf *bytes.Buffer, name string, data any) error {
	if err := pages().ExecuteTemplate(buf, name, data); err != nil {
		return err
	}
	if bytes.ContainsFunc(buf.Bytes(), isBidi) {
		b := bytes.Map(func(r rune) rune {
			if isBidi(r) {
				return utf8.RuneError
			}
			return r
		}, buf.Bytes())
		buf.Reset()
		buf.Write(b)
	}
	return nil
}

func isBidi(r rune) bool { return unicode.Is(unicode.Bidi_Control, r) }

// caller is who asks for the page r.
func (u *UI) caller(r *http.Request) service.Caller {
	p, _ := auth.From(r.Context())
	return CallerOf(p)
}

// CallerOf is what the service's rules need of an authenticated principal: who it is, whether it
// is an admin, and where it may act. The API and the pages both ask it.
func CallerOf(p auth.Principal) service.Caller {
	c := service.Caller{Name: p.Name, Admin: p.Has(auth.RoleAdmin), Repositories: p.Repositories}
	if g := p.GitHub; g != nil {
		repo, _ := events.CanonicalRepo(g.Repository) // verified: the principal's name holds it
		c.GitHub = &service.GitHubJob{Repository: repo, Ref: g.Ref, EventName: g.EventName, JobWorkflowRef: g.JobWorkflowRef,
			Environment: g.Environment, RunID: g.RunID, RunAttempt: g.RunAttempt, SHA: g.SHA, Actor: g.Actor, Claims: p.Describe()}
	}
	return c
}

// fail answers a page's error as Fail says.
func (u *UI) fail(w http.ResponseWriter, err error) {
	status, msg := u.Fail(err)
	http.Error(w, msg, status)
}

type page struct {
	Title      string
	Executions []api.Execution
	Execution  *api.Execution
	// Graph is the execution's stack graph (SVG); Tally how many stacks have each status;
	// Running whether the execution still runs (its page updates live).
	Graph   template.HTML
	Tally   []statusCount
	Running bool
	// Rows are the stacks the page lists; Paged reports that it lists them a page at a time
	// (StacksFrom to StacksTo, counted from 1, with links to the pages before and after).
	Rows                   []stackRow
	Paged                  bool
	StacksFrom, StacksTo   int
	StacksPrev, StacksNext template.URL
	// Approvals are the gates the execution's plan requires (nil: not a plan), GateViews how
	// its page shows them; Forms the anti-forgery token of the admin's Approve and Revoke forms
	// ("": no forms); Notice why a form just sent was refused.
	Approvals *service.PlanGates
	GateViews []gateView
	Forms     string
	Notice    string
	// Applies are the applies that used the listed gates' and grants' plans (gates page).
	Applies map[string][]service.Apply
	Claims  []api.Claim
	Gates   []api.Gate
	Grants  []api.Grant
	Checks  []api.Check
	Audit   []api.AuditEntry
	// Drift is the drift page's view.
	Drift *driftView
	Next  string
	// Older links the executions list's or the audit log's next (older) page, and OlderGates,
	// OlderGrants and OlderChecks that of each list of the gates page, when there may be one:
	// URLs so that a link keeps its separators instead of having them escaped.
	Older, OlderGates, OlderGrants, OlderChecks template.URL
	// Error is why the sign-in page is shown again.
	Error string
	// CSRF is the sign-in form's token (the value of its cookie).
	CSRF string
	// SignOut is the anti-forgery token of the sign-out form, shown when a session reads the
	// page.
	SignOut string
}

// listFilter is the executions list's filter and page (before and before_id: the started_at
// and id of the previous page's last execution, as its Older link gives them), and the query
// parameters of its filter.
func listFilter(r *http.Request) (store.ExecutionFilter, url.Values, error) {
	q := r.URL.Query()
	f := store.ExecutionFilter{Repo: q.Get("repo"), Environment: q.Get("environment"), Limit: 50}
	f.PR, _ = strconv.Atoi(q.Get("pr"))
	var before *time.Time
	if b, err := time.Parse(time.RFC3339Nano, q.Get("before")); err == nil {
		before = &b
	}
	var beforeID *string
	if q.Has("before_id") {
		id := q.Get("before_id")
		beforeID = &id
	}
	keep := url.Values{}
	if f.Repo != "" {
		keep.Set("repo", f.Repo)
	}
	if f.Environment != "" {
		keep.Set("environment", f.Environment)
	}
	if f.PR != 0 {
		keep.Set("pr", strconv.Itoa(f.PR))
	}
	f, err := service.ExecutionsAfter(f, before, beforeID)
	return f, keep, err
}

func (u *UI) list(w http.ResponseWriter, r *http.Request) {
	f, keep, err := listFilter(r)
	var xs []api.Execution
	if err == nil {
		xs, err = u.Service.Executions(r.Context(), u.caller(r), f)
	}
	if err != nil {
		u.fail(w, err)
		return
	}
	p := page{Title: "Executions", Executions: xs}
	if len(xs) == f.Limit {
		// The last execution's started_at to the nanosecond, as the store keeps it (listed in
		// UTC), and its id: the next page starts right after it.
		last := xs[len(xs)-1]
		keep.Set("before", last.StartedAt.Format(time.RFC3339Nano))
		keep.Set("before_id", last.ExecutionID)
		p.Older = template.URL("?" + keep.Encode()) // Encode escapes every value
	}
	render(w, r, "list", p)
}

// layers orders stacks into columns by dependency depth (edges: From before To): a stack's
// column is the length of the longest chain of edges leading to it. Stacks on a cycle, and
// those after one, have no such length; they share one column after all the others. Edges
// naming a stack the execution does not have are left out. Linear in stacks and edges (Kahn's
// topological order): it runs on every render of an execution's page.
func layers(x *api.Execution) [][]api.StackState {
	n := len(x.Stacks)
	index := make(map[string]int, n)
	for i, s := range x.Stacks {
		index[s.Stack] = i
	}
	next := make([][]int, n)
	before := make([]int, n) // edges into each stack not yet followed
	for _, e := range x.Edges {
		f, okF := index[e.From]
		t, okT := index[e.To]
		if okF && okT {
			next[f] = append(next[f], t)
			before[t]++
		}
	}
	depth := make([]int, n)
	var ready []int
	for i := range n {
		if before[i] == 0 {
			ready = append(ready, i)
		}
	}
	placed, deepest := 0, -1
	for len(ready) > 0 {
		u := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		placed++
		deepest = max(deepest, depth[u])
		for _, v := range next[u] {
			depth[v] = max(depth[v], depth[u]+1)
			if before[v]--; before[v] == 0 {
				ready = append(ready, v)
			}
		}
	}
	if placed < n {
		for i := range n {
			if before[i] > 0 {
				depth[i] = deepest + 1
			}
		}
	}
	var out [][]api.StackState
	for i, s := range x.Stacks {
		d := depth[i]
		for len(out) <= d {
			out = append(out, nil)
		}
		out[d] = append(out[d], s)
	}
	for _, l := range out {
		sort.Slice(l, func(i, j int) bool { return l[i].Stack < l[j].Stack })
	}
	return out
}

func (u *UI) execution(w http.ResponseWriter, r *http.Request) {
	u.executionPage(w, r, SessionFrom(r.Context()), http.StatusOK, "")
}

// stackPageSize is the most stacks an execution's page lists at once: a larger execution's
// stacks are listed a page at a time, outside the part of the page that updates live.
const stackPageSize = 200

// stackRow is a row of the stacks table: the stack and how long it ran.
type stackRow struct {
	api.StackState
	Took string
}

// statusOrder is the order in which the pages count stacks by status.
var statusOrder = []api.StackStatus{api.StackStatusSucceeded, api.StackStatusRunning, api.StackStatusPending,
	api.StackStatusFailed, api.StackStatusCancelled, api.StackStatusSkipped}

// statusCount is how many stacks of an execution have a status.
type statusCount struct {
	Status api.StackStatus
	N      int
}

// executionPage renders execution r's {id} as session s (nil: a bearer token) reads it, with
// notice saying why a form just sent was refused (status).
func (u *UI) executionPage(w http.ResponseWriter, r *http.Request, s *Session, status int, notice string) {
	caller := u.caller(r)
	if s != nil {
		caller = CallerOf(s.Principal)
	}
	id := r.PathValue("id")
	asked, _ := strconv.Atoi(r.URL.Query().Get("stacks"))
	var from, to int
	ep, err := u.Service.ExecutionPage(r.Context(), caller, id, true, func(all []api.StackState) []string {
		from = max(0, min(asked, len(all)))
		to = min(from+stackPageSize, len(all))
		return names(all[from:to])
	})
	if err != nil {
		u.fail(w, err)
		return
	}
	x := ep.Execution
	p := liveState(x, ep.Spans)
	p.Title, p.Approvals, p.GateViews, p.Forms, p.Notice = x.ExecutionID, ep.Gates, gateViews(ep.Gates), formsOf(s), notice
	p.Rows, p.StacksFrom, p.StacksTo = rows(x.Stacks[from:to], ep.Spans), from+1, to
	if p.Paged {
		if from > 0 {
			p.StacksPrev = template.URL("?stacks=" + strconv.Itoa(max(0, from-stackPageSize)))
		}
		if to < len(x.Stacks) {
			p.StacksNext = template.URL("?stacks=" + strconv.Itoa(to))
		}
	}
	if s != nil {
		p.SignOut = s.CSRF
	}
	renderStatus(w, status, "execution", p)
}

// liveState is the part of an execution's page its stream keeps up to date: the execution, its
// graph, how many stacks have each status and, unless they are listed a page at a time, its
// stacks with how long each ran (spans).
func liveState(x *api.Execution, spans map[string]store.Span) page {
	p := page{Execution: x, Graph: stackGraph(x, layers(x)), Paged: len(x.Stacks) > stackPageSize,
		Running: x.Status == api.ExecutionStatusRunning}
	n := map[api.StackStatus]int{}
	for _, st := range x.Stacks {
		n[st.Status]++
	}
	for _, st := range statusOrder {
		if n[st] > 0 {
			p.Tally = append(p.Tally, statusCount{st, n[st]})
		}
	}
	if !p.Paged {
		p.Rows = rows(x.Stacks, spans)
	}
	return p
}

// names are the names of stacks.
func names(stacks []api.StackState) []string {
	out := make([]string, len(stacks))
	for i, st := range stacks {
		out[i] = st.Stack
	}
	return out
}

// liveSpans chooses the stacks whose spans the live state shows: every stack, or none when
// they are listed a page at a time.
func liveSpans(all []api.StackState) []string {
	if len(all) > stackPageSize {
		return []string{}
	}
	return nil
}

// rows are the stacks table's rows of stacks.
func rows(stacks []api.StackState, spans map[string]store.Span) []stackRow {
	out := make([]stackRow, len(stacks))
	for i, st := range stacks {
		out[i] = stackRow{StackState: st, Took: took(st.Status, spans[st.Stack])}
	}
	return out
}

// took says how long a stack ran: from its first phase event to its last once it ended, when it
// started while it runs.
func took(status api.StackStatus, sp store.Span) string {
	switch {
	case sp.First.IsZero():
		return ""
	case status == api.StackStatusRunning || status == api.StackStatusPending:
		return "since " + sp.First.UTC().Format("15:04:05")
	}
	d := sp.Last.Sub(sp.First)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%d s", int(d.Round(time.Second).Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min %02d s", int(d/time.Minute), int(d%time.Minute/time.Second))
	}
	return fmt.Sprintf("%d h %02d min", int(d/time.Hour), int(d%time.Hour/time.Minute))
}

func (u *UI) claims(w http.ResponseWriter, r *http.Request) {
	cs, err := u.Service.Claims(r.Context(), u.caller(r), r.URL.Query().Get("repo"), r.URL.Query().Get("environment"))
	if err != nil {
		u.fail(w, err)
		return
	}
	render(w, r, "claims", page{Title: "Claims", Claims: cs})
}

// gatesPaging are the query parameters of the gates page that choose what it shows: the
// filter, and the page of each list (gates_before and checks_before: a row's cursor;
// grants_before: a grant's id; absent, the newest).
var gatesPaging = []string{"repo", "environment", "pr", "gates_before", "grants_before", "checks_before"}

// gates shows a page of each of the gates, grants and checks lists, with a link to the next
// (older) page of each that was full.
func (u *UI) gates(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	pg := service.Page{Repo: q.Get("repo"), Environment: q.Get("environment"), Limit: service.DefaultPageLimit}
	pg.PR, _ = strconv.Atoi(q.Get("pr"))
	grantsBefore, _ := strconv.ParseInt(q.Get("grants_before"), 10, 64)
	p := page{Title: "Gates and grants"}
	var err error
	c := u.caller(r)
	if p.Gates, err = u.Service.Gates(r.Context(), c, pg, q.Get("gates_before")); err == nil {
		if p.Grants, err = u.Service.Grants(r.Context(), c, pg, grantsBefore); err == nil {
			p.Checks, err = u.Service.Checks(r.Context(), c, pg, q.Get("checks_before"))
		}
	}
	if err == nil {
		p.Applies, err = u.appliesOf(r, c, p.Gates, p.Grants)
	}
	if err != nil {
		u.fail(w, err)
		return
	}
	// A list's Older link keeps the filter and the pages the other lists show.
	older := func(param, before string) template.URL {
		keep := url.Values{}
		for _, k := range gatesPaging {
			if v := q.Get(k); v != "" {
				keep.Set(k, v)
			}
		}
		keep.Set(param, before)
		return template.URL("?" + keep.Encode()) // Encode escapes every value
	}
	if n := len(p.Gates); n == pg.Limit {
		p.OlderGates = older("gates_before", p.Gates[n-1].Cursor)
	}
	if n := len(p.Grants); n == pg.Limit {
		p.OlderGrants = older("grants_before", strconv.FormatInt(p.Grants[n-1].ID, 10))
	}
	if n := len(p.Checks); n == pg.Limit {
		p.OlderChecks = older("checks_before", p.Checks[n-1].Cursor)
	}
	render(w, r, "gates", p)
}

// appliesOf returns the applies that used the plans of gates and grants, by plan: an apply's
// end releases the grants it used, so they are how the gates page knows a gate of an applied
// plan was satisfied, and which grants an apply used.
func (u *UI) appliesOf(r *http.Request, c service.Caller, gates []api.Gate, grants []api.Grant) (map[string][]service.Apply, error) {
	var plans []string
	for _, g := range gates {
		plans = append(plans, g.ExecutionID)
	}
	for _, g := range grants {
		plans = append(plans, g.ExecutionID)
	}
	applies, err := u.Service.AppliesOf(r.Context(), c, slices.DeleteFunc(plans, func(id string) bool { return id == "" }))
	out := map[string][]service.Apply{}
	for _, a := range applies {
		out[a.Plan] = append(out[a.Plan], a)
	}
	return out, err
}

// usedBy returns the applies of applies that used grant id.
func usedBy(applies []service.Apply, id int64) []service.Apply {
	var out []service.Apply
	for _, a := range applies {
		if slices.Contains(a.GrantIDs, id) {
			out = append(out, a)
		}
	}
	return out
}

func (u *UI) audit(w http.ResponseWriter, r *http.Request) {
	before, _ := strconv.ParseInt(r.URL.Query().Get("before"), 10, 64)
	entries, err := u.Service.Audit(r.Context(), u.caller(r), r.URL.Query().Get("repo"), 100, before)
	if err != nil {
		u.fail(w, err)
		return
	}
	p := page{Title: "Audit", Audit: entries}
	if len(entries) == 100 {
		// The Older link keeps the repository filter: without it, a caller of several
		// repositories would be refused the next page, and an unlimited one shown every
		// repository's.
		keep := url.Values{}
		if repo := r.URL.Query().Get("repo"); repo != "" {
			keep.Set("repo", repo)
		}
		keep.Set("before", strconv.FormatInt(entries[len(entries)-1].ID, 10))
		p.Older = template.URL("?" + keep.Encode()) // Encode escapes every value
	}
	render(w, r, "audit", p)
}
