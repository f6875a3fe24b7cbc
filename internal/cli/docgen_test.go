package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestWriteReference: the reference has a section for every visible command with a row for
// each of its flags, and rendering it twice gives the same bytes (check-generated.sh compares
// the committed docs/cli.md with a fresh rendering).
func TestWriteReference(t *testing.T) {
	var a, b bytes.Buffer
	if err := WriteReference(&a); err != nil {
		t.Fatal(err)
	}
	if err := WriteReference(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("WriteReference is not deterministic")
	}
	doc := a.String()
	n := 0
	walkCommands(NewRootCmd(&IO{}), func(c *cobra.Command) {
		n++
		head := "\n## " + c.CommandPath() + "\n"
		i := strings.Index(doc, head)
		if i < 0 {
			t.Errorf("no section for %q", c.CommandPath())
			return
		}
		section := doc[i+len(head):]
		if j := strings.Index(section, "\n## "); j >= 0 {
			section = section[:j]
		}
		for _, f := range visibleFlags(c.LocalFlags()) {
			if !strings.Contains(section, "`--"+f.Name) {
				t.Errorf("%s: no row for --%s", c.CommandPath(), f.Name)
			}
		}
	})
	if n < 10 {
		t.Fatalf("only %d commands walked", n)
	}
}
