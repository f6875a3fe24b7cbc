package server

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/notify"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// failedDelivery writes one delivery and records it failed; it returns its id.
func failedDelivery(t *testing.T, st store.Store) int64 {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC()
	ds, err := notify.Deliveries([]notify.Target{{Name: "ops", Format: notify.FormatJSON}},
		notify.Event{Name: notify.ApplyFailed, Repo: "acme/infra", Environment: "prod", PR: 7, ExecutionID: "apply-1"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Write(ctx, func(tx store.Tx) error { return tx.(store.OutboxTx).Enqueue(ds) }); err != nil {
		t.Fatal(err)
	}
	ob := st.(store.Outbox)
	held, err := ob.ClaimDeliveries(ctx, now, time.Minute, 1)
	if err != nil || len(held) != 1 {
		t.Fatalf("claim: %v %v", held, err)
	}
	if ok, err := ob.FinishDeliveries(ctx, []store.Finished{{ID: held[0].ID, HeldUntil: held[0].NextAt,
		Result: store.DeliveryResult{Status: 410, Err: "HTTP 410: gone", Failed: true, At: now}}}); err != nil || !ok[0] {
		t.Fatalf("finish: %v %v", ok, err)
	}
	return held[0].ID
}

var redeliverForm = regexp.MustCompile(`<form method="post" action="(/ui/notifications/\d+/redeliver)"><input type="hidden" name="csrf" value="([^"]+)">`)

// TestNotificationsListAndRedeliverAreAdminOnly: the API list and the page answer admins only;
// the page's Redeliver form needs the session's anti-forgery token and makes the delivery
// pending again.
func TestNotificationsListAndRedeliverAreAdminOnly(t *testing.T) {
	st := storetest.OpenSQLite(t)
	ts := newTestServer(t, st, nil)
	id := failedDelivery(t, st)
	for _, role := range []string{"viewer", "runner"} {
		if status, _, _ := ts.call(t, role, "GET", "/notifications", nil); status != http.StatusForbidden {
			t.Errorf("GET /notifications as %s: %d, want 403", role, status)
		}
		if status, _ := ts.page(t, "/ui/notifications", tokenOf[role]); status != http.StatusForbidden {
			t.Errorf("the notifications page as %s: %d, want 403", role, status)
		}
	}
	status, out, _ := ts.call(t, "admin", "GET", "/notifications?status=failed", nil)
	list, _ := out["list"].([]any)
	if status != 200 || len(list) != 1 {
		t.Fatalf("GET /notifications as admin: %d %v", status, out)
	}
	if d := list[0].(map[string]any); d["status"] != "failed" || d["last_status"] != float64(410) || d["event"] != "apply.failed" || d["delivery"] == "" {
		t.Fatalf("delivery %v", d)
	}
	status, body := ts.page(t, "/ui/notifications", tokenOf["admin"])
	m := redeliverForm.FindStringSubmatch(body)
	if status != 200 || m == nil || !strings.Contains(body, "HTTP 410") {
		t.Fatalf("the admin's page: %d, Redeliver form %v:\n%.3000s", status, m, body)
	}
	action, csrf := m[1], m[2]
	cookie := ts.session(t, tokenOf["admin"])
	if status, _, _ := ts.submit(t, action, url.Values{"csrf": {"forged"}}, cookie); status != http.StatusForbidden {
		t.Fatalf("Redeliver with a wrong token: %d, want 403", status)
	}
	if status, _, _ := ts.submitFrom(t, "cross-site", "https://evil.example", action, url.Values{"csrf": {csrf}}, cookie); status != http.StatusForbidden {
		t.Fatalf("Redeliver from another site: %d, want 403", status)
	}
	viewer := ts.session(t, tokenOf["viewer"])
	_, vbody := ts.pageWith(t, "/", viewer)
	if status, _, _ := ts.submit(t, action, url.Values{"csrf": {signOutToken(t, vbody)}}, viewer); status != http.StatusForbidden {
		t.Fatalf("Redeliver by a viewer: %d, want 403", status)
	}
	ds, err := st.(store.Outbox).Deliveries(context.Background(), store.DeliveryFilter{})
	if err != nil || len(ds) != 1 || ds[0].Status != store.DeliveryFailed {
		t.Fatalf("after refused forms: %+v %v", ds, err)
	}
	if status, loc, _ := ts.submit(t, action, url.Values{"csrf": {csrf}}, cookie); status != http.StatusSeeOther || loc != "/ui/notifications" {
		t.Fatalf("Redeliver: %d %q", status, loc)
	}
	ds, err = st.(store.Outbox).Deliveries(context.Background(), store.DeliveryFilter{})
	if err != nil || len(ds) != 1 || ds[0].ID != id || ds[0].Status != store.DeliveryPending || ds[0].Attempts != 1 {
		t.Fatalf("after Redeliver: %+v %v", ds, err)
	}
}
