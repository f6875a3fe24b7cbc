package web

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// flakyStore fails its reads while failing is set.
type flakyStore struct {
	store.Store
	failing atomic.Bool
}

func (s *flakyStore) Read(ctx context.Context, fn func(store.Tx) error) error {
	if s.failing.Load() {
		return fmt.Errorf("%w: database down", store.ErrUnavailable)
	}
	return s.Store.Read(ctx, fn)
}

// viewerSecret is the token of sessionUI's viewer "v".
const viewerSecret = "viewer-secret-0123456789"

// sessionUI serves the pages of a UI whose guard takes sessions only, on a settable clock.
func sessionUI(t *testing.T) (*UI, *httptest.Server, func(time.Duration)) {
	t.Helper()
	var mu sync.Mutex
	now := time.Now()
	a := &auth.Authenticator{}
	if err := a.ParseTokens("tokens.hcl", []byte(`token "v" {
  secret = "`+viewerSecret+`"
  roles  = ["viewer"]
}`)); err != nil {
		t.Fatal(err)
	}
	u := &UI{Service: service.New(&flakyStore{Store: storetest.OpenSQLite(t)}, nil), Auth: a, Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }}
	mux := http.NewServeMux()
	u.Register(mux, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s, err := u.PageSession(w, r)
			if s == nil {
				http.Error(w, "no session: "+err.Error(), http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r.WithContext(auth.With(WithSession(r.Context(), s), s.Principal)))
		})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return u, srv, func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
}

// TestStreamEndsWithItsSession: a live stream opened by a session ends soon after the session
// is signed out or expires, on whichever replica that happened; the stream of a live session
// goes on.
func TestStreamEndsWithItsSession(t *testing.T) {
	old := keepalive
	keepalive = 20 * time.Millisecond
	t.Cleanup(func() { keepalive = old })
	u, srv, advance := sessionUI(t)
	viewer := auth.Principal{Name: "v", Roles: []auth.Role{auth.RoleViewer}}
	open := func() (*bufio.Scanner, string) {
		id, _, err := u.newSession(context.Background(), viewer, viewerSecret)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		t.Cleanup(cancel)
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/ui/stream/executions", nil)
		req.AddCookie(&http.Cookie{Name: SessionCookieName, Value: id})
		resp, err := srv.Client().Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("stream: %v %v", resp, err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return bufio.NewScanner(resp.Body), id
	}
	// keepalives counts the keep-alive comments a stream sends before it ends, up to max.
	keepalives := func(sc *bufio.Scanner, max int) int {
		n := 0
		for n < max && sc.Scan() {
			if strings.HasPrefix(sc.Text(), ": keepalive") {
				n++
			}
		}
		return n
	}
	kept, _ := open()
	revoked, id := open()
	if keepalives(revoked, 3) != 3 {
		t.Fatal("a live session's stream ended")
	}
	if err := u.Service.Store.Write(context.Background(), func(tx store.Tx) error {
		_, err := tx.RevokeSession(hashID(id), u.now())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if n := keepalives(revoked, 100); n > 1 {
		t.Fatalf("the stream of a signed-out session sent %d more keep-alives", n)
	}
	if keepalives(kept, 3) != 3 {
		t.Fatal("another session's stream ended")
	}
	// A store that fails does not end the stream.
	flaky := u.Service.Store.(*flakyStore)
	flaky.failing.Store(true)
	if keepalives(kept, 3) != 3 {
		t.Fatal("a stream ended while the store failed")
	}
	flaky.failing.Store(false)
	advance(DefaultSessionTTL)
	if n := keepalives(kept, 100); n > 1 {
		t.Fatalf("the stream of an expired session sent %d more keep-alives", n)
	}
	// The tokens file now limits the token to one repository: the stream opened under no limit
	// ends.
	limited, _ := open()
	if keepalives(limited, 2) != 2 {
		t.Fatal("a live session's stream ended")
	}
	if err := u.Auth.ParseTokens("tokens.hcl", []byte(`token "v" {
  secret       = "`+viewerSecret+`"
  roles        = ["viewer"]
  repositories = ["acme/infra"]
}`)); err != nil {
		t.Fatal(err)
	}
	if n := keepalives(limited, 100); n > 1 {
		t.Fatalf("the stream of a session whose token was limited sent %d more keep-alives", n)
	}
}

// A stream opened with an ID token (a bearer token, no session) ends once the token expires.
func TestStreamEndsWithItsIDToken(t *testing.T) {
	old := keepalive
	keepalive = 20 * time.Millisecond
	t.Cleanup(func() { keepalive = old })
	var mu sync.Mutex
	now := time.Now()
	u := &UI{Service: service.New(storetest.OpenSQLite(t), nil), Auth: &auth.Authenticator{}, Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }}
	p := auth.Principal{Name: "github:acme/infra:run:1", Roles: []auth.Role{auth.RoleViewer}, Expires: now.Add(time.Minute)}
	mux := http.NewServeMux()
	u.Register(mux, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r.WithContext(auth.With(r.Context(), p))) })
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/ui/stream/executions", nil)
	resp, err := srv.Client().Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	keepalives := func(max int) int {
		n := 0
		for n < max && sc.Scan() {
			if strings.HasPrefix(sc.Text(), ": keepalive") {
				n++
			}
		}
		return n
	}
	if keepalives(2) != 2 {
		t.Fatal("the stream of a live token ended")
	}
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	if n := keepalives(100); n > 1 {
		t.Fatalf("the stream of an expired token sent %d more keep-alives", n)
	}
}
