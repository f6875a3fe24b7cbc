package events

import (
	"fmt"
	"strings"
)

// StackPathProblem says why the control plane refuses v as a stack's path: NameProblem's
// reasons, or a spelling that is not the path's one canonical form ("" when it takes v). A
// stack's path is relative to the repository root with "/" between its segments: no leading or
// trailing "/", no empty, "." or ".." segment, no backslash. Policy globs and claims see a stack
// by this one spelling, so "./stacks/prod/db", "stacks//prod/db", "stacks/prod/./db" and
// "stacks/prod/x/../db" cannot pass for another stack than "stacks/prod/db".
func StackPathProblem(v string) string {
	if p := NameProblem(v); p != "" {
		return p
	}
	if strings.Contains(v, `\`) {
		return `contains a backslash (paths use "/")`
	}
	if strings.HasPrefix(v, "/") || strings.HasSuffix(v, "/") {
		return `is not a canonical path: it starts or ends with "/"`
	}
	for _, seg := range strings.Split(v, "/") {
		switch seg {
		case "":
			return `is not a canonical path: it has an empty segment ("//")`
		case ".", "..":
			return fmt.Sprintf("is not a canonical path: it has a %q segment", seg)
		}
	}
	return ""
}

// MaxRepoLen bounds a repository name, owner/name, in bytes (GitHub's own limits are lower).
const MaxRepoLen = 256

// CanonicalRepo returns a repository name in its one stored form, owner/name lowercased
// (GitHub compares both case-insensitively), or an error naming what is wrong with v: exactly
// one "/", an owner of letters, digits and "-", a name of letters, digits, "-", "_" and "."
// other than "." and "..".
func CanonicalRepo(v string) (string, error) {
	if v == "" {
		return "", fmt.Errorf("repository is required (owner/name)")
	}
	if len(v) > MaxRepoLen {
		return "", fmt.Errorf("repository is longer than %d bytes", MaxRepoLen)
	}
	owner, name, ok := strings.Cut(v, "/")
	switch {
	case !ok || strings.Contains(name, "/"):
		return "", fmt.Errorf("repository %q is not owner/name", v)
	case owner == "" || strings.Trim(owner, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-") != "":
		return "", fmt.Errorf("repository %q: the owner may hold only letters, digits and \"-\"", v)
	case name == "" || name == "." || name == ".." || strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") != "":
		return "", fmt.Errorf("repository %q: the name may hold only letters, digits, \"-\", \"_\" and \".\" (not \".\" or \"..\")", v)
	}
	return strings.ToLower(v), nil
}
