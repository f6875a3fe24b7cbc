// Package granter makes a lease real: when the control plane leases a requester service account
// to a CI runner, a Granter gives the runner's identity the right to impersonate that account
// until the lease expires, and takes it away when the lease is revoked.
package granter

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// Binding is what one lease grants.
type Binding struct {
	// LeaseID is the apply execution id holding the lease.
	LeaseID string
	// Environment is the environment the lease is for; it is named in the grant's description.
	Environment string
	// Requester is the email of the service account to impersonate.
	Requester string
	// Member is the runner's IAM identity, e.g. "serviceAccount:ci@p.iam.gserviceaccount.com"
	// or "principalSet://iam.googleapis.com/...".
	Member string
	// ExpiresAt is when the lease ends; the grant itself stops working then.
	ExpiresAt time.Time
}

// Granter grants and revokes leases.
type Granter interface {
	// Name is the kind of the granter, as given to New.
	Name() string
	// Grant gives b.Member the right to impersonate b.Requester until b.ExpiresAt; the grant is
	// made when Grant returns nil (a granter documents any delay before it is enforced).
	// Granting a lease again is not an error: the lease ends up granted once, with the latest
	// member and expiry.
	Grant(ctx context.Context, b Binding) error
	// Revoke takes back what Grant gave for b.LeaseID on b.Requester; b.Member and
	// b.ExpiresAt are not needed. Revoking a lease that holds no grant is success.
	Revoke(ctx context.Context, b Binding) error
}

// Sweeper is implemented by granters that can clean up grants whose lease has expired (an
// expired grant gives nothing, but it still takes room in the account's policy).
type Sweeper interface {
	// RemoveExpired removes from requester the grants of leases that expired at or before now,
	// and returns their condition titles (see ConditionTitle), sorted.
	RemoveExpired(ctx context.Context, requester string, now time.Time) ([]string, error)
}

// Kinds accepted by New.
const (
	KindNone   = "none"
	KindGCPIAM = "gcp-iam"
)

// New returns the granter of a kind: KindNone (also the empty string) or KindGCPIAM, which is
// built from cfg.
func New(ctx context.Context, kind string, cfg GCPIAMConfig) (Granter, error) {
	switch kind {
	case "", KindNone:
		return None{}, nil
	case KindGCPIAM:
		return NewGCPIAM(ctx, cfg)
	}
	return nil, fmt.Errorf("granter: unknown kind %q (accepted: %q, %q)", kind, KindNone, KindGCPIAM)
}

// None grants nothing: a lease is only the control plane's record, and the runner must already
// be able to impersonate the requester.
type None struct{}

// Name returns KindNone.
func (None) Name() string { return KindNone }

// Grant does nothing.
func (None) Grant(context.Context, Binding) error { return nil }

// Revoke does nothing.
func (None) Revoke(context.Context, Binding) error { return nil }

// RemoveExpired removes nothing.
func (None) RemoveExpired(context.Context, string, time.Time) ([]string, error) { return nil, nil }

// TitlePrefix starts the condition title of every grant a lease makes.
const TitlePrefix = "tfstackplan-lease-"

// Limits of an IAM condition's title and description.
const (
	MaxTitleLen       = 100
	maxDescriptionLen = 256
)

// maxPlainID is how long a lease id may be to stand in its title as it is.
const maxPlainID = MaxTitleLen - len(TitlePrefix)

// ConditionTitle returns the condition title of leaseID's grants: TitlePrefix and the id itself
// when it is letters, digits and '-' and fits, else a cleaned, shortened id and a hash of the
// whole id. Distinct ids have distinct titles: only the hashed form has a '_'.
func ConditionTitle(leaseID string) string {
	if leaseID != "" && len(leaseID) <= maxPlainID && strings.IndexFunc(leaseID, notPlain) < 0 {
		return TitlePrefix + leaseID
	}
	sum := sha256.Sum256([]byte(leaseID))
	hash := hex.EncodeToString(sum[:8])
	clean := strings.Map(func(r rune) rune {
		if notPlain(r) {
			return '_'
		}
		return r
	}, leaseID)
	// Every rune that was not plain is now one byte, so the cut falls between runes.
	if keep := maxPlainID - 1 - len(hash); len(clean) > keep {
		clean = clean[:keep]
	}
	return TitlePrefix + clean + "_" + hash
}

func notPlain(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-')
}
