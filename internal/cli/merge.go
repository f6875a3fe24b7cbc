package cli

import (
	"context"
	"errors"
	"os"

	"github.com/spf13/cobra"
	"github.com/tfstackplan/tfstackplan/internal/job"
)

// MergeOptions are the options of `tfstackplan run merge`.
type MergeOptions struct {
	IO    *IO
	Merge job.MergeOptions
}

// newMergeCmd is `run merge`. runF runs the parsed options (nil: runMerge); tests pass their
// own to see what the flags parse into without running anything.
func newMergeCmd(ios *IO, runF func(context.Context, *MergeOptions) error) *cobra.Command {
	opts := &MergeOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "merge --matrix MATRIX_RESULT [--result FILE] SHARD_RESULT...",
		Short: "Join a fan-out's shard results into one result, summary, comment and Finalize",
		Long: "run merge joins the result documents of a fan-out's shard jobs (run plan|apply --shard K/N)\n" +
			"with the matrix job's (run plan|apply --matrix N) into one result document, step summary,\n" +
			"PR comment file and job outputs, and finalizes the execution they reported into, as one\n" +
			"job over the same stacks would. A shard whose result is missing leaves its stacks not-run\n" +
			"and the merge failed (exit 1); the execution is finalized either way.",
		Args: func(cmd *cobra.Command, args []string) error {
			if opts.Merge.Matrix == "" {
				return writeUsageResult(ios, "merge", errors.New("--matrix (the matrix job's result document) is required"))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Merge.Shards = args
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return runMerge(cmd.Context(), opts)
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return writeUsageResult(ios, "merge", err)
	})
	f := cmd.Flags()
	f.StringVar(&opts.Merge.Matrix, "matrix", "", "the matrix job's result document `FILE` (required)")
	f.StringVar(&opts.Merge.ResultPath, "result", "", "where the merged result document goes (default $RUNNER_TEMP/tfstackplan-result.json in Actions, else ./tfstackplan-result.json)")
	f.StringVar(&opts.Merge.CommentFile, "comment-file", "", "write the PR comment markdown here (default in Actions: $RUNNER_TEMP/tfstackplan-comment-ENV.md)")
	f.StringVar(&opts.Merge.IssueFile, "issue-file", "", "a fan-out of run drift: write the drift issue body markdown here")
	return cmd
}

// runMerge merges and maps the outcome onto the exit code.
func runMerge(ctx context.Context, opts *MergeOptions) error {
	if ctx == nil {
		ctx = context.Background()
	}
	m := opts.Merge
	m.Stdout, m.Stderr = opts.IO.Out, opts.IO.ErrOut
	m.Color = isTerminal(opts.IO.Out) && os.Getenv("NO_COLOR") == ""
	return resultError(job.Merge(ctx, m))
}
