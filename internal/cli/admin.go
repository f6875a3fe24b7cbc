package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tfstackplan/tfstackplan/internal/api"
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
	IO          *IO
	Conn        ConnOptions
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
	Environment string
	PR          int
	// Class is the change class the grant covers.
	Class string
	// Target is the stack glob the grant covers.
	Target string
	// Execution names the plan whose content the grant approves; empty: the PR's latest plan.
	Execution string
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
	checks.AddCommand(newAdminChecksOverrideCmd(ios))
	executions := &cobra.Command{Use: "executions", Short: "Cancel executions"}
	executions.AddCommand(newAdminExecutionsCancelCmd(ios))
	gates := &cobra.Command{Use: "gates", Short: "Satisfy gates"}
	gates.AddCommand(newAdminGatesSatisfyCmd(ios))
	grants := &cobra.Command{Use: "grants", Short: "Release grants"}
	grants.AddCommand(newAdminGrantsReleaseCmd(ios))
	cmd.AddCommand(checks, executions, gates, grants)
	return cmd
}

func newAdminChecksOverrideCmd(ios *IO) *cobra.Command {
	opts := &AdminChecksOverrideOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "override --environment ENV --pr N --check NAME --conclusion C --reason TEXT",
		Short: "Set a check's conclusion by hand until the PR's next execution concludes it",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAdminChecksOverride(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	addEnvPRFlags(f, &opts.Environment, &opts.PR)
	f.StringVar(&opts.Check, "check", "", "the check, e.g. tfstackplan/plan (required)")
	f.StringVar(&opts.Conclusion, "conclusion", "", "the conclusion: "+strings.Join(checkConclusions, ", ")+" (required)")
	f.StringVar(&opts.Reason, "reason", "", "why (required; recorded in the audit log)")
	_ = cmd.RegisterFlagCompletionFunc("conclusion", cobra.FixedCompletions(checkConclusions, cobra.ShellCompDirectiveNoFileComp))
	addConnFlags(f, &opts.Conn)
	return cmd
}

func runAdminChecksOverride(ctx context.Context, opts *AdminChecksOverrideOptions) error {
	if err := firstError(requireFlag("environment", opts.Environment), requirePR(opts.PR),
		requireFlag("check", opts.Check), requireFlag("conclusion", opts.Conclusion)); err != nil {
		return err
	}
	if !api.ChecksOverrideConclusion(opts.Conclusion).Valid() {
		return Usagef("--conclusion %q: want one of %s", opts.Conclusion, strings.Join(checkConclusions, ", "))
	}
	if err := requireReason(opts.Reason); err != nil {
		return err
	}
	c, err := opts.Conn.dial()
	if err != nil {
		return err
	}
	body := api.ChecksOverride{Environment: opts.Environment, PR: opts.PR, Check: opts.Check,
		Conclusion: api.ChecksOverrideConclusion(opts.Conclusion), Reason: opts.Reason}
	if _, err := call[api.Ack](orBackground(ctx), c, "admin checks override", func(ctx context.Context) (*api.AdminChecksOverrideResponse, error) {
		return c.api.AdminChecksOverrideWithResponse(ctx, body)
	}); err != nil {
		return err
	}
	fmt.Fprintf(opts.IO.Out, "check %s of %s PR #%d overridden: %s\n", opts.Check, opts.Environment, opts.PR, opts.Conclusion)
	return nil
}

func newAdminExecutionsCancelCmd(ios *IO) *cobra.Command {
	opts := &AdminExecutionsCancelOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "cancel EXECUTION --reason TEXT",
		Short: "Cancel a running execution; its runner stops at its next report",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Execution = args[0]
			return runAdminExecutionsCancel(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Reason, "reason", "", "why (required; recorded in the audit log and told to the runner)")
	addConnFlags(f, &opts.Conn)
	return cmd
}

func runAdminExecutionsCancel(ctx context.Context, opts *AdminExecutionsCancelOptions) error {
	if err := firstError(requireFlag("execution", opts.Execution), requireReason(opts.Reason)); err != nil {
		return err
	}
	c, err := opts.Conn.dial()
	if err != nil {
		return err
	}
	body := api.ExecutionsCancel{ExecutionID: opts.Execution, Reason: opts.Reason}
	if _, err := call[api.Ack](orBackground(ctx), c, "admin executions cancel", func(ctx context.Context) (*api.AdminExecutionsCancelResponse, error) {
		return c.api.AdminExecutionsCancelWithResponse(ctx, body)
	}); err != nil {
		return err
	}
	fmt.Fprintf(opts.IO.Out, "execution %s cancelled (a runner still running stops at its next report)\n", opts.Execution)
	return nil
}

func newAdminGatesSatisfyCmd(ios *IO) *cobra.Command {
	opts := &AdminGatesSatisfyOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "satisfy --environment ENV --pr N --class CLASS --target GLOB [--execution PLAN] [--expires-at TIME|--expires-in DURATION] --reason TEXT",
		Short: "Approve one plan's content for a gate",
		Long: "satisfy grants a gate: it approves the stacks of the class under the target in one plan\n" +
			"of the PR (the latest finalized plan in the environment, or --execution), with the content\n" +
			"hashes of their plans. An apply passes the gate only while its plan has exactly that\n" +
			"content on those stacks; a re-plan that changes it needs a new grant.",
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAdminGatesSatisfy(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	addGrantKeyFlags(cmd, &opts.Environment, &opts.PR, &opts.Class, &opts.Target)
	f.StringVar(&opts.Execution, "execution", "", "the plan execution to approve (default: the PR's latest plan)")
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
	if err := checkGrantKey(opts.Environment, opts.PR, opts.Class, opts.Target); err != nil {
		return err
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	var expires time.Time
	switch {
	case opts.ExpiresAt != "" && opts.ExpiresIn != 0:
		return Usagef("--expires-at and --expires-in exclude each other")
	case opts.ExpiresAt != "":
		t, err := time.Parse(time.RFC3339, opts.ExpiresAt)
		if err != nil {
			return Usagef("--expires-at %q: want an RFC 3339 time, e.g. 2030-01-02T15:04:05Z", opts.ExpiresAt)
		}
		expires = t
	case opts.ExpiresIn < 0:
		return Usagef("--expires-in must be positive, not %s", opts.ExpiresIn)
	case opts.ExpiresIn > 0:
		expires = now().Add(opts.ExpiresIn)
	}
	if err := requireReason(opts.Reason); err != nil {
		return err
	}
	c, err := opts.Conn.dial()
	if err != nil {
		return err
	}
	body := api.GatesSatisfy{Environment: opts.Environment, PR: opts.PR, Class: opts.Class, Target: opts.Target,
		ExecutionID: opts.Execution, ExpiresAt: expires, Reason: opts.Reason}
	if _, err := call[api.Ack](orBackground(ctx), c, "admin gates satisfy", func(ctx context.Context) (*api.AdminGatesSatisfyResponse, error) {
		return c.api.AdminGatesSatisfyWithResponse(ctx, body)
	}); err != nil {
		return err
	}
	plan := "the latest plan"
	if opts.Execution != "" {
		plan = "plan " + opts.Execution
	}
	until := "until released"
	if !expires.IsZero() {
		until = "until " + stamp(expires)
	}
	fmt.Fprintf(opts.IO.Out, "gate %s on %q of %s PR #%d satisfied: %s approved, %s\n",
		opts.Class, opts.Target, opts.Environment, opts.PR, plan, until)
	return nil
}

func newAdminGrantsReleaseCmd(ios *IO) *cobra.Command {
	opts := &AdminGrantsReleaseOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "release --environment ENV --pr N --class CLASS --target GLOB --reason TEXT",
		Short: "End the active grants of a gate; releasing none is not an error",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAdminGrantsRelease(cmd.Context(), opts)
		},
	}
	addGrantKeyFlags(cmd, &opts.Environment, &opts.PR, &opts.Class, &opts.Target)
	cmd.Flags().StringVar(&opts.Reason, "reason", "", "why (required; recorded in the audit log)")
	addConnFlags(cmd.Flags(), &opts.Conn)
	return cmd
}

func runAdminGrantsRelease(ctx context.Context, opts *AdminGrantsReleaseOptions) error {
	if err := checkGrantKey(opts.Environment, opts.PR, opts.Class, opts.Target); err != nil {
		return err
	}
	if err := requireReason(opts.Reason); err != nil {
		return err
	}
	c, err := opts.Conn.dial()
	if err != nil {
		return err
	}
	body := api.GrantsRelease{Environment: opts.Environment, PR: opts.PR, Class: opts.Class, Target: opts.Target, Reason: opts.Reason}
	if _, err := call[api.Ack](orBackground(ctx), c, "admin grants release", func(ctx context.Context) (*api.AdminGrantsReleaseResponse, error) {
		return c.api.AdminGrantsReleaseWithResponse(ctx, body)
	}); err != nil {
		return err
	}
	fmt.Fprintf(opts.IO.Out, "active grants of gate %s on %q of %s PR #%d released\n", opts.Class, opts.Target, opts.Environment, opts.PR)
	return nil
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
