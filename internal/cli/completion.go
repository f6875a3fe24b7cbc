package cli

import (
	"github.com/spf13/cobra"
)

// CompletionShells are the shells `completion` writes scripts for.
var CompletionShells = []string{"bash", "zsh", "fish"}

// CompletionOptions are the options of `tfstackplan completion`.
type CompletionOptions struct {
	IO *IO
	// Root is the command tree to complete.
	Root *cobra.Command
	// Shell is one of CompletionShells.
	Shell string
}

func newCompletionCmd(ios *IO) *cobra.Command {
	opts := &CompletionOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print a shell completion script",
		Long: "completion prints the completion script of a shell on stdout. For example:\n\n" +
			"  bash: source <(tfstackplan completion bash)\n" +
			"  zsh:  tfstackplan completion zsh > \"${fpath[1]}/_tfstackplan\"\n" +
			"  fish: tfstackplan completion fish > ~/.config/fish/completions/tfstackplan.fish",
		ValidArgs: CompletionShells,
		Args:      usageArgs(cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs)),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Root, opts.Shell = cmd.Root(), args[0]
			return runCompletion(opts)
		},
	}
	return cmd
}

func runCompletion(opts *CompletionOptions) error {
	out := opts.IO.Out
	switch opts.Shell {
	case "bash":
		return opts.Root.GenBashCompletionV2(out, true)
	case "zsh":
		return opts.Root.GenZshCompletion(out)
	case "fish":
		return opts.Root.GenFishCompletion(out, true)
	}
	return Usagef("completion: unknown shell %q (want bash, zsh or fish)", opts.Shell)
}
