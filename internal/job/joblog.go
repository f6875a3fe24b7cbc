package job

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tfstackplan/tfstackplan/runner"

	"github.com/tfstackplan/tfstackplan/events"
)

// The job's own log. terramate's stream interleaves the stacks that run at once, line by line,
// with nothing saying whose a line is. In GitHub Actions, and on a terminal, the run prints
// instead one line per stack as it starts and as it ends:
//
//	[12/40] stacks/prod/db  plan  succeeded  destructive  41 s
//
// and, in Actions, each stack's own output (its log file, masked) as a collapsed group of its
// own when it ends. terramate's raw stream goes to a file; in Actions it is also printed at the
// end as one collapsed group. On a terminal a status line under the stack lines says how many
// stacks are done and which run. Anywhere else (a pipe, a file) the raw stream is printed as
// before.

// maxGroupLog bounds how much of a stack's log its group shows, and maxRawGroup how much of
// terramate's raw stream its group shows: the end of them.
const (
	maxGroupLog = 1 << 20
	maxRawGroup = 16 << 20
)

// startJobLog starts the job's own log of one script run, in Actions and on a terminal: it
// returns the file terramate's stream goes to instead of the job's output, and the jobLog the
// script watcher and the tick relay tell of each stack (nil, nil elsewhere, or when the file
// cannot be made: the stream is then printed as it comes).
func (r *run) startJobLog(step string) (*os.File, *jobLog) {
	if !r.gh.Actions && !r.o.Terminal {
		return nil, nil
	}
	raw, err := os.CreateTemp("", "tfstackplan-terramate-"+safeFileWord(r.o.Environment)+"-"+step+"-*.log")
	if err != nil {
		r.warn("terramate's output goes to the job's log as it comes: %v", err)
		return nil, nil
	}
	masker := r.masker // shared with the log pump: what its logs announce is masked here too
	jl := &jobLog{
		w: r.out, step: step, total: len(r.paths), actions: r.gh.Actions, terminal: r.o.Terminal && !r.gh.Actions, now: r.now,
		started: map[string]time.Time{}, ended: map[string]bool{}, masker: masker,
		logOf: func(stack string) ([]byte, int64) {
			file, err := r.root.StackFile(stack, r.o.LogFile)
			if err != nil {
				return nil, 0
			}
			return maskedTail(masker, file, maxGroupLog)
		},
	}
	if !r.gh.Actions {
		fmt.Fprintf(r.out, "tfstackplan: terramate's own output: %s\n", raw.Name())
	}
	return raw, jl
}

// jobLog prints the per-stack lines of one script run.
type jobLog struct {
	w        io.Writer
	step     string // the script run's step: plan or apply
	total    int
	actions  bool // print each stack's log as a group, with workflow commands
	terminal bool // keep a live status line under the stack lines
	now      func() time.Time
	// logOf returns the masked end of a stack's log, and how many bytes were left out before it.
	logOf func(stack string) ([]byte, int64)
	// masker masks what the job log prints of the scripts' output.
	masker *runner.Masker

	mu      sync.Mutex
	started map[string]time.Time
	ended   map[string]bool
	status  string // the status line on screen ("" : none)
}

// start notes that stack (root-relative) started.
func (j *jobLog) start(stack string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.started[stack]; ok {
		return
	}
	j.started[stack] = j.now()
	j.say(fmt.Sprintf("[%*s/%d] %s  %s  started", len(fmt.Sprint(j.total)), "", j.total, stack, j.step))
}

// end notes that stack ended with status (and class, when known) and prints its line (and, in
// Actions, its log).
func (j *jobLog) end(stack, status string, class events.Class) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.ended[stack] {
		return
	}
	j.ended[stack] = true
	began, ok := j.started[stack]
	if !ok {
		began = j.now()
		j.started[stack] = began
	}
	line := fmt.Sprintf("[%*d/%d] %s  %s  %s", len(fmt.Sprint(j.total)), len(j.ended), j.total, stack, j.step, status)
	if class != "" {
		line += "  " + string(class)
	}
	line += fmt.Sprintf("  %d s", int(j.now().Sub(began).Round(time.Second)/time.Second))
	j.say(line)
	if !j.actions {
		return
	}
	log, skipped := j.logOf(stack)
	fmt.Fprintf(j.w, "::group::%s (%s, %s)\n", stack, j.step, status)
	if skipped > 0 {
		fmt.Fprintf(j.w, "(the first %d bytes of the log are left out)\n", skipped)
	}
	writeUncommanded(j.w, log)
	fmt.Fprintln(j.w, "::endgroup::")
}

// finish ends every stack that started and has not ended, with its status and class from
// endOf (a stack that never ticked done ends when terramate does).
func (j *jobLog) finish(endOf func(stack string) (string, events.Class)) {
	j.mu.Lock()
	var open []string
	for s := range j.started {
		if !j.ended[s] {
			open = append(open, s)
		}
	}
	j.mu.Unlock()
	sort.Strings(open)
	for _, s := range open {
		status, class := endOf(s)
		j.end(s, status, class)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.clearStatus()
}

// say prints a stack line (under the status line, on a terminal); j.mu is held.
func (j *jobLog) say(line string) {
	j.clearStatus()
	fmt.Fprintln(j.w, line)
	if !j.terminal {
		return
	}
	var running []string
	for s := range j.started {
		if !j.ended[s] {
			running = append(running, s)
		}
	}
	sort.Strings(running)
	more := ""
	if len(running) > 3 {
		more = fmt.Sprintf(" (+%d)", len(running)-3)
		running = running[:3]
	}
	j.status = fmt.Sprintf("%d/%d done; running: %s%s", len(j.ended), j.total, strings.Join(running, ", "), more)
	fmt.Fprint(j.w, j.status)
}

// clearStatus erases the status line; j.mu is held.
func (j *jobLog) clearStatus() {
	if j.status != "" {
		fmt.Fprint(j.w, "\r\x1b[K")
		j.status = ""
	}
}

// writeUncommanded writes b so that no line of it is taken for a workflow command
// (::stop-commands:: with a random token around it), ending it with a newline.
func writeUncommanded(w io.Writer, b []byte) {
	resume := randomDelimiter()
	fmt.Fprintf(w, "::stop-commands::%s\n", resume)
	_, _ = w.Write(b)
	if len(b) > 0 && b[len(b)-1] != '\n' {
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "::%s::\n", resume)
}

// maskedTail returns the last n bytes of the file at path masked by m, and how many bytes come
// before them. The bytes before are read too, for the values their `::add-mask::` lines
// announce.
func maskedTail(m *runner.Masker, path string, n int64) ([]byte, int64) {
	b, skipped := tailOfFile(path, n)
	if skipped > 0 {
		if f, err := os.Open(path); err == nil {
			buf := make([]byte, 1<<20)
			for left := skipped; left > 0; {
				k, err := f.Read(buf[:min(int64(len(buf)), left)])
				m.Mask(buf[:k])
				left -= int64(k)
				if err != nil {
					break
				}
			}
			f.Close()
		}
	}
	return m.Mask(b), skipped
}

// tailOfFile returns the last n bytes of the file at path and how many bytes come before them
// (nil when it cannot be read).
func tailOfFile(path string, n int64) ([]byte, int64) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, 0
	}
	skipped := max(fi.Size()-n, 0)
	if _, err := f.Seek(skipped, io.SeekStart); err != nil {
		return nil, 0
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return b, skipped
}
