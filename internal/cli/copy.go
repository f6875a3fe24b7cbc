package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

// CopyOptions are the options of `tfstackplan copy <dest>`.
type CopyOptions struct {
	IO   *IO
	Dest string
	// Source is the file copied ("" : the running executable).
	Source string
}

func newCopyCmd(ios *IO, runF RunFunc[CopyOptions]) *cobra.Command {
	opts := &CopyOptions{IO: ios}
	return &cobra.Command{
		Use:   "copy DEST",
		Short: "Copy the running binary to DEST (mode 0755)",
		Long: "copy places this tfstackplan binary at DEST and makes it executable, e.g. to put it on a\n" +
			"shared volume or into a repository's tool directory. Exit 0 on success, 1 when a file\n" +
			"cannot be read or written, 2 without exactly one argument.",
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Dest = args[0]
			return runWith(cmd.Context(), runF, runCopy, opts)
		},
	}
}

func runCopy(_ context.Context, opts *CopyOptions) error {
	if opts.Dest == "" {
		return Usagef("copy needs a destination")
	}
	src := opts.Source
	if src == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("copy: finding the running binary: %w", err)
		}
		src = exe
	}
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	defer in.Close()
	dest := opts.Dest
	if fi, err := os.Stat(dest); err == nil && fi.IsDir() {
		dest = filepath.Join(dest, "tfstackplan")
	}
	// Write beside the destination and rename, so a running copy is never half-replaced.
	tmp, err := os.CreateTemp(filepath.Dir(dest), "."+filepath.Base(dest)+".tmp*")
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	_, cerr := io.Copy(tmp, in)
	if err := tmp.Close(); cerr == nil {
		cerr = err
	}
	if cerr == nil {
		cerr = os.Chmod(tmp.Name(), 0o755)
	}
	if cerr == nil {
		cerr = os.Rename(tmp.Name(), dest)
	}
	if cerr != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("copy to %s: %w", dest, cerr)
	}
	fmt.Fprintf(opts.IO.ErrOut, "tfstackplan: copied to %s\n", dest)
	return nil
}
