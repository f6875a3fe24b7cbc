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
		"join": func(s []string) string { return strings.Join(s, ", ") },
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
	mux.Handle("GET /ui/stream/executions", g(u.streamList))
	mux.Handle("GET /ui/stream/executions/{id}", g(u.streamExecution))
	mux.HandleFunc("POST /ui/login", u.login)
	mux.HandleFunc("POST /ui/logout", u.logout)
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
	Layers     [][]api.StackState
	Claims     []api.Claim
	Gates      []api.Gate
	Grants     []api.Grant
	Checks     []api.Check
	Audit      []api.AuditEntry
	Next       string
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
	x, err := u.Service.Execution(r.Context(), u.caller(r), r.PathValue("id"))
	if err != nil {
		u.fail(w, err)
		return
	}
	render(w, r, "execution", page{Title: x.ExecutionID, Execution: x, Layers: layers(x)})
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
