package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tfstackplan/tfstackplan/internal/buildinfo"
)

// VersionOptions are the options of `tfstackplan version`.
type VersionOptions struct {
	IO  *IO
	Raw bool
}

func newVersionCmd(ios *IO, runF RunFunc[VersionOptions]) *cobra.Command {
	opts := &VersionOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version and build information",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runWith(cmd.Context(), runF, runVersion, opts)
		},
	}
	cmd.Flags().BoolVar(&opts.Raw, "raw", false, "print the full build information")
	return cmd
}

func runVersion(_ context.Context, opts *VersionOptions) error {
	if opts.Raw {
		_, err := fmt.Fprint(opts.IO.Out, buildinfo.Raw())
		return err
	}
	_, err := fmt.Fprintf(opts.IO.Out, "tfstackplan %s\n", buildinfo.Version())
	return err
}
