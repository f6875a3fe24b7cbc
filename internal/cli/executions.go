package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/termsafe"
	"github.com/tfstackplan/tfstackplan/runner"
)

// MaxExecutionsLimit is the most executions one `executions list` asks for (the API's bound).
const MaxExecutionsLimit = 500

// ExecutionsListOptions are the options of `tfstackplan executions list`.
type ExecutionsListOptions struct {
	IO   *IO
	Conn ConnOptions
	// Repo, Environment and PR filter the executions (empty, 0: all; Repo see
	// ConnOptions.repoOr).
	Repo        string
	Environment string
	PR          int
	// Limit is how many of the newest executions to list (1 to MaxExecutionsLimit).
	Limit int
	JSON  bool
}

// ExecutionsShowOptions are the options of `tfstackplan executions show`.
type ExecutionsShowOptions struct {
	IO        *IO
	Conn      ConnOptions
	Execution string
	JSON      bool
}

func newExecutionsCmd(ios *IO) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "executions",
		Short: "List executions and show one with its stacks",
	}
	cmd.AddCommand(newExecutionsListCmd(ios, nil), newExecutionsShowCmd(ios, nil))
	return cmd
}

func newExecutionsListCmd(ios *IO, runF RunFunc[ExecutionsListOptions]) *cobra.Command {
	opts := &ExecutionsListOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "list [--repo OWNER/NAME] [--environment ENV] [--pr N] [--limit N] [--json]",
		Short: "List executions, newest first",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runWith(cmd.Context(), runF, runExecutionsList, opts)
		},
	}
	f := cmd.Flags()
	addRepoFlag(f, &opts.Repo)
	f.StringVarP(&opts.Environment, "environment", "e", "", "only this environment's executions")
	f.IntVar(&opts.PR, "pr", 0, "only this pull request's executions")
	f.IntVar(&opts.Limit, "limit", 50, fmt.Sprintf("how many executions (at most %d)", MaxExecutionsLimit))
	f.BoolVar(&opts.JSON, "json", false, "print JSON instead of a table")
	addConnFlags(f, &opts.Conn)
	return cmd
}

func runExecutionsList(ctx context.Context, opts *ExecutionsListOptions) error {
	var limitErr, prErr error
	if opts.Limit < 1 || opts.Limit > MaxExecutionsLimit {
		limitErr = Usagef("--limit must be between 1 and %d (got %d)", MaxExecutionsLimit, opts.Limit)
	}
	if opts.PR < 0 {
		prErr = Usagef("--pr must be a pull request number (got %d)", opts.PR)
	}
	repo, repoErr := opts.Conn.repoOr(opts.Repo)
	return operate(ctx, &opts.Conn, []error{limitErr, prErr, repoErr}, func(ctx context.Context, c *opClient) error {
		params := &api.ExecutionsListParams{Repo: repo, Environment: opts.Environment, Pr: opts.PR, Limit: &opts.Limit}
		list, err := opCall(ctx, c, "executions list", func(ctx context.Context, rc *runner.Client) ([]api.Execution, error) {
			return rc.ExecutionsList(ctx, params)
		})
		if err != nil {
			return err
		}
		if opts.JSON {
			return writeJSON(opts.IO.Out, list)
		}
		if len(list) == 0 {
			fmt.Fprintln(opts.IO.ErrOut, "no executions")
			return nil
		}
		t := newTable(opts.IO.Out)
		row(t, "EXECUTION", "REPOSITORY", "ENVIRONMENT", "PR", "OP", "STATUS", "CLASS", "CHANGES", "STARTED", "DURATION", "ACTOR")
		for _, e := range list {
			row(t, e.ExecutionID, e.Repo, e.Environment, prCell(e.PR), string(e.Op), string(e.Status), string(e.Class),
				countsCell(e.Counts), stamp(e.StartedAt), duration(e.StartedAt, e.FinishedAt), e.Actor)
		}
		return t.Flush()
	})
}

func newExecutionsShowCmd(ios *IO, runF RunFunc[ExecutionsShowOptions]) *cobra.Command {
	opts := &ExecutionsShowOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "show EXECUTION [--json]",
		Short: "Show an execution: its stacks with status, class, changes, phase and plan hash; edges; error",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Execution = args[0]
			return runWith(cmd.Context(), runF, runExecutionsShow, opts)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&opts.JSON, "json", false, "print JSON instead of a table")
	addConnFlags(f, &opts.Conn)
	return cmd
}

func runExecutionsShow(ctx context.Context, opts *ExecutionsShowOptions) error {
	return operate(ctx, &opts.Conn, []error{requireFlag("execution", opts.Execution)}, func(ctx context.Context, c *opClient) error {
		e, err := getExecution(ctx, c, "executions show", opts.Execution)
		if err != nil {
			return err
		}
		if opts.JSON {
			return writeJSON(opts.IO.Out, e)
		}
		return writeExecution(opts.IO.Out, e)
	})
}

// getExecution reads one execution with its stacks.
func getExecution(ctx context.Context, c *opClient, op, id string) (*api.Execution, error) {
	return opCall(ctx, c, op, func(ctx context.Context, rc *runner.Client) (*api.Execution, error) {
		return rc.ExecutionGet(ctx, id)
	})
}

// writeExecution prints an execution: its fields, a table of its stacks, its edges, and the
// errors of the execution and its stacks.
func writeExecution(w io.Writer, e *api.Execution) error {
	t := newTable(w)
	field := func(name, value string) {
		if value != "" {
			row(t, name, value)
		}
	}
	field("execution", e.ExecutionID)
	field("environment", e.Environment)
	field("pr", prCell(e.PR))
	field("op", string(e.Op))
	field("status", string(e.Status))
	field("class", string(e.Class))
	field("changes", countsCell(e.Counts))
	field("repo", e.Repo)
	field("sha", e.SHA)
	field("actor", e.Actor)
	field("run", e.RunURL)
	field("started", stamp(e.StartedAt))
	field("finished", stamp(e.FinishedAt))
	field("cancelled", e.CancelReason)
	if err := t.Flush(); err != nil {
		return err
	}
	if len(e.Stacks) > 0 {
		fmt.Fprintln(w)
		t = newTable(w)
		row(t, "STACK", "STATUS", "CLASS", "CHANGES", "PHASE", "PLAN", "LOG")
		for _, st := range e.Stacks {
			row(t, st.Stack, string(st.Status), string(st.Class), countsCell(st.Counts), st.Phase, short(st.PlanHash, 15), logCell(st))
		}
		if err := t.Flush(); err != nil {
			return err
		}
	}
	if len(e.Edges) > 0 {
		title := "edges (from runs before to):"
		if e.EdgesApproximate {
			title = "edges (from runs before to; approximate: derived from stack metadata, or not all of them):"
		}
		fmt.Fprintln(w, "\n"+title)
		for _, ed := range e.Edges {
			fmt.Fprintf(w, "  %s -> %s\n", termsafe.Line(ed.From), termsafe.Line(ed.To))
		}
	}
	if e.Error != "" {
		fmt.Fprintln(w, "\nerror:")
		fmt.Fprintln(w, indent(termsafe.Text(e.Error), "  "))
	}
	for _, st := range e.Stacks {
		if st.Error != "" {
			fmt.Fprintf(w, "\nerror of stack %s:\n%s\n", termsafe.Line(st.Stack), indent(termsafe.Text(st.Error), "  "))
		}
	}
	return nil
}

// logCell is the size of a stack's latest log generation, with its generation and gaps when
// there are any.
func logCell(st api.StackState) string {
	if st.LogBytes == 0 && st.LogGeneration == 0 && len(st.Gaps) == 0 {
		return ""
	}
	s := strconv.FormatInt(st.LogBytes, 10) + " B"
	if st.LogGeneration > 0 {
		s += fmt.Sprintf(" gen %d", st.LogGeneration)
	}
	switch {
	case st.GapsTruncated:
		s += fmt.Sprintf(" (%d+ gaps)", len(st.Gaps))
	case len(st.Gaps) > 0:
		s += fmt.Sprintf(" (%d gaps)", len(st.Gaps))
	}
	return s
}

func prCell(pr int) string {
	if pr == 0 {
		return ""
	}
	return strconv.Itoa(pr)
}

// duration is how long an execution ran, "" while it runs.
func duration(started, finished time.Time) string {
	if started.IsZero() || finished.IsZero() {
		return ""
	}
	return finished.Sub(started).Round(time.Second).String()
}

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+prefix)
}
