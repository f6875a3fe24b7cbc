package sqlstore

import (
	"strings"
	"testing"
	"testing/fstest"
)

// A migration is recorded under the number its file name starts with, not its rank among the
// files: with 001, 002 and 004, 004 is version 4, so a 003 merged later is still applied.
func TestMigrationVersionsComeFromFileNames(t *testing.T) {
	fsys := fstest.MapFS{
		"migrations/004_list_indexes.sql": {Data: []byte("SELECT 1;\n")},
		"migrations/001_init.sql":         {Data: []byte("SELECT 1;\n")},
		"migrations/002_gate.sql":         {Data: []byte("SELECT 1;\n")},
	}
	ms, err := migrations(fsys)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, m := range ms {
		got = append(got, m.version)
	}
	if len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 4 {
		t.Fatalf("versions %v, want [1 2 4]", got)
	}
	for name, want := range map[string]string{
		"migrations/init.sql":      "must start with a positive version number",
		"migrations/000_zero.sql":  "must start with a positive version number",
		"migrations/002_again.sql": "the same version 2",
	} {
		bad := fstest.MapFS{"migrations/001_init.sql": {}, "migrations/002_gate.sql": {}, name: {}}
		if _, err := migrations(bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v, want %q", name, err, want)
		}
	}
}

// The embedded migrations all parse, each version once.
func TestEmbeddedMigrationsParse(t *testing.T) {
	ms, err := migrations(migrationFS)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 || ms[0].version != 1 {
		t.Fatalf("migrations %v, want version 1 first", ms)
	}
}
