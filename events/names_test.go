package events

import (
	"fmt"
	"strings"
	"testing"
)

func TestStackPathProblem(t *testing.T) {
	for _, c := range []struct{ path, want string }{
		{"stacks/prod/db", ""},
		{"stacks/prod/café", ""},
		{"Stacks/prod/db", ""}, // case is data: policy globs match it case-insensitively
		{"a", ""},
		{"a..b/c", ""},
		{"./stacks/prod/db", `"." segment`},
		{"stacks//prod/db", "empty segment"},
		{"stacks/prod/./db", `"." segment`},
		{"stacks/prod/x/../db", `".." segment`},
		{"../stacks/prod/db", `".." segment`},
		{"/stacks/prod/db", `starts or ends with "/"`},
		{"stacks/prod/db/", `starts or ends with "/"`},
		{`stacks\prod\db`, "backslash"},
		{"", "is required"},
		{"stacks/\x00", "control character"},
	} {
		got := StackPathProblem(c.path)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("StackPathProblem(%q) = %q, want %q", c.path, got, c.want)
		}
	}
}

func TestCanonicalRepo(t *testing.T) {
	for in, want := range map[string]string{
		"acme/infra": "acme/infra", "Acme/Infra": "acme/infra", "a-1/x_y.z-2": "a-1/x_y.z-2", "Acme/Infra.Live_2": "acme/infra.live_2",
		"A/.github": "a/.github", strings.Repeat("o", 39) + "/" + strings.Repeat("n", 100): strings.Repeat("o", 39) + "/" + strings.Repeat("n", 100),
	} {
		if got, err := CanonicalRepo(in); err != nil || got != want {
			t.Errorf("CanonicalRepo(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{
		"", "acme", "acme/", "/infra", "acme/infra/x", "acme//infra", "ac_me/infra", "ac.me/infra", "acme/in fra",
		"acme/.", "acme/..", "acme/infra\n", "acme/\u212Aey", "ACME/inf\u0131ra", strings.Repeat("o", 40) + "/x", "o/" + strings.Repeat("n", 101),
	} {
		_, err := CanonicalRepo(bad)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("CanonicalRepo(%q): err %v, want an error naming it", bad, err)
		}
	}
	// A huge name is named in part.
	if _, err := CanonicalRepo(strings.Repeat("x", 1<<20)); err == nil || len(err.Error()) > 400 {
		t.Errorf("CanonicalRepo of 1 MiB: %d bytes of error", len(err.Error()))
	}
}
