// Package doctest reads the code blocks of the project's markdown documents (README.md and
// docs/*.md) so that its test can run the shell commands they show.
//
// The convention, for every fenced code block of those documents:
//
//   - ```sh blocks are runnable: the doc test runs each one, in order, in a sandbox (see
//     doctest_test.go). Every command must succeed; a command expected to fail says so in shell,
//     e.g. `tfstackplan run apply ... || test $? -eq 3`.
//   - A ```sh block that cannot run in a test is preceded by `<!-- doctest: skip REASON -->`,
//     and REASON must say why (it needs real cloud credentials, it runs until interrupted, ...).
//   - `<!-- doctest: file PATH -->` before any block writes the block's text to PATH (relative to
//     the directory the previous ```sh block ended in) before the next block runs: the files a
//     document shows are the files its commands use.
//   - `<!-- doctest: serve -->` before a ```sh block holding one `tfstackplan serve ...` command
//     starts it in the background for the rest of the document; every 127.0.0.1:8080 in that
//     command and in the blocks after it is replaced by the address the server really bound.
//   - Shell-like blocks must be tagged sh (runnable) or text (output, synopses): bash, shell,
//     console and zsh are refused, and so is a fence without a language.
//
// The directives are HTML comments, invisible where the markdown is rendered.
package doctest

import (
	"bufio"
	"bytes"
	"fmt"
	"regexp"
	"strings"
)

// Block is one fenced code block of a document.
type Block struct {
	// File and Line say where the block starts (the opening fence).
	File string
	Line int
	// Lang is the first word of the fence's info string, lower-cased ("sh", "hcl", ...).
	Lang string
	// Body is the block's text, with a final newline.
	Body string
	// Skip is the reason of a `skip` directive ("" : none).
	Skip string
	// WriteFile is the path of a `file` directive ("" : none).
	WriteFile string
	// Serve marks a `serve` directive.
	Serve bool
}

// Runnable reports whether the doc test runs the block as shell commands.
func (b *Block) Runnable() bool { return b.Lang == "sh" && b.Skip == "" }

// Where is "FILE:LINE".
func (b *Block) Where() string { return fmt.Sprintf("%s:%d", b.File, b.Line) }

// shellLike are the languages a shell block must not be tagged with: sh runs, text shows.
var shellLike = map[string]bool{"bash": true, "shell": true, "console": true, "zsh": true, "shell-session": true, "shellsession": true}

var (
	fenceRE     = regexp.MustCompile("^( *)(```+|~~~+)[ \t]*([^`]*)$")
	directiveRE = regexp.MustCompile(`^\s*<!--\s*doctest:\s*(.*?)\s*-->\s*$`)
)

type directive struct {
	line int
	kind string
	arg  string
}

// Parse returns the fenced code blocks of a markdown document, with their directives. It fails
// on a block or directive that breaks the convention (see the package documentation); the
// error names every problem with its line.
func Parse(file string, src []byte) ([]*Block, error) {
	var blocks []*Block
	var problems []string
	bad := func(line int, format string, a ...any) {
		problems = append(problems, fmt.Sprintf("%s:%d: %s", file, line, fmt.Sprintf(format, a...)))
	}
	var pending *directive
	var open *Block
	var fence string
	var indent int
	var body strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if open != nil {
			if m := fenceRE.FindStringSubmatch(line); m != nil && strings.TrimSpace(m[3]) == "" &&
				m[2][0] == fence[0] && len(m[2]) >= len(fence) {
				open.Body = body.String()
				blocks = append(blocks, open)
				open = nil
				continue
			}
			// Drop up to the opening fence's indentation, as markdown does.
			trimmed := strings.TrimLeft(line, " ")
			if cut := len(line) - len(trimmed); cut > indent {
				trimmed = line[indent:]
			}
			body.WriteString(trimmed + "\n")
			continue
		}
		if m := directiveRE.FindStringSubmatch(line); m != nil {
			if pending != nil {
				bad(pending.line, "doctest directive not followed by a code block")
			}
			kind, arg, _ := strings.Cut(m[1], " ")
			d := &directive{line: n, kind: kind, arg: strings.TrimSpace(arg)}
			switch {
			case kind == "skip" && d.arg == "":
				bad(n, "`doctest: skip` must say why the block cannot run in a test")
			case kind == "file" && d.arg == "":
				bad(n, "`doctest: file` needs a path")
			case kind == "serve" && d.arg != "":
				bad(n, "`doctest: serve` takes no argument")
			case kind != "skip" && kind != "file" && kind != "serve":
				bad(n, "unknown doctest directive %q (want skip REASON, file PATH or serve)", kind)
			}
			pending = d
			continue
		}
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			open = &Block{File: file, Line: n}
			fence, indent = m[2], len(m[1])
			body.Reset()
			info := strings.Fields(m[3])
			if len(info) > 0 {
				open.Lang = strings.ToLower(info[0])
			}
			switch {
			case open.Lang == "":
				bad(n, "code block without a language: tag it sh (runnable), text, hcl, json, ...")
			case shellLike[open.Lang]:
				bad(n, "code block tagged %s: tag commands sh (the doc test runs them; `<!-- doctest: skip REASON -->` before one that cannot run) and output text", open.Lang)
			}
			if pending != nil {
				switch pending.kind {
				case "skip":
					open.Skip = pending.arg
					if open.Lang != "sh" {
						bad(pending.line, "`doctest: skip` before a %s block: only sh blocks run", open.Lang)
					}
				case "file":
					open.WriteFile = pending.arg
				case "serve":
					open.Serve = true
					if open.Lang != "sh" {
						bad(pending.line, "`doctest: serve` before a %s block: it starts an sh block's tfstackplan serve", open.Lang)
					}
				}
				pending = nil
			}
			continue
		}
		if pending != nil && strings.TrimSpace(line) != "" {
			bad(pending.line, "doctest directive not followed by a code block")
			pending = nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if open != nil {
		bad(open.Line, "code block never closed")
	}
	if pending != nil {
		bad(pending.line, "doctest directive not followed by a code block")
	}
	if len(problems) > 0 {
		return blocks, fmt.Errorf("%s", strings.Join(problems, "\n"))
	}
	return blocks, nil
}

// ServeCommand checks that a serve block holds exactly one command (backslash continuations
// allowed) and returns it on one line.
func ServeCommand(b *Block) (string, error) {
	joined := strings.ReplaceAll(strings.TrimSpace(b.Body), "\\\n", " ")
	if strings.ContainsAny(joined, "\n;|&") || !strings.HasPrefix(joined, "tfstackplan serve") {
		return "", fmt.Errorf("%s: a `doctest: serve` block must hold one `tfstackplan serve ...` command and nothing else", b.Where())
	}
	return joined, nil
}
