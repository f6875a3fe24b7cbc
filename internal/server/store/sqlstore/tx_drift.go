package sqlstore

import (
	"github.com/tfstackplan/tfstackplan/internal/api"
)

const driftCols = "repo, environment, stack, execution_id, checked_at, status, drifted, class, counts"

// driftParams is the number of driftCols.
const driftParams = 9

func driftArgs(c api.DriftCheck) []any {
	return []any{c.Repo, c.Environment, c.Stack, c.ExecutionID, ns(c.CheckedAt), string(c.Status), b2i(c.Drifted), string(c.Class), toJSON(c.Counts)}
}

func (t *sqlTx) AddDriftChecks(cs []api.DriftCheck) error {
	return inParts(len(cs), driftParams, func(from, to int, values string) error {
		args := make([]any, 0, driftParams*(to-from))
		for _, c := range cs[from:to] {
			args = append(args, driftArgs(c)...)
		}
		if _, err := t.exec("INSERT INTO drift_checks ("+driftCols+") "+values+
			" ON CONFLICT (repo, environment, stack, execution_id) DO NOTHING", args...); err != nil {
			return err
		}
		// A check finalized late (a slow run) does not hide a later one already recorded.
		_, err := t.exec("INSERT INTO drift_latest ("+driftCols+") "+values+
			" ON CONFLICT (repo, environment, stack) DO UPDATE SET execution_id = excluded.execution_id, "+
			"checked_at = excluded.checked_at, status = excluded.status, drifted = excluded.drifted, "+
			"class = excluded.class, counts = excluded.counts WHERE excluded.checked_at >= drift_latest.checked_at", args...)
		return err
	})
}

func (t *sqlTx) LatestDrift(repo, env string) ([]api.DriftCheck, error) {
	if repo == "" {
		return t.scanDrift("SELECT "+driftCols+" FROM drift_latest WHERE environment = ? ORDER BY repo, stack", env)
	}
	return t.scanDrift("SELECT "+driftCols+" FROM drift_latest WHERE repo = ? AND environment = ? ORDER BY stack", repo, env)
}

func (t *sqlTx) DriftHistory(repo, env, stack string, limit int) ([]api.DriftCheck, error) {
	return t.scanDrift("SELECT "+driftCols+" FROM drift_checks WHERE repo = ? AND environment = ? AND stack = ? "+
		"ORDER BY checked_at DESC, execution_id DESC LIMIT ?", repo, env, stack, limit)
}

// scanDrift lists the drift checks a query of driftCols returns.
func (t *sqlTx) scanDrift(q string, args ...any) ([]api.DriftCheck, error) {
	rows, err := t.query(q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []api.DriftCheck
	for rows.Next() {
		var c api.DriftCheck
		var checked, drifted int64
		var status, class, counts string
		if err := rows.Scan(&c.Repo, &c.Environment, &c.Stack, &c.ExecutionID, &checked, &status, &drifted, &class, &counts); err != nil {
			return nil, t.s.mapErr(err)
		}
		c.CheckedAt, c.Status, c.Drifted, c.Class = tm(checked), api.StackStatus(status), drifted != 0, api.Class(class)
		fromJSON(counts, &c.Counts)
		out = append(out, c)
	}
	return out, t.s.mapErr(rows.Err())
}
