package client_test

import (
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/faultproxy"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// TestAMemberCutOffFromTheAssignersDemotesItself runs an exclusive cluster of two members and
// cuts one off from the assigners while it stays up: its lease ends unrenewed, it demotes
// its primary ranges itself, and only once its lease has run out on the assigner's clock
// too does the other member become their primary. The checker sees every application's
// role calls and fails when a member becomes primary of a point another holds as primary
// within its lease (by Member.Leased: its demotion calls may take longer, one range at a
// time, and an application checks Leased before a write).
func TestAMemberCutOffFromTheAssignersDemotesItself(t *testing.T) {
	const ttl = 2 * time.Second
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) {
		cfg.Core.Roles, cfg.Core.Exclusive, cfg.Core.NodeTTL = core.RolesPrimarySecondary, true, ttl
		// A handoff in flight at the cut waits for m1 until it times out: under the race
		// detector on a busy machine, 20 s of it made the takeover 28 s and more.
		cfg.Core.HandoffTimeout, cfg.Core.HandoffLinger = 5*time.Second, 200*time.Millisecond
		// The first map waits for both members: made between their registrations, it gave
		// every slice to one of them, and m2 then had to load them all after the cut.
		cfg.Core.FirstMapNodes = 2
	}})
	link, err := faultproxy.New(c.Assigners()[0])
	require.NoError(t, err)
	t.Cleanup(func() { link.Close() })
	check := &primaries{by: map[string]keyspace.Set{}, taken: map[string]time.Time{}, exclusive: true}
	members := startRoleMembers(t, check, map[string][]string{"m1": {link.Addr()}, "m2": c.Assigners()})
	waitFor(t, 30*time.Second, "every point has a primary", check.covered)
	waitFor(t, 30*time.Second, "m1 is the primary of some range", func() bool { return check.holds("m1") })
	require.True(t, members["m1"].Leased())
	require.Empty(t, check.failures(), "two primaries at once, before the cut")

	cut := time.Now()
	link.Stall()
	link.DropStalled()
	waitFor(t, 30*time.Second, "m2 is the primary of every point", func() bool { return check.holdsAll("m2") })
	took := time.Since(cut)
	require.Empty(t, check.failures(), "two primaries at once")
	require.False(t, members["m1"].Leased())
	waitFor(t, 30*time.Second, "m1 demoted itself", func() bool { return !check.holds("m1") })
	t.Logf("cut off at 0: m2 was the primary of every point after %s (lease %s)", took.Round(time.Millisecond), ttl)
}
