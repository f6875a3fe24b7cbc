package earlytick

import (
	"os"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tfstackplan/tfstackplan/internal/tickline"
)

// blank must agree with strings.TrimSpace(s) == "" on every rune, valid or not.
func TestBlankIsTrimSpaceEmpty(t *testing.T) {
	for r := rune(0); r <= utf8.MaxRune+1; r++ {
		s := string(r)
		if got, want := blank(s), strings.TrimSpace(s) == ""; got != want {
			t.Fatalf("blank(%U) = %v, strings.TrimSpace says %v", r, got, want)
		}
		if got, want := blank(" x"+s), strings.TrimSpace(" x"+s) == ""; got != want {
			t.Fatalf("blank(%q) = %v, want %v", " x"+s, got, want)
		}
	}
	for _, s := range []string{"", " \t\n", "\xff", " \xff ", "\u3000\u2000\u200a"} {
		if got, want := blank(s), strings.TrimSpace(s) == ""; got != want {
			t.Fatalf("blank(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestCutIsStringsCut(t *testing.T) {
	for _, s := range []string{"", "=", "phase", "phase=", "phase=x", "phase=x=y", "=x"} {
		b, a, f := cut(s, '=')
		wb, wa, wf := strings.Cut(s, "=")
		if b != wb || a != wa || f != wf {
			t.Fatalf("cut(%q) = %q %q %v, strings.Cut gives %q %q %v", s, b, a, f, wb, wa, wf)
		}
	}
}

// Handle's own decisions; internal/cli's tests hold them equal to the full command line's.
func TestHandle(t *testing.T) {
	at := time.Unix(0, 1796114412647223557)
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		handled bool
		want    *tickline.Record // the line written under the driver, if any
	}{
		{"offline", []string{"run", "tick", "--phase", "plan", "--stack", "s"}, nil, true, nil},
		{"offline, stack from the environment", []string{"run", "tick", "--phase=plan"}, map[string]string{envStack: "s"}, true, nil},
		{"under the driver", []string{"run", "tick", "--phase", "done", "--status=succeeded", "--message", "--looks-like-a-flag"},
			map[string]string{envStack: "stacks/a", tickline.EnvDir: "DIR"}, true,
			&tickline.Record{Stack: "stacks/a", Phase: "done", Status: "succeeded", Message: "--looks-like-a-flag", At: at.UnixNano()}},
		{"a server but no execution", []string{"run", "tick", "--phase", "plan", "--stack", "s"}, map[string]string{envServer: "http://127.0.0.1:1"}, true, nil},
		{"a blank server", []string{"run", "tick", "--phase", "plan", "--stack", "s"}, map[string]string{envServer: " \t", envExecution: "e"}, true, nil},
		{"straight to a server", []string{"run", "tick", "--phase", "plan", "--stack", "s"}, map[string]string{envServer: "http://127.0.0.1:1", envExecution: "e"}, false, nil},
		{"no phase", []string{"run", "tick", "--stack", "s"}, nil, false, nil},
		{"a blank phase", []string{"run", "tick", "--phase", " ", "--stack", "s"}, nil, false, nil},
		{"no stack, offline", []string{"run", "tick", "--phase", "plan"}, nil, true, nil},
		{"a blank --stack and no environment, offline", []string{"run", "tick", "--phase", "plan", "--stack="}, nil, true, nil},
		{"no stack under the driver", []string{"run", "tick", "--phase", "plan"}, map[string]string{tickline.EnvDir: "DIR"}, false, nil},
		{"a blank stack under the driver", []string{"run", "tick", "--phase", "plan"}, map[string]string{envStack: " ", tickline.EnvDir: "DIR"}, false, nil},
		{"no stack, straight to a server", []string{"run", "tick", "--phase", "plan"}, map[string]string{envServer: "http://127.0.0.1:1", envExecution: "e"}, false, nil},
		{"a missing value", []string{"run", "tick", "--stack", "s", "--phase"}, nil, false, nil},
		{"a repeated flag", []string{"run", "tick", "--phase", "a", "--phase", "b", "--stack", "s"}, nil, false, nil},
		{"an unknown flag", []string{"run", "tick", "--phase", "a", "--stack", "s", "--verbose", "x"}, nil, false, nil},
		{"a short flag", []string{"run", "tick", "-h"}, nil, false, nil},
		{"help", []string{"run", "tick", "--help"}, nil, false, nil},
		{"a positional argument", []string{"run", "tick", "--phase", "a", "--stack", "s", "extra"}, nil, false, nil},
		{"the end of flags", []string{"run", "tick", "--", "--phase", "a"}, nil, false, nil},
		{"another command", []string{"run", "plan", "--phase", "a", "--stack", "s"}, nil, false, nil},
		{"no command", nil, nil, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			env := func(k string) string {
				v := tc.env[k]
				if v == "DIR" {
					return dir
				}
				return v
			}
			if got := Handle(tc.args, env, func() (int64, bool) { return at.UnixNano(), true }); got != tc.handled {
				t.Fatalf("Handle(%q) = %v, want %v", tc.args, got, tc.handled)
			}
			b, err := os.ReadFile(tickline.Path(dir))
			if tc.want == nil {
				if err == nil {
					t.Fatalf("a tick file was written: %s", b)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := string(tc.want.AppendJSON(nil)) + "\n"; string(b) != want {
				t.Fatalf("tick file\n got %s\nwant %s", b, want)
			}
		})
	}
}
