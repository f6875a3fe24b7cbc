package runner

import (
	"sort"
	"strconv"
	"strings"

	"github.com/tfstackplan/tfstackplan/events"
)

// The reason texts terramate 0.17 prints for `list --changed --why`.
const (
	whyUnmerged    = "stack has unmerged changes"
	whyTriggered   = "stack has been triggered by: "
	whyWatched     = `stack changed because watched file `
	whyWatchedEnd  = ` changed`
	whyTerragrunt  = `stack changed because module `
	whyModule      = `stack changed because `
	whyBecauseStep = " changed because "
	whySeparator   = " - "
)

// ParseLine parses one line of `terramate list --changed --why` ("<stack> - <reason>", or a bare
// reason) into a change reason: unmerged changes; a watched file; a Terraform module (Detail is
// the module source, Chain the "changed because" steps after it); a trigger (Detail is the
// trigger file); a Terragrunt module. A form it does not know is kept verbatim (Raw) with kind
// "other", never dropped.
//
// Without the list of stacks, a stack path containing " - " is split at the first separator
// after which a known reason follows; WhyChanged resolves lines against the listed stacks.
func ParseLine(line string) events.ChangeReason {
	line = strings.TrimRight(line, "\r\n")
	first := -1
	for i := 0; i <= len(line); {
		j := strings.Index(line[i:], whySeparator)
		if j < 0 {
			break
		}
		k := i + j
		if first < 0 {
			first = k
		}
		if r := parseReason(line[k+len(whySeparator):]); r.Kind != events.ReasonOther {
			r.Stack = line[:k]
			return r
		}
		i = k + 1
	}
	if r := parseReason(line); r.Kind != events.ReasonOther || first < 0 {
		return r
	}
	r := parseReason(line[first+len(whySeparator):])
	r.Stack = line[:first]
	return r
}

// parseReason parses the reason part of a --why line.
func parseReason(reason string) events.ChangeReason {
	r := events.ChangeReason{Kind: events.ReasonOther, Raw: reason}
	switch {
	case reason == whyUnmerged:
		r.Kind = events.ReasonUnmerged
	case strings.HasPrefix(reason, whyTriggered):
		r.Kind = events.ReasonTrigger
		r.Detail = strings.TrimPrefix(reason, whyTriggered)
	case len(reason) >= len(whyWatched)+len(whyWatchedEnd) &&
		strings.HasPrefix(reason, whyWatched) && strings.HasSuffix(reason, whyWatchedEnd):
		q := reason[len(whyWatched) : len(reason)-len(whyWatchedEnd)]
		if file, ok := unquoteWhole(q); ok {
			r.Kind = events.ReasonWatchedFile
			r.Detail = file
		}
	case strings.HasPrefix(reason, whyTerragrunt):
		if detail, chain, ok := parseBecause(reason[len(whyTerragrunt):]); ok {
			r.Kind, r.Detail, r.Chain = events.ReasonTerragruntModule, detail, chain
		}
	case strings.HasPrefix(reason, whyModule):
		if detail, chain, ok := parseBecause(reason[len(whyModule):]); ok {
			r.Kind, r.Detail, r.Chain = events.ReasonModule, detail, chain
		}
	}
	return r
}

// parseBecause parses `"<source>" changed because <step> changed because <step>...`.
func parseBecause(s string) (detail string, chain []string, ok bool) {
	q, err := strconv.QuotedPrefix(s)
	if err != nil {
		return "", nil, false
	}
	rest, found := strings.CutPrefix(s[len(q):], whyBecauseStep)
	if !found {
		return "", nil, false
	}
	detail, err = strconv.Unquote(q)
	if err != nil {
		return "", nil, false
	}
	for step := range strings.SplitSeq(rest, whyBecauseStep) {
		if step = strings.TrimSpace(step); step != "" {
			chain = append(chain, step)
		}
	}
	return detail, chain, len(chain) > 0
}

// unquoteWhole unquotes s when it is exactly one Go/HCL-quoted string.
func unquoteWhole(s string) (string, bool) {
	q, err := strconv.QuotedPrefix(s)
	if err != nil || len(q) != len(s) {
		return "", false
	}
	u, err := strconv.Unquote(q)
	return u, err == nil
}

// ParseWhyLines (see WhyLines) resolves each --why line against the listed stacks: the stack is the listed
// path the line starts with (followed by " - "), preferring one after which a known reason
// follows, then the longest. Lines naming no listed stack fall back to ParseLine.
func ParseWhyLines(lines, stacks []string) []events.ChangeReason {
	listed := make(map[string]bool, len(stacks))
	longest := 0
	for _, s := range stacks {
		listed[s] = true
		longest = max(longest, len(s))
	}
	out := make([]events.ChangeReason, 0, len(lines))
	for _, line := range lines {
		var best events.ChangeReason
		found := false
		for i := 0; i <= len(line); {
			j := strings.Index(line[i:], whySeparator)
			// A prefix longer than every listed stack is none of them: without this bound a
			// line full of separators (a file name, say) costs its length squared.
			if j < 0 || i+j > longest {
				break
			}
			k := i + j
			i = k + 1
			if !listed[line[:k]] {
				continue
			}
			r := parseReason(line[k+len(whySeparator):])
			r.Stack = line[:k]
			if !found || best.Kind == events.ReasonOther || r.Kind != events.ReasonOther {
				best, found = r, true
			}
		}
		if !found {
			best = ParseLine(line)
		}
		out = append(out, best)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Stack < out[j].Stack })
	return out
}
