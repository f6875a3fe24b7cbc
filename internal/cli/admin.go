package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/termsafe"
	"github.com/tfstackplan/tfstackplan/runner"
)

// Check conclusions and change classes, as `admin` flags accept them.
var (
	checkConclusions = []string{
		string(api.ChecksOverrideConclusionSuccess), string(api.ChecksOverrideConclusionFailure),
		string(api.ChecksOverrideConclusionNeutral), string(api.ChecksOverrideConclusionCancelled),
		string(api.ChecksOverrideConclusionSkipped), string(api.ChecksOverrideConclusionActionRequired),
	}
	changeClasses = []string{
		string(api.NoChanges), string(api.Additive), string(api.Mutating),
		string(api.Destructive), string(api.Unclassified),
	}
)

// AdminChecksOverrideOptions are the options of `tfstackplan admin checks override`.
type AdminChecksOverrideOptions struct {
	IO   *IO
	Conn ConnOptions
	// Repo is the repository (--repo; see ConnOptions.repoOr).
	Repo        string
	Environment string
	PR          int
	// Check is the check's name, e.g. tfstackplan/plan.
	Check string
	// Conclusion is one of checkConclusions.
	Conclusion string
	Reason     string
}

// AdminExecutionsCancelOptions are the options of `tfstackplan admin executions cancel`.
type AdminExecutionsCancelOptions struct {
	IO        *IO
	Conn      ConnOptions
	Execution string
	Reason    string
}

// AdminGatesSatisfyOptions are the options of `tfstackplan admin gates satisfy`.
type AdminGatesSatisfyOptions struct {
	IO          *IO
	Conn        ConnOptions
	Repo        string
	Environment string
	PR          int
	// Class is the change class of the gate.
	Class string
	// Target is the stack glob of the gate.
	Target string
	// Execution names the plan whose content the grant approves: the plan the approver
	// reviewed, which must be the PR's latest. Latest instead looks the latest plan up, prints
	// it, and approves that one. Exactly one of them is given.
	Execution string
	Latest    bool
	// ExpiresAt (RFC 3339) or ExpiresIn ends the grant; neither: it lasts until released.
	ExpiresAt string
	ExpiresIn time.Duration
	Reason    string
	// Now is the clock --expires-in counts from (nil: time.Now).
	Now func() time.Time
}

// AdminGrantsReleaseOptions are the options of `tfstackplan admin grants release`.
type AdminGrantsReleaseOptions struct {
	IO          *IO
	Conn        ConnOptions
	Repo        string
	Environment string
	PR          int
	Class       string
	Target      string
	Reason      string
}

func newAdminCmd(ios *IO) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "admin",
		Short: "Administrator actions: override checks, cancel executions, satisfy gates, release grants",
		Long: "Administrator actions on the control plane. Each needs the admin role and a --reason,\n" +
			"which the server's audit log records.",
	}
	checks := &cobra.Command{Use: "checks", Short: "Override check conclusions"}
	checks.AddCommand(newAdminChecksOverrideCmd(ios, nil))
	executions := &cobra.Command{Use: "executions", Short: "Cancel executions"}
	executions.AddCommand(newAdminExecutionsCancelCmd(ios, nil))
	gates := &cobra.Command{Use: "gates", Short: "Satisfy gates"}
	gates.AddCommand(newAdminGatesSatisfyCmd(ios, nil))
	grants := &cobra.Command{Use: "grants", Short: "Release grants"}
	grants.AddCommand(newAdminGrantsReleaseCmd(ios, nil))
	cmd.AddCommand(checks, executions, gates, grants)
	return cmd
}

func newAdminChecksOverrideCmd(ios *IO, runF RunFunc[AdminChecksOverrideOptions]) *cobra.Command {
	opts := &AdminChecksOverrideOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "override [--repo OWNER/NAME] --environment ENV --pr N --check NAME --conclusion C --reason TEXT",
		Short: "Set a check's conclusion by hand until the PR's next execution concludes it",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runWith(cmd.Context(), runF, runAdminChecksOverride, opts)
		},
	}
	f := cmd.Flags()
	addRepoFlag(f, &opts.Repo)
	addEnvPRFlags(f, &opts.Environment, &opts.PR)
	f.StringVar(&opts.Check, "check", "", "the check, e.g. tfstackplan/plan (required)")
	f.StringVar(&opts.Conclusion, "conclusion", "", "the conclusion: "+strings.Join(checkConclusions, ", ")+" (required)")
	f.StringVar(&opts.Reason, "reason", "", "why (required; recorded in the audit log)")
	_ = cmd.RegisterFlagCompletionFunc("conclusion", cobra.FixedCompletions(checkConclusions, cobra.ShellCompDirectiveNoFileComp))
	addConnFlags(f, &opts.Conn)
	return cmd
}

func runAdminChecksOverride(ctx context.Context, opts *AdminChecksOverrideOptions) error {
	repo, repoErr := opts.Conn.repoOr(opts.Repo)
	checks := []error{requireFlag("environment", opts.Environment), requirePR(opts.PR), requireFlag("check", opts.Check),
		requireFlag("conclusion", opts.Conclusion), validConclusion(opts.Conclusion), requireReason(opts.Reason), repoErr}
	return operate(ctx, &opts.Conn, checks, func(ctx context.Context, c *opClient) error {
		body := api.ChecksOverride{Repo: repo, Environment: opts.Environment, PR: opts.PR, Check: opts.Check,
			Conclusion: api.ChecksOverrideConclusion(opts.Conclusion), Reason: opts.Reason}
		if err := opDo(ctx, c, "admin checks override", func(ctx context.Context, rc *runner.Client) error {
			return rc.AdminChecksOverride(ctx, body)
		}); err != nil {
			return err
		}
		fmt.Fprintf(opts.IO.Out, "check %s of %s PR #%d overridden: %s\n", opts.Check, where(repo, opts.Environment), opts.PR, opts.Conclusion)
		return nil
	})
}

// validConclusion refuses a --conclusion that is not one of checkConclusions (an empty one is
// requireFlag's to refuse).
func validConclusion(conclusion string) error {
	if conclusion != "" && !api.ChecksOverrideConclusion(conclusion).Valid() {
		return Usagef("--conclusion %q: want one of %s", conclusion, strings.Join(checkConclusions, ", "))
	}
	return nil
}

func newAdminExecutionsCancelCmd(ios *IO, runF RunFunc[AdminExecutionsCancelOptions]) *cobra.Command {
	opts := &AdminExecutionsCancelOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "cancel EXECUTION --reason TEXT",
		Short: "Cancel a running execution; its runner stops at its next report",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Execution = args[0]
			return runWith(cmd.Context(), runF, runAdminExecutionsCancel, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Reason, "reason", "", "why (required; recorded in the audit log and told to the runner)")
	addConnFlags(f, &opts.Conn)
	return cmd
}

func runAdminExecutionsCancel(ctx context.Context, opts *AdminExecutionsCancelOptions) error {
	checks := []error{requireFlag("execution", opts.Execution), requireReason(opts.Reason)}
	return operate(ctx, &opts.Conn, checks, func(ctx context.Context, c *opClient) error {
		if err := opDo(ctx, c, "admin executions cancel", func(ctx context.Context, rc *runner.Client) error {
			return rc.AdminExecutionsCancel(ctx, opts.Execution, opts.Reason)
		}); err != nil {
			return err
		}
		fmt.Fprintf(opts.IO.Out, "execution %s cancelled (a runner still running stops at its next report)\n", opts.Execution)
		return nil
	})
}

func newAdminGatesSatisfyCmd(ios *IO, runF RunFunc[AdminGatesSatisfyOptions]) *cobra.Command {
	opts := &AdminGatesSatisfyOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "satisfy [--repo OWNER/NAME] --environment ENV --pr N --class CLASS --target GLOB (--execution PLAN|--latest) [--expires-at TIME|--expires-in DURATION] --reason TEXT",
		Short: "Approve the content of the plan you reviewed for one of its gates",
		Long: "satisfy grants a gate: it approves the stacks of one gate (a class and a target glob the\n" +
			"server's policy gates) in the plan you reviewed, --execution, with the content hashes of\n" +
			"their plans. The plan must be the PR's latest (a newer plan is refused: review it, then\n" +
			"approve it), and the gate one that plan requires (the server lists them when it is not).\n" +
			"--latest looks up the PR's latest plan, prints its stacks, classes, hashes and gates, and\n" +
			"approves exactly that execution. An apply passes the gate only while its plan has exactly\n" +
			"the approved content on those stacks; a re-plan that changes it needs a new grant.",
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runWith(cmd.Context(), runF, runAdminGatesSatisfy, opts)
		},
	}
	f := cmd.Flags()
	addRepoFlag(f, &opts.Repo)
	addGrantKeyFlags(cmd, &opts.Environment, &opts.PR, &opts.Class, &opts.Target)
	f.StringVar(&opts.Execution, "execution", "", "the plan execution you reviewed and approve (it must be the PR's latest plan)")
	f.BoolVar(&opts.Latest, "latest", false, "approve the PR's latest plan, printing it first")
	f.StringVar(&opts.ExpiresAt, "expires-at", "", "the grant ends at this RFC 3339 `time`")
	f.DurationVar(&opts.ExpiresIn, "expires-in", 0, "the grant ends after this `duration`")
	f.StringVar(&opts.Reason, "reason", "", "why (required; recorded in the audit log)")
	addConnFlags(f, &opts.Conn)
	return cmd
}

// addGrantKeyFlags registers the flags naming a grant: environment, PR, class and target.
func addGrantKeyFlags(cmd *cobra.Command, env *string, pr *int, class, target *string) {
	f := cmd.Flags()
	addEnvPRFlags(f, env, pr)
	f.StringVar(class, "class", "", "the change class: "+strings.Join(changeClasses, ", ")+" (required)")
	f.StringVar(target, "target", "", "the stack `glob` of the gate, e.g. '**' (required)")
	_ = cmd.RegisterFlagCompletionFunc("class", cobra.FixedCompletions(changeClasses, cobra.ShellCompDirectiveNoFileComp))
}

// checkGrantKey checks the flags naming a grant.
func checkGrantKey(env string, pr int, class, target string) error {
	if err := firstError(requireFlag("environment", env), requirePR(pr), requireFlag("class", class), requireFlag("target", target)); err != nil {
		return err
	}
	if !api.Class(class).Valid() {
		return Usagef("--class %q: want one of %s", class, strings.Join(changeClasses, ", "))
	}
	return nil
}

func runAdminGatesSatisfy(ctx context.Context, opts *AdminGatesSatisfyOptions) error {
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	expires, expiresErr := grantExpiry(opts.ExpiresAt, opts.ExpiresIn, now)
	var planErr error
	if (opts.Execution == "") == !opts.Latest {
		planErr = Usagef("name the plan you approve: --execution ID (the plan you reviewed) or --latest (the PR's latest plan, printed first)")
	}
	repo, repoErr := opts.Conn.repoOr(opts.Repo)
	checks := []error{checkGrantKey(opts.Environment, opts.PR, opts.Class, opts.Target), planErr, expiresErr, requireReason(opts.Reason), repoErr}
	return operate(ctx, &opts.Conn, checks, func(ctx context.Context, c *opClient) error {
		execution := opts.Execution
		if opts.Latest {
			var err error
			if execution, err = showLatestPlan(ctx, c, opts.IO.Out, repo, opts.Environment, opts.PR); err != nil {
				return err
			}
		}
		body := api.GatesSatisfy{Repo: repo, Environment: opts.Environment, PR: opts.PR, Class: opts.Class, Target: opts.Target,
			ExecutionID: execution, ExpiresAt: expires, Reason: opts.Reason}
		if err := opDo(ctx, c, "admin gates satisfy", func(ctx context.Context, rc *runner.Client) error {
			return rc.AdminGatesSatisfy(ctx, body)
		}); err != nil {
			return err
		}
		until := "until released"
		if !expires.IsZero() {
			until = "until " + stamp(expires)
		}
		fmt.Fprintf(opts.IO.Out, "gate %s on %q of %s PR #%d satisfied: plan %s approved, %s\n",
			opts.Class, opts.Target, where(repo, opts.Environment), opts.PR, termsafe.Line(execution), until)
		return nil
	})
}

// grantExpiry is when a grant ends, from --expires-at or --expires-in (counted from now); the
// zero time when neither is given: it lasts until released.
func grantExpiry(at string, in time.Duration, now func() time.Time) (time.Time, error) {
	switch {
	case at != "" && in != 0:
		return time.Time{}, Usagef("--expires-at and --expires-in exclude each other")
	case at != "":
		t, err := time.Parse(time.RFC3339, at)
		if err != nil {
			return time.Time{}, Usagef("--expires-at %q: want an RFC 3339 time, e.g. 2030-01-02T15:04:05Z", at)
		}
		return t, nil
	case in < 0:
		return time.Time{}, Usagef("--expires-in must be positive, not %s", in)
	case in > 0:
		return now().Add(in), nil
	}
	return time.Time{}, nil
}

// where names an environment of a repository in messages ("acme/infra prod", or the
// environment alone when the server chose the repository).
func where(repo, env string) string {
	if repo == "" {
		return env
	}
	return repo + " " + env
}

// showLatestPlan finds the latest plan of a PR (the one the server received last, whatever the
// runner's clock said), prints what an approval of it covers (its changed stacks with their
// classes and content hashes, and the gates it requires) and returns its id. The server still
// refuses the approval when a newer plan arrives meanwhile.
func showLatestPlan(ctx context.Context, c *opClient, out io.Writer, repo, env string, pr int) (string, error) {
	x, err := opCall(ctx, c, "plans latest", func(ctx context.Context, rc *runner.Client) (*api.Execution, error) {
		return rc.LatestPlan(ctx, repo, env, pr)
	})
	var ae *runner.APIError
	if errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound {
		return "", fmt.Errorf("%s PR #%d has no plan to approve", where(repo, env), pr)
	}
	if err != nil {
		return "", err
	}
	gparams := &api.GatesListParams{Repo: repo, Environment: env, Pr: pr}
	gates, err := opCall(ctx, c, "gates list", func(ctx context.Context, rc *runner.Client) ([]api.Gate, error) {
		return rc.GatesList(ctx, gparams)
	})
	if err != nil {
		return "", err
	}
	// Every field the server sent goes through the one sanitizer: a plan's job chose its sha,
	// and an escape sequence there must not hide or forge what follows.
	safe := termsafe.Line
	fmt.Fprintf(out, "latest plan of %s PR #%d: %s (%s, commit %s, %s)\n", safe(where(x.Repo, env)), pr, safe(x.ExecutionID),
		safe(string(x.Status)), safe(short(x.SHA, 12)), stamp(x.StartedAt))
	t := newTable(out)
	row(t, "  STACK", "CLASS", "CHANGES", "PLAN HASH")
	for _, st := range x.Stacks {
		if st.Class != "" && st.Class != api.NoChanges {
			row(t, "  "+st.Stack, string(st.Class), countsCell(st.Counts), st.PlanHash)
		}
	}
	if err := t.Flush(); err != nil {
		return "", err
	}
	n := 0
	for _, g := range gates {
		if g.ExecutionID == x.ExecutionID {
			fmt.Fprintf(out, "gate: %s on %s (stacks %s)\n", safe(g.Class), safe(g.Target), safe(strings.Join(g.Stacks, ", ")))
			n++
		}
	}
	if n == 0 {
		fmt.Fprintln(out, "gates: none recorded for this plan")
	}
	return x.ExecutionID, nil
}

func newAdminGrantsReleaseCmd(ios *IO, runF RunFunc[AdminGrantsReleaseOptions]) *cobra.Command {
	opts := &AdminGrantsReleaseOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "release [--repo OWNER/NAME] --environment ENV --pr N --class CLASS --target GLOB --reason TEXT",
		Short: "End the active grants of a gate; releasing none is not an error",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runWith(cmd.Context(), runF, runAdminGrantsRelease, opts)
		},
	}
	addRepoFlag(cmd.Flags(), &opts.Repo)
	addGrantKeyFlags(cmd, &opts.Environment, &opts.PR, &opts.Class, &opts.Target)
	cmd.Flags().StringVar(&opts.Reason, "reason", "", "why (required; recorded in the audit log)")
	addConnFlags(cmd.Flags(), &opts.Conn)
	return cmd
}

func runAdminGrantsRelease(ctx context.Context, opts *AdminGrantsReleaseOptions) error {
	repo, repoErr := opts.Conn.repoOr(opts.Repo)
	checks := []error{checkGrantKey(opts.Environment, opts.PR, opts.Class, opts.Target), requireReason(opts.Reason), repoErr}
	return operate(ctx, &opts.Conn, checks, func(ctx context.Context, c *opClient) error {
		body := api.GrantsRelease{Repo: repo, Environment: opts.Environment, PR: opts.PR, Class: opts.Class, Target: opts.Target, Reason: opts.Reason}
		if err := opDo(ctx, c, "admin grants release", func(ctx context.Context, rc *runner.Client) error {
			return rc.AdminGrantsRelease(ctx, body)
		}); err != nil {
			return err
		}
		fmt.Fprintf(opts.IO.Out, "active grants of gate %s on %q of %s PR #%d released\n", opts.Class, opts.Target, where(repo, opts.Environment), opts.PR)
		return nil
	})
}

// firstError returns the first non-nil error.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
