package auth

import (
	"fmt"
	"strings"

	"github.com/tfstackplan/tfstackplan/internal/textfit"
)

// Lengths GitHub allows for an owner (user or organization) and a repository name.
const (
	maxRepoOwner = 39
	maxRepoName  = 100
)

// CanonicalRepo returns a GitHub repository's owner/name lowercased, the form repositories are
// stored and compared in (GitHub's names are case-insensitive). It fails, naming s, unless s is
// owner/name with an owner of ASCII letters, digits and "-" (at most 39) and a name of ASCII
// letters, digits, "-", "_" and "." (at most 100, not "." or "..").
func CanonicalRepo(s string) (string, error) {
	owner, name, _ := strings.Cut(s, "/")
	if !validRepoPart(owner, maxRepoOwner, "-") || !validRepoPart(name, maxRepoName, "-_.") || name == "." || name == ".." {
		return "", fmt.Errorf("repository %q: want owner/name (owner: letters, digits and -, at most %d; name: letters, digits, -, _ and ., at most %d)",
			textfit.Prefix(s, 2*maxRepoName), maxRepoOwner, maxRepoName)
	}
	return strings.ToLower(s), nil
}

// validRepoPart reports whether s is 1 to max ASCII letters, digits and bytes of extra; a
// second "/" fails here too.
func validRepoPart(s string, max int, extra string) bool {
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
