package runner

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/gauth"
)

// strictCtx is the context of an operator's call named op.
func strictCtx(op string) context.Context {
	return WithCallOptions(context.Background(), CallOptions{Strict: true, Op: op})
}

// A strict call is tried once and named as its caller says; the same call best-effort is
// retried. Both give the one APIError, its message safe for a terminal.
func TestStrictCallIsTriedOnceAndNamed(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"code":"UNAVAILABLE","message":"down\u001b[8m"}`)
	}))
	t.Cleanup(srv.Close)
	c := fastClient(t, srv.URL)
	c.sleep = func(context.Context, time.Duration) error { return nil }

	_, err := c.ExecutionsList(strictCtx("executions list"), &api.ExecutionsListParams{})
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusServiceUnavailable || ae.Op != "executions list" {
		t.Fatalf("strict: err %v, want the 503 named executions list", err)
	}
	if got := err.Error(); got != "executions list: the server failed (HTTP 503): down?[8m" {
		t.Fatalf("strict: message %q", got)
	}
	if got := n.Load(); got != 1 {
		t.Fatalf("strict: %d attempts, want 1", got)
	}

	n.Store(0)
	if _, err = c.ExecutionsList(context.Background(), &api.ExecutionsListParams{}); !errors.As(err, &ae) || ae.Op != "ExecutionsList" {
		t.Fatalf("best-effort: err %v", err)
	}
	if got := err.Error(); got != "ExecutionsList: the server failed (HTTP 503): down?[8m (UNAVAILABLE)" {
		t.Fatalf("best-effort: message %q, want the code after it", got)
	}
	if got := n.Load(); got != MaxAttempts {
		t.Fatalf("best-effort: %d attempts, want %d", got, MaxAttempts)
	}
}

// A strict call is neither stopped by an open breaker nor counted by it.
func TestStrictCallIsNotBehindTheBreaker(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `[]`)
	}))
	t.Cleanup(srv.Close)
	c := fastClient(t, srv.URL)
	for range BreakerThreshold {
		c.breaker.failure()
	}
	if !c.Unreachable() {
		t.Fatal("the breaker did not open")
	}
	if _, err := c.ExecutionsList(context.Background(), &api.ExecutionsListParams{}); !errors.Is(err, ErrCircuitOpen) {
		t.Fatalf("best-effort behind an open breaker: %v, want ErrCircuitOpen", err)
	}
	list, err := c.ExecutionsList(strictCtx("executions list"), &api.ExecutionsListParams{})
	if err != nil || list == nil {
		t.Fatalf("strict behind an open breaker: %v %v", list, err)
	}
	if !c.Unreachable() {
		t.Fatal("a strict call's success closed the breaker: it must not feed it")
	}
}

// A strict call refuses a redirect to another host with a RedirectError, and the other host
// never sees the token; a best-effort call takes the redirect as a non-2xx answer.
func TestStrictCallRefusesRedirectsElsewhere(t *testing.T) {
	var leaked atomic.Bool
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaked.Store(leaked.Load() || r.Header.Get("Authorization") != "")
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `[]`)
	}))
	t.Cleanup(other.Close)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(srv.Close)
	c, err := NewClientTokenSource(srv.URL, gauth.Static("secret-token"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.GatesList(strictCtx("gates list"), &api.GatesListParams{})
	var re *RedirectError
	var te *TransportError
	if !errors.As(err, &re) || !errors.As(err, &te) || !strings.Contains(err.Error(), "not followed: credentials go only to "+srv.URL) {
		t.Fatalf("strict: err %v, want a refused redirect", err)
	}
	_, err = c.GatesList(context.Background(), &api.GatesListParams{})
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusTemporaryRedirect {
		t.Fatalf("best-effort: err %v, want the 307 as the answer", err)
	}
	if leaked.Load() {
		t.Fatal("the token reached another host")
	}
}
