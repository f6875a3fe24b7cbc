package cli

import (
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// The README's command synopsis is written by hand for readers, so this test holds it to the
// command tree: every command it names exists, every flag it names belongs to that command, and
// every command and flag of the tree appears in it.

// serverFlagsMarker stands, in a synopsis entry, for the flags listed on the block's
// "server flags:" line.
const serverFlagsMarker = "[server flags]"

// A flag followed by a command's name in parentheses, `[--rerun-failed (plan)]` in an entry of
// `run plan|apply`, is that command's alone.
var synopsisFlag = regexp.MustCompile(`--([a-z][a-z0-9-]*)(?:\s+\(([a-z]+)\))?`)

// readmeSynopsis returns the entries of the README's "## Commands" block (continuation lines
// joined) and the flags its "server flags:" line lists.
func readmeSynopsis(t *testing.T) (entries []string, serverFlags []string) {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "## Commands\n\n```text\n")
	if !ok {
		t.Fatal("README.md has no \"## Commands\" section opening with a text block")
	}
	block, _, ok := strings.Cut(rest, "```\n")
	if !ok {
		t.Fatal("README.md's command block is not closed")
	}
	for _, line := range strings.Split(block, "\n") {
		switch {
		case strings.TrimSpace(line) == "":
		case strings.HasPrefix(line, "server flags:"):
			for _, m := range synopsisFlag.FindAllStringSubmatch(line, -1) {
				serverFlags = append(serverFlags, m[1])
			}
		case strings.HasPrefix(line, "tfstackplan"):
			entries = append(entries, line)
		case strings.HasPrefix(line, " ") && len(entries) > 0:
			entries[len(entries)-1] += " " + strings.TrimSpace(line)
		default:
			t.Fatalf("README.md's command block: line %q is neither an entry, a continuation nor the server flags", line)
		}
	}
	if len(serverFlags) == 0 {
		t.Fatal("README.md's command block has no \"server flags:\" line")
	}
	return entries, serverFlags
}

// synopsisCommands resolves the command words at the start of an entry ("run plan|apply"
// names two commands); the rest of the entry is arguments and flags.
func synopsisCommands(root *cobra.Command, entry string) []*cobra.Command {
	cmds := []*cobra.Command{root}
	for _, word := range strings.Fields(entry)[1:] {
		var next []*cobra.Command
		for _, c := range cmds {
			for _, alt := range strings.Split(word, "|") {
				if sub := subcommand(c, alt); sub != nil {
					next = append(next, sub)
				}
			}
		}
		if len(next) != len(cmds)*len(strings.Split(word, "|")) {
			break
		}
		cmds = next
	}
	return cmds
}

func subcommand(c *cobra.Command, name string) *cobra.Command {
	for _, s := range c.Commands() {
		if s.Name() == name && !s.Hidden {
			return s
		}
	}
	return nil
}

// synopsisProblems lists what differs between the synopsis entries and the command tree.
func synopsisProblems(root *cobra.Command, entries, serverFlags []string) []string {
	var problems []string
	covered := map[*cobra.Command]bool{}
	for _, entry := range entries {
		named := map[string]string{} // flag → the one command it is named for ("" : every one)
		for _, m := range synopsisFlag.FindAllStringSubmatch(entry, -1) {
			named[m[1]] = m[2]
		}
		if strings.Contains(entry, serverFlagsMarker) {
			for _, f := range serverFlags {
				named[f] = ""
			}
		}
		for _, c := range synopsisCommands(root, entry) {
			covered[c] = true
			for f, only := range named {
				if only != "" && only != c.Name() {
					continue
				}
				if fl := c.Flags().Lookup(f); fl == nil || fl.Hidden {
					problems = append(problems, "names --"+f+" for \""+c.CommandPath()+"\", which has no such flag")
				}
			}
			c.LocalFlags().VisitAll(func(fl *pflag.Flag) {
				if only, ok := named[fl.Name]; !fl.Hidden && fl.Name != "help" && (!ok || only != "" && only != c.Name()) {
					problems = append(problems, "omits --"+fl.Name+" of \""+c.CommandPath()+"\"")
				}
			})
		}
	}
	walkCommands(root, func(c *cobra.Command) {
		if c.Runnable() && !c.HasAvailableSubCommands() && !covered[c] {
			problems = append(problems, "has no entry for \""+c.CommandPath()+"\"")
		}
	})
	sort.Strings(problems)
	return problems
}

func TestReadmeSynopsisMatchesCommands(t *testing.T) {
	root := NewRootCmd(&IO{In: strings.NewReader(""), Out: io.Discard, ErrOut: io.Discard})
	entries, serverFlags := readmeSynopsis(t)
	for _, p := range synopsisProblems(root, entries, serverFlags) {
		t.Errorf("README.md's command synopsis %s", p)
	}
}

// TestReadmeSynopsisCheckCatches shows the check can fail: a synopsis naming a flag a command
// lacks, omitting one it has, or leaving a command out is reported.
func TestReadmeSynopsisCheckCatches(t *testing.T) {
	root := NewRootCmd(&IO{In: strings.NewReader(""), Out: io.Discard, ErrOut: io.Discard})
	if got := synopsisCommands(root, "tfstackplan run plan|apply --environment ENV"); len(got) != 2 ||
		got[0].CommandPath() != "tfstackplan run plan" || got[1].CommandPath() != "tfstackplan run apply" {
		t.Fatalf("run plan|apply resolved to %v", got)
	}
	if got := synopsisCommands(root, "tfstackplan completion bash|zsh|fish"); len(got) != 1 || got[0].Name() != "completion" {
		t.Fatalf("completion's arguments were taken for commands: %v", got)
	}
	entries, serverFlags := readmeSynopsis(t)
	var broken []string
	for _, e := range entries {
		switch {
		case strings.HasPrefix(e, "tfstackplan run tick "):
			broken = append(broken, "tfstackplan run tick --phase PHASE [--stack STACK] [--status STATUS] [--colour C]")
		case strings.HasPrefix(e, "tfstackplan copy "):
		case strings.HasPrefix(e, "tfstackplan run plan|apply "):
			// A flag of plan alone, named for apply.
			broken = append(broken, strings.Replace(e, "--rerun-failed (plan)", "--rerun-failed (apply)", 1))
		default:
			broken = append(broken, e)
		}
	}
	got := synopsisProblems(root, broken, serverFlags)
	want := []string{
		`has no entry for "tfstackplan copy"`,
		`names --colour for "tfstackplan run tick", which has no such flag`,
		`omits --message of "tfstackplan run tick"`,
		`names --rerun-failed for "tfstackplan run apply", which has no such flag`,
		`omits --rerun-failed of "tfstackplan run plan"`,
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("problems of a broken synopsis:\n%s\nlack: %s", strings.Join(got, "\n"), w)
		}
	}
}
