package sqlstore_test

import (
	"context"
	"database/sql"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlite"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlstore"
)

// The log reads seek on SQLite: no query of a log's chunks scans log_chunks, sorts or steps
// through a log from its start (a SEARCH on the log's key alone), and a chunk's extent comes from
// the covering index, never from the table, where n comes after the data blob (reading it walks
// the blob's overflow pages).
func TestLogReadsSeekOnSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "plan.db")
	s, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	plan := func(q string, args ...any) []string {
		t.Helper()
		rows, err := db.Query("EXPLAIN QUERY PLAN "+q, args...)
		if err != nil {
			t.Fatalf("explain: %v", err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			out = append(out, detail)
		}
		return out
	}
	check := func(name string, lines []string, want string) {
		t.Helper()
		seen := false
		for _, l := range lines {
			switch {
			case strings.Contains(l, "TEMP B-TREE"):
				t.Errorf("%s sorts: %q", name, lines)
			case !strings.Contains(l, "log_chunks"):
			case !strings.HasPrefix(l, "SEARCH"):
				t.Errorf("%s scans log_chunks: %q", name, lines)
			case strings.Contains(l, want):
				seen = true
			}
		}
		if !seen {
			t.Errorf("%s: no step %q in %q", name, want, lines)
		}
	}
	extent := plan(sqlstore.LogExtentSQL, "e", "s", 1, 10, "e", "s", 1, 10, 100)
	check("extent", extent, "USING COVERING INDEX log_chunks_extent (execution_id=? AND stack=? AND generation=? AND off>? AND off<?)")
	check("extent", extent, "USING COVERING INDEX log_chunks_extent (execution_id=? AND stack=? AND generation=? AND off>?)")
	check("extent after", plan(sqlstore.LogExtentAfterSQL, "e", "s", 1, 10, 100),
		"USING COVERING INDEX log_chunks_extent (execution_id=? AND stack=? AND generation=? AND off>?)")
	check("data", plan(sqlstore.LogDataSQL, "e", "s", 1, 10, 20), "(execution_id=? AND stack=? AND generation=? AND off>? AND off<?)")
	top := int64(math.MaxInt64)
	sums := plan(sqlstore.LogSummarySQL, "e", "e", "e", top, top, "e", "e", 101)
	check("summaries", sums, "USING COVERING INDEX log_chunks_extent (execution_id=? AND stack=? AND generation=?)")
	// The next stack after another is the first index entry past it (min() stops there).
	check("summaries", sums, "(execution_id=? AND stack>?)")
	check("summaries", sums, "USING COVERING INDEX log_chunks_gaps (execution_id=? AND stack=? AND generation=?)")
}
