package server

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

func TestWebListOlderLinkKeepsItsFilter(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := range 110 { // 55 in dev: one full page and five older
		env := "prod"
		if i%2 == 1 {
			env = "dev"
		}
		_, err := ts.svc.Init(context.Background(), service.Caller{Name: "", Repositories: []string{testRepo}}, &api.Init{ExecutionID: fmt.Sprint("x", i), Environment: env, Op: "plan", PR: 7,
			SHA: "s", StartedAt: start.Add(time.Duration(i) * time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
	}
	status, body := ts.page(t, "/?repo=acme/infra&environment=dev&pr=7", tokenOf["viewer"])
	if status != 200 {
		t.Fatalf("list page: %d %s", status, body)
	}
	m := regexp.MustCompile(`<a href="([^"]*)">Older…</a>`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no Older link on a full filtered page: %s", body)
	}
	href, err := url.Parse(strings.ReplaceAll(m[1], "&amp;", "&"))
	if err != nil {
		t.Fatal(err)
	}
	q := href.Query()
	if q.Get("environment") != "dev" || q.Get("pr") != "7" || q.Get("before") == "" {
		t.Fatalf("Older link %q lost its filter: %v", m[1], q)
	}
	// Following it lists only older executions of the same filter.
	status, body = ts.page(t, "/"+href.String(), tokenOf["viewer"])
	if status != 200 || !strings.Contains(body, ">x1<") || strings.Contains(body, ">x11<") || strings.Contains(body, ">x0<") {
		t.Fatalf("older page: %d %s", status, body)
	}
}

// The gates page shows the newest 100 rows of each list with an Older link to the next page of
// each that was full: a link keeps the filter and the pages the other lists show, and the page
// it opens lists the older rows of its list only.
func TestWebGatesOlderLinks(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	err := ts.store.Write(context.Background(), func(tx store.Tx) error {
		for i := 1; i <= 105; i++ { // one full page and five older rows of each list in prod
			at := start.Add(time.Duration(i/3) * time.Second) // three rows of each list a second
			if err := tx.ReplaceGates(store.PRKey{Repo: testRepo, Environment: "prod", PR: i}, []api.Gate{{Class: "destructive", Target: fmt.Sprint("t-", i), RequiredAt: at}}); err != nil {
				return err
			}
			if _, err := tx.AddGrant(api.Grant{Repo: testRepo, Environment: "prod", PR: i, Class: "destructive", Target: "**", Reason: fmt.Sprint("r-", i), GrantedAt: at}); err != nil {
				return err
			}
			if err := tx.PutCheck(api.Check{Repo: testRepo, Environment: "prod", PR: i, Check: fmt.Sprint("c-", i), Conclusion: "success", UpdatedAt: at}); err != nil {
				return err
			}
		}
		// The newest of all, of another environment: never on prod's pages.
		if err := tx.ReplaceGates(store.PRKey{Repo: testRepo, Environment: "dev", PR: 1}, []api.Gate{{Class: "destructive", Target: "t-dev", RequiredAt: start.Add(time.Hour)}}); err != nil {
			return err
		}
		return tx.PutCheck(api.Check{Repo: testRepo, Environment: "dev", PR: 1, Check: "c-dev", Conclusion: "success", UpdatedAt: start.Add(time.Hour)})
	})
	if err != nil {
		t.Fatal(err)
	}
	viewer := tokenOf["viewer"]
	get := func(path string) string {
		t.Helper()
		status, body := ts.page(t, path, viewer)
		if status != 200 {
			t.Fatalf("%s: %d %s", path, status, body)
		}
		return body
	}
	// shows fails unless body lists exactly rows from..to (newest first) of the list whose cells
	// are prefix and a number.
	shows := func(what, body, prefix string, from, to int) {
		t.Helper()
		for i := 1; i <= 105; i++ {
			if want, got := i <= from && i >= to, strings.Contains(body, ">"+prefix+fmt.Sprint(i)+"<"); got != want {
				t.Fatalf("%s: row %s%d listed %v, want %v", what, prefix, i, got, want)
			}
		}
		if strings.Contains(body, ">"+prefix+"dev<") {
			t.Fatalf("%s: lists a dev row", what)
		}
	}
	link := func(body, list string) *url.URL {
		t.Helper()
		m := regexp.MustCompile(`<a href="([^"]*)">Older ` + list + `…</a>`).FindStringSubmatch(body)
		if m == nil {
			return nil
		}
		u, err := url.Parse(strings.ReplaceAll(m[1], "&amp;", "&"))
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	first := get("/ui/gates?environment=prod")
	shows("first page gates", first, "t-", 105, 6)
	shows("first page grants", first, "r-", 105, 6)
	shows("first page checks", first, "c-", 105, 6)
	gates, grants := link(first, "gates"), link(first, "grants")
	if gates == nil || grants == nil || link(first, "checks") == nil {
		t.Fatalf("a full list without its Older link: %s", first)
	}
	if q := gates.Query(); q.Get("environment") != "prod" || q.Get("gates_before") == "" || q.Has("grants_before") {
		t.Fatalf("Older gates link %q: want the filter and gates_before only", gates)
	}
	// The older gates, beside the newest grants and checks; no Older gates link after the last.
	older := get("/ui/gates" + gates.String())
	shows("older gates page gates", older, "t-", 5, 1)
	shows("older gates page grants", older, "r-", 105, 6)
	shows("older gates page checks", older, "c-", 105, 6)
	if link(older, "gates") != nil {
		t.Fatalf("an Older gates link under the last gates")
	}
	// The grants' Older link of that page keeps the gates' page.
	grants = link(older, "grants")
	if grants == nil || grants.Query().Get("gates_before") != gates.Query().Get("gates_before") || grants.Query().Get("environment") != "prod" {
		t.Fatalf("Older grants link %v does not keep the filter and the gates' page", grants)
	}
	both := get("/ui/gates" + grants.String())
	shows("older gates and grants page gates", both, "t-", 5, 1)
	shows("older gates and grants page grants", both, "r-", 5, 1)
	shows("older gates and grants page checks", both, "c-", 105, 6)
	// A cursor that is not one is refused.
	if status, body := ts.page(t, "/ui/gates?gates_before=nonsense", viewer); status != 400 || !strings.Contains(body, "before") {
		t.Fatalf("a bad cursor: %d %s", status, body)
	}
}
