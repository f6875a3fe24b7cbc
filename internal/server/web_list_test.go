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
		_, err := ts.svc.Init(context.Background(), "", &api.Init{ExecutionID: fmt.Sprint("x", i), Environment: env, Op: "plan", PR: 7,
			SHA: "s", StartedAt: start.Add(time.Duration(i) * time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
	}
	status, body := ts.page(t, "/?environment=dev&pr=7", tokenOf["viewer"])
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
