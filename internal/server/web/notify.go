package web

import (
	"html/template"
	"net/http"
	"strconv"

	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// The notifications page: an admin's list of the outbox's deliveries, with a Redeliver form on
// each that ended (posted with the session's anti-forgery token, as every form of these pages).

// notificationsPage is the notifications page's data.
type notificationsPage struct {
	Title string
	// SignOut is the sign-out form's token; Forms that of the Redeliver forms ("": no forms).
	SignOut, Forms string
	Deliveries     []store.Delivery
	Older          template.URL
}

// notificationsPageSize is how many deliveries one page lists.
const notificationsPageSize = 100

// notifications lists the deliveries (admins only: the service refuses anyone else).
func (u *UI) notifications(w http.ResponseWriter, r *http.Request) {
	before, _ := strconv.ParseInt(r.URL.Query().Get("before"), 10, 64)
	ds, err := u.Service.Notifications(r.Context(), u.caller(r), store.DeliveryFilter{Before: max(before, 0), Limit: notificationsPageSize})
	if err != nil {
		u.fail(w, err)
		return
	}
	p := notificationsPage{Title: "Notifications", Deliveries: ds}
	if s := SessionFrom(r.Context()); s != nil {
		p.SignOut = s.CSRF
		if s.Principal.Has(auth.RoleAdmin) {
			p.Forms = s.CSRF
		}
	}
	if len(ds) == notificationsPageSize {
		p.Older = template.URL("?before=" + strconv.FormatInt(ds[len(ds)-1].ID, 10))
	}
	renderStatus(w, http.StatusOK, "notifications", p)
}

// redeliver makes a delivery pending again (an admin's form, CSRF-checked by SessionPost).
func (u *UI) redeliver(w http.ResponseWriter, r *http.Request) {
	s := u.SessionPost(w, r)
	if s == nil {
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		http.Error(w, "no such delivery", http.StatusNotFound)
		return
	}
	if err := u.Service.Redeliver(r.Context(), CallerOf(s.Principal), id); err != nil {
		u.fail(w, err)
		return
	}
	http.Redirect(w, r, "/ui/notifications", http.StatusSeeOther)
}
