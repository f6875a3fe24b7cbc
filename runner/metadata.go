package runner

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/tfstackplan/tfstackplan/events"
)

// stackMeta is what `terramate debug show metadata` tells about one stack that ordering needs.
type stackMeta struct {
	Path          string // root-relative with a leading slash: "/stacks/nonprod/network"
	Tags          []string
	Before, After []string
}

// parseMetadata parses `terramate debug show metadata`:
//
//	stack "/stacks/x":
//		terramate.stack.tags=["prod"]
//		terramate.stack.after=["/stacks/y","tag:prod"]
//		...
func parseMetadata(out []byte) ([]stackMeta, error) {
	var stacks []stackMeta
	for n, line := range strings.Split(string(out), "\n") {
		line = strings.TrimRight(line, "\r")
		if rest, ok := strings.CutPrefix(line, "stack "); ok {
			rest, ok = strings.CutSuffix(rest, ":")
			p, err := strconv.Unquote(rest)
			if !ok || err != nil || !strings.HasPrefix(p, "/") {
				return nil, fmt.Errorf("terramate debug show metadata, line %d: expected `stack \"/path\":`, got %q", n+1, line)
			}
			stacks = append(stacks, stackMeta{Path: path.Clean(p)})
			continue
		}
		kv, ok := strings.CutPrefix(strings.TrimLeft(line, " \t"), "terramate.stack.")
		if !ok || len(stacks) == 0 {
			continue
		}
		key, val, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		cur := &stacks[len(stacks)-1]
		var dst *[]string
		switch key {
		case "tags":
			dst = &cur.Tags
		case "before":
			dst = &cur.Before
		case "after":
			dst = &cur.After
		case "path.absolute":
			if p, err := strconv.Unquote(val); err == nil && strings.HasPrefix(p, "/") {
				cur.Path = path.Clean(p)
			}
			continue
		default:
			continue
		}
		list, err := parseStringList(val)
		if err != nil {
			return nil, fmt.Errorf("terramate debug show metadata, line %d: %s of stack %s: %w", n+1, key, cur.Path, err)
		}
		*dst = list
	}
	return stacks, nil
}

// parseStringList parses ["a","b"] (terramate prints lists of quoted strings).
func parseStringList(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	inner, ok := strings.CutPrefix(s, "[")
	if inner, ok = strings.CutSuffix(inner, "]"); !ok {
		return nil, fmt.Errorf("expected a list of strings, got %q", s)
	}
	var out []string
	for inner = strings.TrimSpace(inner); inner != ""; {
		q, err := strconv.QuotedPrefix(inner)
		if err != nil {
			return nil, fmt.Errorf("expected a quoted string in %q", s)
		}
		v, _ := strconv.Unquote(q)
		out = append(out, v)
		inner = strings.TrimSpace(inner[len(q):])
		if rest, ok := strings.CutPrefix(inner, ","); ok {
			inner = strings.TrimSpace(rest)
		} else if inner != "" {
			return nil, fmt.Errorf("expected ',' between strings in %q", s)
		}
	}
	return out, nil
}

// metadataEdges derives the ordering edges from the stacks' before/after the way terramate
// does: an entry is a path (absolute, or relative to the stack) or a tag filter ("tag:a:b" is
// a AND b, "tag:a,b" is a OR b); it selects the stack or directory there, or the tagged stacks,
// and every stack nested below what it selects. `after` puts the selected stacks before the
// stack, `before` after it. Edges are root-relative with a leading slash, sorted, unique.
func metadataEdges(stacks []stackMeta) []events.Edge {
	paths := make([]string, len(stacks))
	for i, s := range stacks {
		paths[i] = s.Path
	}
	slices.Sort(paths)
	tags := make(map[string][]string, len(stacks))
	for _, s := range stacks {
		tags[s.Path] = s.Tags
	}
	// A tag filter is evaluated over every stack once, however many stacks name it.
	tagged := map[string][]string{}
	byTag := func(filter string) []string {
		ps, ok := tagged[filter]
		if !ok {
			for _, p := range paths {
				if matchTagFilter(filter, tags[p]) {
					ps = append(ps, p)
				}
			}
			tagged[filter] = ps
		}
		return ps
	}
	out := []events.Edge{}
	for _, s := range stacks {
		for _, a := range s.After {
			for _, t := range selectStacks(paths, byTag, s.Path, a) {
				out = append(out, events.Edge{From: t, To: s.Path})
			}
		}
		for _, b := range s.Before {
			for _, t := range selectStacks(paths, byTag, s.Path, b) {
				out = append(out, events.Edge{From: s.Path, To: t})
			}
		}
	}
	slices.SortFunc(out, compareEdges)
	return slices.Compact(out)
}

// selectStacks resolves one before/after entry of stack self into the stacks it selects
// (never self): those byTag returns for a "tag:" filter, or a directory's stacks. paths is
// sorted, so the stacks below a directory are one contiguous run, found by binary search
// (not the longer run of every path that merely starts with the directory's name).
func selectStacks(paths []string, byTag func(filter string) []string, self, entry string) []string {
	var dirs []string
	if filter, ok := strings.CutPrefix(entry, "tag:"); ok {
		dirs = byTag(filter)
	} else {
		abs := entry
		if !strings.HasPrefix(abs, "/") {
			abs = path.Join(self, abs)
		}
		dirs = append(dirs, path.Clean("/"+abs))
	}
	var out []string
	for _, d := range dirs {
		if d == "/" { // the root: every stack
			for _, p := range paths {
				if p != self {
					out = append(out, p)
				}
			}
			continue
		}
		if _, found := slices.BinarySearch(paths, d); found && d != self {
			out = append(out, d)
		}
		below := d + "/"
		i, _ := slices.BinarySearch(paths, below)
		for ; i < len(paths) && strings.HasPrefix(paths[i], below); i++ {
			if paths[i] != self {
				out = append(out, paths[i])
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// matchTagFilter evaluates a terramate tag filter against tags.
func matchTagFilter(filter string, tags []string) bool {
	for alt := range strings.SplitSeq(filter, ",") {
		ok := alt != ""
		for t := range strings.SplitSeq(alt, ":") {
			if !slices.Contains(tags, t) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}
