package web

import (
	"net/http"
	"slices"

	"github.com/tfstackplan/tfstackplan/internal/api"
)

// driftView is what the drift page shows: an environment's stacks with their latest drift
// check, drifted first (or, with Stack, that stack's history, newest first).
type driftView struct {
	Repo, Environment, Stack string
	Checks                   []api.DriftCheck
	// Drifted counts the checks that found drift.
	Drifted int
}

// drift shows the drift checks of the environment the query names (repo, environment, stack:
// as GET /drift takes them); without an environment, the form that names one.
func (u *UI) drift(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := &driftView{Repo: q.Get("repo"), Environment: q.Get("environment"), Stack: q.Get("stack")}
	if v.Environment != "" {
		cs, err := u.Service.Drift(r.Context(), u.caller(r), v.Repo, v.Environment, v.Stack, nil)
		if err != nil {
			u.fail(w, err)
			return
		}
		if v.Stack == "" {
			// Drifted first, then by repository and stack, as listed.
			slices.SortStableFunc(cs, func(a, b api.DriftCheck) int { return b2i(b.Drifted) - b2i(a.Drifted) })
		}
		for _, c := range cs {
			if c.Drifted {
				v.Drifted++
			}
		}
		v.Checks = cs
	}
	render(w, r, "drift", page{Title: "Drift", Drift: v})
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
