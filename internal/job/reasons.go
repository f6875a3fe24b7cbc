package job

import (
	"slices"
	"strconv"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/textfit"
)

// fitReason returns cr within the contract's bounds, and whether it had to change it: every
// text valid UTF-8 (invalid bytes become U+FFFD) without NUL bytes (U+FFFD too) and at most
// events.MaxReasonText bytes (a longer one is cut at a character boundary and ends with "…"), at
// most events.MaxReasonChain chain steps (the last one kept says how many more there were). The
// stack is left alone: it is a listed stack's path, which no report may change.
func fitReason(cr events.ChangeReason) (events.ChangeReason, bool) {
	changed := false
	fit := func(s string) string {
		t := fitReasonText(s)
		changed = changed || t != s
		return t
	}
	cr.Kind, cr.Detail, cr.Raw = fit(cr.Kind), fit(cr.Detail), fit(cr.Raw)
	if len(cr.Chain) > 0 {
		chain := make([]string, 0, min(len(cr.Chain), events.MaxReasonChain)) // never cr's own array
		for i, step := range cr.Chain {
			if i == events.MaxReasonChain-1 && len(cr.Chain) > events.MaxReasonChain {
				chain = append(chain, "… "+strconv.Itoa(len(cr.Chain)-i)+" more steps")
				changed = true
				break
			}
			chain = append(chain, fit(step))
		}
		cr.Chain = chain
	}
	return cr, changed
}

// fitReasons returns reasons fitted with fitReason (a new slice when any changed), and how many
// changed.
func fitReasons(reasons []events.ChangeReason) ([]events.ChangeReason, int) {
	out, n := reasons, 0
	for i, cr := range reasons {
		f, changed := fitReason(cr)
		if !changed {
			continue
		}
		if n == 0 {
			out = slices.Clone(reasons)
		}
		out[i] = f
		n++
	}
	return out, n
}

// fitReasonText makes s a valid reason text (see fitReason).
func fitReasonText(s string) string {
	s = textfit.Sanitize(s)
	if len(s) <= events.MaxReasonText {
		return s
	}
	const ellipsis = "…"
	return textfit.Prefix(s, events.MaxReasonText-len(ellipsis)) + ellipsis
}
