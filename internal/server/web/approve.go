package web

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/textfit"
)

// Approving a gate from a plan's page, and revoking its grants. The page shows each gate the
// plan requires with its stacks' changes and content hashes; an admin's Approve form posts the
// execution id and those hashes back, and the approval is refused when they are no longer what
// the server would approve (a newer plan arrived, or the content differs): the approver approves
// what they saw, or nothing.

// errStalePage refuses a form whose page no longer shows what the server would approve.
var errStalePage = fmt.Errorf("%w: this page is out of date", store.ErrStale)

// approve grants the gate the form names for the plan execution of the page it was sent from,
// through the same service call as POST /admin/gates/satisfy (audited there).
func (u *UI) approve(w http.ResponseWriter, r *http.Request) {
	s := u.SessionPost(w, r)
	if s == nil {
		return
	}
	id := r.PathValue("id")
	f := r.PostForm
	caller := CallerOf(s.Principal)
	if !s.Principal.Has(auth.RoleAdmin) {
		u.executionPage(w, r, s, http.StatusForbidden, "Approving a gate is an admin action: "+s.Principal.Name+" is not an admin.")
		return
	}
	err := u.checkShown(r, caller, id, f)
	if err == nil {
		x, xerr := u.Service.Execution(r.Context(), caller, id)
		if err = xerr; err == nil {
			_, err = u.Service.SatisfyGate(r.Context(), caller, &api.GatesSatisfy{Repo: x.Repo, Environment: x.Environment, PR: x.PR,
				ExecutionID: id, Class: f.Get("class"), Target: f.Get("target"), Reason: f.Get("reason")})
		}
	}
	if err != nil {
		status, msg := u.Fail(err)
		if errors.Is(err, store.ErrStale) {
			msg = "Not approved: " + msg
		}
		u.executionPage(w, r, s, status, msg)
		return
	}
	// The page shows the grant: a message in the address would let a link show one too.
	http.Redirect(w, r, "/ui/executions/"+url.PathEscape(id)+"#approvals", http.StatusSeeOther)
}

// checkShown refuses, with errStalePage, a form whose execution id and content (the digest of
// the gate's stacks with their content hashes, as the page showed them) are not exactly those
// the server would approve for the gate it names now: the plan is the PR's latest, and the gate
// covers those stacks at those hashes.
func (u *UI) checkShown(r *http.Request, caller service.Caller, id string, f url.Values) error {
	if f.Get("execution_id") != id {
		return fmt.Errorf("%w: the form names execution %q, not this page's", store.ErrInvalid, f.Get("execution_id"))
	}
	pg, err := u.Service.GatesOfPlan(r.Context(), caller, id)
	if err != nil {
		return err
	}
	if pg == nil {
		return fmt.Errorf("%w: execution %s is not a pull request's plan; only a plan is approved", store.ErrPrecondition, id)
	}
	if pg.Latest != id {
		return fmt.Errorf("%w: a newer plan of this pull request (%s) arrived after this page was loaded; review that plan and approve it", errStalePage, pg.Latest)
	}
	for _, g := range pg.Gates {
		if g.Class != f.Get("class") || g.Target != f.Get("target") {
			continue
		}
		if subtle.ConstantTimeCompare([]byte(f.Get("content")), []byte(contentDigest(g.Stacks))) != 1 {
			return fmt.Errorf("%w: the stacks or content hashes of gate %s on %s differ from what the page showed; reload it and review them", errStalePage, g.Class, g.Target)
		}
		return nil
	}
	return fmt.Errorf("%w: plan %s requires no gate %s on %q", store.ErrPrecondition, id, clipped(f.Get("class")), clipped(f.Get("target")))
}

// contentDigest is what an Approve form carries of the stacks of its gate and their content
// hashes: a SHA-256 over them in order of name, so that a gate of thousands of stacks fits in
// a form, and any stack or hash that differs from the page's changes it.
func contentDigest(stacks []api.StackState) string {
	lines := make([]string, len(stacks))
	for i, st := range stacks {
		lines[i] = st.Stack + "\x00" + st.PlanHash + "\n"
	}
	slices.Sort(lines)
	h := sha256.New()
	for _, l := range lines {
		h.Write([]byte(l))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// gateView is a gate of a plan's page: the stacks it lists (at most maxGateRows), how many more
// the gate covers, and its content digest.
type gateView struct {
	service.PlanGate
	Shown   []api.StackState
	More    int
	Content string
}

// maxGateRows is the most stacks a gate's box lists; its content digest covers them all.
const maxGateRows = 100

func gateViews(pg *service.PlanGates) []gateView {
	if pg == nil {
		return nil
	}
	out := make([]gateView, len(pg.Gates))
	for i, g := range pg.Gates {
		n := min(len(g.Stacks), maxGateRows)
		out[i] = gateView{PlanGate: g, Shown: g.Stacks[:n], More: len(g.Stacks) - n, Content: contentDigest(g.Stacks)}
	}
	return out
}

// clipped keeps what a form echoes back short.
func clipped(s string) string {
	if len(s) > 100 {
		return textfit.Prefix(s, 100) + "…"
	}
	return s
}

// revoke ends the active grants of the gate the form names, for the pull request of the page's
// execution (POST /admin/grants/release, audited there).
func (u *UI) revoke(w http.ResponseWriter, r *http.Request) {
	s := u.SessionPost(w, r)
	if s == nil {
		return
	}
	id := r.PathValue("id")
	f := r.PostForm
	if !s.Principal.Has(auth.RoleAdmin) {
		u.executionPage(w, r, s, http.StatusForbidden, "Revoking a grant is an admin action: "+s.Principal.Name+" is not an admin.")
		return
	}
	caller := CallerOf(s.Principal)
	x, err := u.Service.Execution(r.Context(), caller, id)
	if err == nil {
		_, err = u.Service.ReleaseGrant(r.Context(), caller, &api.GrantsRelease{Repo: x.Repo, Environment: x.Environment, PR: x.PR,
			Class: f.Get("class"), Target: f.Get("target"), Reason: f.Get("reason")})
	}
	if err != nil {
		status, msg := u.Fail(err)
		u.executionPage(w, r, s, status, "Not revoked: "+msg)
		return
	}
	http.Redirect(w, r, "/ui/executions/"+url.PathEscape(id)+"#approvals", http.StatusSeeOther)
}

// formsOf returns the anti-forgery token of the forms of a page that session s reads ("": no
// forms: not a session, or not an admin).
func formsOf(s *Session) string {
	if s == nil || !s.Principal.Has(auth.RoleAdmin) {
		return ""
	}
	return s.CSRF
}
