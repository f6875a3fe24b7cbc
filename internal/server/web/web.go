// Package web serves the control plane's pages: server-rendered HTML (html/template, go:embed)
// with Server-Sent Events for live updates and no JavaScript build step.
package web

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
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
			return s[:n] + "…"
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

// Live-stream tuning.
const (
	// InitialLogTail is how much of each stack's log a freshly opened page receives.
	InitialLogTail = 256 << 10
	// maxLogPerPush bounds the log bytes one update sends per stack.
	maxLogPerPush = 1 << 20
	coalesce      = 100 * time.Millisecond
	keepalive     = 15 * time.Second
	refresh       = 10 * time.Second
)

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
}

// Register adds the pages to mux; guard authenticates each page (not the login form).
func (u *UI) Register(mux *http.ServeMux, guard func(http.Handler) http.Handler) {
	pages() // parse the templates when the server starts, not on the first page
	if u.Fail == nil {
		u.Fail = func(error) (int, string) { return http.StatusInternalServerError, "internal error" }
	}
	g := func(f http.HandlerFunc) http.Handler { return guard(f) }
	mux.Handle("GET /{$}", g(u.list))
	mux.Handle("GET /ui/executions/{id}", g(u.execution))
	mux.Handle("GET /ui/claims", g(u.claims))
	mux.Handle("GET /ui/gates", g(u.gates))
	mux.Handle("GET /ui/audit", g(u.audit))
	mux.Handle("GET /ui/stream/executions", g(u.streamList))
	mux.Handle("GET /ui/stream/executions/{id}", g(u.streamExecution))
	mux.HandleFunc("POST /ui/login", u.login)
}

func render(w http.ResponseWriter, name string, data any) {
	renderStatus(w, http.StatusOK, name, data)
}

func renderStatus(w http.ResponseWriter, status int, name string, data any) {
	var buf bytes.Buffer
	if err := pages().ExecuteTemplate(&buf, name, data); err != nil {
		http.Error(w, "rendering failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self'; form-action 'self'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
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
	// Filter is the list's query filter ("&environment=…&pr=…", values URL-encoded): a URL so the
	// "Older…" link keeps its separators instead of having them escaped.
	Filter template.URL
	Error  string
	// CSRF is the sign-in form's token (the value of its cookie).
	CSRF string
}

func listFilter(r *http.Request) (store.ExecutionFilter, template.URL) {
	q := r.URL.Query()
	f := store.ExecutionFilter{Environment: q.Get("environment"), Limit: 50}
	f.PR, _ = strconv.Atoi(q.Get("pr"))
	if b, err := time.Parse(time.RFC3339Nano, q.Get("before")); err == nil {
		f.Before = b
	}
	keep := url.Values{}
	if f.Environment != "" {
		keep.Set("environment", f.Environment)
	}
	if f.PR != 0 {
		keep.Set("pr", strconv.Itoa(f.PR))
	}
	extra := template.URL("")
	if len(keep) > 0 {
		extra = template.URL("&" + keep.Encode()) // Encode escapes every value
	}
	return f, extra
}

func (u *UI) list(w http.ResponseWriter, r *http.Request) {
	f, extra := listFilter(r)
	xs, err := u.Service.Executions(r.Context(), f)
	if err != nil {
		u.fail(w, err)
		return
	}
	p := page{Title: "Executions", Executions: xs, Filter: extra}
	if len(xs) == f.Limit {
		p.Next = xs[len(xs)-1].StartedAt.Format(time.RFC3339Nano)
	}
	render(w, "list", p)
}

// layers orders stacks into columns by dependency depth (edges: From before To).
func layers(x *api.Execution) [][]api.StackState {
	depth := map[string]int{}
	for _, s := range x.Stacks {
		depth[s.Stack] = 0
	}
	// Longest path by relaxation, bounded by the stack count (cycles cannot loop forever).
	for i := 0; i < len(x.Stacks); i++ {
		changed := false
		for _, e := range x.Edges {
			df, okF := depth[e.From]
			dt, okT := depth[e.To]
			if okF && okT && dt < df+1 && df+1 < len(x.Stacks) {
				depth[e.To] = df + 1
				changed = true
			}
		}
		if !changed {
			break
		}
	}
	var out [][]api.StackState
	for _, s := range x.Stacks {
		d := depth[s.Stack]
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
	x, err := u.Service.Execution(r.Context(), r.PathValue("id"))
	if err != nil {
		u.fail(w, err)
		return
	}
	render(w, "execution", page{Title: x.ExecutionID, Execution: x, Layers: layers(x)})
}

func (u *UI) claims(w http.ResponseWriter, r *http.Request) {
	cs, err := u.Service.Claims(r.Context(), r.URL.Query().Get("environment"))
	if err != nil {
		u.fail(w, err)
		return
	}
	render(w, "claims", page{Title: "Claims", Claims: cs})
}

func (u *UI) gates(w http.ResponseWriter, r *http.Request) {
	env := r.URL.Query().Get("environment")
	pr, _ := strconv.Atoi(r.URL.Query().Get("pr"))
	p := page{Title: "Gates and grants"}
	var err error
	if p.Gates, err = u.Service.Gates(r.Context(), env, pr); err == nil {
		if p.Grants, err = u.Service.Grants(r.Context(), env, pr); err == nil {
			p.Checks, err = u.Service.Checks(r.Context(), env, pr)
		}
	}
	if err != nil {
		u.fail(w, err)
		return
	}
	render(w, "gates", p)
}

func (u *UI) audit(w http.ResponseWriter, r *http.Request) {
	before, _ := strconv.ParseInt(r.URL.Query().Get("before"), 10, 64)
	entries, err := u.Service.Audit(r.Context(), 100, before)
	if err != nil {
		u.fail(w, err)
		return
	}
	p := page{Title: "Audit", Audit: entries}
	if len(entries) == 100 {
		p.Next = strconv.FormatInt(entries[len(entries)-1].ID, 10)
	}
	render(w, "audit", p)
}

// sse writes Server-Sent Events.
type sse struct {
	w http.ResponseWriter
	f http.Flusher
}

func startSSE(w http.ResponseWriter) (*sse, bool) {
	f, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return nil, false
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	f.Flush()
	return &sse{w: w, f: f}, true
}

func (s *sse) send(event string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", event, data); err != nil {
		return err
	}
	s.f.Flush()
	return nil
}

func (s *sse) ping() error {
	if _, err := fmt.Fprint(s.w, ": keepalive\n\n"); err != nil {
		return err
	}
	s.f.Flush()
	return nil
}

// follow calls push now and after every change of execID (coalesced), until the client leaves
// or the server stops.
func (u *UI) follow(w http.ResponseWriter, r *http.Request, execID string, push func(*sse) error) {
	ch, cancel := u.Service.Hub.Subscribe(execID)
	defer cancel()
	s, ok := startSSE(w)
	if !ok {
		return
	}
	if push(s) != nil {
		return
	}
	ka := time.NewTicker(keepalive)
	defer ka.Stop()
	rf := time.NewTicker(refresh)
	defer rf.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-u.Done:
			return
		case <-ka.C:
			if s.ping() != nil {
				return
			}
			continue
		case <-ch:
			time.Sleep(coalesce)
		case <-rf.C:
		}
		if push(s) != nil {
			return
		}
	}
}

func (u *UI) streamList(w http.ResponseWriter, r *http.Request) {
	f, _ := listFilter(r)
	u.follow(w, r, service.AllExecutions, func(s *sse) error {
		xs, err := u.Service.Executions(r.Context(), f)
		if err != nil {
			return nil // keep the stream; the next signal retries
		}
		var buf bytes.Buffer
		if err := pages().ExecuteTemplate(&buf, "execrows", xs); err != nil {
			return err
		}
		return s.send("rows", map[string]string{"html": buf.String()})
	})
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]`)

type logCursor struct{ gen, off int64 }

func (u *UI) streamExecution(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, err := u.Service.Execution(r.Context(), id); err != nil {
		u.fail(w, err)
		return
	}
	cursors := map[string]*logCursor{}
	var lastState string
	u.follow(w, r, id, func(s *sse) error {
		x, err := u.Service.Execution(r.Context(), id)
		if err != nil {
			return nil
		}
		var buf bytes.Buffer
		if err := pages().ExecuteTemplate(&buf, "state", page{Execution: x, Layers: layers(x)}); err != nil {
			return err
		}
		if state := buf.String(); state != lastState {
			lastState = state
			if err := s.send("state", map[string]string{"html": state}); err != nil {
				return err
			}
		}
		for _, st := range x.Stacks {
			if err := u.pushLog(r, s, id, st, cursors); err != nil {
				return err
			}
		}
		return nil
	})
}

type logEvent struct {
	Stack string `json:"stack"`
	Text  string `json:"text,omitempty"`
	Reset bool   `json:"reset,omitempty"`
	Gap   int64  `json:"gap,omitempty"`
}

// pushLog sends what a stack's log gained since the cursor (a new generation resets the view).
func (u *UI) pushLog(r *http.Request, s *sse, id string, st api.StackState, cursors map[string]*logCursor) error {
	if st.LogBytes == 0 && st.LogGeneration == 0 {
		return nil
	}
	c, seen := cursors[st.Stack]
	reset := false
	if !seen || c.gen != st.LogGeneration {
		c = &logCursor{gen: st.LogGeneration, off: max(0, st.LogBytes-InitialLogTail)}
		cursors[st.Stack] = c
		reset = seen
	}
	sent := 0
	for sent < maxLogPerPush {
		sl, err := u.Service.LogRead(r.Context(), id, st.Stack, c.gen, false, c.off, maxLogPerPush-sent)
		if err != nil || sl.NextOffset == c.off {
			break
		}
		ev := logEvent{Stack: st.Stack, Reset: reset, Text: ansi.ReplaceAllString(string(sl.Data), "")}
		for _, g := range sl.Gaps {
			if g.From >= c.off && g.From < sl.NextOffset && len(sl.Data) == 0 {
				ev.Gap += g.To - g.From
			}
		}
		if err := s.send("log", ev); err != nil {
			return err
		}
		reset = false
		sent += len(sl.Data)
		c.off = sl.NextOffset
	}
	return nil
}
