package client_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/memstore"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// heldBy lists the ranges of a's slices that node holds.
func heldBy(a *assignment.Assignment, node assignment.NodeID) []keyspace.Range {
	var out []keyspace.Range
	for _, s := range a.All() {
		if slices.Contains(s.Replicas, node) {
			out = append(out, s.Range)
		}
	}
	return out
}

// reads counts the reads of existing keys done.
func reads(n *readCount) int64 { return n.hits.Load() + n.misses.Load() + n.failed.Load() }

// TestARollingRestartFailsNoRead restarts each of three nodes in turn, each draining first
// (Node.Drain, make-before-break), staying down while every key is read, and coming back on
// its store, while readers read every key through the router: no read of an existing key is answered "not found", and every
// read finds a replica that serves it.
func TestARollingRestartFailsNoRead(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{})
	c.StartDistributor("d1")
	ids := []string{"n1", "n2", "n3"}
	stores := map[string]*memstore.Store{}
	nodes := map[string]*clustertest.Node{}
	for _, id := range ids {
		stores[id] = memstore.New()
		nodes[id] = c.StartNode(id, stores[id])
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	const items = 600
	keys := fillKeys(ctx, t, c, items)
	r, err := client.NewRouter(client.RouterConfig{Assigners: c.Assigners(), Logger: quiet()})
	require.NoError(t, err)
	runRouter(t, r)
	require.NoError(t, r.WaitReady(ctx))

	// The readers see the nodes as a client would at each moment: a restarted node replaces
	// the one that left.
	var live atomic.Pointer[map[string]*clustertest.Node]
	first := nodes
	live.Store(&first)
	var n readCount
	stopReads := startReaders(r, func() map[string]*clustertest.Node { return *live.Load() }, keys, &n)
	for _, id := range ids {
		held := len(nodes[id].Slices())
		dctx, dcancel := context.WithTimeout(ctx, time.Minute)
		err := nodes[id].Drain(dctx)
		dcancel()
		require.NoError(t, err, "%s drains", id)
		nodes[id].Stop()
		// Down, the node answers no read: it stays down until every key has been read again,
		// so that a slice it still held would show as failed reads.
		down := maps.Clone(nodes)
		delete(down, id)
		live.Store(&down)
		from := reads(&n)
		waitFor(t, 2*time.Minute, "every key read while "+id+" is down", func() bool { return reads(&n) >= from+items })
		next := maps.Clone(nodes)
		next[id] = c.StartNode(id, stores[id])
		live.Store(&next)
		nodes = next
		t.Logf("%s drained %d slices and restarted; reads so far: %d hits, %d misses, %d failed",
			id, held, n.hits.Load(), n.misses.Load(), n.failed.Load())
		waitFor(t, time.Minute, id+" holds slices again", func() bool { return len(nodes[id].Slices()) > 0 })
		report, err := c.WaitConverged(ctx)
		require.NoError(t, err, "%s", report)
	}
	stopReads()
	t.Logf("rolling restart of %d nodes; reads: %d hits, %d misses, %d failed, %d misdirected on the way",
		len(ids), n.hits.Load(), n.misses.Load(), n.failed.Load(), n.misdirected.Load())
	assert.Greater(t, n.hits.Load(), int64(items), "every key read at least once on average")
	assert.Zero(t, n.misses.Load(), "reads of existing keys answered not found")
	assert.Zero(t, n.failed.Load(), "reads no replica answered")
}

// TestANodeThatRestartsWithinItsGraceKeepsItsSlices stops a node after LeaveFor: though its
// lease lapses meanwhile, the assigner keeps its slices where they are, and the node,
// restarted on its store, holds them again and applies what was written while it was away.
func TestANodeThatRestartsWithinItsGraceKeepsItsSlices(t *testing.T) {
	const ttl = 2 * time.Second
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) { cfg.Core.NodeTTL = ttl }})
	c.StartDistributor("d1")
	store := memstore.New()
	n1 := c.StartNode("n1", store)
	c.StartNode("n2", nil)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for i := range 100 {
		_, err := c.Source.Put(ctx, fmt.Appendf(nil, "item-%d", i), []byte("v"))
		require.NoError(t, err)
	}
	waitFor(t, time.Minute, "both nodes hold slices", func() bool {
		a, _, err := c.Assignment(ctx)
		return err == nil && len(heldBy(a, "n1")) > 0 && len(heldBy(a, "n2")) > 0
	})
	report, err := c.WaitConverged(ctx)
	require.NoError(t, err, "%s", report)
	adm := newAdmin(c)
	_, err = adm.Freeze(ctx, &pb.FreezeRequest{Reason: "a still map: only an expiry could move n1's slices"}, grpc.WaitForReady(true))
	require.NoError(t, err)
	before, gen, err := c.Assignment(ctx)
	require.NoError(t, err)
	held := heldBy(before, "n1")

	n1.Stop()
	require.NoError(t, n1.LeaveFor(ctx, time.Minute))
	// Three leases pass without a word from n1: it stays registered (the passes, frozen here,
	// would otherwise move the slices of a node gone), and its slices stay.
	gone := time.Now().Add(3 * ttl)
	for time.Now().Before(gone) {
		a, g, err := c.Assignment(ctx)
		require.NoError(t, err)
		require.Equal(t, gen, g, "the map changed while n1 was away")
		require.Equal(t, held, heldBy(a, "n1"))
		nodes, err := adm.ListNodes(ctx, &pb.ListNodesRequest{})
		require.NoError(t, err)
		require.True(t, slices.ContainsFunc(nodes.GetNodes(), func(n *pb.NodeInfo) bool { return n.GetNode().GetId() == "n1" }),
			"n1 was taken out while away")
		time.Sleep(100 * time.Millisecond)
	}
	key := []byte("item-written-while-away")
	clock, err := c.Source.Put(ctx, key, []byte("v"))
	require.NoError(t, err)

	n1 = c.StartNode("n1", store)
	waitFor(t, time.Minute, "the restarted n1 catches up", func() bool { return n1.Clock() >= clock })
	after, _, err := c.Assignment(ctx)
	require.NoError(t, err)
	assert.Equal(t, held, heldBy(after, "n1"), "n1 holds the slices it held")
	report, err = c.WaitConverged(ctx)
	require.NoError(t, err, "%s", report)
}
