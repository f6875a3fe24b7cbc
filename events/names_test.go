package events

import (
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
	for _, c := range []struct{ in, want, err string }{
		{"acme/infra", "acme/infra", ""},
		{"Acme/Infra.Live_2", "acme/infra.live_2", ""},
		{"my-org/x", "my-org/x", ""},
		{"", "", "required"},
		{"acme", "", "not owner/name"},
		{"acme/infra/x", "", "not owner/name"},
		{"/infra", "", "owner"},
		{"ac_me/infra", "", "owner"},
		{"acme/", "", "name"},
		{"acme/..", "", "name"},
		{"acme/in fra", "", "name"},
		{"acme/infra\n", "", "name"},
		{strings.Repeat("a", 300) + "/x", "", "longer"},
	} {
		got, err := CanonicalRepo(c.in)
		if c.err == "" {
			if err != nil || got != c.want {
				t.Errorf("CanonicalRepo(%q) = %q, %v; want %q", c.in, got, err, c.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("CanonicalRepo(%q) error = %v, want one containing %q", c.in, err, c.err)
		}
	}
}
