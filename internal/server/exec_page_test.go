package server

import (
	"cmp"
	"fmt"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// execStarts are the started_at the runners of the seeded executions send, near the server's
// clock now (one further off would be replaced by it): most of them one instant, to the
// nanosecond and in another zone than UTC, the others a nanosecond before or after it, a
// microsecond after it and the whole second before it (a runner whose clock says seconds). The
// store's own tests cover the epoch and the times before it.
func execStarts(now time.Time) []string {
	b := now.UTC().Truncate(time.Second)
	return []string{
		b.Add(123456789).In(time.FixedZone("", 2*3600)).Format(time.RFC3339Nano),
		b.Add(123456790).Format(time.RFC3339Nano),
		b.Add(123456788).Format(time.RFC3339Nano),
		b.Add(123457000).Format(time.RFC3339Nano),
		b.Format(time.RFC3339Nano),
	}
}

// seededExec is a seeded execution: its place in the list (its started_at in Unix nanoseconds,
// then its id) and what it is filtered by.
type seededExec struct {
	at  int64
	id  string
	env string
	pr  int
}

// seedExecutionPages has runners start 130 executions of dev and prod and PRs 0 to 3, two
// thirds of them at the same instant, and returns them in the list's order.
func seedExecutionPages(t *testing.T, ts *testServer) []seededExec {
	t.Helper()
	var out []seededExec
	starts := execStarts(time.Now())
	for i := range 130 {
		start := starts[0]
		if i%3 == 0 {
			start = starts[1+(i/3)%(len(starts)-1)]
		}
		at, err := time.Parse(time.RFC3339Nano, start)
		if err != nil {
			t.Fatal(err)
		}
		// Ids out of the order of their times: lower-case letters and digits of one length,
		// which every collation orders alike.
		e := seededExec{at: at.UnixNano(), id: fmt.Sprintf("x%03d", (i*47)%130), env: []string{"dev", "prod"}[i%2], pr: i % 4}
		init := map[string]any{"execution_id": e.id, "environment": e.env, "op": "plan", "pr": e.pr, "started_at": start}
		if status, body, _ := ts.call(t, "runner", "POST", "/events/init", init); status != 200 {
			t.Fatalf("init %s: %d %v", e.id, status, body)
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b seededExec) int { return cmp.Or(cmp.Compare(b.at, a.at), cmp.Compare(b.id, a.id)) })
	return out
}

// forEachSeededServer runs fn on a server of each store, with the executions
// seedExecutionPages starts.
func forEachSeededServer(t *testing.T, fn func(t *testing.T, ts *testServer, all []seededExec)) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ts := newTestServer(t, b.Open(t), nil)
			fn(t, ts, seedExecutionPages(t, ts))
		})
	}
}

// selected are the ids of the executions of env and pr (zero values: any), in the list's order.
func selected(all []seededExec, env string, pr int) []string {
	var ids []string
	for _, e := range all {
		if (env == "" || e.env == env) && (pr == 0 || e.pr == pr) {
			ids = append(ids, e.id)
		}
	}
	return ids
}

// startedAt is the started_at of an execution as GET /executions lists it: the zero time when
// it has none (the Unix epoch, stored as 0).
func startedAt(r map[string]any) string {
	s, _ := r["started_at"].(string)
	return cmp.Or(s, "0001-01-01T00:00:00Z")
}

// Walking GET /executions page after page, each page asked before the started_at and
// before_id the execution_id of the previous page's last execution, exactly as the JSON gave
// them, lists every execution once, newest first and by id among those of the same instant,
// whatever the filter and the page size, on both stores: the started_at a client gets, to the
// nanosecond, is the one stored, and sent back it is that execution's place in the list.
func TestExecutionsWalkEveryExecutionOnce(t *testing.T) {
	forEachSeededServer(t, func(t *testing.T, ts *testServer, all []seededExec) {
		at := map[string]int64{}
		for _, e := range all {
			at[e.id] = e.at
		}
		for _, f := range []struct {
			env string
			pr  int
		}{{"", 0}, {"prod", 0}, {"", 2}, {"prod", 2}} {
			want := selected(all, f.env, f.pr)
			for _, limit := range []int{1, 3, 50, 500} {
				filter := fmt.Sprintf("repo=%s&environment=%s&pr=%d&limit=%d", testRepo, f.env, f.pr, limit)
				var got []string
				for query := ""; len(got) <= len(all); {
					page := ts.list(t, "/executions?"+filter+query)
					for _, r := range page {
						id, started := r["execution_id"].(string), startedAt(r)
						listed, err := time.Parse(time.RFC3339Nano, started)
						if err != nil || listed.UnixNano() != at[id] && !(listed.IsZero() && at[id] == 0) {
							t.Fatalf("%s: listed started at %q, runner sent %v (%v)", id, started, time.Unix(0, at[id]).UTC(), err)
						}
						got = append(got, id)
					}
					if len(page) < limit {
						break
					}
					last := page[len(page)-1]
					query = "&before=" + url.QueryEscape(startedAt(last)) + "&before_id=" + url.QueryEscape(last["execution_id"].(string))
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%s: the pages listed %d executions, want %d\ngot  %v\nwant %v", filter, len(got), len(want), got, want)
				}
			}
		}
		// before alone keeps its meaning: the executions started before it.
		var older []string
		for _, e := range all {
			if e.at < at["x000"] {
				older = append(older, e.id)
			}
		}
		before := url.QueryEscape(time.Unix(0, at["x000"]).UTC().Format(time.RFC3339Nano))
		var got []string
		for _, r := range ts.list(t, "/executions?limit=500&before="+before) {
			got = append(got, r["execution_id"].(string))
		}
		if !reflect.DeepEqual(got, older) {
			t.Fatalf("before alone: %v, want %v", got, older)
		}
	})
}

// The generated client walks the pages too: it sends a page's last execution's started_at and
// id as it decoded them, and leaves before and before_id out when unset.
func TestExecutionsWalkThroughTheGeneratedClient(t *testing.T) {
	forEachSeededServer(t, func(t *testing.T, ts *testServer, all []seededExec) {
		client := ts.client(t, "viewer")
		for _, env := range []string{"", "dev"} {
			params := &api.ExecutionsListParams{Environment: env, Limit: ptr(3)}
			var got []string
			for len(got) <= len(all) {
				resp, err := client.ExecutionsListWithResponse(t.Context(), params)
				if err != nil || resp.JSON200 == nil {
					t.Fatalf("%+v: %v %v", params, resp, err)
				}
				page := *resp.JSON200
				for _, e := range page {
					got = append(got, e.ExecutionID)
				}
				if len(page) < *params.Limit {
					break
				}
				params.Before, params.BeforeID = &page[len(page)-1].StartedAt, &page[len(page)-1].ExecutionID
			}
			if want := selected(all, env, 0); !reflect.DeepEqual(got, want) {
				t.Fatalf("environment %q: the pages listed %v, want %v", env, got, want)
			}
		}
		resp, err := client.ExecutionsListWithResponse(t.Context(), &api.ExecutionsListParams{BeforeID: ptr("x001")})
		if err != nil || resp.StatusCode() != 400 || resp.JSONDefault == nil || !strings.Contains(resp.JSONDefault.Message, "before_id") {
			t.Fatalf("before_id without before: %v %v", resp, err)
		}
	})
}

// A before_id without before, or one that is no execution id, is refused with 400
// INVALID_ARGUMENT naming before_id, by the API and by the executions page and its stream.
func TestExecutionsRefuseBadBeforeID(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	seedExecutionPages(t, ts)
	before := "before=" + url.QueryEscape("2026-03-01T12:00:00Z")
	for _, query := range []string{
		"before_id=x001",
		"environment=prod&before_id=x001&limit=3",
		before + "&before_id=",
		before + "&before_id=x%01",
		before + "&before_id=x%FF",
		before + "&before_id=" + strings.Repeat("x", 1025),
	} {
		status, out, _ := ts.call(t, "viewer", "GET", "/executions?"+query, nil)
		msg, _ := out["message"].(string)
		if status != 400 || out["code"] != "INVALID_ARGUMENT" || !strings.Contains(msg, "before_id") {
			t.Errorf("GET /executions?%s: %d %v %q, want 400 INVALID_ARGUMENT naming before_id", query, status, out["code"], msg)
		}
		for _, page := range []string{"/", "/ui/stream/executions"} {
			if status, body := ts.page(t, page+"?"+query, tokenOf["viewer"]); status != 400 || !strings.Contains(body, "before_id") {
				t.Errorf("GET %s?%s: %d %q, want 400 naming before_id", page, query, status, body)
			}
		}
	}
	// The longest id there may be is one.
	if status, out, _ := ts.call(t, "viewer", "GET", "/executions?"+before+"&before_id="+strings.Repeat("x", 1024), nil); status != 200 {
		t.Errorf("a before_id of 1024 bytes: %d %v", status, out)
	}
}

// Following the executions page's Older links from the newest page lists every execution once,
// newest first, by id among those of the same instant: a link carries the last execution's
// started_at, to the nanosecond, and its id, and keeps the filter.
func TestWebExecutionsOlderLinksWalkEveryExecutionOnce(t *testing.T) {
	forEachSeededServer(t, func(t *testing.T, ts *testServer, all []seededExec) {
		row := regexp.MustCompile(`<a href="/ui/executions/([^"]+)">`)
		older := regexp.MustCompile(`<a href="([^"]*)">Older…</a>`)
		for _, filter := range []string{"", "environment=prod", "repo=acme%2Finfra&pr=2"} {
			var got []string
			pages := 0
			for path := "/?" + filter; path != ""; pages++ {
				if pages > len(all) {
					t.Fatalf("%s: more pages than executions", filter)
				}
				status, body := ts.page(t, path, tokenOf["viewer"])
				if status != 200 {
					t.Fatalf("%s: %d %s", path, status, body)
				}
				for _, m := range row.FindAllStringSubmatch(body, -1) {
					got = append(got, m[1])
				}
				path = ""
				if m := older.FindStringSubmatch(body); m != nil {
					href, err := url.Parse(strings.ReplaceAll(m[1], "&amp;", "&"))
					if err != nil {
						t.Fatal(err)
					}
					q := href.Query()
					if q.Get("before") == "" || q.Get("before_id") != got[len(got)-1] || filter != "" && !strings.Contains(href.RawQuery, filter) {
						t.Fatalf("Older link %q: want the filter %q, before and the last execution's id", m[1], filter)
					}
					path = "/" + href.String()
				}
			}
			env, _ := url.ParseQuery(filter)
			var pr int
			_, _ = fmt.Sscan(env.Get("pr"), &pr)
			if want := selected(all, env.Get("environment"), pr); !reflect.DeepEqual(got, want) {
				t.Fatalf("%q: the pages listed %d executions, want %d\ngot  %v\nwant %v", filter, len(got), len(want), got, want)
			}
		}
	})
}
