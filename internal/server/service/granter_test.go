package service

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/granter"
	"github.com/tfstackplan/tfstackplan/internal/server/granter/iamfake"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

const (
	deployer = "deployer@proj.iam.gserviceaccount.com"
	ciMember = "serviceAccount:ci@proj.iam.gserviceaccount.com"
)

// withIAM gives the fixture the gcp-iam granter over a local fake of IAM, as serve builds it
// from a policy file.
func withIAM(t *testing.T, f *fixture) *iamfake.Server {
	t.Setenv("GCE_METADATA_HOST", "127.0.0.1:1")
	t.Setenv("CLOUDSDK_CONFIG", t.TempDir())
	fake := iamfake.Start(t)
	fake.AddAccount(deployer)
	p, err := ParsePolicy("policy.hcl", []byte(`
granter "gcp-iam" {
  endpoint         = "`+fake.URL+`"
  credentials_file = "`+fake.CredentialsFile(t)+`"
}
environment "prod" {
  requester     = "`+deployer+`"
  runner_member = "`+ciMember+`"
  lease_ttl     = "1h"
}
`))
	f.must(err)
	f.Policy = p
	g, err := granter.New(context.Background(), p.Granter, p.GranterConfig)
	f.must(err)
	iam := g.(*granter.GCPIAM)
	iam.Sleep = func(context.Context, time.Duration) error { return nil }
	iam.Now = func() time.Time { return f.now }
	f.Granter = g
	return fake
}

// bound lists the members the requester's policy lets create tokens under a lease's condition.
func bound(fake *iamfake.Server, lease string) []string {
	var members []string
	for _, b := range fake.Policy(deployer).Bindings {
		if b.Condition != nil && b.Condition.Title == granter.ConditionTitle(lease) {
			members = append(members, b.Members...)
		}
	}
	return members
}

func (f *fixture) lease(id string) store.Lease {
	f.t.Helper()
	var l *store.Lease
	f.must(f.Store.Read(ctx, func(tx store.Tx) (err error) { l, err = tx.Lease(id); return }))
	return *l
}

func TestASatisfiedGateGrantsImpersonationAndTheRevokeTakesItBack(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		fake := withIAM(t, f)
		f.planWith("p1", 1, "s1", map[string][2]string{"m": {"mutating", "v1:m"}})
		lease, err := f.check("ap1", 1, sp("m", "v1:m"))
		f.must(err)
		if lease.Requester != deployer {
			t.Fatalf("lease %+v", lease)
		}
		if got := bound(fake, "ap1"); len(got) != 1 || got[0] != ciMember {
			t.Fatalf("after the check, the lease binds %v; policy %+v", got, fake.Policy(deployer))
		}
		for _, b := range fake.Policy(deployer).Bindings {
			if want := lease.ExpiresAt.UTC().Format(time.RFC3339); b.Condition == nil || !strings.Contains(b.Condition.Expression, want) {
				t.Fatalf("binding %+v does not expire at the lease's end %s", b, want)
			}
		}
		if l := f.lease("ap1"); !l.Bound || l.Member != ciMember {
			t.Fatalf("stored lease %+v", l)
		}
		_, err = f.GateRevoke(ctx, who("runner"), &api.GateRevoke{ExecutionID: "ap1", Outcome: "succeeded"})
		f.must(err)
		if got := bound(fake, "ap1"); len(got) != 0 {
			t.Fatalf("after the revoke the lease still binds %v", got)
		}
		if l := f.lease("ap1"); l.Bound || l.RevokedAt.IsZero() {
			t.Fatalf("stored lease after revoke %+v", l)
		}
	})
}

func TestAGranterFailureDeniesTheGate(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		fake := withIAM(t, f)
		f.planWith("p1", 1, "s1", map[string][2]string{"m": {"mutating", "v1:m"}})
		fake.Fail("setIamPolicy", 1, 403)
		_, err := f.check("ap1", 1, sp("m", "v1:m"))
		wantErr(t, err, store.ErrDenied, "could not grant "+deployer)
		if got := bound(fake, "ap1"); len(got) != 0 {
			t.Fatalf("a failed grant left %v bound", got)
		}
		l := f.lease("ap1")
		if l.RevokedAt.IsZero() || l.Outcome != "grant failed" {
			t.Fatalf("lease after a failed grant %+v", l)
		}
		entries, err := f.Audit(ctx, reader, "", 5, 0)
		f.must(err)
		// Newest first: whatever part of the grant took effect was removed at once.
		if len(entries) < 2 || entries[0].Action != "gate.unbind" || entries[0].Outcome != "removed" ||
			entries[1].Action != "gate.check" || entries[1].Outcome != "denied" || !strings.Contains(entries[1].Detail, "granter failed") {
			t.Fatalf("audit %+v", entries)
		}
		// The same execution cannot come back for a lease once its grant failed.
		_, err = f.check("ap1", 1, sp("m", "v1:m"))
		wantErr(t, err, store.ErrDenied, "already revoked")
	})
}

func TestAFailedRevokeIsAuditedAndRetriedBySweeper(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		fake := withIAM(t, f)
		f.planWith("p1", 1, "s1", map[string][2]string{"m": {"mutating", "v1:m"}})
		_, err := f.check("ap1", 1, sp("m", "v1:m"))
		f.must(err)
		fake.Fail("", 1, 403)
		_, err = f.GateRevoke(ctx, who("runner"), &api.GateRevoke{ExecutionID: "ap1", Outcome: "failed"})
		f.must(err) // the lease is ended; removing its binding is the server's job from here
		if got := bound(fake, "ap1"); len(got) != 1 {
			t.Fatalf("binding after a failed removal %v", got)
		}
		l := f.lease("ap1")
		if !l.Bound || l.UnbindAttempts != 1 || !strings.Contains(l.UnbindError, "403") {
			t.Fatalf("lease after a failed removal %+v", l)
		}
		entries, _ := f.Audit(ctx, reader, "", 5, 0)
		if entries[0].Action != "gate.unbind" || entries[0].Outcome != "failed" {
			t.Fatalf("audit %+v", entries[0])
		}
		n, err := f.SweepLeases(ctx, 10)
		f.must(err)
		if n != 1 || len(bound(fake, "ap1")) != 0 || f.lease("ap1").Bound {
			t.Fatalf("sweep tried %d; still bound %v", n, bound(fake, "ap1"))
		}
		if n, _ := f.SweepLeases(ctx, 10); n != 0 {
			t.Fatalf("a second sweep found %d leases", n)
		}
	})
}

func TestAnExpiredLeaseIsUnboundBySweeper(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		fake := withIAM(t, f)
		f.planWith("p1", 1, "s1", map[string][2]string{"m": {"mutating", "v1:m"}})
		_, err := f.check("ap1", 1, sp("m", "v1:m"))
		f.must(err)
		if n, _ := f.SweepLeases(ctx, 10); n != 0 || len(bound(fake, "ap1")) != 1 {
			t.Fatalf("a live lease was swept (%d)", n)
		}
		f.now = f.now.Add(61 * time.Minute) // the runner never revoked
		n, err := f.SweepLeases(ctx, 10)
		f.must(err)
		if n != 1 || len(bound(fake, "ap1")) != 0 {
			t.Fatalf("sweep after expiry tried %d; still bound %v", n, bound(fake, "ap1"))
		}
	})
}

// A binding the store no longer knows of (here: its lease row is gone) is removed from the
// requester once it has expired, by the account sweep.
func TestTheAccountSweepRemovesExpiredBindingsTheStoreForgot(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		fake := withIAM(t, f)
		f.planWith("p1", 1, "s1", map[string][2]string{"m": {"mutating", "v1:m"}})
		_, err := f.check("ap1", 1, sp("m", "v1:m"))
		f.must(err)
		f.must(f.Store.Write(ctx, func(tx store.Tx) error {
			l, err := tx.Lease("ap1")
			if err != nil {
				return err
			}
			l.Bound = false // as if the record of the binding were lost
			return tx.PutLease(*l)
		}))
		f.sweepAccounts(ctx)
		if len(bound(fake, "ap1")) != 1 {
			t.Fatal("a live binding was swept")
		}
		f.now = f.now.Add(2 * time.Hour)
		f.sweepAccounts(ctx)
		if got := bound(fake, "ap1"); len(got) != 0 {
			t.Fatalf("an expired binding survived the account sweep: %v", got)
		}
	})
}
