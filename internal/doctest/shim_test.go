package doctest_test

// Without the real terramate and tofu, the documents' commands run against the project's
// stand-ins (testdata/faketerramate, testdata/faketofu). Those replay recordings and must be
// told what to replay: the fake terramate reads the project's stacks and changed stacks from a
// scenario file, the fake tofu the recorded case of each stack from a case file. A document
// writes neither: it shows what a user writes. So the sandbox's `terramate` and `tofu` are this
// test binary, which writes those files from the project as it is (stack blocks, git history,
// the stack's *.tf) and then becomes the fake (TestMain).

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// Environment of the shims: the fakes they become.
const (
	envFakeTerramate = "DOCTEST_FAKETERRAMATE"
	envFakeTofu      = "DOCTEST_FAKETOFU"
)

// shim runs when this binary was invoked as terramate, tofu or terraform; ok is false otherwise.
func shim() (code int, ok bool) {
	switch filepath.Base(os.Args[0]) {
	case "terramate":
		return terramateShim(os.Args[1:]), true
	case "tofu", "terraform":
		return tofuShim(os.Args[1:]), true
	}
	return 0, false
}

func shimFail(format string, a ...any) int {
	fmt.Fprintf(os.Stderr, "doctest shim: "+format+"\n", a...)
	return 1
}

// become replaces this process with bin (keeping its pid: the driver signals terramate's
// process group).
func become(bin string, args []string) int {
	if bin == "" {
		return shimFail("the fake to run is not set")
	}
	err := syscall.Exec(bin, append([]string{bin}, args...), os.Environ())
	return shimFail("exec %s: %v", bin, err)
}

// fakeStack and fakeChange are the scenario's, see testdata/faketerramate.
type fakeStack struct {
	Path        string   `json:"path"`
	Name        string   `json:"name,omitempty"`
	ID          string   `json:"id,omitempty"`
	Description string   `json:"description,omitempty"`
	Tags        []string `json:"tags,omitempty"`
	After       []string `json:"after,omitempty"`
	Before      []string `json:"before,omitempty"`
}

type fakeChange struct {
	Stack string `json:"stack"`
	Why   string `json:"why"`
}

type fakeScenario struct {
	Stacks        []fakeStack             `json:"stacks"`
	Changed       []fakeChange            `json:"changed,omitempty"`
	ChangedByBase map[string][]fakeChange `json:"changedByBase,omitempty"`
}

// terramateShim writes .faketerramate.json at the project root (the directory holding .git):
// the stack blocks of the project's *.tm.hcl files, and as changed the stacks whose own files
// differ from the base terramate would use (origin/main, HEAD^ on main, or -B REF).
func terramateShim(args []string) int {
	dir, _ := os.Getwd()
	for i, a := range args {
		switch {
		case (a == "-C" || a == "--chdir") && i+1 < len(args):
			dir = filepath.Join(dir, args[i+1])
		case strings.HasPrefix(a, "--chdir="):
			dir = filepath.Join(dir, strings.TrimPrefix(a, "--chdir="))
		}
	}
	root := dir
	for {
		if _, err := os.Stat(filepath.Join(root, ".git")); err == nil {
			break
		}
		parent := filepath.Dir(root)
		if parent == root {
			// Not a repository: the fake says so itself.
			return become(os.Getenv(envFakeTerramate), args)
		}
		root = parent
	}
	stacks, err := projectStacks(root)
	if err != nil {
		return shimFail("%v", err)
	}
	sc := fakeScenario{Stacks: stacks}
	sc.Changed = changedStacks(root, stacks, defaultBase(root))
	for i, a := range args {
		base := ""
		switch {
		case (a == "-B" || a == "--git-change-base") && i+1 < len(args):
			base = args[i+1]
		case strings.HasPrefix(a, "--git-change-base="):
			base = strings.TrimPrefix(a, "--git-change-base=")
		}
		if base != "" {
			sc.ChangedByBase = map[string][]fakeChange{base: changedStacks(root, stacks, base)}
		}
	}
	b, err := json.MarshalIndent(sc, "", "  ")
	if err != nil {
		return shimFail("%v", err)
	}
	// Written whole, then renamed into place: the driver runs some terramate commands at once,
	// and one must never read the file while another rewrites it. The temporary file is made
	// in .git, where no git status (nor the fake's untracked-file check) sees it.
	tmp, err := os.CreateTemp(filepath.Join(root, ".git"), "faketerramate-*.json")
	if err != nil {
		return shimFail("%v", err)
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(root, ".faketerramate.json"))
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return shimFail("%v", err)
	}
	return become(os.Getenv(envFakeTerramate), args)
}

// projectStacks reads the stack blocks of every *.tm.hcl and *.tm file under root.
func projectStacks(root string) ([]fakeStack, error) {
	var stacks []fakeStack
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != root && (strings.HasPrefix(name, ".") || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".tm.hcl") && !strings.HasSuffix(p, ".tm") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		f, diags := hclsyntax.ParseConfig(src, p, hcl.InitialPos)
		if diags.HasErrors() {
			return nil // terramate (the fake) reports syntax errors its own way
		}
		for _, blk := range f.Body.(*hclsyntax.Body).Blocks {
			if blk.Type != "stack" {
				continue
			}
			rel, _ := filepath.Rel(root, filepath.Dir(p))
			st := fakeStack{Path: filepath.ToSlash(rel)}
			for name, attr := range blk.Body.Attributes {
				v, diags := attr.Expr.Value(nil)
				if diags.HasErrors() {
					continue
				}
				strs := map[string]*string{"name": &st.Name, "id": &st.ID, "description": &st.Description}
				lists := map[string]*[]string{"tags": &st.Tags, "after": &st.After, "before": &st.Before}
				switch {
				case strs[name] != nil && v.Type().FriendlyName() == "string":
					*strs[name] = v.AsString()
				case lists[name] != nil && v.CanIterateElements():
					for it := v.ElementIterator(); it.Next(); {
						if _, e := it.Element(); e.Type().FriendlyName() == "string" {
							*lists[name] = append(*lists[name], e.AsString())
						}
					}
				}
			}
			stacks = append(stacks, st)
		}
		return nil
	})
	sort.Slice(stacks, func(i, j int) bool { return stacks[i].Path < stacks[j].Path })
	return stacks, err
}

// defaultBase is terramate's default change base: the previous commit on the default branch,
// else origin/main.
func defaultBase(root string) string {
	if branch, err := gitOut(root, "rev-parse", "--abbrev-ref", "HEAD"); err == nil && branch == "main" {
		return "HEAD^"
	}
	return "origin/main"
}

// changedStacks lists the stacks owning a file that changed between base and HEAD (a file
// belongs to the deepest stack above it).
func changedStacks(root string, stacks []fakeStack, base string) []fakeChange {
	from, err := gitOut(root, "merge-base", base, "HEAD")
	if err != nil {
		return nil
	}
	files, err := gitOut(root, "diff", "--name-only", from, "HEAD")
	if err != nil {
		return nil
	}
	changed := map[string]bool{}
	for _, f := range strings.Split(files, "\n") {
		owner := ""
		for _, st := range stacks {
			if (st.Path == "." || strings.HasPrefix(f, st.Path+"/")) && len(st.Path) > len(owner) {
				owner = st.Path
			}
		}
		if owner != "" {
			changed[owner] = true
		}
	}
	var out []fakeChange
	for _, st := range stacks {
		if changed[st.Path] {
			out = append(out, fakeChange{Stack: st.Path, Why: "stack has unmerged changes"})
		}
	}
	return out
}

func gitOut(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
}

// tofuShim writes faketofu.case before each plan: the recorded case (testdata/tofu/CASE) whose
// configuration after the change (v2.tf), else before it (v1.tf), is the stack's *.tf. (A saved
// plan names its case itself: show and apply need no case file.)
func tofuShim(args []string) int {
	fixtures := os.Getenv("FAKETOFU_FIXTURES")
	if len(args) > 0 && args[0] == "plan" && fixtures != "" {
		c, err := recordedCase(fixtures)
		if err != nil {
			return shimFail("%v", err)
		}
		if err := os.WriteFile("faketofu.case", []byte(c+"\n"), 0o644); err != nil {
			return shimFail("%v", err)
		}
	}
	return become(os.Getenv(envFakeTofu), args)
}

func recordedCase(fixtures string) (string, error) {
	here, err := tfText(".")
	if err != nil {
		return "", err
	}
	cases, err := os.ReadDir(fixtures)
	if err != nil {
		return "", err
	}
	for _, v := range []string{"v2.tf", "v1.tf"} {
		for _, c := range cases {
			if !c.IsDir() || strings.HasPrefix(c.Name(), "_") {
				continue
			}
			b, err := os.ReadFile(filepath.Join(fixtures, c.Name(), v))
			if err == nil && normalize(string(b)) == here {
				return c.Name(), nil
			}
		}
	}
	wd, _ := os.Getwd()
	return "", fmt.Errorf("the fake tofu replays recordings, and no case of %s has the configuration of %s: "+
		"give a stack the v1.tf or v2.tf of a recorded case, or set TFSTACKPLAN_TOFU to a real tofu", fixtures, wd)
}

// tfText is the stack's *.tf files, concatenated in name order and normalized.
func tfText(dir string) (string, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.tf"))
	if err != nil {
		return "", err
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		src, err := os.ReadFile(n)
		if err != nil {
			return "", err
		}
		b.Write(src)
		b.WriteString("\n")
	}
	return normalize(b.String()), nil
}

// normalize drops blank lines and trailing spaces, which do not change a configuration.
func normalize(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimRight(l, " \t\r"); l != "" {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
