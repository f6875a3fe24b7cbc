package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
)

// EnvTickDir names the directory where `run tick` records each tick for the driver that
// started the scripts (set by `run plan|apply`, one directory per script run).
const EnvTickDir = "TFSTACKPLAN_TICK_DIR"

// tickFile is the file in EnvTickDir that ticks are appended to, one JSON object a line.
const tickFile = "ticks.jsonl"

// maxTickField bounds each field of a recorded tick in bytes, so that one append stays one
// small write.
const maxTickField = 1024

// TickBudget bounds the whole online tick: building the client (minting a token included)
// and one Phase event.
const TickBudget = 2 * time.Second

// TickOptions are the inputs of one `run tick`.
type TickOptions struct {
	Phase   string
	Stack   string // "" : TFSTACKPLAN_STACK
	Status  string
	Message string
	// Getenv reads the environment (os.Getenv when nil).
	Getenv func(string) string
	// Budget bounds the online part (TickBudget when 0).
	Budget time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// tickRecord is one line of the tick file.
type tickRecord struct {
	Stack   string `json:"stack"`
	Phase   string `json:"phase"`
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
	At      int64  `json:"at"` // unix nanoseconds
}

// ErrTickUsage is returned when a tick has no phase, or no stack where it would report one.
var ErrTickUsage = errors.New("run tick needs --phase and a stack (--stack or TFSTACKPLAN_STACK)")

// Tick reports that a stack entered a phase. It reads nothing but the environment. Under the
// driver (TFSTACKPLAN_TICK_DIR set) it appends the tick to the driver's tick file and returns
// at once, touching no network: the driver relays it to the server as a Phase event, through
// its own client, breaker included, so a dead server costs a tick nothing. Without the driver
// and without a server it does nothing. Without the driver but with a server and an execution
// (scripts run by hand for an execution) it sends one Phase event within the budget. Server
// trouble never makes it fail: the returned warning (if any) says what went wrong, and only a
// missing phase, or a missing stack where there is somewhere to report it, is an error.
func Tick(ctx context.Context, o TickOptions) (warning string, err error) {
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	stack := o.Stack
	if stack == "" {
		stack = getenv(EnvStack)
	}
	if strings.TrimSpace(o.Phase) == "" {
		return "", ErrTickUsage
	}
	dir := getenv(EnvTickDir)
	server, exec := strings.TrimSpace(getenv(EnvServer)), getenv(EnvExecution)
	if dir == "" && (server == "" || exec == "") {
		return "", nil // offline: nothing to report to, so nothing to name either
	}
	if strings.TrimSpace(stack) == "" {
		return "", ErrTickUsage
	}
	if dir != "" {
		recordTick(dir, tickRecord{Stack: stack, Phase: o.Phase, Status: o.Status, Message: o.Message, At: now().UnixNano()})
		return "", nil
	}
	budget := o.Budget
	if budget <= 0 {
		budget = TickBudget
	}
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		c, err := RunClient(Environment{}, getenv)
		if err != nil {
			done <- err
			return
		}
		c.callBudget = min(c.callBudget, budget)
		done <- c.Phase(ctx, events.PhaseEvent{
			ExecutionID: exec, Stack: stack, Phase: o.Phase, Status: o.Status, Message: o.Message,
			At: now().UTC(), Seq: now().UnixNano(),
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			return "tick not reported: " + err.Error(), nil
		}
		return "", nil
	case <-ctx.Done():
		return "tick not reported: the server did not answer within " + budget.String(), nil
	}
}

// recordTick appends one line to the tick file. Failing to record is silent: the driver then
// relies on terramate's output alone.
func recordTick(dir string, r tickRecord) { _ = appendTick(dir, r) }

// appendTick appends r, each field clipped to maxTickField bytes (a rune cut in half becomes
// U+FFFD), as one line to the tick file in dir. O_APPEND and a single write keep the lines of
// concurrent ticks (parallel stacks) from interleaving; the file is its owner's alone, as a
// message may say more than a log line should.
func appendTick(dir string, r tickRecord) error {
	r.Stack, r.Phase, r.Status, r.Message = clipTick(r.Stack), clipTick(r.Phase), clipTick(r.Status), clipTick(r.Message)
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, tickFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(line, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// clipTick cuts s to maxTickField bytes.
func clipTick(s string) string { return s[:min(len(s), maxTickField)] }

// tickReader reads the tick file as it grows: each call to next returns the complete lines
// appended since the last call. Lines that do not parse are skipped. What the ticks say about
// each stack that keep accepts is summed up as they are read; the records themselves are not
// kept (a script ticking a hundred thousand times must not hold them all).
type tickReader struct {
	path   string
	off    int64
	keep   func(stack string) bool
	stacks map[string]tickSummary
}

// tickSummary is what a stack's ticks say about its status (see scriptOutcome.status).
type tickSummary struct {
	done   bool // it ticked phase done
	failed bool // it ticked a failed status
}

// add folds one tick into s.
func (s *tickSummary) add(r tickRecord) {
	switch strings.ToLower(r.Status) {
	case "failed", "failure", "error", "errored":
		s.failed = true
	}
	if r.Phase == "done" {
		s.done = true
	}
}

// newTickReader reads the tick file in dir, summing up the ticks of the stacks keep accepts.
func newTickReader(dir string, keep func(stack string) bool) *tickReader {
	return &tickReader{path: filepath.Join(dir, tickFile), keep: keep, stacks: map[string]tickSummary{}}
}

// maxTickRead bounds one read of the tick file.
const maxTickRead = 1 << 20

func (t *tickReader) next() []tickRecord {
	f, err := os.Open(t.path)
	if err != nil {
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() <= t.off {
		return nil // nothing new: no buffer, no garbage
	}
	var out []tickRecord
	buf := make([]byte, min(fi.Size()-t.off, maxTickRead))
	for {
		n, _ := f.ReadAt(buf, t.off)
		if n == 0 {
			return out
		}
		chunk := buf[:n]
		end := bytes.LastIndexByte(chunk, '\n')
		if end < 0 {
			if n == maxTickRead {
				t.off += int64(n) // a line longer than any tick: skip it
				continue
			}
			return out
		}
		for line := range bytes.SplitSeq(chunk[:end], []byte("\n")) {
			var r tickRecord
			if len(line) == 0 || json.Unmarshal(line, &r) != nil {
				continue
			}
			if t.keep(r.Stack) {
				s := t.stacks[r.Stack]
				s.add(r)
				t.stacks[r.Stack] = s
			}
			out = append(out, r)
		}
		t.off += int64(end + 1)
		if n < len(buf) || len(buf) < maxTickRead {
			return out
		}
	}
}
