package assigner_test

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/membership"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/wire"
)

var distT0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// distCore returns the core of term 7 at clock 100, with nodes a and b registered, and the
// hub it publishes to.
func distCore(t *testing.T) (*core.Core, *quantum.Hub) {
	t.Helper()
	c, err := core.New(core.Config{NodeTTL: 10 * time.Second, Algorithm: "weighted-move",
		Params: map[string]string{"min_slices_per_node": "1", "initial_slices_per_node": "2", "max_slices_per_node": "8"}})
	require.NoError(t, err)
	c.Settle(distT0, core.LeadershipGained{Term: 7, Clock: 100})
	h := quantum.NewHub(quantum.HubConfig{}, 7, nil, 100)
	for _, id := range []assignment.NodeID{"a", "b"} {
		// Each registration is audited with a clock-only quantum.
		publishTo(t, h, c, distT0, core.Register{Node: core.Node{Node: assignment.Node{ID: id}, Address: string(id) + ":1"}})
	}
	return c, h
}

// publishTo steps ev, commits every write it leads to and publishes the quanta to h, as the
// server does: the hub refuses a quantum whose position does not follow the last one or
// whose clock goes back.
func publishTo(t *testing.T, h *quantum.Hub, c *core.Core, now time.Time, ev core.Event) []quantum.Quantum {
	t.Helper()
	var qs []quantum.Quantum
	for _, out := range c.Settle(now, ev) {
		for _, p := range out.Publish {
			require.NoError(t, h.Publish(p.Quantum, p.Map))
			qs = append(qs, p.Quantum)
		}
	}
	return qs
}

// firstPass is when the core of distCore runs its first pass: a pass interval after it leads.
var firstPass = distT0.Add(time.Second)

func TestSetDistributorsBeforeTheFirstMapPublishesNothing(t *testing.T) {
	c, h := distCore(t)
	one := quantum.Distributors{"d1": "10.0.0.1:7001"}

	_, before, _ := c.Assignment()
	out := c.Step(distT0, core.DistributorsChanged{Distributors: one})
	assert.Empty(t, out.Publish, "no map yet: nothing to publish")
	assert.Nil(t, out.Write, "the set lives in etcd already; the core stores nothing")
	assert.Equal(t, one, c.Distributors(), "the core must remember the set for the first map")
	_, pos, _ := c.Assignment()
	assert.Equal(t, before, pos, "no quantum was used up")
	assert.Empty(t, publishTo(t, h, c, distT0, core.DistributorsChanged{Distributors: maps.Clone(one)}), "the same set again changes nothing")

	qs := publishTo(t, h, c, firstPass, core.Tick{})
	require.Len(t, qs, 1)
	require.True(t, qs[0].Reinitializing())
	assert.Equal(t, one, qs[0].Distributors, "the first map's quantum carries the set")
	assert.Equal(t, one, h.Distributors())
}

func TestSetDistributorsAfterTheFirstMapIsOneReinitializingQuantum(t *testing.T) {
	c, h := distCore(t)
	qs := publishTo(t, h, c, firstPass, core.Tick{})
	require.Len(t, qs, 1)
	first := qs[0]
	require.NotNil(t, first.Distributors, "the first map carries the set, even empty")
	assert.Empty(t, first.Distributors)
	a, _, _ := c.Assignment()

	c.Step(firstPass, core.ClockObserved{Clock: 130})
	two := quantum.Distributors{"d1": "10.0.0.1:7001", "d2": "10.0.0.2:7001"}
	out := c.Step(firstPass, core.DistributorsChanged{Distributors: two})
	require.Len(t, out.Publish, 1, "a changed set is published")
	assert.Nil(t, out.Write)
	q := out.Publish[0].Quantum
	assert.True(t, q.Reinitializing(), "so that every distributor learns its nodes from one step")
	assert.Same(t, a, q.Snapshot, "the full map, unchanged")
	assert.Same(t, a, out.Publish[0].Map)
	assert.Empty(t, q.Ops)
	assert.Equal(t, two, q.Distributors)
	assert.Equal(t, "distributors", q.Cause)
	assert.Equal(t, a.Generation(), q.Generation, "the map does not change")
	assert.Equal(t, quantum.Position{Term: 7, Seq: first.Seq + 1}, q.Position)
	assert.Equal(t, uint64(130), q.Clock, "stamped with the clock seen so far")
	assert.Equal(t, firstPass, q.Time)
	require.NoError(t, h.Publish(q, out.Publish[0].Map))

	assert.Equal(t, two, h.Distributors())
	_, pos, clock := c.Assignment()
	assert.Equal(t, q.Position, pos)
	assert.Equal(t, uint64(130), clock)
	later := firstPass.Add(500 * time.Millisecond) // before the next pass
	assert.Empty(t, publishTo(t, h, c, later, core.DistributorsChanged{Distributors: maps.Clone(two)}), "an equal set produces nothing")
	assert.Empty(t, publishTo(t, h, c, later, core.Tick{}), "the reinitializing quantum already carries clock 130")

	// The quanta that follow are ordered after it.
	c.Step(later, core.ClockObserved{Clock: 140})
	qs = publishTo(t, h, c, later, core.Tick{})
	require.Len(t, qs, 1)
	assert.Equal(t, quantum.Position{Term: 7, Seq: q.Seq + 1}, qs[0].Position)
	assert.Equal(t, uint64(140), qs[0].Clock)
	assert.Nil(t, qs[0].Distributors, "only reinitializing quanta carry the set")
	assert.Equal(t, two, h.Distributors(), "a quantum without a set keeps the last one")

	// A change of the map follows on the same map the distributors quantum carried.
	_, s := a.Lookup(0)
	to := assignment.NodeID("a")
	if s.Holds("a") {
		to = "b"
	}
	qs = publishTo(t, h, c, later, core.Move{Slice: core.SliceRef{Hash: new(uint64)}, To: []assignment.NodeID{to}})
	require.Len(t, qs, 1)
	assert.Equal(t, quantum.Position{Term: 7, Seq: q.Seq + 2}, qs[0].Position)
	assert.Equal(t, uint64(140), qs[0].Clock)
	assert.Equal(t, a.Generation()+1, qs[0].Generation, "the ops apply to the map the set came with")

	// Every distributor leaving is a change too, carried as an empty (not absent) set.
	_, before, _ := c.Assignment()
	qs = publishTo(t, h, c, later, core.DistributorsChanged{Distributors: quantum.Distributors{}})
	require.Len(t, qs, 1)
	assert.NotNil(t, qs[0].Distributors)
	assert.Empty(t, qs[0].Distributors)
	assert.True(t, before.Less(qs[0].Position))
	assert.GreaterOrEqual(t, qs[0].Clock, uint64(140))
	assert.Empty(t, h.Distributors())
	_, _, ok := h.Distributors().For("a")
	assert.False(t, ok, "no distributor serves any node")
}

// distributorsOf returns the set a quantum carries, nil if it carries none.
func distributorsOf(q *pb.Quantum) quantum.Distributors {
	if q.GetDistributors() == nil {
		return nil
	}
	d := quantum.Distributors(maps.Clone(q.GetDistributors().GetAddresses()))
	if d == nil {
		d = quantum.Distributors{}
	}
	return d
}

// joinDistributor registers distributor id at addr under the assigner's prefix; it leaves the
// set when the test ends, if it has not before.
func joinDistributor(t *testing.T, c *cluster, id, addr string) *membership.Registration {
	t.Helper()
	reg, err := membership.Register(ctxT(t, 10*time.Second), c.cli, "/sliceplane/", id, addr, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close() }) // a second Close finds the lease gone
	return reg
}

// nextSetChange reads w until the quantum that changes the set of distributors, checking
// that positions only grow and that only reinitializing quanta carry a set.
func nextSetChange(t *testing.T, w pb.QuantaService_WatchQuantaClient, after *pb.Position) *pb.Quantum {
	t.Helper()
	last := wire.PositionFromProto(after)
	for {
		resp, err := recv(w)
		require.NoError(t, err, "no change of the distributors before the deadline")
		q := resp.GetQuantum()
		pos := wire.PositionFromProto(q.GetPosition())
		require.True(t, last.Less(*pos), "quantum %s after %s", pos, last)
		last = pos
		if !q.GetReinitializing() {
			require.Nil(t, q.GetDistributors(), "quantum %s carries a set but no map", pos)
			continue
		}
		require.Equal(t, "distributors", q.GetCause())
		require.NotNil(t, q.GetDistributors(), "a reinitializing quantum always carries the set")
		a, err := wire.AssignmentFromProto(q.GetAssignment())
		require.NoError(t, err)
		require.Equal(t, q.GetGeneration(), a.Generation())
		return q
	}
}

func TestNodesAreToldWhichDistributorServesThem(t *testing.T) {
	c := newCluster(t)
	a := c.start(small, func(cfg *assigner.Config) { cfg.Core.NodeTTL = time.Minute })
	a.leading(t)
	ctx := ctxT(t, 60*time.Second)

	ids := []string{"node-0", "node-1", "node-2", "node-3", "node-4", "node-5", "node-6", "node-7"}
	n := &servedNodes{a: a, ctx: ctx, registered: ids[:len(ids)-1]}
	heartbeat := func(id string) *pb.Distributor { return n.heartbeat(t, id) }
	register := func(id string) *pb.Distributor { return n.register(t, id) }
	assertServed := func(set quantum.Distributors) { n.assertServed(t, set) }

	for _, id := range n.registered {
		assert.Nil(t, register(id), "%s: no distributor runs yet", id)
	}
	eventually(t, 10*time.Second, "a map exists", a.hasMap)
	assertServed(quantum.Distributors{})

	// One distributor: it serves every node.
	one := quantum.Distributors{"d1": "127.0.0.1:7001"}
	d1 := joinDistributor(t, c, "d1", one["d1"])
	eventually(t, 10*time.Second, "node-0's heartbeat names d1", func() bool { return heartbeat("node-0").GetId() == "d1" })
	assertServed(one)
	n.registered = ids
	got := register(ids[len(ids)-1])
	assert.Equal(t, "d1", got.GetId(), "a node registering now is told at once")
	assert.Equal(t, one["d1"], got.GetAddress())

	// A stream started now begins with the whole map and the set.
	w, err := a.quanta.WatchQuanta(ctx, &pb.WatchQuantaRequest{})
	require.NoError(t, err)
	start, err := recv(w)
	require.NoError(t, err)
	require.True(t, start.GetQuantum().GetReinitializing())
	assert.Equal(t, one, distributorsOf(start.GetQuantum()))
	pos := start.GetQuantum().GetPosition()

	// A second distributor joins: one reinitializing quantum carries both, and each node is
	// told the one rendezvous hashing picks.
	two := quantum.Distributors{"d1": "127.0.0.1:7001", "d2": "127.0.0.1:7002"}
	picked := map[string]bool{}
	for _, id := range ids {
		d, _, _ := two.For(assignment.NodeID(id))
		picked[d] = true
	}
	require.Len(t, picked, 2, "the test's nodes must be spread over both distributors")
	d2 := joinDistributor(t, c, "d2", two["d2"])
	q := nextSetChange(t, w, pos)
	assert.Equal(t, two, distributorsOf(q))
	assertServed(two) // the quantum is published before it is streamed: no wait
	pos = q.GetPosition()

	// A distributor that registers again at another address is a change too.
	moved := quantum.Distributors{"d1": "127.0.0.1:7001", "d2": "127.0.0.1:7012"}
	d2b := joinDistributor(t, c, "d2", moved["d2"])
	q = nextSetChange(t, w, pos)
	assert.Equal(t, moved, distributorsOf(q))
	assertServed(moved)
	pos = q.GetPosition()
	require.NoError(t, d2.Close(), "the old lease no longer holds the key: nothing changes")

	// Closing a registration takes the distributor out at once; its nodes move to d1.
	require.NoError(t, d2b.Close())
	q = nextSetChange(t, w, pos)
	assert.Equal(t, one, distributorsOf(q))
	assertServed(one)
	pos = q.GetPosition()

	// With no distributor left, the set is empty, not absent, and nodes are told none.
	require.NoError(t, d1.Close())
	q = nextSetChange(t, w, pos)
	assert.Empty(t, distributorsOf(q))
	assertServed(quantum.Distributors{})
}

// servedNodes registers nodes and checks which distributor their heartbeats name.
type servedNodes struct {
	a          *node
	ctx        context.Context
	registered []string
}

func (n *servedNodes) heartbeat(t *testing.T, id string) *pb.Distributor {
	t.Helper()
	resp, err := n.a.nodes.Heartbeat(n.ctx, &pb.HeartbeatRequest{NodeId: id})
	require.NoError(t, err)
	return resp.GetDistributor()
}

func (n *servedNodes) register(t *testing.T, id string) *pb.Distributor {
	t.Helper()
	resp, err := n.a.nodes.Register(n.ctx, &pb.RegisterRequest{Node: &pb.Node{Id: id}, Address: "127.0.0.1:1"})
	require.NoError(t, err)
	return resp.GetDistributor()
}

// assertServed checks that every registered node's heartbeat names the distributor set.For
// picks.
func (n *servedNodes) assertServed(t *testing.T, set quantum.Distributors) {
	t.Helper()
	for _, id := range n.registered {
		got := n.heartbeat(t, id)
		if w := wantDistributor(set, id); w == nil {
			assert.Nil(t, got, "%s: no distributor runs", id)
		} else {
			assert.Equal(t, w.GetId(), got.GetId(), id)
			assert.Equal(t, w.GetAddress(), got.GetAddress(), id)
		}
	}
}

func wantDistributor(set quantum.Distributors, id string) *pb.Distributor {
	d, addr, ok := set.For(assignment.NodeID(id))
	if !ok {
		return nil
	}
	return &pb.Distributor{Id: d, Address: addr}
}

func TestANewLeaderKnowsTheDistributorsBeforeItServes(t *testing.T) {
	c := newCluster(t)
	ttl := func(cfg *assigner.Config) { cfg.Core.NodeTTL = time.Minute }
	a := c.start(small, ttl)
	a.leading(t)
	b := c.start(small, ttl)
	ctx := ctxT(t, 60*time.Second)
	_, err := a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: "node-0"}, Address: "127.0.0.1:1"})
	require.NoError(t, err)
	eventually(t, 10*time.Second, "a map exists", a.hasMap)
	two := quantum.Distributors{"d1": "127.0.0.1:7001", "d2": "127.0.0.1:7002"}
	for _, id := range slices.Sorted(maps.Keys(two)) {
		joinDistributor(t, c, id, two[id])
	}
	eventually(t, 10*time.Second, "the leader knows both distributors", func() bool {
		resp, err := a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "node-0"})
		require.NoError(t, err)
		d, _, _ := two.For("node-0")
		return resp.GetDistributor().GetId() == d
	})

	a.stop()
	b.leading(t)
	// The first quantum any watcher of the new leader sees already names both.
	w, err := b.quanta.WatchQuanta(ctx, &pb.WatchQuantaRequest{})
	require.NoError(t, err)
	resp, err := recv(w)
	require.NoError(t, err)
	require.True(t, resp.GetQuantum().GetReinitializing())
	assert.Equal(t, two, distributorsOf(resp.GetQuantum()))
	d, addr, _ := two.For("node-0")
	reg, err := b.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: "node-0"}, Address: "127.0.0.1:1"})
	require.NoError(t, err)
	assert.Equal(t, d, reg.GetDistributor().GetId())
	assert.Equal(t, addr, reg.GetDistributor().GetAddress())
}
