package auth

import (
	"context"
	"crypto/sha256"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"

	"github.com/tfstackplan/tfstackplan/internal/testkit"
)

// A remembered token is verified anew once any key set is fetched: a key the issuer withdrew
// stops verifying at the next fetch, as it did before tokens were remembered.
func TestRememberedTokenForgottenOnRefetch(t *testing.T) {
	iss := testkit.NewOIDCIssuer(t)
	v := githubValidator(t, iss)
	old := mintWith(t, iss, func(map[string]any) {})
	oldKid, _ := iss.Key()
	for range 2 {
		if _, err := v.Validate(context.Background(), old, testAudience); err != nil {
			t.Fatal(err)
		}
	}
	iss.Rotate(t)
	iss.Withdraw(oldKid)
	v.limiter.mu.Lock()
	v.limiter.last = time.Time{}
	v.limiter.mu.Unlock()
	if _, err := v.Validate(context.Background(), mintWith(t, iss, func(map[string]any) {}), testAudience); err != nil {
		t.Fatalf("new key: %v", err)
	}
	if _, err := v.Validate(context.Background(), old, testAudience); err == nil {
		t.Fatal("a token of a withdrawn key verified after the key set was fetched again")
	}
}

// A token remembered for one audience is checked in full for another.
func TestRememberedTokenOnlyForItsAudience(t *testing.T) {
	iss := testkit.NewOIDCIssuer(t)
	v := githubValidator(t, iss)
	tok := mintWith(t, iss, func(map[string]any) {})
	// The first verification fetches the keys, so only the second is remembered.
	for range 2 {
		if _, err := v.Validate(context.Background(), tok, testAudience); err != nil {
			t.Fatal(err)
		}
	}
	if k := v.remembered(sha256.Sum256([]byte(tok)), testAudience); k == nil {
		t.Fatal("the token is not remembered")
	}
	if _, err := v.Validate(context.Background(), tok, "https://other.example"); err == nil || !strings.Contains(err.Error(), "audience") {
		t.Fatalf("another audience: err %v", err)
	}
}

func TestRememberedTokensExpireAndAreBounded(t *testing.T) {
	k := &rotatingKeys{limiter: &refetchLimiter{}, maxAge: time.Hour, now: time.Now, keysSince: time.Now()}
	sum := func(i int) [32]byte { return [32]byte{byte(i), byte(i >> 8)} }
	live := &oidc.IDToken{Expiry: time.Now().Add(time.Hour)}
	k.remember(sum(0), verifiedToken{idt: &oidc.IDToken{Expiry: time.Now().Add(-time.Second)}, audience: "a"})
	if k.remembered(sum(0), "a") != nil {
		t.Fatal("an expired token is remembered")
	}
	k.remember(sum(1), verifiedToken{idt: live, audience: "a"})
	if k.remembered(sum(1), "a") != live {
		t.Fatal("a live token is not remembered")
	}
	k.now = func() time.Time { return time.Now().Add(time.Hour) }
	if k.remembered(sum(1), "a") != nil {
		t.Fatal("a token is remembered past its key set's age")
	}
	k.now = time.Now
	k.limiter.fetches.Add(1)
	if k.remembered(sum(1), "a") != nil {
		t.Fatal("a token is remembered after a fetch")
	}
	for i := range maxVerifiedTokens + 10 {
		k.remember(sum(i), verifiedToken{idt: live, audience: "a", fetches: k.limiter.fetches.Load()})
		if n := len(k.verified); n > maxVerifiedTokens {
			t.Fatalf("%d tokens remembered after %d, want at most %d", n, i+1, maxVerifiedTokens)
		}
	}
	if k.remembered(sum(maxVerifiedTokens+9), "a") != live {
		t.Fatal("the last token is not remembered")
	}
}
