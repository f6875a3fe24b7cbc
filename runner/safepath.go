package runner

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrPathEscapes is wrapped by the errors ResolveStackPath and ResolveStackFile return when a
// path would leave the project root (through "..", an absolute path or a symbolic link).
var ErrPathEscapes = errors.New("path escapes the project root")

// ResolveStackPath resolves the stack directory stack under root and returns its absolute,
// symlink-free path. A stack path is data, not trust: it must be relative, must not contain a
// ".." element, and every symbolic link on the way (the stack directory included) must resolve
// inside root. The directory need not exist yet; the part of it that does exist is checked.
func ResolveStackPath(root, stack string) (string, error) {
	return resolveUnder(root, stack, "stack path")
}

// ResolveStackFile resolves the file named file inside the stack directory stack under root,
// with the rules of ResolveStackPath applied to both names: if the file (or any directory on the
// way) is a symbolic link, it must point inside root. The file need not exist yet.
func ResolveStackFile(root, stack, file string) (string, error) {
	if err := checkRelative(file, "log file name"); err != nil {
		return "", err
	}
	if err := checkRelative(stack, "stack path"); err != nil {
		return "", err
	}
	return resolveUnder(root, filepath.Join(filepath.FromSlash(stack), filepath.FromSlash(file)), "stack file")
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

// resolveUnder joins rel onto root and resolves symbolic links in the existing part of the
// result, refusing anything that ends up outside root.
func resolveUnder(root, rel, what string) (string, error) {
	if err := checkRelative(rel, what); err != nil {
		return "", err
	}
	if root == "" {
		return "", errors.New("project root is empty")
	}
	absRoot, err := filepath.Abs(root)
	if err != nil {
		return "", fmt.Errorf("project root %q: %w", root, err)
	}
	realRoot, err := filepath.EvalSymlinks(absRoot)
	if err != nil {
		return "", fmt.Errorf("project root %q: %w", root, err)
	}
	joined := filepath.Join(realRoot, filepath.FromSlash(rel))
	// Resolve the longest existing prefix; the missing remainder cannot contain links yet.
	existing, missing := joined, ""
	for {
		resolved, err := filepath.EvalSymlinks(existing)
		if err == nil {
			full := filepath.Join(resolved, missing)
			if !within(realRoot, full) {
				return "", fmt.Errorf("%s %q resolves outside the project root: %w", what, rel, ErrPathEscapes)
			}
			return full, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			if fi, lerr := os.Lstat(existing); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
				// A dangling or looping link: refuse rather than guess where it goes.
				return "", fmt.Errorf("%s %q has an unresolvable symbolic link: %w", what, rel, ErrPathEscapes)
			}
			return "", fmt.Errorf("%s %q: %w", what, rel, err)
		}
		if fi, lerr := os.Lstat(existing); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			// A dangling link: its target may appear later, anywhere. Refuse.
			return "", fmt.Errorf("%s %q has a dangling symbolic link: %w", what, rel, ErrPathEscapes)
		}
		parent := filepath.Dir(existing)
		if parent == existing || !within(realRoot, parent) {
			return "", fmt.Errorf("%s %q: %w", what, rel, err)
		}
		missing = filepath.Join(filepath.Base(existing), missing)
		existing = parent
	}
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

// openResolved opens a path ResolveStackFile returned for reading, refusing it when it was
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
