package client_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
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
		cfg.Core.Roles, cfg.Core.Exclusive, cfg.Core.NodeTTL = assigner.RolesPrimarySecondary, true, ttl
		cfg.Core.HandoffTimeout, cfg.Core.HandoffLinger = 20*time.Second, 200*time.Millisecond
	}})
	link, err := faultproxy.New(c.Assigners()[0])
	require.NoError(t, err)
	t.Cleanup(func() { link.Close() })
	check := &primaries{by: map[string]keyspace.Set{}, taken: map[string]time.Time{}}
	members := map[string]*client.Member{}
	check.leased = map[string]func() bool{"m1": func() bool { return members["m1"].Leased() }, "m2": func() bool { return members["m2"].Leased() }}
	for id, assigners := range map[string][]string{"m1": {link.Addr()}, "m2": c.Assigners()} {
		m, err := client.NewMember(client.MemberConfig{ID: id, Address: id + ":1", Assigners: assigners,
			App: &roleApp{id: id, check: check, demote: 50 * time.Millisecond}, Roles: client.RolesPrimarySecondary,
			ReportInterval: 100 * time.Millisecond, Logger: quiet()})
		require.NoError(t, err)
		members[id] = m
		runMember(t, m)
	}
	waitFor(t, 30*time.Second, "every point has a primary", check.covered)
	waitFor(t, 30*time.Second, "m1 is the primary of some range", func() bool { return check.holds("m1") })
	require.True(t, members["m1"].Leased())
	require.Empty(t, check.failures(), "two primaries at once, before the cut")

	cut := time.Now()
	link.Stall()
	link.DropStalled()
	waitFor(t, 30*time.Second, "m1 demoted itself", func() bool { return !check.holds("m1") })
	demoted := time.Since(cut)
	require.False(t, members["m1"].Leased())
	waitFor(t, 30*time.Second, "every point has a primary again", check.covered)
	require.Empty(t, check.failures(), "two primaries at once")
	t.Logf("cut off at 0: m1 demoted itself after %s, every point had a primary again after %s (lease %s)",
		demoted.Round(time.Millisecond), time.Since(cut).Round(time.Millisecond), ttl)
}
