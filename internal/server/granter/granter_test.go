package granter_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/granter"
)

func TestNewSelectsKind(t *testing.T) {
	for _, kind := range []string{"", granter.KindNone} {
		g, err := granter.New(context.Background(), kind, granter.GCPIAMConfig{})
		if err != nil || g.Name() != granter.KindNone {
			t.Errorf("New(%q) = %v, %v; want the none granter", kind, g, err)
		}
	}
	_, err := granter.New(context.Background(), "aws-iam", granter.GCPIAMConfig{})
	if err == nil || !strings.Contains(err.Error(), `"aws-iam"`) || !strings.Contains(err.Error(), `"none", "gcp-iam"`) {
		t.Errorf("unknown kind: error %v, want it named with the accepted kinds", err)
	}
}

func TestNoneDoesNothing(t *testing.T) {
	var g granter.Granter = granter.None{}
	b := granter.Binding{LeaseID: "x", Requester: requester, Member: runner, ExpiresAt: time.Now()}
	if err := g.Grant(context.Background(), b); err != nil {
		t.Error(err)
	}
	if err := g.Revoke(context.Background(), b); err != nil {
		t.Error(err)
	}
	if removed, err := g.(granter.Sweeper).RemoveExpired(context.Background(), requester, time.Now()); removed != nil || err != nil {
		t.Errorf("RemoveExpired = %v, %v", removed, err)
	}
}

func TestConditionTitle(t *testing.T) {
	long := strings.Repeat("a", 200)
	ids := []string{"0123456789abcdef0123456789abcdef", "a", "run-42", strings.Repeat("b", 82), strings.Repeat("b", 83),
		long, long + "b", "a_b", "a.b", "a/b", "ä", "a b", "", "_"}
	seen := map[string]string{}
	for _, id := range ids {
		title := granter.ConditionTitle(id)
		if len(title) > granter.MaxTitleLen || !strings.HasPrefix(title, granter.TitlePrefix) {
			t.Errorf("ConditionTitle(%q) = %q: over %d bytes or without the prefix", id, title, granter.MaxTitleLen)
		}
		if prev, dup := seen[title]; dup {
			t.Errorf("ids %q and %q share title %q", prev, id, title)
		}
		seen[title] = id
	}
	for id, want := range map[string]string{
		"run-42":                "tfstackplan-lease-run-42",
		strings.Repeat("b", 82): "tfstackplan-lease-" + strings.Repeat("b", 82),
	} {
		if got := granter.ConditionTitle(id); got != want {
			t.Errorf("ConditionTitle(%q) = %q, want %q", id, got, want)
		}
	}
	if got := granter.ConditionTitle("a/b"); !strings.HasPrefix(got, "tfstackplan-lease-a_b_") {
		t.Errorf("ConditionTitle(a/b) = %q, want the cleaned id and a hash", got)
	}
}
