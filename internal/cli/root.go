// Package cli holds tfstackplan's cobra commands. Each verb has an options struct and a run
// function testable without a process; Main is the single place errors become exit codes.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tfstackplan/tfstackplan/internal/termsafe"
)

// IO is the standard streams a command uses; tests give it buffers.
type IO struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
	// Args are the raw command-line arguments (for what flag parsing may not reach).
	Args []string
}

// Main runs tfstackplan with args and returns the process exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ios := &IO{In: stdin, Out: stdout, ErrOut: stderr, Args: args}
	root := NewRootCmd(ios)
	root.SetArgs(args)
	err := root.Execute()
	if isUnknownCommand(err) {
		err = &UsageError{Err: err}
	}
	if err != nil && !errors.Is(err, ErrSilent) {
		// Errors carry what servers and tools said: through the one sanitizer.
		fmt.Fprintln(stderr, "tfstackplan:", termsafe.Text(err.Error()))
	}
	return ExitCode(err)
}

// RunFunc runs a command with its parsed options. Each command's constructor takes one, in
// GitHub CLI's NewCmdX(f, runF) shape: nil runs the command; a test passes one that keeps the
// options, so that flag parsing is tested apart from running.
type RunFunc[O any] func(context.Context, *O) error

// runWith runs opts with runF, or with run when runF is nil.
func runWith[O any](ctx context.Context, runF, run RunFunc[O], opts *O) error {
	if runF == nil {
		runF = run
	}
	return runF(orBackground(ctx), opts)
}

// NewRootCmd builds the command tree.
func NewRootCmd(ios *IO) *cobra.Command {
	var versionFlag string
	root := &cobra.Command{
		Use:   "tfstackplan",
		Short: "Plan, gate and apply Terramate stacks in CI, with a control plane",
		Long: "tfstackplan runs terramate scripts over the changed stacks of one environment, classifies\n" +
			"and renders their plans, reports live progress to a control plane, and gates applies.",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if versionFlag != "" {
				return runVersion(cmd.Context(), &VersionOptions{IO: ios, Raw: versionFlag == "raw"})
			}
			cmd.SetOut(ios.ErrOut)
			_ = cmd.Usage()
			return &UsageError{Err: errors.New("a command is required")}
		},
	}
	root.SetIn(ios.In)
	root.SetOut(ios.Out)
	root.SetErr(ios.ErrOut)
	root.Flags().StringVar(&versionFlag, "version", "", "print the version (--version=raw: full build information)")
	root.Flags().Lookup("version").NoOptDefVal = "short"
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &UsageError{Err: err}
	})
	root.CompletionOptions.DisableDefaultCmd = true

	root.AddCommand(newVersionCmd(ios, nil))
	root.AddCommand(newRenderCmd(ios, nil))
	root.AddCommand(newServeCmd(ios, nil))
	root.AddCommand(newRunCmd(ios))
	root.AddCommand(newCopyCmd(ios, nil))
	root.AddCommand(newClaimsCmd(ios))
	root.AddCommand(newAdminCmd(ios))
	root.AddCommand(newExecutionsCmd(ios))
	root.AddCommand(newLogsCmd(ios, nil))
	root.AddCommand(newCompletionCmd(ios))
	root.AddCommand(newPolicyCmd(ios))
	// Later verbs register here, one line each.

	// Unknown sub-commands of a command group are usage errors, not silent help.
	for _, c := range root.Commands() {
		markGroupsStrict(c)
	}
	return root
}

// markGroupsStrict makes a command that only groups sub-commands fail with a usage error
// when run bare or with an unknown sub-command.
func markGroupsStrict(c *cobra.Command) {
	if c.HasSubCommands() && c.RunE == nil && c.Run == nil {
		c.Args = cobra.NoArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			cmd.SetOut(cmd.ErrOrStderr())
			_ = cmd.Usage()
			return &UsageError{Err: fmt.Errorf("%s needs a sub-command", cmd.CommandPath())}
		}
	}
	for _, s := range c.Commands() {
		markGroupsStrict(s)
	}
}

// usageArgs wraps a cobra positional-args check so its failure is a usage error.
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return &UsageError{Err: err}
		}
		return nil
	}
}

// isUnknownCommand reports cobra's unknown-command error.
func isUnknownCommand(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "unknown command")
}
