package sqlstore

import (
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// The PR-level state: latest plans, claims, gates, grants, leases, checks and the audit log.

func (t *sqlTx) LatestPlan(k store.PRKey) (*store.Execution, error) {
	e, err := scanExecution(t.row("SELECT "+execReadCols+" FROM executions WHERE repo = ? AND environment = ? AND pr = ? AND op = 'plan' "+
		"ORDER BY received_at DESC, id DESC LIMIT 1", k.Repo, k.Environment, k.PR))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: no plan for %s PR #%d in %q", store.ErrNotFound, k.Repo, k.PR, k.Environment)
	}
	return e, t.s.mapErr(err)
}

func (t *sqlTx) StampExecution(id, principal string, at time.Time) error {
	n, err := t.exec("UPDATE executions SET principal = ?, received_at = ? WHERE id = ?", principal, ns(at), id)
	if err == nil && n == 0 {
		err = fmt.Errorf("%w: execution %q", store.ErrNotFound, id)
	}
	return err
}

func (t *sqlTx) ExecutionPrincipal(id string) (string, string, error) {
	var p, repo string
	err := t.row("SELECT principal, repo FROM executions WHERE id = ?", id).Scan(&p, &repo)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", fmt.Errorf("%w: execution %q", store.ErrNotFound, id)
	}
	return p, repo, t.s.mapErr(err)
}

const claimSelect = "SELECT repo, environment, stack, pr, execution_id, sha, claimed_at, expires_at FROM claims WHERE (expires_at = 0 OR expires_at > ?)"

func (t *sqlTx) Claims(repo, env string, now time.Time) ([]api.Claim, error) {
	q := claimSelect
	args := []any{ns(now)}
	if repo != "" {
		q += " AND repo = ?"
		args = append(args, repo)
	}
	if env != "" {
		q += " AND environment = ?"
		args = append(args, env)
	}
	return t.scanClaims(nil, q+" ORDER BY repo, environment, stack", args...)
}

func (t *sqlTx) ClaimsOn(k store.PRKey, stacks []string, now time.Time) ([]api.Claim, error) {
	var out []api.Claim
	var err error
	if k.PR != 0 {
		if out, err = t.scanClaims(out, claimSelect+" AND repo = ? AND environment = ? AND pr = ?", ns(now), k.Repo, k.Environment, k.PR); err != nil {
			return nil, err
		}
	}
	names := slices.Compact(slices.Sorted(slices.Values(stacks)))
	err = inLists(names, func(list string, args []any) error {
		out, err = t.scanClaims(out, claimSelect+" AND repo = ? AND environment = ? AND stack IN "+list, append([]any{ns(now), k.Repo, k.Environment}, args...)...)
		return err
	})
	if err != nil {
		return nil, err
	}
	// A claim of the PR on one of stacks came twice.
	slices.SortFunc(out, func(a, b api.Claim) int { return strings.Compare(a.Stack, b.Stack) })
	return slices.CompactFunc(out, func(a, b api.Claim) bool { return a.Stack == b.Stack }), nil
}

// scanClaims appends the claims a query of claimSelect's columns returns to out.
func (t *sqlTx) scanClaims(out []api.Claim, q string, args ...any) ([]api.Claim, error) {
	rows, err := t.query(q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var c api.Claim
		var claimed, expires int64
		if err := rows.Scan(&c.Repo, &c.Environment, &c.Stack, &c.PR, &c.ExecutionID, &c.SHA, &claimed, &expires); err != nil {
			return nil, t.s.mapErr(err)
		}
		c.ClaimedAt, c.ExpiresAt = tm(claimed), tm(expires)
		out = append(out, c)
	}
	return out, t.s.mapErr(rows.Err())
}

func (t *sqlTx) PutClaim(c api.Claim) error {
	_, err := t.exec("INSERT INTO claims (repo, environment, stack, pr, execution_id, sha, claimed_at, expires_at) VALUES (?,?,?,?,?,?,?,?) "+
		"ON CONFLICT (repo, environment, stack) DO UPDATE SET pr = excluded.pr, execution_id = excluded.execution_id, "+
		"sha = excluded.sha, claimed_at = excluded.claimed_at, expires_at = excluded.expires_at",
		c.Repo, c.Environment, c.Stack, c.PR, c.ExecutionID, c.SHA, ns(c.ClaimedAt), ns(c.ExpiresAt))
	return err
}

func (t *sqlTx) ReleaseClaims(k store.PRKey, stack string) (int64, error) {
	if stack != "" {
		return t.exec("DELETE FROM claims WHERE repo = ? AND environment = ? AND pr = ? AND stack = ?", k.Repo, k.Environment, k.PR, stack)
	}
	return t.exec("DELETE FROM claims WHERE repo = ? AND environment = ? AND pr = ?", k.Repo, k.Environment, k.PR)
}

func (t *sqlTx) ReplaceGates(k store.PRKey, gates []api.Gate) error {
	if _, err := t.exec("DELETE FROM gates WHERE repo = ? AND environment = ? AND pr = ?", k.Repo, k.Environment, k.PR); err != nil {
		return err
	}
	for _, g := range gates {
		if _, err := t.exec("INSERT INTO gates (repo, environment, pr, execution_id, class, target, stacks, required_at) VALUES (?,?,?,?,?,?,?,?)",
			k.Repo, k.Environment, k.PR, g.ExecutionID, g.Class, g.Target, toJSON(g.Stacks), ns(g.RequiredAt)); err != nil {
			return err
		}
	}
	return nil
}

// whereClause is a WHERE clause made of only the conditions a listing was given. A condition
// its own argument switches off in SQL, like (? = 0 OR pr = ?), keeps SQLite from using the
// index on its column: every listing scanned its whole table.
type whereClause struct {
	conds []string
	args  []any
	fixed map[string]bool // the columns eq set
}

// eq adds col = v when given.
func (w *whereClause) eq(given bool, col string, v any) {
	if given {
		w.conds = append(w.conds, col+" = ?")
		w.args = append(w.args, v)
		if w.fixed == nil {
			w.fixed = map[string]bool{}
		}
		w.fixed[col] = true
	}
}

// String is the clause, empty when no condition was given.
func (w *whereClause) String() string {
	if len(w.conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(w.conds, " AND ")
}

// page makes the clause select one page of a list ordered by the columns order, all descending
// (newest first: a time or an id, then a key that makes the order total): it adds the
// condition of the rows after the row whose values of order are after (none when after is nil),
// and returns the ORDER BY and LIMIT (none when limit is 0) to append to the query with their
// arguments. The columns eq fixed are left out of both: equal in every row selected, they change
// neither the order nor what comes after a row of the list, and without them the condition is a
// range of the index that holds the list's rows by those fixed columns and then the others, read
// backwards from there in its order.
func (w *whereClause) page(order []string, after []any, limit int) (string, []any) {
	var cols []string
	var vals []any
	for i, c := range order {
		if !w.fixed[c] {
			cols = append(cols, c)
			if after != nil {
				vals = append(vals, after[i])
			}
		}
	}
	switch {
	case after != nil && len(cols) == 1:
		w.conds = append(w.conds, cols[0]+" < ?")
		w.args = append(w.args, vals...)
	case after != nil: // a row value: (a, b) < (?, ?) is a < ? OR a = ? AND b < ?
		w.conds = append(w.conds, "("+strings.Join(cols, ", ")+") < (?"+strings.Repeat(", ?", len(cols)-1)+")")
		w.args = append(w.args, vals...)
	}
	tail := " ORDER BY " + strings.Join(cols, " DESC, ") + " DESC"
	if limit <= 0 {
		return tail, nil
	}
	return tail + " LIMIT ?", []any{limit}
}

// listPage returns the WHERE, ORDER BY and LIMIT of one page of a gates or checks list, f's
// rows in the order of the columns order (the list's time, repository, environment, PR, then as
// many names as the list's rows have), and their arguments.
func listPage(f store.ListFilter, order ...string) (string, []any, error) {
	var w whereClause
	w.eq(f.Repo != "", "repo", f.Repo)
	w.eq(f.Environment != "", "environment", f.Environment)
	w.eq(f.PR != 0, "pr", f.PR)
	var after []any
	if k := f.After; k != nil {
		switch {
		case len(k.Names) != len(order)-4:
			return "", nil, fmt.Errorf("%w: a row of this list has %d names, not %d", store.ErrInvalid, len(order)-4, len(k.Names))
		case f.Repo != "" && k.Repo != f.Repo, f.Environment != "" && k.Environment != f.Environment, f.PR != 0 && k.PR != f.PR:
			return "", nil, fmt.Errorf("%w: the row to list after (repository %q, environment %q, PR %d) is not one of the list's", store.ErrInvalid, k.Repo, k.Environment, k.PR)
		}
		after = []any{ns(k.At), k.Repo, k.Environment, k.PR}
		for _, n := range k.Names {
			after = append(after, n)
		}
	}
	tail, targs := w.page(order, after, f.Limit)
	return w.String() + tail, append(w.args, targs...), nil
}

// maxInList bounds the IN list of one query; shorter lists are padded to a power of two so
// that only a few distinct statements are prepared.
const maxInList = 256

// inLists calls fn for consecutive parts of names (at most maxInList each, padded with the
// part's last name), with the part's IN list "(?,?,...)" and its arguments.
func inLists(names []string, fn func(list string, args []any) error) error {
	for rest := names; len(rest) > 0; {
		k := min(len(rest), maxInList)
		size := 1
		for size < k {
			size *= 2
		}
		args := make([]any, size)
		for i := range args {
			args[i] = rest[min(i, k-1)]
		}
		if err := fn("(?"+strings.Repeat(",?", size-1)+")", args); err != nil {
			return err
		}
		rest = rest[k:]
	}
	return nil
}

func (t *sqlTx) Gates(f store.ListFilter) ([]api.Gate, error) {
	clause, args, err := listPage(f, "required_at", "repo", "environment", "pr", "class", "target")
	if err != nil {
		return nil, err
	}
	rows, err := t.query("SELECT repo, environment, pr, execution_id, class, target, stacks, required_at FROM gates"+clause, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []api.Gate
	for rows.Next() {
		var g api.Gate
		var stacks string
		var required int64
		if err := rows.Scan(&g.Repo, &g.Environment, &g.PR, &g.ExecutionID, &g.Class, &g.Target, &stacks, &required); err != nil {
			return nil, t.s.mapErr(err)
		}
		g.RequiredAt = tm(required)
		fromJSON(stacks, &g.Stacks)
		out = append(out, g)
	}
	return out, t.s.mapErr(rows.Err())
}

func (t *sqlTx) AddGrant(g api.Grant) (int64, error) {
	var id int64
	err := t.row("INSERT INTO grants (repo, environment, pr, class, target, principal, reason, granted_at, expires_at, released_at, released_by, execution_id, stacks) "+
		"VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) RETURNING id",
		g.Repo, g.Environment, g.PR, g.Class, g.Target, g.Principal, g.Reason, ns(g.GrantedAt), ns(g.ExpiresAt), ns(g.ReleasedAt), g.ReleasedBy,
		g.ExecutionID, toJSON(g.Stacks)).Scan(&id)
	return id, t.s.mapErr(err)
}

func (t *sqlTx) Grants(f store.GrantFilter) ([]api.Grant, error) {
	var w whereClause
	w.eq(f.Repo != "", "repo", f.Repo)
	w.eq(f.Environment != "", "environment", f.Environment)
	w.eq(f.PR != 0, "pr", f.PR)
	w.eq(f.Class != "", "class", f.Class)
	w.eq(f.Target != "", "target", f.Target)
	if !f.ActiveAt.IsZero() {
		w.conds = append(w.conds, "released_at = 0", "(expires_at = 0 OR expires_at > ?)")
		w.args = append(w.args, ns(f.ActiveAt))
	}
	var after []any
	if f.Before > 0 {
		after = []any{f.Before}
	}
	tail, targs := w.page([]string{"id"}, after, f.Limit)
	rows, err := t.query("SELECT id, repo, environment, pr, class, target, principal, reason, granted_at, expires_at, released_at, released_by, execution_id, stacks FROM grants"+
		w.String()+tail, append(w.args, targs...)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []api.Grant
	for rows.Next() {
		var g api.Grant
		var granted, expires, released int64
		var stacks string
		if err := rows.Scan(&g.ID, &g.Repo, &g.Environment, &g.PR, &g.Class, &g.Target, &g.Principal, &g.Reason,
			&granted, &expires, &released, &g.ReleasedBy, &g.ExecutionID, &stacks); err != nil {
			return nil, t.s.mapErr(err)
		}
		g.GrantedAt, g.ExpiresAt, g.ReleasedAt = tm(granted), tm(expires), tm(released)
		fromJSON(stacks, &g.Stacks)
		out = append(out, g)
	}
	return out, t.s.mapErr(rows.Err())
}

func (t *sqlTx) ReleaseGrants(k store.PRKey, class, target, by string, at time.Time) (int64, error) {
	return t.exec("UPDATE grants SET released_at = ?, released_by = ? WHERE repo = ? AND environment = ? AND pr = ? AND class = ? AND target = ? "+
		"AND released_at = 0 AND (expires_at = 0 OR expires_at > ?)", ns(at), by, k.Repo, k.Environment, k.PR, class, target, ns(at))
}

func (t *sqlTx) ReleaseGrantIDs(ids []int64, by string, at time.Time) (int64, error) {
	var total int64
	for _, id := range ids {
		n, err := t.exec("UPDATE grants SET released_at = ?, released_by = ? WHERE id = ? AND released_at = 0 AND (expires_at = 0 OR expires_at > ?)",
			ns(at), by, id, ns(at))
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

func (t *sqlTx) ReleaseExecutionClaims(env, execID, stack string) (int64, error) {
	var w whereClause
	w.eq(true, "environment", env)
	w.eq(true, "execution_id", execID)
	w.eq(stack != "", "stack", stack)
	return t.exec("DELETE FROM claims"+w.String(), w.args...)
}

const leaseCols = "execution_id, environment, pr, requester, outcome, granted_at, expires_at, revoked_at, " +
	"principal, sha, plan_id, grant_ids, member, bound, unbind_attempts, unbind_error, repo"

func scanLease(sc interface{ Scan(...any) error }) (*store.Lease, error) {
	var l store.Lease
	var granted, expires, revoked, bound int64
	var grants string
	if err := sc.Scan(&l.ExecutionID, &l.Environment, &l.PR, &l.Requester, &l.Outcome, &granted, &expires, &revoked,
		&l.Principal, &l.SHA, &l.PlanID, &grants, &l.Member, &bound, &l.UnbindAttempts, &l.UnbindError, &l.Repo); err != nil {
		return nil, err
	}
	l.GrantedAt, l.ExpiresAt, l.RevokedAt, l.Bound = tm(granted), tm(expires), tm(revoked), bound != 0
	fromJSON(grants, &l.GrantIDs)
	return &l, nil
}

func (t *sqlTx) Lease(execID string) (*store.Lease, error) {
	l, err := scanLease(t.row("SELECT "+leaseCols+" FROM leases WHERE execution_id = ?", execID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: lease for execution %q", store.ErrNotFound, execID)
	}
	return l, t.s.mapErr(err)
}

func (t *sqlTx) PutLease(l store.Lease) error {
	grants := l.GrantIDs
	if grants == nil {
		grants = []int64{}
	}
	_, err := t.exec("INSERT INTO leases ("+leaseCols+") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) "+
		"ON CONFLICT (execution_id) DO UPDATE SET environment = excluded.environment, pr = excluded.pr, requester = excluded.requester, "+
		"outcome = excluded.outcome, granted_at = excluded.granted_at, expires_at = excluded.expires_at, revoked_at = excluded.revoked_at, "+
		"principal = excluded.principal, sha = excluded.sha, plan_id = excluded.plan_id, grant_ids = excluded.grant_ids, "+
		"member = excluded.member, bound = excluded.bound, unbind_attempts = excluded.unbind_attempts, unbind_error = excluded.unbind_error, "+
		"repo = excluded.repo",
		l.ExecutionID, l.Environment, l.PR, l.Requester, l.Outcome, ns(l.GrantedAt), ns(l.ExpiresAt), ns(l.RevokedAt),
		l.Principal, l.SHA, l.PlanID, toJSON(grants), l.Member, b2i(l.Bound), l.UnbindAttempts, l.UnbindError, l.Repo)
	return err
}

func (t *sqlTx) LeasesToUnbind(now time.Time, limit int) ([]store.Lease, error) {
	rows, err := t.query("SELECT "+leaseCols+" FROM leases WHERE bound = 1 AND (revoked_at > 0 OR expires_at <= ?) "+
		"ORDER BY unbind_attempts, expires_at LIMIT ?", ns(now), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Lease
	for rows.Next() {
		l, err := scanLease(rows)
		if err != nil {
			return nil, t.s.mapErr(err)
		}
		out = append(out, *l)
	}
	return out, t.s.mapErr(rows.Err())
}

func (t *sqlTx) PutCheck(c api.Check) error {
	_, err := t.exec("INSERT INTO checks (repo, environment, pr, name, conclusion, overridden, reason, updated_at) VALUES (?,?,?,?,?,?,?,?) "+
		"ON CONFLICT (repo, environment, pr, name) DO UPDATE SET conclusion = excluded.conclusion, overridden = excluded.overridden, "+
		"reason = excluded.reason, updated_at = excluded.updated_at",
		c.Repo, c.Environment, c.PR, c.Check, c.Conclusion, b2i(c.Overridden), c.Reason, ns(c.UpdatedAt))
	return err
}

func (t *sqlTx) scanChecks(q string, args ...any) ([]api.Check, error) {
	rows, err := t.query(q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []api.Check
	for rows.Next() {
		var c api.Check
		var overridden, updated int64
		if err := rows.Scan(&c.Repo, &c.Environment, &c.PR, &c.Check, &c.Conclusion, &overridden, &c.Reason, &updated); err != nil {
			return nil, t.s.mapErr(err)
		}
		c.Overridden, c.UpdatedAt = overridden != 0, tm(updated)
		out = append(out, c)
	}
	return out, t.s.mapErr(rows.Err())
}

const checkSelect = "SELECT repo, environment, pr, name, conclusion, overridden, reason, updated_at FROM checks"

func (t *sqlTx) Check(k store.PRKey, name string) (*api.Check, error) {
	cs, err := t.scanChecks(checkSelect+" WHERE repo = ? AND environment = ? AND pr = ? AND name = ?", k.Repo, k.Environment, k.PR, name)
	if err != nil {
		return nil, err
	}
	if len(cs) == 0 {
		return nil, fmt.Errorf("%w: check %q of %s PR #%d in %q", store.ErrNotFound, name, k.Repo, k.PR, k.Environment)
	}
	return &cs[0], nil
}

func (t *sqlTx) Checks(f store.ListFilter) ([]api.Check, error) {
	clause, args, err := listPage(f, "updated_at", "repo", "environment", "pr", "name")
	if err != nil {
		return nil, err
	}
	return t.scanChecks(checkSelect+clause, args...)
}

func (t *sqlTx) AddAudit(e api.AuditEntry) (int64, error) {
	var id int64
	err := t.row("INSERT INTO audit (at, principal, repo, action, target, reason, outcome, detail) VALUES (?,?,?,?,?,?,?,?) RETURNING id",
		ns(e.At), e.Principal, e.Repo, e.Action, e.Target, e.Reason, e.Outcome, e.Detail).Scan(&id)
	return id, t.s.mapErr(err)
}

func (t *sqlTx) Audit(repo string, limit int, before int64) ([]api.AuditEntry, error) {
	if limit <= 0 {
		limit = 100
	}
	var w whereClause
	w.eq(repo != "", "repo", repo)
	if before > 0 { // a page after the first: a range of the primary key, not a scan from the newest
		w.conds = append(w.conds, "id < ?")
		w.args = append(w.args, before)
	}
	rows, err := t.query("SELECT id, at, principal, repo, action, target, reason, outcome, detail FROM audit"+w.String()+" ORDER BY id DESC LIMIT ?",
		append(w.args, limit)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []api.AuditEntry
	for rows.Next() {
		var e api.AuditEntry
		var at int64
		if err := rows.Scan(&e.ID, &at, &e.Principal, &e.Repo, &e.Action, &e.Target, &e.Reason, &e.Outcome, &e.Detail); err != nil {
			return nil, t.s.mapErr(err)
		}
		e.At = tm(at)
		out = append(out, e)
	}
	return out, t.s.mapErr(rows.Err())
}

func (t *sqlTx) LeasesOfPlans(planIDs []string) ([]store.Lease, error) {
	ids := slices.Compact(slices.Sorted(slices.Values(planIDs)))
	var out []store.Lease
	err := inLists(ids, func(list string, args []any) error {
		rows, err := t.query("SELECT "+leaseCols+" FROM leases WHERE plan_id IN "+list+" ORDER BY granted_at, execution_id", args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			l, err := scanLease(rows)
			if err != nil {
				return t.s.mapErr(err)
			}
			out = append(out, *l)
		}
		return t.s.mapErr(rows.Err())
	})
	return out, err
}
