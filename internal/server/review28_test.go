package server

import (
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// bidiRunes are the characters that reorder text: shown raw, a runner's sha or actor could make
// a page read otherwise than what the server stored.
const bidiRunes = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"

// What runners report reaches the pages without its bidirectional formatting characters.
func TestPagesShowNoBidirectionalOverrides(t *testing.T) {
	ts := newTestServer(t, storetest.OpenSQLite(t), nil)
	if status, out, _ := ts.call(t, "runner", "POST", "/events/init", map[string]any{"execution_id": "bidi-1", "environment": "prod",
		"op": "plan", "pr": 12, "sha": "abc\u202edef", "actor": "\u2066mallory\u2069", "stacks": []string{"app"},
		"reasons": []map[string]string{{"stack": "app", "kind": "watched-file", "detail": "main.tf\u202e"}}}); status != 200 {
		t.Fatalf("init: %d %v", status, out)
	}
	if status, out, _ := ts.call(t, "runner", "POST", "/events/finalize", map[string]any{"execution_id": "bidi-1", "status": "failed",
		"error": "boom \u202e!"}); status != 200 {
		t.Fatalf("finalize: %d %v", status, out)
	}
	for _, path := range []string{"/", "/ui/executions/bidi-1"} {
		status, body := ts.page(t, path, tokenOf["viewer"])
		if status != 200 || !strings.Contains(body, "bidi-1") {
			t.Fatalf("%s: %d %s", path, status, body)
		}
		if i := strings.IndexAny(body, bidiRunes); i >= 0 {
			t.Fatalf("%s shows a bidirectional formatting character: …%s…", path, body[max(0, i-60):min(len(body), i+60)])
		}
		if !strings.Contains(body, "abc\ufffd") {
			t.Fatalf("%s does not show the sha with the character replaced", path)
		}
	}
}
