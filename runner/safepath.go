package runner

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ErrPathEscapes is wrapped by the errors resolveStackPath and resolveStackFile return when a
// path would leave the project root (through "..", an absolute path or a symbolic link).
var ErrPathEscapes = errors.New("path escapes the project root")

// resolveStackPath resolves the stack directory stack under root and returns its absolute,
// symlink-free path. A stack path is data, not trust: it must be relative, must not contain a
// ".." element, and every symbolic link on the way (the stack directory included) must resolve
// inside root. The directory need not exist yet; the part of it that does exist is checked.
func resolveStackPath(root, stack string) (string, error) {
	sr, err := newStackRoot(root)
	if err != nil {
		return "", err
	}
	return sr.stackPath(stack)
}

// resolveStackFile resolves the file named file inside the stack directory stack under root,
// with the rules of resolveStackPath applied to both names: if the file (or any directory on the
// way) is a symbolic link, it must point inside root. The file need not exist yet.
func resolveStackFile(root, stack, file string) (string, error) {
	sr, err := newStackRoot(root)
	if err != nil {
		return "", err
	}
	return sr.stackFile(stack, file)
}

// stackRoot is a project root resolved once (absolute and symlink-free), so that the many
// stack paths of a run are resolved beneath it without walking the root's own directories again.
type stackRoot struct {
	real string
}

// newStackRoot resolves root: it must be named and exist.
func newStackRoot(root string) (stackRoot, error) {
	if root == "" {
		return stackRoot{}, errors.New("project root is empty")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return stackRoot{}, fmt.Errorf("project root %q: %w", root, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return stackRoot{}, fmt.Errorf("project root %q: %w", root, err)
	}
	return stackRoot{real: real}, nil
}

// stackPath is resolveStackPath under sr.
func (sr stackRoot) stackPath(stack string) (string, error) {
	return sr.resolve(stack, "stack path")
}

// stackFile is resolveStackFile under sr.
func (sr stackRoot) stackFile(stack, file string) (string, error) {
	path, _, err := sr.stackFileInfo(stack, file)
	return path, err
}

// stackFileInfo is stackFile, with the lstat of the resolved path (nil: nothing is there).
func (sr stackRoot) stackFileInfo(stack, file string) (string, os.FileInfo, error) {
	if err := checkRelative(file, "log file name"); err != nil {
		return "", nil, err
	}
	if err := checkRelative(stack, "stack path"); err != nil {
		return "", nil, err
	}
	return sr.resolveInfo(filepath.Join(filepath.FromSlash(stack), filepath.FromSlash(file)), "stack file")
}

// checkRelative refuses names that are empty, absolute, contain NUL or a ".." element.
func checkRelative(name, what string) error {
	switch {
	case name == "":
		return fmt.Errorf("%s is empty", what)
	case strings.ContainsRune(name, 0):
		return fmt.Errorf("%s %q contains a NUL byte", what, name)
	case filepath.IsAbs(name) || strings.HasPrefix(name, "/") || strings.HasPrefix(name, `\`) || filepath.VolumeName(name) != "":
		return fmt.Errorf("%s %q is absolute: %w", what, name, ErrPathEscapes)
	}
	for _, el := range strings.FieldsFunc(name, func(r rune) bool { return r == '/' || r == '\\' }) {
		if el == ".." {
			return fmt.Errorf("%s %q contains \"..\": %w", what, name, ErrPathEscapes)
		}
	}
	return nil
}

// resolve joins rel onto the root one element at a time, resolving each symbolic link met on
// the way (a chain of links as a whole, as filepath.EvalSymlinks does) and refusing it when it
// resolves outside the root, dangles or loops: a later element cannot bring the path back in.
// The first element that does not exist ends the walk: what follows it cannot contain links
// yet. The path built so far is symlink-free at every step, so the result is what
// filepath.EvalSymlinks would give for the existing part, at one lstat per element of rel.
func (sr stackRoot) resolve(rel, what string) (string, error) {
	path, _, err := sr.resolveInfo(rel, what)
	return path, err
}

// resolveInfo is resolve, with the lstat of the resolved path (nil: nothing is there), so that
// a caller need not look again: the walk's own, or its target's for a symbolic link.
func (sr stackRoot) resolveInfo(rel, what string) (string, os.FileInfo, error) {
	if err := checkRelative(rel, what); err != nil {
		return "", nil, err
	}
	cur := sr.real
	var last os.FileInfo
	elems := strings.Split(filepath.Clean(filepath.FromSlash(rel)), string(filepath.Separator))
	for i, el := range elems {
		if el == "." || el == "" {
			continue
		}
		next := filepath.Join(cur, el)
		fi, err := os.Lstat(next)
		if errors.Is(err, fs.ErrNotExist) {
			full := filepath.Join(append([]string{next}, elems[i+1:]...)...)
			if !within(sr.real, full) {
				return "", nil, fmt.Errorf("%s %q resolves outside the project root: %w", what, rel, ErrPathEscapes)
			}
			return full, nil, nil
		}
		if err != nil {
			return "", nil, fmt.Errorf("%s %q: %w", what, rel, err)
		}
		last = fi
		if fi.Mode()&fs.ModeSymlink != 0 {
			link := filepath.Join(elems[:i+1]...)
			target, err := filepath.EvalSymlinks(next)
			switch {
			case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ELOOP):
				// Its target may appear later, anywhere: refuse rather than guess where it goes.
				return "", nil, fmt.Errorf("%s %q: symbolic link %s dangles or loops: %w", what, rel, link, ErrPathEscapes)
			case err != nil:
				return "", nil, fmt.Errorf("%s %q: symbolic link %s: %w", what, rel, link, err)
			case !within(sr.real, target):
				return "", nil, fmt.Errorf("%s %q: symbolic link %s resolves outside the project root: %w", what, rel, link, ErrPathEscapes)
			}
			next = target
			if last, err = os.Lstat(target); err != nil {
				last = nil // gone since: looked at again by whoever opens it
			}
		}
		cur = next
	}
	return cur, last, nil
}

// within reports whether path is root or below it (both cleaned, absolute).
func within(root, path string) bool {
	if path == root {
		return true
	}
	r, err := filepath.Rel(root, path)
	if err != nil {
		return false
	}
	return r != ".." && !strings.HasPrefix(r, ".."+string(filepath.Separator)) && !filepath.IsAbs(r)
}

// openResolved opens a path resolveStackFile returned for reading, refusing it when it was
// swapped for a symbolic link (or anything but a regular file) after it was resolved.
func openResolved(path string) (*os.File, os.FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	li, err := os.Lstat(path)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() || !os.SameFile(fi, li) {
		f.Close()
		return nil, nil, fmt.Errorf("%s is not a regular file: %w", filepath.Base(path), ErrPathEscapes)
	}
	return f, fi, nil
}

// StackRoot is a project root resolved once, for a caller that resolves many stack paths
// beneath it: the job resolves every stack's plan, log and lock files under the repository.
type StackRoot struct {
	sr stackRoot
}

// NewStackRoot resolves root: it must be named and exist.
func NewStackRoot(root string) (StackRoot, error) {
	sr, err := newStackRoot(root)
	return StackRoot{sr: sr}, err
}

// Dir is the root, absolute and symlink-free.
func (r StackRoot) Dir() string { return r.sr.real }

// StackPath is resolveStackPath under r.
func (r StackRoot) StackPath(stack string) (string, error) { return r.sr.stackPath(stack) }

// StackFile is resolveStackFile under r.
func (r StackRoot) StackFile(stack, file string) (string, error) { return r.sr.stackFile(stack, file) }

// StackFileInfo is StackFile, with the lstat of the resolved path (nil: nothing is there).
func (r StackRoot) StackFileInfo(stack, file string) (string, os.FileInfo, error) {
	return r.sr.stackFileInfo(stack, file)
}
