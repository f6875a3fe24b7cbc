package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// failingStore fails every unit of work and ping with err.
type failingStore struct {
	store.Store
	err error
}

func (f failingStore) Read(context.Context, func(store.Tx) error) error  { return f.err }
func (f failingStore) Write(context.Context, func(store.Tx) error) error { return f.err }
func (f failingStore) Ping(context.Context) error                        { return f.err }

// loggedWith reports whether one line of logs holds both strings.
func loggedWith(logs, a, b string) bool {
	for line := range strings.Lines(logs) {
		if strings.Contains(line, a) && strings.Contains(line, b) {
			return true
		}
	}
	return false
}

// TestStoreErrorTextStaysInTheLog: a database error (driver text, table names) never reaches a
// client; the client gets a generic message with a request id, and the log has the detail under
// that id. The messages the service writes for users still reach them.
func TestStoreErrorTextStaysInTheLog(t *testing.T) {
	const secret = `relation "executions" does not exist`
	cases := []struct {
		name   string
		err    error
		status int
		public string // a message the client must see; empty: generic
	}{
		{"postgres unavailable", fmt.Errorf("%w: postgres: pq: %s", store.ErrUnavailable, secret), 503, ""},
		{"unrecognized sqlite", errors.New("sqlite: SQL logic error: " + secret + " (1)"), 500, ""},
		{"driver conflict", fmt.Errorf("%w: constraint failed: UNIQUE constraint failed: %s", store.ErrConflict, secret), 409, ""},
		{"deadline", fmt.Errorf("pq: canceling statement: %s: %w", secret, context.DeadlineExceeded), 504, ""},
		{"invalid", fmt.Errorf("%w: environment must be set", store.ErrInvalid), 400, "environment must be set"},
		{"not found", fmt.Errorf("%w: execution e1", store.ErrNotFound), 404, "execution e1"},
		{"precondition", fmt.Errorf("%w: no finalized plan", store.ErrPrecondition), 412, "no finalized plan"},
		{"denied", fmt.Errorf("%w: needs a grant", store.ErrDenied), 403, "needs a grant"},
		{"log mismatch", fmt.Errorf("%w: the log chunk of stack \"a\" at offset 7 differs", store.ErrMismatch), 409, "at offset 7 differs"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			logFile, err := os.Create(filepath.Join(t.TempDir(), "server.log"))
			if err != nil {
				t.Fatal(err)
			}
			defer logFile.Close()
			ts := newTestServer(t, failingStore{Store: storetest.OpenSQLite(t), err: tc.err}, func(c *Config) {
				c.Logger = slog.New(slog.NewTextHandler(logFile, nil))
			})
			logs := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
			for _, path := range []string{BasePath + "/executions", BasePath + "/executions/e1", "/", "/ui/claims"} {
				status, body := ts.read(t, path, tokenOf["viewer"])
				if status != tc.status || strings.Contains(body, secret) || strings.Contains(body, "pq:") || strings.Contains(body, "sqlite") {
					t.Fatalf("%s: %d %s, want %d without the driver's text", path, status, body, tc.status)
				}
				if tc.public != "" {
					if !strings.Contains(body, tc.public) {
						t.Fatalf("%s: %s lacks the service's message %q", path, body, tc.public)
					}
					continue
				}
				_, id, ok := strings.Cut(body, "request id ")
				id, _, _ = strings.Cut(id, ")")
				if !ok || id == "" || !loggedWith(logs(), "request_id="+id, "does not exist") {
					t.Fatalf("%s: %s: no request id matching a logged detail:\n%s", path, body, logs())
				}
			}
			if tc.public == "" {
				for _, path := range []string{"/readyz", BasePath + "/health"} {
					if status, body := ts.page(t, path, ""); status < 400 || strings.Contains(body, secret) {
						t.Fatalf("%s: %d %s", path, status, body)
					}
				}
			}
		})
	}
}

// readBody reads a body whole whether its Content-Length is announced (up to maxPreallocBody,
// read into a buffer of that size) or not, refuses one over the limit, and reports one shorter
// than announced.
func TestReadBody(t *testing.T) {
	big := bytes.Repeat([]byte("x"), maxPreallocBody+10)
	for _, c := range []struct {
		name    string
		body    []byte
		length  int64
		limit   int64
		wantErr string
	}{
		{"announced", []byte(`{"a":1}`), 7, 100, ""},
		{"unannounced", []byte(`{"a":1}`), -1, 100, ""},
		{"announced past the preallocation", big, int64(len(big)), 2 * maxPreallocBody, ""},
		{"over the limit", []byte(`{"a":1}`), 7, 5, "request body too large"},
		{"over the limit, unannounced", []byte(`{"a":1}`), -1, 5, "request body too large"},
		{"shorter than announced", []byte(`{"a"`), 7, 100, "unexpected EOF"},
	} {
		r := httptest.NewRequest("POST", "/", bytes.NewReader(c.body))
		r.ContentLength = c.length
		got, err := readBody(r, c.limit)
		switch {
		case c.wantErr == "" && (err != nil || !bytes.Equal(got, c.body)):
			t.Errorf("%s: %d bytes, %v; want the %d bytes", c.name, len(got), err, len(c.body))
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%s: %v, want %q", c.name, err, c.wantErr)
		}
	}
}
