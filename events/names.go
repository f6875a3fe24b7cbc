package events

import (
	"fmt"
	"strings"

	"github.com/tfstackplan/tfstackplan/internal/textfit"
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

// GitHub's limits on a repository's owner (a user or an organization) and name.
const (
	MaxRepoOwner = 39
	MaxRepoName  = 100
)

// CanonicalRepo returns a GitHub repository's owner/name lowercased, the one form repositories
// are stored and compared in (GitHub's names are case-insensitive). It fails, naming v, unless v
// is owner/name with an owner of ASCII letters, digits and "-" (at most MaxRepoOwner) and a
// name of ASCII letters, digits, "-", "_" and "." (at most MaxRepoName, not "." or "..").
func CanonicalRepo(v string) (string, error) {
	owner, name, _ := strings.Cut(v, "/")
	if !repoPart(owner, MaxRepoOwner, "-") || !repoPart(name, MaxRepoName, "-_.") || name == "." || name == ".." {
		return "", fmt.Errorf("repository %q: want owner/name (owner: letters, digits and -, at most %d; name: letters, digits, -, _ and ., at most %d)",
			textfit.Prefix(textfit.Sanitize(v), 2*MaxRepoName), MaxRepoOwner, MaxRepoName)
	}
	return strings.ToLower(v), nil
}

// repoPart reports whether s is 1 to max ASCII letters, digits and bytes of extra (a second "/"
// fails here).
func repoPart(s string, max int, extra string) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(extra, c) >= 0) {
			return false
		}
	}
	return true
}
