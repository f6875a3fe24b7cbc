package server

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// seedLists stores 520 gates, grants and checks of prod (two of each per PR, ten PRs a second:
// most rows share their time with others) and one gate, grant and check of dev.
func seedLists(t *testing.T, ts *testServer) {
	t.Helper()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	err := ts.store.Write(t.Context(), func(tx store.Tx) error {
		for pr := 1; pr <= 260; pr++ {
			at := t0.Add(time.Duration(pr/10) * time.Second)
			if err := tx.ReplaceGates(store.PRKey{Repo: testRepo, Environment: "prod", PR: pr}, []api.Gate{{Class: "destructive", Target: "**", RequiredAt: at}, {Class: "mutating", Target: "**", RequiredAt: at}}); err != nil {
				return err
			}
			for _, name := range []string{"tfstackplan/plan", "tfstackplan/apply"} {
				if err := tx.PutCheck(api.Check{Repo: testRepo, Environment: "prod", PR: pr, Check: name, Conclusion: "success", UpdatedAt: at}); err != nil {
					return err
				}
				if _, err := tx.AddGrant(api.Grant{Repo: testRepo, Environment: "prod", PR: pr, Class: "destructive", Target: "**", Reason: name, GrantedAt: at}); err != nil {
					return err
				}
			}
		}
		if err := tx.ReplaceGates(store.PRKey{Repo: testRepo, Environment: "dev", PR: 1}, []api.Gate{{Class: "destructive", Target: "**", RequiredAt: t0}}); err != nil {
			return err
		}
		if _, err := tx.AddGrant(api.Grant{Repo: testRepo, Environment: "dev", PR: 1, Class: "destructive", Target: "**", GrantedAt: t0}); err != nil {
			return err
		}
		return tx.PutCheck(api.Check{Repo: testRepo, Environment: "dev", PR: 1, Check: "tfstackplan/plan", Conclusion: "success", UpdatedAt: t0})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// list GETs a list and returns its rows, failing unless it answers 200.
func (ts *testServer) list(t *testing.T, path string) []map[string]any {
	t.Helper()
	status, out, _ := ts.call(t, "viewer", "GET", path, nil)
	if status != 200 {
		t.Fatalf("GET %s: %d %v", path, status, out)
	}
	rows, _ := out["list"].([]any)
	var maps []map[string]any
	for _, r := range rows {
		maps = append(maps, r.(map[string]any))
	}
	return maps
}

// A list without a limit is a page of 100 rows; a limit of 1 to 500 is a page of that many.
func TestListsPageByDefaultAndUpToTheMaximum(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	seedLists(t, ts)
	for _, list := range []string{"/gates", "/grants", "/checks"} {
		for query, want := range map[string]int{"": 100, "?limit=1": 1, "?limit=500": 500, "?environment=prod&limit=500": 500, "?environment=dev": 1} {
			if got := len(ts.list(t, list+query)); got != want {
				t.Errorf("GET %s%s: %d rows, want %d", list, query, got, want)
			}
		}
	}
}

// A limit out of 1 to 500 (/audit: 1000; a log read: 4 MiB) and a before that is not a place of the list are refused with 400
// INVALID_ARGUMENT naming the parameter, as is the cursor of a row of another list, or of
// another environment than asked for.
func TestListsRefuseBadPaging(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	seedLists(t, ts)
	gate := ts.list(t, "/gates?limit=1")[0]["cursor"].(string)
	check := ts.list(t, "/checks?limit=1")[0]["cursor"].(string)
	bad := map[string]string{
		"/gates?environment=dev&before=" + url.QueryEscape(gate):      "before",
		"/gates?repo=acme/infra&pr=7&before=" + url.QueryEscape(gate): "before",
		"/gates?before=" + url.QueryEscape(check):                     "before",
		"/checks?before=" + url.QueryEscape(gate):                     "before",
		"/checks?before=" + url.QueryEscape(check+"x"):                "before",
		"/grants?before=-1":  "before",
		"/grants?before=abc": "before",
	}
	for list, limits := range map[string][]string{"/executions": {"501"}, "/audit": {"1001"}, "/executions/e1/log?stack=a&": {"4194305"}} {
		sep := "?"
		if strings.HasSuffix(list, "&") {
			sep = ""
		}
		for _, limit := range append(limits, "0", "-1", "1000000000", "many") {
			bad[list+sep+"limit="+limit] = "limit"
		}
	}
	for _, list := range []string{"/gates", "/grants", "/checks"} {
		for _, limit := range []string{"0", "501", "-1", "1000000", "many"} {
			bad[list+"?limit="+limit] = "limit"
		}
		if list != "/grants" {
			for _, cursor := range []string{"nonsense", "eyJ9", "W10", "e30"} { // not base64, `{"}`, `[]`, `{}`
				bad[list+"?before="+cursor] = "before"
			}
			// Well-formed cursors of places no row has: a NUL byte (PostgreSQL cannot compare
			// it) and an environment too long for any row.
			names := map[string][]string{"/gates": {"destructive", "**"}, "/checks": {"ci"}}[list]
			for _, env := range []string{`pro\u0000d`, strings.Repeat("p", 2000)} {
				c := fmt.Sprintf(`{"at":1,"environment":"%s","pr":1,"names":%s}`, env, jsonOf(t, names))
				bad[list+"?before="+base64.RawURLEncoding.EncodeToString([]byte(c))] = "before"
			}
		}
	}
	for path, param := range bad {
		status, out, _ := ts.call(t, "viewer", "GET", path, nil)
		msg, _ := out["message"].(string)
		if status != 400 || out["code"] != "INVALID_ARGUMENT" || !strings.Contains(msg, param) || len(msg) > 600 {
			t.Errorf("GET %s: %d %v %q, want 400 INVALID_ARGUMENT naming %s", path, status, out["code"], msg, param)
		}
	}
}

// Walking a list page after page through the API, each page before the last row of the one
// before it, lists every row once, newest first, whatever the page size.
func TestListsWalkEveryRowOnce(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	seedLists(t, ts)
	cursor := func(r map[string]any) string { return url.QueryEscape(r["cursor"].(string)) }
	for _, c := range []struct {
		list, at string // at: the field of the time the list is ordered by
		// key names a row; next is the before of the page after it.
		key, next func(row map[string]any) string
	}{
		{"/gates?environment=prod", "required_at", func(r map[string]any) string { return fmt.Sprint(r["pr"], r["class"]) }, cursor},
		{"/checks?environment=prod", "updated_at", func(r map[string]any) string { return fmt.Sprint(r["pr"], r["check"]) }, cursor},
		{"/grants?environment=prod", "granted_at", func(r map[string]any) string { return fmt.Sprint(r["id"]) },
			func(r map[string]any) string { return fmt.Sprint(int64(r["id"].(float64))) }},
	} {
		for _, limit := range []int{7, 100, 500} {
			seen := map[string]bool{}
			var last time.Time
			pages := 0
			for query := ""; ; {
				pages++
				page := ts.list(t, fmt.Sprintf("%s&limit=%d%s", c.list, limit, query))
				for _, r := range page {
					k := c.key(r)
					if seen[k] {
						t.Fatalf("%s limit %d: %s listed twice", c.list, limit, k)
					}
					seen[k] = true
					at, err := time.Parse(time.RFC3339Nano, r[c.at].(string))
					if err != nil || !last.IsZero() && at.After(last) {
						t.Fatalf("%s limit %d: %s of %v after a row of %v: not newest first (%v)", c.list, limit, k, at, last, err)
					}
					last = at
				}
				if len(page) < limit {
					break
				}
				query = "&before=" + c.next(page[len(page)-1])
			}
			// 520 is no multiple of a limit: every page but the last is full.
			if len(seen) != 520 || pages != 520/limit+1 {
				t.Errorf("%s limit %d: %d rows in %d pages, want 520 in %d", c.list, limit, len(seen), pages, 520/limit+1)
			}
		}
	}
}

// The generated Go client pages too: a request that leaves the limit unset gets the default
// page (the client sends no limit, rather than limit=0), the limit it sets is the page's size,
// and a limit of 0 it sets is refused.
func TestListsPageThroughTheGeneratedClient(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	seedLists(t, ts)
	client := ts.client(t, "viewer")
	for _, c := range []struct {
		limit  *int
		status int
		rows   int
	}{{nil, 200, 100}, {ptr(500), 200, 500}, {ptr(7), 200, 7}, {ptr(0), 400, 0}} {
		gates, err := client.GatesListWithResponse(t.Context(), &api.GatesListParams{Environment: "prod", Limit: c.limit})
		if err != nil {
			t.Fatal(err)
		}
		grants, err := client.GrantsListWithResponse(t.Context(), &api.GrantsListParams{Environment: "prod", Limit: c.limit})
		if err != nil {
			t.Fatal(err)
		}
		checks, err := client.ChecksListWithResponse(t.Context(), &api.ChecksListParams{Environment: "prod", Limit: c.limit})
		if err != nil {
			t.Fatal(err)
		}
		for _, got := range []struct {
			list   string
			status int
			rows   int
		}{
			{"gates", gates.StatusCode(), len(deref(gates.JSON200))},
			{"grants", grants.StatusCode(), len(deref(grants.JSON200))},
			{"checks", checks.StatusCode(), len(deref(checks.JSON200))},
		} {
			if got.status != c.status || got.rows != c.rows {
				t.Errorf("%s, limit %v: %d with %d rows, want %d with %d", got.list, c.limit, got.status, got.rows, c.status, c.rows)
			}
		}
	}
	// A page's last gate's cursor, sent back as before, gets the next page.
	first, err := client.GatesListWithResponse(t.Context(), &api.GatesListParams{Environment: "prod", Limit: ptr(3)})
	if err != nil || first.JSON200 == nil || len(*first.JSON200) != 3 {
		t.Fatalf("first page: %v %v", first, err)
	}
	next, err := client.GatesListWithResponse(t.Context(), &api.GatesListParams{Environment: "prod", Limit: ptr(3), Before: (*first.JSON200)[2].Cursor})
	if err != nil || next.JSON200 == nil || len(*next.JSON200) != 3 || (*next.JSON200)[0].Cursor == (*first.JSON200)[2].Cursor {
		t.Fatalf("next page: %v %v", next, err)
	}
}

func ptr[T any](v T) *T { return &v }

func deref[T any](p *[]T) []T {
	if p == nil {
		return nil
	}
	return *p
}

// jsonOf is v as JSON.
func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
