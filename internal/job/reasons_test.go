package job

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tfstackplan/tfstackplan/events"
)

// fitReason keeps a reason the server takes as it is, and brings every other within the
// contract: texts cut at a character boundary to events.MaxReasonText bytes ending in "…", invalid
// UTF-8 and NUL bytes replaced, chains cut to events.MaxReasonChain steps saying how many are left out.
func TestFitReason(t *testing.T) {
	t.Parallel()
	ok := events.ChangeReason{Stack: "s", Kind: events.ReasonModule, Detail: "../m", Chain: []string{"a", "b"}, Raw: "stack changed because \"../m\" changed because a changed because b"}
	if got, changed := fitReason(ok); changed || !reflect.DeepEqual(got, ok) {
		t.Errorf("fitReason(%+v) = %+v, %v; want it unchanged", ok, got, changed)
	}
	long := strings.Repeat("é", 700) // 1,400 bytes, 2 a character: a cut at 1,021 falls mid-character
	var steps []string
	for i := range 100 {
		steps = append(steps, fmt.Sprintf("step%d", i))
	}
	steps[3] = "bad\xff\x00step"
	in := events.ChangeReason{Stack: "s", Kind: events.ReasonModule, Detail: long, Chain: steps, Raw: "x\xfey"}
	got, changed := fitReason(in)
	if !changed {
		t.Fatal("fitReason reported no change")
	}
	for _, text := range append([]string{got.Kind, got.Detail, got.Raw}, got.Chain...) {
		if len(text) > events.MaxReasonText || !utf8.ValidString(text) || strings.IndexByte(text, 0) >= 0 {
			t.Errorf("text %q (%d bytes) is not within the contract", firstN(text, 40), len(text))
		}
	}
	if want := strings.Repeat("é", 510) + "…"; got.Detail != want {
		t.Errorf("detail = %q… (%d bytes), want 510 é and an ellipsis", firstN(got.Detail, 20), len(got.Detail))
	}
	if got.Raw != "x\uFFFDy" || got.Chain[3] != "bad\uFFFD\uFFFDstep" {
		t.Errorf("raw %q, chain[3] %q: want U+FFFD for the invalid byte and the NUL", got.Raw, got.Chain[3])
	}
	if len(got.Chain) != events.MaxReasonChain || got.Chain[events.MaxReasonChain-1] != "… 37 more steps" || got.Chain[62] != "step62" {
		t.Errorf("chain of %d steps ending %q", len(got.Chain), got.Chain[len(got.Chain)-1])
	}
	if in.Chain[3] != "bad\xff\x00step" || len(in.Chain) != 100 {
		t.Error("fitReason changed its argument's chain")
	}
}
