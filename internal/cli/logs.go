package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/termsafe"
	"github.com/tfstackplan/tfstackplan/runner"
)

// Bounds of the --follow poll interval: it starts at the minimum, doubles while nothing new
// arrives, and drops back to the minimum when something does.
const (
	DefaultLogsPollMin = 250 * time.Millisecond
	DefaultLogsPollMax = 2 * time.Second
)

// LogsOptions are the options of `tfstackplan logs`.
type LogsOptions struct {
	IO        *IO
	Conn      ConnOptions
	Execution string
	Stack     string
	// Follow keeps reading until the execution is finalized.
	Follow bool
	// Generation reads that generation of the log; nil: the latest (and, with Follow, the ones
	// that replace it).
	Generation *int64
	// PollMin and PollMax bound the --follow poll interval (0: the defaults).
	PollMin, PollMax time.Duration
	// Signals ends --follow (nil: the process's SIGINT and SIGTERM).
	Signals <-chan os.Signal
}

func newLogsCmd(ios *IO, runF RunFunc[LogsOptions]) *cobra.Command {
	opts := &LogsOptions{IO: ios}
	var generation int64
	cmd := &cobra.Command{
		Use:   "logs EXECUTION STACK [--follow] [--generation N]",
		Short: "Print a stack's log as the server has it",
		Long: "logs prints the bytes of one stack's log of an execution, as the runner posted them\n" +
			"(masked), on stdout. Bytes the server never received are reported on stderr as\n" +
			"\"[N bytes missing]\". --follow keeps polling until the execution is finalized (the runner\n" +
			"posts every stack's log before it finalizes), or until interrupted; a log that restarts\n" +
			"(the file was truncated or recreated) is followed into its new generation.",
		Args: usageArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Execution, opts.Stack = args[0], args[1]
			if cmd.Flags().Changed("generation") {
				opts.Generation = &generation
			}
			return runWith(cmd.Context(), runF, runLogs, opts)
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&opts.Follow, "follow", "f", false, "keep printing new bytes until the execution is finalized")
	f.Int64Var(&generation, "generation", 0, "read this generation of the log (default: the latest)")
	addConnFlags(f, &opts.Conn)
	return cmd
}

func runLogs(ctx context.Context, opts *LogsOptions) error {
	var genErr error
	if opts.Generation != nil && *opts.Generation < 0 {
		genErr = Usagef("--generation must not be negative (got %d)", *opts.Generation)
	}
	checks := []error{requireFlag("execution", opts.Execution), requireFlag("stack", opts.Stack), genErr}
	return operate(ctx, &opts.Conn, checks, func(ctx context.Context, c *opClient) error {
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		if opts.Follow {
			stop := watchSignals(opts.Signals, cancel)
			defer stop()
		}
		err := followLog(ctx, c, opts)
		var se *SignalError
		if errors.As(context.Cause(ctx), &se) {
			// Interrupting --follow is how it is meant to end: exit 128+signal, without a message.
			return errors.Join(ErrSilent, se)
		}
		return err
	})
}

// watchSignals cancels with a SignalError on the first of sigs (nil: SIGINT and SIGTERM); the
// returned function stops watching.
func watchSignals(sigs <-chan os.Signal, cancel context.CancelCauseFunc) func() {
	var unnotify func()
	if sigs == nil {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
		sigs, unnotify = ch, func() { signal.Stop(ch) }
	}
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			cancel(&SignalError{Signal: s})
		case <-done:
		}
	}()
	return func() {
		close(done)
		if unnotify != nil {
			unnotify()
		}
	}
}

// logReader reads one stack's log from where it got to.
type logReader struct {
	c      *opClient
	opts   *LogsOptions
	id     string
	stack  string
	gen    int64
	known  bool // gen is set: by --generation, or learned from the first read
	offset int64
}

// followLog prints the stack's log; with Follow, until the execution is finalized.
func followLog(ctx context.Context, c *opClient, opts *LogsOptions) error {
	e, err := getExecution(ctx, c, "logs", opts.Execution)
	if err != nil {
		return err
	}
	stack, err := resolveStack(e, opts.Stack)
	if err != nil {
		return err
	}
	r := &logReader{c: c, opts: opts, id: opts.Execution, stack: stack}
	if opts.Generation != nil {
		r.gen, r.known = *opts.Generation, true
	}
	pollMin, pollMax := opts.PollMin, opts.PollMax
	if pollMin <= 0 {
		pollMin = DefaultLogsPollMin
	}
	if pollMax < pollMin {
		pollMax = max(pollMin, DefaultLogsPollMax)
	}
	interval := pollMin
	finalized := false
	for {
		progressed, err := r.drain(ctx)
		if err != nil || !opts.Follow || finalized {
			return err
		}
		if e, err = getExecution(ctx, c, "logs", opts.Execution); err != nil {
			return err
		}
		// Read once more after the execution is seen finalized: bytes posted before the
		// finalize may have arrived after the last read.
		finalized = !e.FinishedAt.IsZero()
		if opts.Generation == nil {
			if st := stackState(e, stack); st != nil && st.LogGeneration > r.gen {
				if _, err := r.drain(ctx); err != nil {
					return err
				}
				fmt.Fprintf(opts.IO.ErrOut, "[log restarted: generation %d]\n", st.LogGeneration)
				r.gen, r.offset = st.LogGeneration, 0
				continue
			}
		}
		if finalized {
			continue
		}
		if progressed {
			interval = pollMin
		} else {
			interval = min(interval*2, pollMax)
		}
		select {
		case <-time.After(interval):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// drain prints everything the server has from the reader's offset on, and reports whether
// there was anything.
func (r *logReader) drain(ctx context.Context) (bool, error) {
	progressed := false
	for {
		s, err := r.read(ctx)
		if err != nil {
			return progressed, err
		}
		if !r.known {
			r.gen, r.known = s.Generation, true
		}
		// A gap the server stepped over is always at the start of the slice.
		for _, g := range s.Gaps {
			if from, to := max(g.From, r.offset), min(g.To, s.NextOffset); to > from {
				fmt.Fprintf(r.opts.IO.ErrOut, "[%d bytes missing]\n", to-from)
			}
		}
		if len(s.Data) > 0 {
			if _, err := r.opts.IO.Out.Write(s.Data); err != nil {
				return progressed, err
			}
		}
		if s.NextOffset <= r.offset {
			return progressed, nil
		}
		r.offset, progressed = s.NextOffset, true
	}
}

// read asks for the bytes from the reader's offset.
func (r *logReader) read(ctx context.Context) (*api.LogSlice, error) {
	params := api.LogReadParams{Stack: r.stack, Generation: r.gen, Offset: r.offset}
	return opCall(ctx, r.c, "logs", func(ctx context.Context, rc *runner.Client) (*api.LogSlice, error) {
		return rc.LogRead(ctx, r.id, params, !r.known)
	})
}

// resolveStack finds the stack of e that name means, with or without a leading slash (as
// terramate prints stacks). An execution that lists no stacks takes the name as it is.
func resolveStack(e *api.Execution, name string) (string, error) {
	if len(e.Stacks) == 0 {
		return name, nil
	}
	names := make([]string, 0, len(e.Stacks))
	for _, st := range e.Stacks {
		if st.Stack == name {
			return name, nil
		}
		names = append(names, st.Stack)
	}
	for _, st := range e.Stacks {
		if strings.TrimPrefix(st.Stack, "/") == strings.TrimPrefix(name, "/") {
			return st.Stack, nil
		}
	}
	return "", fmt.Errorf("logs: execution %s has no stack %q (its stacks: %s)", e.ExecutionID, name, termsafe.Line(strings.Join(names, ", ")))
}

func stackState(e *api.Execution, stack string) *api.StackState {
	for i := range e.Stacks {
		if e.Stacks[i].Stack == stack {
			return &e.Stacks[i]
		}
	}
	return nil
}
