package cli

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tfstackplan/tfstackplan/internal/plan"
)

// RenderFormats are the values `render --format` accepts.
var RenderFormats = []string{"markdown", "comment", "text", "json"}

// RenderOptions are the options of `tfstackplan render`.
type RenderOptions struct {
	IO *IO
	// Plan is the `show -json` plan file to classify.
	Plan string
	// Stack names the stack in the output; empty: the plan file's directory.
	Stack string
	// Format is one of RenderFormats.
	Format string
	// ExecutionURL links renders to the server's execution page, when known.
	ExecutionURL string
	// Color forces (true) or forbids (false) ANSI colour in text; nil: only on a terminal
	// and when NO_COLOR is unset.
	Color *bool
}

func newRenderCmd(ios *IO, runF RunFunc[RenderOptions]) *cobra.Command {
	opts := &RenderOptions{IO: ios}
	var color string
	cmd := &cobra.Command{
		Use:   "render --plan FILE [--stack NAME] [--format markdown|comment|text|json]",
		Short: "Classify a plan JSON offline and render it",
		Long: "render reads the output of `tofu show -json PLANFILE` (or terraform's), classifies it\n" +
			"(no-changes < additive < mutating < destructive; unclassified when it cannot be read) and\n" +
			"renders it as a step summary (markdown), a PR comment, terminal text or JSON. Sensitive\n" +
			"values are never printed. Exit 1 when the plan cannot be classified.",
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch color {
			case "always":
				opts.Color = new(true)
			case "never":
				opts.Color = new(false)
			case "auto":
			default:
				return Usagef("--color must be auto, always or never, not %q", color)
			}
			return runWith(cmd.Context(), runF, runRender, opts)
		},
	}
	cmd.Flags().StringVar(&opts.Plan, "plan", "", "`FILE` with the plan JSON (tofu show -json PLANFILE > plan.json)")
	cmd.Flags().StringVar(&opts.Stack, "stack", "", "stack name shown in the output (default: the plan file's directory)")
	cmd.Flags().StringVar(&opts.Format, "format", "text", "output format: "+strings.Join(RenderFormats, ", "))
	cmd.Flags().StringVar(&opts.ExecutionURL, "execution-url", "", "link to the execution page on the server")
	cmd.Flags().StringVar(&color, "color", "auto", "colour in text output: auto (terminal only), always, never")
	return cmd
}

func runRender(_ context.Context, opts *RenderOptions) error {
	if opts.Plan == "" {
		return Usagef("--plan FILE is required")
	}
	if !slices.Contains(RenderFormats, opts.Format) {
		return Usagef("--format must be one of %s, not %q", strings.Join(RenderFormats, ", "), opts.Format)
	}
	stack := opts.Stack
	if stack == "" {
		stack = defaultStackName(opts.Plan)
	}
	s, classifyErr := plan.ClassifyFile(stack, opts.Plan)
	r := &plan.Report{Stacks: []*plan.Stack{s}, ExecutionURL: opts.ExecutionURL}

	var err error
	switch opts.Format {
	case "markdown":
		_, err = io.WriteString(opts.IO.Out, plan.Markdown(r))
	case "comment":
		_, err = io.WriteString(opts.IO.Out, plan.Comment(r))
	case "json":
		err = plan.JSON(opts.IO.Out, r)
	default:
		color := isTerminal(opts.IO.Out) && os.Getenv("NO_COLOR") == ""
		if opts.Color != nil {
			color = *opts.Color
		}
		err = plan.Text(opts.IO.Out, r, color)
	}
	if classifyErr != nil {
		return classifyErr
	}
	return err
}

// defaultStackName names a stack after its plan file's directory ("stacks/app" for
// stacks/app/plan.json; the working directory's name for a plan in it).
func defaultStackName(planPath string) string {
	dir := filepath.Dir(planPath)
	if dir == "." {
		if abs, err := filepath.Abs(dir); err == nil {
			return filepath.Base(abs)
		}
	}
	return filepath.ToSlash(dir)
}

// isTerminal reports whether w is a character device (a TTY).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
