package sqlstore

// Log chunks: batches, resends, reads and summaries of the stacks' logs.

import (
	"cmp"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

func (t *sqlTx) AddLogBatch(execID string, cs []store.LogChunk) (store.EventState, []string, int64, error) {
	cs, err := normalizeBatch(cs)
	if err != nil {
		return store.EventState{}, nil, 0, err
	}
	if t.s.d.WritableCTE {
		st, missing, added, overlaps, err := t.addLogBatchCTE(execID, cs)
		if err != nil || len(missing) > 0 || !overlaps {
			return st, missing, added, err
		}
		if t.tx == nil {
			return st, nil, 0, errNeedsTransaction
		}
		added, err = t.addChecked(execID, cs)
		return st, nil, added, err
	}
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.Stack
	}
	st, missing, err := t.logTarget(execID, names)
	if err != nil || len(missing) > 0 {
		return st, missing, 0, err
	}
	overlaps, err := t.logOverlaps(execID, cs)
	if err != nil {
		return st, nil, 0, err
	}
	var added int64
	if overlaps {
		added, err = t.addChecked(execID, cs)
	} else {
		added, err = t.addRuns(cs)
	}
	return st, nil, added, err
}

// addRuns stores the chunks cs (sorted by stack, generation and offset) as the rows of joinRuns,
// each row once, and returns how many of cs the rows it inserted hold.
func (t *sqlTx) addRuns(cs []store.LogChunk) (int64, error) {
	rows, counts := joinRuns(cs)
	type key struct {
		stack      string
		generation int64
		off        int64
	}
	count := make(map[key]int64, len(rows))
	for i, r := range rows {
		count[key{r.Stack, r.Generation, r.Offset}] = counts[i]
	}
	var added int64
	err := inParts(len(rows), 7, func(from, to int, values string) error {
		args := make([]any, 0, 7*(to-from))
		for _, c := range rows[from:to] {
			args = append(args, chunkArgs(c)...)
		}
		res, err := t.query(chunkInsert+values+chunkConflict+" RETURNING stack, generation, off", args...)
		if err != nil {
			return err
		}
		defer res.Close()
		for res.Next() {
			var k key
			if err := res.Scan(&k.stack, &k.generation, &k.off); err != nil {
				return t.s.mapErr(err)
			}
			added += count[k]
		}
		return t.s.mapErr(res.Err())
	})
	return added, err
}

// logOverlaps reports whether some chunk of cs (normalized) may overlap the stored log
// (overlapProbeSQL over probeSpans), in a statement per maxRowsPerInsert spans.
func (t *sqlTx) logOverlaps(execID string, cs []store.LogChunk) (bool, error) {
	found := false
	stacks, gens, offs, lens := probeSpans(cs)
	err := inParts(len(stacks), 4, func(from, to int, values string) error {
		if found {
			return nil
		}
		args := make([]any, 0, 4*(to-from)+1)
		for i := from; i < to; i++ {
			args = append(args, stacks[i], gens[i], offs[i], lens[i])
		}
		args = append(args, execID)
		rows, err := t.query("WITH c (stack, generation, off, n) AS ("+values+") SELECT 1 FROM c WHERE "+overlapProbeSQL+" LIMIT 1", args...)
		if err != nil {
			return err
		}
		found = rows.Next()
		rows.Close()
		return t.s.mapErr(rows.Err())
	})
	return found, err
}

// logBatchSQL is the statement of addLogBatchCTE: the execution's state (e), the chunks (c, one
// array a column), the stacks the execution lacks (m), whether some chunk may overlap the stored
// log (o), and the insert (w), which stores nothing when m or o has a row.
const logBatchSQL = "WITH e AS (" + eventStateSQL + "), " +
	"c AS (SELECT * FROM unnest(CAST(? AS TEXT[]), CAST(? AS BIGINT[]), CAST(? AS BIGINT[]), CAST(? AS BYTEA[]), CAST(? AS BIGINT[]), CAST(? AS BIGINT[]), CAST(? AS BIGINT[])) " +
	"AS c (stack, generation, off, data, n, gap_length, k)), " +
	"m AS (SELECT DISTINCT c.stack FROM c WHERE NOT EXISTS (SELECT 1 FROM stacks s WHERE s.execution_id = ? AND s.stack = c.stack)), " +
	"o AS (SELECT 1 FROM unnest(CAST(? AS TEXT[]), CAST(? AS BIGINT[]), CAST(? AS BIGINT[]), CAST(? AS BIGINT[])) AS c (stack, generation, off, n) " +
	"WHERE " + overlapProbeSQL + " LIMIT 1), " +
	"w AS (INSERT INTO log_chunks (execution_id, stack, generation, off, data, n, gap_length) " +
	"SELECT CAST(? AS TEXT), c.stack, c.generation, c.off, c.data, c.n, c.gap_length FROM c, e WHERE NOT EXISTS (SELECT 1 FROM m) AND NOT EXISTS (SELECT 1 FROM o)" +
	chunkConflict + " RETURNING stack, generation, off) " +
	"SELECT e.cancelled, e.cancel_reason, e.finalized, (SELECT COALESCE(SUM(c.k), 0) FROM w JOIN c USING (stack, generation, off)), " +
	"(SELECT json_agg(stack ORDER BY stack) FROM m), (SELECT COUNT(*) FROM o) FROM e"

// addLogBatchCTE is AddLogBatch in one statement: the chunks travel as one array a column. It
// stores nothing, and reports overlaps, when some chunk may overlap the stored log
// (overlapProbeSQL over probeSpans).
func (t *sqlTx) addLogBatchCTE(execID string, cs []store.LogChunk) (store.EventState, []string, int64, bool, error) {
	rows, counts := joinRuns(cs)
	n := len(rows)
	stacks, data := make([]string, n), make([][]byte, n)
	gens, offs, sizes, gaps := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, c := range rows {
		a := chunkArgs(c)
		stacks[i], gens[i], offs[i], data[i], sizes[i], gaps[i] = c.Stack, c.Generation, c.Offset, a[4].([]byte), a[5].(int64), c.GapLength
	}
	pStacks, pGens, pOffs, pLens := probeSpans(cs)
	var st store.EventState
	var cancelled, finalized, added, overlaps int64
	var missingJSON sql.NullString
	err := t.row(logBatchSQL,
		execID, stacks, gens, offs, data, sizes, gaps, counts, execID, pStacks, pGens, pOffs, pLens, execID, execID).Scan(&cancelled, &st.CancelReason, &finalized, &added, &missingJSON, &overlaps)
	if errors.Is(err, sql.ErrNoRows) {
		return st, nil, 0, false, fmt.Errorf("%w: execution %q", store.ErrNotFound, execID)
	}
	if err != nil {
		return st, nil, 0, false, t.s.mapErr(err)
	}
	st.Cancelled, st.Finalized = cancelled != 0, finalized != 0
	var missing []string
	if missingJSON.Valid {
		if err := json.Unmarshal([]byte(missingJSON.String), &missing); err != nil {
			return st, nil, 0, false, fmt.Errorf("%w: missing stacks %q: %v", store.ErrUnavailable, missingJSON.String, err)
		}
	}
	return st, missing, added, overlaps > 0, nil
}

// maxNamesPerQuery bounds the IN list of one logTarget query; shorter lists are padded to a
// power of two so that only a few distinct statements are prepared.
const maxNamesPerQuery = 64

// logTarget returns execID's state, read without locking, and the names among stacks (sorted,
// once each) it has no stack of, or ErrNotFound.
func (t *sqlTx) logTarget(execID string, stacks []string) (store.EventState, []string, error) {
	var st store.EventState
	want := append([]string(nil), stacks...)
	sort.Strings(want)
	want = slices.Compact(want)
	known := make(map[string]bool, len(want))
	rest := want
	for first := true; first || len(rest) > 0; first = false {
		k := min(len(rest), maxNamesPerQuery)
		size := 1
		for size < k {
			size *= 2
		}
		args := make([]any, 0, size+1)
		for i := range size {
			name := ""
			if k > 0 {
				name = rest[min(i, k-1)]
			}
			args = append(args, name)
		}
		args = append(args, execID)
		rows, err := t.query("SELECT e.cancelled, e.cancel_reason, e.finalized, s.stack FROM executions e "+
			"LEFT JOIN stacks s ON s.execution_id = e.id AND s.stack IN (?"+strings.Repeat(",?", size-1)+") WHERE e.id = ?", args...)
		if err != nil {
			return st, nil, err
		}
		found := false
		for rows.Next() {
			var cancelled, finalized int64
			var name sql.NullString
			if err := rows.Scan(&cancelled, &st.CancelReason, &finalized, &name); err != nil {
				rows.Close()
				return st, nil, t.s.mapErr(err)
			}
			found = true
			st.Cancelled, st.Finalized = cancelled != 0, finalized != 0
			if name.Valid {
				known[name.String] = true
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return st, nil, t.s.mapErr(err)
		}
		if !found {
			return st, nil, fmt.Errorf("%w: execution %q", store.ErrNotFound, execID)
		}
		rest = rest[k:]
	}
	var missing []string
	for _, name := range want {
		if !known[name] {
			missing = append(missing, name)
		}
	}
	return st, missing, nil
}

func chunkArgs(c store.LogChunk) []any {
	size := int64(len(c.Data))
	if c.GapLength > 0 {
		size = c.GapLength
	}
	data := c.Data
	if data == nil {
		data = []byte{}
	}
	return []any{c.ExecutionID, c.Stack, c.Generation, c.Offset, data, size, c.GapLength}
}

const chunkInsert = "INSERT INTO log_chunks (execution_id, stack, generation, off, data, n, gap_length) "
const chunkConflict = " ON CONFLICT (execution_id, stack, generation, off) DO NOTHING"

func (t *sqlTx) AddLogChunk(c store.LogChunk) (bool, error) {
	n, err := t.exec(chunkInsert+values(7)+chunkConflict, chunkArgs(c)...)
	return n > 0, err
}

// maxRowsPerInsert keeps multi-row inserts to a few distinct (cacheable) statements.
const maxRowsPerInsert = 64

// inParts calls fn for consecutive parts [from, to) of n rows, at most maxRowsPerInsert each,
// with the VALUES clause of the part's rows of params parameters each.
func inParts(n, params int, fn func(from, to int, values string) error) error {
	row := "(?" + strings.Repeat(",?", params-1) + ")"
	for from := 0; from < n; from += maxRowsPerInsert {
		to := min(from+maxRowsPerInsert, n)
		if err := fn(from, to, "VALUES "+strings.Repeat(row+",", to-from-1)+row); err != nil {
			return err
		}
	}
	return nil
}

func (t *sqlTx) AddLogChunks(cs []store.LogChunk) (int64, error) {
	var added int64
	err := inParts(len(cs), 7, func(from, to int, values string) error {
		args := make([]any, 0, 7*(to-from))
		for _, c := range cs[from:to] {
			args = append(args, chunkArgs(c)...)
		}
		n, err := t.exec(chunkInsert+values+chunkConflict, args...)
		added += n
		return err
	})
	return added, err
}

// chunkEndSQL is the offset just past a log_chunks row c, saturating at its two arguments
// (math.MaxInt64): rows stored before offsets were bounded may reach past int64, and neither
// backend may compute c.off + c.n then (PostgreSQL fails, SQLite turns it into a float).
const chunkEndSQL = "CASE WHEN c.off < 0 OR c.n < 0 THEN c.off WHEN c.n > ? - c.off THEN ? ELSE c.off + c.n END"

// addSat is a + b for b >= 0, saturating at math.MaxInt64.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// logExtentSQL lists where the chunks of one generation around an offset start and how far they
// reach, from the covering index log_chunks_extent alone (no data is read): the chunk that starts
// last before the offset, then at most a given number of those that start at it or later.
const logExtentSQL = "SELECT off, n, gap_length FROM (SELECT off, n, gap_length FROM log_chunks " +
	"WHERE execution_id = ? AND stack = ? AND generation = ? AND off >= 0 AND off < ? ORDER BY off DESC LIMIT 1) p " +
	"UNION ALL SELECT off, n, gap_length FROM (SELECT off, n, gap_length FROM log_chunks " +
	"WHERE execution_id = ? AND stack = ? AND generation = ? AND off >= ? ORDER BY off LIMIT ?) f"

// logExtentAfterSQL is logExtentSQL for the chunks that start after an offset.
const logExtentAfterSQL = "SELECT off, n, gap_length FROM log_chunks WHERE execution_id = ? AND stack = ? AND generation = ? AND off > ? ORDER BY off LIMIT ?"

// logDataSQL reads the data of the chunks of one generation starting in [from, to].
const logDataSQL = "SELECT off, data FROM log_chunks WHERE execution_id = ? AND stack = ? AND generation = ? AND off >= ? AND off <= ? ORDER BY off"

func (t *sqlTx) LogChunks(execID, stack string, generation, from int64, maxBytes, maxRows int) ([]store.LogChunk, error) {
	from = max(from, 0)
	return t.logChunks(execID, stack, generation, from, maxBytes, maxRows,
		logExtentSQL, execID, stack, generation, from, execID, stack, generation, from, max(maxRows, 1))
}

func (t *sqlTx) LogChunksAfter(execID, stack string, generation, after int64, maxBytes, maxRows int) ([]store.LogChunk, error) {
	if after == math.MaxInt64 {
		return nil, nil
	}
	after = max(after, -1)
	return t.logChunks(execID, stack, generation, after+1, maxBytes, maxRows,
		logExtentAfterSQL, execID, stack, generation, after, max(maxRows, 1))
}

// logChunks reads the extents the query selects and keeps, in offset order, those that reach past
// from (a chunk starting before from only when it does), up to maxBytes of data or maxRows chunks;
// then it reads the data of the data chunks kept, and of no other.
func (t *sqlTx) logChunks(execID, stack string, generation, from int64, maxBytes, maxRows int, query string, args ...any) ([]store.LogChunk, error) {
	maxRows = max(maxRows, 1)
	rows, err := t.query(query, args...)
	if err != nil {
		return nil, err
	}
	type extent struct{ off, n, gap int64 }
	var ext []extent
	for rows.Next() {
		var e extent
		if err := rows.Scan(&e.off, &e.n, &e.gap); err != nil {
			rows.Close()
			return nil, t.s.mapErr(err)
		}
		ext = append(ext, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, t.s.mapErr(err)
	}
	slices.SortFunc(ext, func(a, b extent) int { return cmp.Compare(a.off, b.off) })
	var out []store.LogChunk
	total := 0
	first, last := int64(-1), int64(-1) // the data chunks kept
	for _, e := range ext {
		if len(out) >= maxRows || total >= maxBytes {
			break
		}
		if e.off < from && e.n <= from-e.off { // off + n may be past math.MaxInt64 (rows stored before offsets were bounded)
			continue
		}
		out = append(out, store.LogChunk{ExecutionID: execID, Stack: stack, Generation: generation, Offset: e.off, GapLength: e.gap})
		if e.gap <= 0 {
			total += int(min(max(e.n, 0), math.MaxInt32))
			if first < 0 {
				first = e.off
			}
			last = e.off
		}
	}
	if first < 0 {
		return out, nil
	}
	data, err := t.query(logDataSQL, execID, stack, generation, first, last)
	if err != nil {
		return nil, err
	}
	defer data.Close()
	byOff := make(map[int64][]byte, len(out))
	for data.Next() {
		var off int64
		var b []byte
		if err := data.Scan(&off, &b); err != nil {
			return nil, t.s.mapErr(err)
		}
		byOff[off] = b
	}
	if err := data.Err(); err != nil {
		return nil, t.s.mapErr(err)
	}
	// A chunk that went between the two reads (pruned: each statement of a PostgreSQL read may see
	// newer commits) ends the chunks here, as a hole would.
	for i := range out {
		if out[i].GapLength > 0 {
			continue
		}
		b, ok := byOff[out[i].Offset]
		if !ok {
			return out[:i], nil
		}
		out[i].Data = b
	}
	return out, nil
}

func (t *sqlTx) LatestGeneration(execID, stack string) (int64, error) {
	var g sql.NullInt64
	err := t.row("SELECT MAX(generation) FROM log_chunks WHERE execution_id = ? AND stack = ?", execID, stack).Scan(&g)
	return g.Int64, t.s.mapErr(err)
}

// logStacksSQL walks the stacks an execution has logs of, one index seek each (a loose index scan:
// GROUP BY would read every chunk), with the latest generation of each.
const logStacksSQL = "WITH RECURSIVE s(stack) AS (SELECT MIN(stack) FROM log_chunks WHERE execution_id = ? " +
	"UNION ALL SELECT (SELECT MIN(c.stack) FROM log_chunks c WHERE c.execution_id = ? AND c.stack > s.stack) FROM s WHERE s.stack IS NOT NULL), " +
	"g AS (SELECT s.stack, (SELECT MAX(c.generation) FROM log_chunks c WHERE c.execution_id = ? AND c.stack = s.stack) AS generation " +
	"FROM s WHERE s.stack IS NOT NULL) "

// logSummarySQL is each stack's latest generation, where its last chunk ends (one seek of the
// covering index, where the greatest end of every chunk would read them all) and its first gap
// records up to a given number ("offset,length" separated by spaces), read from the gap index.
const logSummarySQL = logStacksSQL + "SELECT g.stack, g.generation, (SELECT " + chunkEndSQL + " FROM log_chunks c " +
	"WHERE c.execution_id = ? AND c.stack = g.stack AND c.generation = g.generation ORDER BY c.off DESC LIMIT 1), " +
	"(SELECT string_agg(CAST(x.off AS TEXT) || ',' || CAST(x.gap_length AS TEXT), ' ') FROM (SELECT c.off, c.gap_length FROM log_chunks c " +
	"WHERE c.execution_id = ? AND c.stack = g.stack AND c.generation = g.generation AND c.gap_length > 0 ORDER BY c.off LIMIT ?) x) FROM g"

func (t *sqlTx) LogSummaries(execID string, maxGaps int) ([]store.LogSummary, error) {
	maxGaps = max(maxGaps, 0)
	rows, err := t.query(logSummarySQL, execID, execID, execID, int64(math.MaxInt64), int64(math.MaxInt64), execID, execID, maxGaps+1)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.LogSummary
	for rows.Next() {
		var s store.LogSummary
		var gaps sql.NullString
		if err := rows.Scan(&s.Stack, &s.Generation, &s.Bytes, &gaps); err != nil {
			return nil, t.s.mapErr(err)
		}
		for _, g := range strings.Fields(gaps.String) {
			off, length, _ := strings.Cut(g, ",")
			from, err1 := strconv.ParseInt(off, 10, 64)
			n, err2 := strconv.ParseInt(length, 10, 64)
			if err := cmp.Or(err1, err2); err != nil {
				return nil, fmt.Errorf("%w: gap %q of stack %q: %v", store.ErrUnavailable, g, s.Stack, err)
			}
			s.Gaps = append(s.Gaps, api.LogGap{Generation: s.Generation, From: from, To: addSat(from, n)})
		}
		slices.SortFunc(s.Gaps, func(a, b api.LogGap) int { return cmp.Compare(a.From, b.From) })
		if len(s.Gaps) > maxGaps {
			s.Gaps, s.GapsTruncated = s.Gaps[:maxGaps], true
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, t.s.mapErr(err)
	}
	slices.SortFunc(out, func(a, b store.LogSummary) int { return strings.Compare(a.Stack, b.Stack) })
	return out, nil
}

func (t *sqlTx) StackSpans(execID string, stacks []string) (map[string]store.Span, error) {
	out := map[string]store.Span{}
	read := func(where string, args ...any) error {
		rows, err := t.query("SELECT stack, MIN(at), MAX(at) FROM phases WHERE execution_id = ? AND at > 0"+where+" GROUP BY stack", args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var stack string
			var first, last int64
			if err := rows.Scan(&stack, &first, &last); err != nil {
				return t.s.mapErr(err)
			}
			out[stack] = store.Span{First: tm(first), Last: tm(last)}
		}
		return t.s.mapErr(rows.Err())
	}
	if stacks == nil {
		return out, read("", execID)
	}
	return out, inLists(slices.Compact(slices.Sorted(slices.Values(stacks))), func(list string, args []any) error {
		return read(" AND stack IN "+list, append([]any{execID}, args...)...)
	})
}
