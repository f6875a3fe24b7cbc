package doctest_test

import (
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/doctest"
)

func TestParse(t *testing.T) {
	src := "# doc\n\n" +
		"```sh\ntfstackplan version\n```\n\n" +
		"<!-- doctest: skip needs real cloud credentials -->\n```sh\ngcloud auth login\n```\n\n" +
		"<!-- doctest: file policy.hcl -->\n```hcl\nclaim_ttl = \"1h\"\n```\n\n" +
		"<!-- doctest: serve -->\n```sh\ntfstackplan serve --listen 127.0.0.1:8080 \\\n  --insecure-no-auth\n```\n\n" +
		"1. a list\n\n   ```text\n   output\n     indented\n   ```\n" +
		"````sh\necho '```'\n````\n"
	blocks, err := doctest.Parse("doc.md", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 6 {
		t.Fatalf("got %d blocks, want 6", len(blocks))
	}
	checks := []struct {
		lang, body, skip, file string
		serve, runnable        bool
		line                   int
	}{
		{"sh", "tfstackplan version\n", "", "", false, true, 3},
		{"sh", "gcloud auth login\n", "needs real cloud credentials", "", false, false, 8},
		{"hcl", "claim_ttl = \"1h\"\n", "", "policy.hcl", false, false, 13},
		{"sh", "tfstackplan serve --listen 127.0.0.1:8080 \\\n  --insecure-no-auth\n", "", "", true, true, 18},
		{"text", "output\n  indented\n", "", "", false, false, 25},
		{"sh", "echo '```'\n", "", "", false, true, 29},
	}
	for i, c := range checks {
		b := blocks[i]
		if b.Lang != c.lang || b.Body != c.body || b.Skip != c.skip || b.WriteFile != c.file || b.Serve != c.serve ||
			b.Runnable() != c.runnable || b.Line != c.line {
			t.Errorf("block %d = %+v (runnable %v), want %+v", i, *b, b.Runnable(), c)
		}
	}
	cmd, err := doctest.ServeCommand(blocks[3])
	if err != nil || cmd != "tfstackplan serve --listen 127.0.0.1:8080    --insecure-no-auth" {
		t.Errorf("ServeCommand = %q, %v", cmd, err)
	}
	if _, err := doctest.ServeCommand(blocks[0]); err == nil {
		t.Error("ServeCommand accepted a block that is not tfstackplan serve")
	}
}

func TestParseRefuses(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"```bash\nls\n```\n", "tagged bash"},
		{"```console\n$ ls\n```\n", "tagged console"},
		{"```\nls\n```\n", "without a language"},
		{"<!-- doctest: skip -->\n```sh\nls\n```\n", "must say why"},
		{"<!-- doctest: skip slow -->\n```text\nls\n```\n", "only sh blocks run"},
		{"<!-- doctest: skip slow -->\ntext\n```sh\nls\n```\n", "not followed by a code block"},
		{"<!-- doctest: file -->\n```hcl\nx = 1\n```\n", "needs a path"},
		{"<!-- doctest: frobnicate -->\n```sh\nls\n```\n", "unknown doctest directive"},
		{"<!-- doctest: serve -->\n```hcl\nx = 1\n```\n", "starts an sh block"},
		{"```sh\nls\n", "never closed"},
		{"<!-- doctest: skip slow -->\n", "not followed by a code block"},
	} {
		_, err := doctest.Parse("doc.md", []byte(c.src))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want an error with %q", c.src, err, c.want)
		}
	}
}
