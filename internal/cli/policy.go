package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tfstackplan/tfstackplan/internal/policy"
)

// ErrPolicyFailed marks a policy check that failed a plan: it exits ExitPolicy.
var ErrPolicyFailed = errors.New("policy failed")

// PolicyTestOptions are the options of `tfstackplan policy test`.
type PolicyTestOptions struct {
	IO *IO
	// Policies are the --policy files, globs or directories: together, one policy.
	Policies []string
	// Package is the Rego package whose rules count ("main" when empty).
	Package string
	// RegoVersion is policy.RegoV1 or policy.RegoV0.
	RegoVersion string
	// Plans are the `show -json` plan files to check.
	Plans []string
}

func newPolicyCmd(ios *IO) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Rego policy checks on plans",
	}
	cmd.AddCommand(newPolicyTestCmd(ios))
	return cmd
}

func newPolicyTestCmd(ios *IO) *cobra.Command {
	opts := &PolicyTestOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "test --policy PATH... [--package P] [--rego-version v1|v0] PLAN_JSON...",
		Short: "Check plan JSON files against Rego policies, as conftest test",
		Long: "policy test evaluates Rego policies on plans (the output of `tofu show -json PLANFILE`) by\n" +
			"conftest's conventions: in the package, deny and violation rules (and deny_*, violation_*)\n" +
			"fail, warn rules (and warn_*) warn; each is a set of strings or of objects with \"msg\".\n" +
			"--policy names Rego modules and data files (.json, .yaml), globs or directories; together\n" +
			"they are one policy. It prints each plan's failures and warnings. Exit 5 when a policy fails\n" +
			"a plan (a policy that errors fails it), 0 otherwise, 1 when a policy cannot be compiled or a\n" +
			"plan cannot be read.",
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Plans = args
			return runPolicyTest(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringArrayVar(&opts.Policies, "policy", nil, "`PATH` of Rego modules and data files: a file, a glob or a directory (repeatable)")
	cmd.Flags().StringVar(&opts.Package, "package", policy.DefaultPackage, "the Rego `package` whose rules count")
	cmd.Flags().StringVar(&opts.RegoVersion, "rego-version", policy.RegoV1, "Rego syntax of the policies: v1, or v0 for policies written before OPA 1.0")
	return cmd
}

func runPolicyTest(ctx context.Context, opts *PolicyTestOptions) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if len(opts.Policies) == 0 {
		return Usagef("--policy PATH is required")
	}
	if len(opts.Plans) == 0 {
		return Usagef("at least one PLAN_JSON is required")
	}
	if opts.RegoVersion != policy.RegoV1 && opts.RegoVersion != policy.RegoV0 {
		return Usagef("--rego-version must be %s or %s, not %q", policy.RegoV1, policy.RegoV0, opts.RegoVersion)
	}
	pkg := opts.Package
	if pkg == "" {
		pkg = policy.DefaultPackage
	}
	set, err := policy.Compile(ctx, []policy.Definition{{
		Name: pkg, Files: opts.Policies, Package: pkg, RegoVersion: opts.RegoVersion,
	}})
	if err != nil {
		return err
	}
	if len(set.Rules()[pkg]) == 0 {
		fmt.Fprintf(opts.IO.ErrOut, "tfstackplan: package %s has no deny, violation or warn rules: there is nothing to check\n", pkg)
	}
	var failures, warnings int
	for _, path := range opts.Plans {
		r, err := evalPlanFile(ctx, set, path)
		if err != nil {
			return err
		}
		for _, f := range r.Failures {
			printFinding(opts.IO, "FAIL", path, f)
		}
		for _, f := range r.Warnings {
			printFinding(opts.IO, "WARN", path, f)
		}
		failures += len(r.Failures)
		warnings += len(r.Warnings)
	}
	fmt.Fprintf(opts.IO.Out, "\n%s: %s, %s\n", plural(len(opts.Plans), "plan"), plural(failures, "failure"), plural(warnings, "warning"))
	if failures > 0 {
		return fmt.Errorf("%w: %s", ErrPolicyFailed, plural(failures, "failure"))
	}
	return nil
}

// evalPlanFile reads the plan JSON at path and evaluates set on it.
func evalPlanFile(ctx context.Context, set *policy.Set, path string) (*policy.Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	input, err := policy.ReadInput(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return set.Eval(ctx, input)
}

// printFinding prints one finding as conftest does: LEVEL - FILE - POLICY - MESSAGE; an
// evaluation error is ERROR whichever list it is in.
func printFinding(ios *IO, level, path string, f policy.Finding) {
	if f.Rule == policy.RuleError {
		level = "ERROR"
	}
	msg := strings.ReplaceAll(f.Message, "\n", "\n    ")
	fmt.Fprintf(ios.Out, "%s - %s - %s - %s\n", level, path, f.Policy, msg)
}

// plural is "1 plan", "2 plans".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
