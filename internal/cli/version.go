package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tfstackplan/tfstackplan/internal/buildinfo"
)

// VersionOptions are the options of `tfstackplan version`.
type VersionOptions struct {
	IO  *IO
	Raw bool
}

func newVersionCmd(ios *IO) *cobra.Command {
	opts := &VersionOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version and build information",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVersion(opts.IO, opts.Raw)
		},
	}
	cmd.Flags().BoolVar(&opts.Raw, "raw", false, "print the full build information")
	return cmd
}

func runVersion(ios *IO, raw bool) error {
	if raw {
		_, err := fmt.Fprint(ios.Out, buildinfo.Raw())
		return err
	}
	_, err := fmt.Fprintf(ios.Out, "tfstackplan %s\n", buildinfo.Version())
	return err
}
