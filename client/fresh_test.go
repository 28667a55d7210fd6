package client_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/distributor"
	"github.com/sliceplane/sliceplane/internal/faultproxy"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/source/sourcetest"
)

// A node whose pull link stalls stops being fresh within its freshness bound (its
// distributor falls silent), though the stall timeout that makes it reconnect is longer; it
// says so to the assigner, and a router marks it stale. Once the link is back, it catches
// up and is fresh again.
func TestANodeWhosePullLinkStallsIsNoLongerFresh(t *testing.T) {
	listen := deadAddress(t) // free a moment ago: the distributor listens there
	proxy, err := faultproxy.New(listen)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	const bound = time.Second
	c := clustertest.New(t, clustertest.Options{
		Assigner:    func(cfg *assigner.Config) { cfg.Core.NodeTTL = 3 * time.Second },
		Distributor: func(cfg *distributor.Config) { cfg.Listen, cfg.Advertise = listen, proxy.Addr() },
		Node: func(cfg *client.NodeConfig) {
			cfg.FreshnessBound, cfg.StallTimeout = bound, 5*bound
		},
	})
	c.StartDistributor("d1")
	n1 := c.StartNode("n1", nil)
	router, err := client.NewRouter(client.RouterConfig{Assigners: c.Assigners()})
	require.NoError(t, err)
	runRouter(t, router)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	key := []byte("item-1")
	routedStale := func(want bool) func() bool {
		return func() bool {
			rt, err := router.Lookup(key)
			return err == nil && slices.ContainsFunc(rt.Replicas, func(r client.Replica) bool { return r.ID == "n1" && r.Stale == want })
		}
	}

	last := putItem(ctx, t, c, 0)
	waitFor(t, 30*time.Second, "the node applies the first write", func() bool { return n1.Clock() >= last })
	waitFor(t, 10*time.Second, "the node is fresh", func() bool { ok, _ := n1.Fresh(); return ok })
	waitFor(t, 30*time.Second, "the router hears the node is fresh", routedStale(false))

	proxy.Stall()
	stalled := time.Now()
	last = putItem(ctx, t, c, 1)
	var why string
	waitFor(t, 10*time.Second, "the node is no longer fresh", func() bool {
		var ok bool
		ok, why = n1.Fresh()
		return !ok
	})
	noticed := time.Since(stalled)
	// The node last heard from its distributor before the stall: past the bound from then,
	// it is not fresh. The slack is the polling and a busy machine.
	require.Less(t, noticed, bound+2*time.Second, "noticed after %s", noticed)
	require.Contains(t, why, "distributor silent")
	require.Zero(t, n1.Health().Stalls, "the stall timeout has not passed: freshness, not it, said so")
	waitFor(t, 30*time.Second, "the router hears the node is stale", routedStale(true))
	require.Less(t, n1.Clock(), last, "the write cannot have reached the node")

	proxy.Resume()
	waitFor(t, 30*time.Second, "the node catches up once the link is back", func() bool { return n1.Clock() >= last })
	waitFor(t, 10*time.Second, "the node is fresh again", func() bool { ok, _ := n1.Fresh(); return ok })
	waitFor(t, 30*time.Second, "the router hears the node is fresh again", routedStale(false))
}

// TestANodeGoesStaleWhileItsDistributorCannotReachTheSource cuts the distributor off its
// source while the application goes on writing to it: the node has applied all its
// distributor read, but the distributor's silence makes it stale past the bound, so it
// answers no reads from data that misses the writes. Once the source is back, the node
// catches up in the same epoch (the outage was a stall: no snapshot) and is fresh again.
func TestANodeGoesStaleWhileItsDistributorCannotReachTheSource(t *testing.T) {
	const bound = time.Second
	var src *sourcetest.Outage
	c := clustertest.New(t, clustertest.Options{
		Distributor: func(cfg *distributor.Config) {
			src = sourcetest.NewOutage(source.NewEtcd(cfg.Client, "/sliceplane/data/"))
			cfg.Source = src
		},
		Node: func(cfg *client.NodeConfig) { cfg.FreshnessBound, cfg.StallTimeout = bound, 10*bound },
	})
	c.StartDistributor("d1")
	n1 := c.StartNode("n1", nil)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	last := putItem(ctx, t, c, 0)
	waitFor(t, 30*time.Second, "the node applies the first write", func() bool { return n1.Clock() >= last })
	waitFor(t, 10*time.Second, "the node is fresh", func() bool { ok, _ := n1.Fresh(); return ok })
	epoch := n1.Cursor().Epoch

	src.Cut()
	cut := time.Now()
	last = putItem(ctx, t, c, 1) // the application writes on; the distributor cannot see it
	var why string
	waitFor(t, 10*time.Second, "the node is no longer fresh", func() bool {
		var ok bool
		ok, why = n1.Fresh()
		return !ok
	})
	noticed := time.Since(cut)
	require.Contains(t, why, "has not heard from its source")
	require.Less(t, noticed, bound+2*time.Second, "noticed after %s", noticed)
	require.Less(t, n1.Clock(), last)

	src.Restore()
	waitFor(t, 30*time.Second, "the node catches up once the source is back", func() bool { return n1.Clock() >= last })
	waitFor(t, 10*time.Second, "the node is fresh again", func() bool { ok, _ := n1.Fresh(); return ok })
	require.Equal(t, epoch, n1.Cursor().Epoch, "the outage made the node take a snapshot")
}
