package service

import (
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// The lists of gates, grants and checks are read a page at a time, newest first (the
// contract's PageLimit).
const (
	// DefaultPageLimit is how many rows a page holds when the request does not say.
	DefaultPageLimit = 100
	// MaxPageLimit is the most rows a page may hold.
	MaxPageLimit = 500
)

// Page selects one page of a list of gates, grants or checks: the rows of Repo, Environment
// and PR (zero values: any; Repo as the request names it, see Caller.ReadRepo), at most Limit
// of them (1 to MaxPageLimit).
type Page struct {
	Repo        string
	Environment string
	PR          int
	Limit       int
}

func (p Page) check() error {
	_, err := Limit(&p.Limit, DefaultPageLimit, MaxPageLimit)
	return err
}

// The pages of GET /executions and GET /audit (the contract's limits of each).
const (
	DefaultExecutionsLimit = 50
	MaxExecutionsLimit     = 500
	DefaultAuditLimit      = 100
	MaxAuditLimit          = 1000
)

// Limit is the limit a request asks for (rows of a page, bytes of a log read): def when it
// names none; one out of 1 to max is invalid.
func Limit(limit *int, def, max int) (int, error) {
	switch {
	case limit == nil:
		return def, nil
	case *limit < 1 || *limit > max:
		return 0, invalid("limit %d is out of range (1 to %d)", *limit, max)
	}
	return *limit, nil
}

// scoped is p with its repository as caller may read it (Caller.ReadRepo).
func (p Page) scoped(caller Caller) (Page, error) {
	if err := p.check(); err != nil {
		return p, err
	}
	var err error
	if p.Repo, err = caller.ReadRepo(p.Repo); err != nil {
		return p, err
	}
	return p, checkPRFilter(p.Repo, p.PR)
}

// after is the store's filter of the page of a gates or checks list, of the repositories caller
// may read, that comes after the row whose cursor is before (empty: the first page); the list's
// rows have names names after their repository, environment and PR (gates: class and target;
// checks: the check's name).
func (p Page) after(caller Caller, before string, names int) (store.ListFilter, error) {
	p, err := p.scoped(caller)
	f := store.ListFilter{Repo: p.Repo, Environment: p.Environment, PR: p.PR, Limit: p.Limit}
	if err != nil || before == "" {
		return f, err
	}
	k, ok := parseCursor(before)
	if ok && len(k.Names) == names {
		// Made by a client, a cursor may hold what no row does: a NUL byte (which PostgreSQL
		// refuses to compare) or megabytes of text.
		for _, v := range append([]string{k.Repo, k.Environment}, k.Names...) {
			ok = ok && checkText("before", v, MaxNameLen) == nil
		}
	}
	if !ok || len(k.Names) != names {
		return f, invalid("before %q is not a cursor of this list (the cursor field of one of its rows)", clip(before, 100))
	}
	if p.Repo != "" && k.Repo != p.Repo || p.Environment != "" && k.Environment != p.Environment || p.PR != 0 && k.PR != p.PR {
		return f, invalid("before is the cursor of a row of repository %q, environment %q, PR %d: not one of this list's",
			clip(k.Repo, 100), clip(k.Environment, 100), k.PR)
	}
	f.After = &k
	return f, nil
}

// cursor is what a cursor holds: a row's place in its list (store.RowKey).
type cursor struct {
	At          int64    `json:"at"` // Unix nanoseconds, 0 for the zero time
	Repo        string   `json:"repo"`
	Environment string   `json:"environment"`
	PR          int      `json:"pr"`
	Names       []string `json:"names"`
}

// cursorOf is the cursor of the place k: JSON in unpadded base64url (safe in a query string
// as it is), opaque to clients.
func cursorOf(k store.RowKey) string {
	c := cursor{Repo: k.Repo, Environment: k.Environment, PR: k.PR, Names: k.Names}
	if !k.At.IsZero() {
		c.At = k.At.UnixNano()
	}
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

// parseCursor returns the place a cursor stands for; ok is false unless s is exactly what
// cursorOf makes of some place.
func parseCursor(s string) (k store.RowKey, ok bool) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	var c cursor
	if err != nil || json.Unmarshal(b, &c) != nil {
		return k, false
	}
	k = store.RowKey{Repo: c.Repo, Environment: c.Environment, PR: c.PR, Names: c.Names}
	if c.At != 0 {
		k.At = time.Unix(0, c.At).UTC()
	}
	return k, cursorOf(k) == s
}

// ExecutionsAfter is f paged as a request asks: before, the started_at of the previous page's
// last execution, and beforeID, its id (nil: not in the request). The zero before is the zero
// started_at, as listed, when beforeID is given; alone it is outside the times the server
// stores, and refused. A beforeID that is not an execution id, or is given without before, is
// refused.
func ExecutionsAfter(f store.ExecutionFilter, before *time.Time, beforeID *string) (store.ExecutionFilter, error) {
	if before != nil && before.IsZero() && beforeID == nil {
		return f, invalid("before %s is outside %s to %s, the times the server stores (the zero time is a place in the list only with before_id)",
			before.UTC().Format(time.RFC3339), minTime.Format(time.DateOnly), MaxTime.Format(time.DateOnly))
	}
	if before != nil {
		if err := checkTime("before", *before); err != nil {
			return f, err
		}
		f.Before = *before
	}
	if beforeID == nil {
		return f, nil
	}
	if err := checkName("before_id", *beforeID); err != nil {
		return f, err
	}
	if before == nil {
		return f, invalid("before_id needs before: the started_at of the execution before_id names, as listed")
	}
	f.BeforeID = *beforeID
	return f, nil
}
