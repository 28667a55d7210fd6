package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/distributor"
	"github.com/sliceplane/sliceplane/internal/faultproxy"
)

// putItem writes item i into the cluster's source and returns the clock of the write.
func putItem(ctx context.Context, t *testing.T, c *clustertest.Cluster, i int) uint64 {
	t.Helper()
	clock, err := c.Source.Put(ctx, fmt.Appendf(nil, "item-%d", i), fmt.Appendf(nil, "value-%d", i))
	require.NoError(t, err)
	return clock
}

// A pull link that holds bytes without resetting anything (a stalled link) is noticed: the
// node says its data is stale (Health, and through its heartbeats the assigner), counts the
// stall, reconnects, and once the link is back it is fresh again and catches up.
func TestANodeNoticesAStalledPullStream(t *testing.T) {
	listen := deadAddress(t) // free a moment ago: the distributor listens there
	proxy, err := faultproxy.New(listen)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	const stallTimeout = time.Second
	c := clustertest.New(t, clustertest.Options{
		Assigner:    func(cfg *assigner.Config) { cfg.Core.NodeTTL = 3 * time.Second },
		Distributor: func(cfg *distributor.Config) { cfg.Listen, cfg.Advertise = listen, proxy.Addr() },
		Node:        func(cfg *client.NodeConfig) { cfg.StallTimeout = stallTimeout },
	})
	c.StartDistributor("d1")
	n1 := c.StartNode("n1", nil)
	adm := newAdmin(c)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	fresh := func(want bool) func() bool {
		return func() bool {
			n := adm.nodes(ctx)["n1"]
			return n != nil && n.GetStale() != want && n.GetSilence() != nil
		}
	}
	last := putItem(ctx, t, c, 0)
	waitFor(t, 30*time.Second, "the node applies the first write", func() bool { return n1.Clock() >= last })
	// Idle is not stalled: the distributor's heartbeats keep the node fresh.
	idleSince := time.Now()
	waitFor(t, 30*time.Second, "the assigner hears the node is fresh", fresh(true))
	for time.Since(idleSince) < 3*stallTimeout {
		require.False(t, n1.Health().Stale, "an idle stream is not a stalled one: %+v", n1.Health())
		time.Sleep(50 * time.Millisecond)
	}
	require.Zero(t, n1.Health().Stalls)

	proxy.Stall()
	stalled := time.Now()
	last = putItem(ctx, t, c, 1)
	waitFor(t, 10*time.Second, "the node notices the stall", func() bool {
		h := n1.Health()
		return h.Stale && h.Stalls > 0
	})
	noticed := time.Since(stalled)
	require.Less(t, noticed, 3*stallTimeout, "noticed after %s", noticed)
	waitFor(t, 10*time.Second, "the assigner learns the node's data is stale", fresh(false))
	require.Less(t, n1.Clock(), last, "the write cannot have reached the node")
	var st *pb.NodeInfo
	require.Eventually(t, func() bool { st = adm.nodes(ctx)["n1"]; return st.GetSilence().AsDuration() >= stallTimeout }, 10*time.Second, 50*time.Millisecond)

	proxy.Resume()
	waitFor(t, 30*time.Second, "the node catches up once the link is back", func() bool { return n1.Clock() >= last })
	waitFor(t, 10*time.Second, "the node is fresh again", func() bool { return !n1.Health().Stale })
	waitFor(t, 10*time.Second, "the assigner hears the node is fresh again", fresh(true))
}

// A watcher whose stream goes silent while its connection stays open (a leader that hangs
// looks like this) drops the connection and watches again on a new one: the distributor's
// quanta stream and the router's assignment stream both recover, though the old
// connections stay stalled.
func TestWatchersLeaveASilentStream(t *testing.T) {
	var toDistributor, toRouter *faultproxy.Proxy
	c := clustertest.New(t, clustertest.Options{
		Distributor: func(cfg *distributor.Config) { cfg.Assigners = []string{toDistributor.Addr()} },
	})
	for _, p := range []**faultproxy.Proxy{&toDistributor, &toRouter} {
		proxy, err := faultproxy.New(c.Assigners()[0])
		require.NoError(t, err)
		t.Cleanup(func() { proxy.Close() })
		*p = proxy
	}
	c.StartDistributor("d1")
	n1 := c.StartNode("n1", nil)
	router, err := client.NewRouter(client.RouterConfig{Assigners: []string{toRouter.Addr()}})
	require.NoError(t, err)
	runRouter(t, router)
	adm := newAdmin(c)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	last := putItem(ctx, t, c, 0)
	waitFor(t, 30*time.Second, "the node applies the first write", func() bool { return n1.Clock() >= last })
	require.NoError(t, router.WaitReady(ctx))

	toDistributor.StallExisting()
	toRouter.StallExisting()
	stalled := time.Now()
	last = putItem(ctx, t, c, 1)
	_, err = adm.Split(ctx, &pb.SplitRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: []byte("item-0")}}}, grpc.WaitForReady(true))
	require.NoError(t, err)
	gen := adm.assignment(t, ctx).Generation()
	// Within the streams' idle timeout and a margin: before keepalive would close the
	// stalled transports (the clients' after dial.KeepaliveTime + dial.KeepaliveTimeout, 13 s).
	deadline := stalled.Add(dial.StreamIdleTimeout + 4*time.Second)
	waitFor(t, time.Until(deadline), "the write reaches the node through a new quanta stream", func() bool { return n1.Clock() >= last })
	waitFor(t, time.Until(deadline), "the split reaches the router through a new assignment stream", func() bool { return router.Generation() >= gen })
}
