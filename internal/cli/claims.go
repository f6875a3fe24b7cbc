package cli

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/runner"
)

// ClaimsListOptions are the options of `tfstackplan claims list`.
type ClaimsListOptions struct {
	IO   *IO
	Conn ConnOptions
	// Repo filters the claims (see ConnOptions.repoOr).
	Repo string
	// Environment filters the claims; empty: every environment.
	Environment string
	// JSON prints the claims as the API gives them instead of a table.
	JSON bool
}

// ClaimsReleaseOptions are the options of `tfstackplan claims release`.
type ClaimsReleaseOptions struct {
	IO          *IO
	Conn        ConnOptions
	Repo        string
	Environment string
	PR          int
	// Stack releases one stack's claim; empty: all of the PR's claims in the environment.
	Stack string
	// Execution names the plan execution whose claims to release; a runner must name its own.
	Execution string
	// Reason says why; required.
	Reason string
}

func newClaimsCmd(ios *IO) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "claims",
		Short: "List and release apply-lock claims",
		Long: "A finalized plan claims its changed stacks for its pull request until that PR applies them\n" +
			"(or the claim expires); another PR's apply of a claimed stack is denied.",
	}
	cmd.AddCommand(newClaimsListCmd(ios, nil), newClaimsReleaseCmd(ios, nil))
	return cmd
}

func newClaimsListCmd(ios *IO, runF RunFunc[ClaimsListOptions]) *cobra.Command {
	opts := &ClaimsListOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "list [--repo OWNER/NAME] [--environment ENV] [--json]",
		Short: "List the current claims",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runWith(cmd.Context(), runF, runClaimsList, opts)
		},
	}
	f := cmd.Flags()
	addRepoFlag(f, &opts.Repo)
	f.StringVarP(&opts.Environment, "environment", "e", "", "only the claims of this environment")
	f.BoolVar(&opts.JSON, "json", false, "print JSON instead of a table")
	addConnFlags(f, &opts.Conn)
	return cmd
}

func runClaimsList(ctx context.Context, opts *ClaimsListOptions) error {
	repo, repoErr := opts.Conn.repoOr(opts.Repo)
	return operate(ctx, &opts.Conn, []error{repoErr}, func(ctx context.Context, c *opClient) error {
		claims, err := opCall(ctx, c, "claims list", func(ctx context.Context, rc *runner.Client) ([]api.Claim, error) {
			return rc.ClaimsList(ctx, repo, opts.Environment)
		})
		if err != nil {
			return err
		}
		if opts.JSON {
			return writeJSON(opts.IO.Out, claims)
		}
		if len(claims) == 0 {
			fmt.Fprintln(opts.IO.ErrOut, "no claims")
			return nil
		}
		t := newTable(opts.IO.Out)
		row(t, "REPOSITORY", "ENVIRONMENT", "STACK", "PR", "EXECUTION", "SHA", "CLAIMED", "EXPIRES")
		for _, cl := range claims {
			row(t, cl.Repo, cl.Environment, cl.Stack, strconv.Itoa(cl.PR), cl.ExecutionID, short(cl.SHA, 12), stamp(cl.ClaimedAt), stamp(cl.ExpiresAt))
		}
		return t.Flush()
	})
}

func newClaimsReleaseCmd(ios *IO, runF RunFunc[ClaimsReleaseOptions]) *cobra.Command {
	opts := &ClaimsReleaseOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "release [--repo OWNER/NAME] --environment ENV --pr N [--stack STACK] [--execution ID] --reason TEXT",
		Short: "Release a PR's claims, or one stack's",
		Long: "release frees the claims of a pull request in an environment (one stack's with --stack).\n" +
			"A runner may release only the claims of an execution it announced itself, and must name\n" +
			"it with --execution; releasing any other claim is an admin action. The server decides.\n" +
			"Releasing what is not held is not an error.",
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runWith(cmd.Context(), runF, runClaimsRelease, opts)
		},
	}
	f := cmd.Flags()
	addRepoFlag(f, &opts.Repo)
	addEnvPRFlags(f, &opts.Environment, &opts.PR)
	f.StringVar(&opts.Stack, "stack", "", "release only this stack's claim")
	f.StringVar(&opts.Execution, "execution", "", "release only the claims of this plan execution (required of a runner)")
	f.StringVar(&opts.Reason, "reason", "", "why (required; recorded in the audit log)")
	addConnFlags(f, &opts.Conn)
	return cmd
}

func runClaimsRelease(ctx context.Context, opts *ClaimsReleaseOptions) error {
	repo, repoErr := opts.Conn.repoOr(opts.Repo)
	checks := []error{requireFlag("environment", opts.Environment), requirePR(opts.PR), requireReason(opts.Reason), repoErr}
	return operate(ctx, &opts.Conn, checks, func(ctx context.Context, c *opClient) error {
		body := api.ClaimsRelease{Repo: repo, Environment: opts.Environment, PR: opts.PR, Stack: opts.Stack, ExecutionID: opts.Execution, Reason: opts.Reason}
		if err := opDo(ctx, c, "claims release", func(ctx context.Context, rc *runner.Client) error {
			return rc.ClaimsRelease(ctx, body)
		}); err != nil {
			return err
		}
		what := "all stacks"
		if opts.Stack != "" {
			what = "stack " + opts.Stack
		}
		if opts.Execution != "" {
			what += " of execution " + opts.Execution
		}
		fmt.Fprintf(opts.IO.Out, "released the claims of %s PR #%d: %s\n", where(repo, opts.Environment), opts.PR, what)
		return nil
	})
}
