package assigner_test

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/membership"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/store"
	"github.com/sliceplane/sliceplane/internal/wire"
)

var distT0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// distCore returns the core of term 7 at clock 100, with nodes a and b registered.
func distCore(t *testing.T) *assigner.Core {
	t.Helper()
	c, first, err := assigner.NewCore(assigner.CoreConfig{NodeTTL: 10 * time.Second, Algorithm: "weighted-move",
		Params: map[string]string{"min_slices_per_node": "1", "initial_slices_per_node": "2", "max_slices_per_node": "8"}},
		7, store.State{}, false, 100, distT0)
	require.NoError(t, err)
	c.Commit(first)
	for _, id := range []assignment.NodeID{"a", "b"} {
		p, err := c.Register(store.Node{Node: assignment.Node{ID: id}, Address: string(id) + ":1"}, distT0)
		require.NoError(t, err)
		c.Commit(p)
	}
	return c
}

// publishTo commits p and publishes its quantum to h, as the server does: the hub refuses a
// quantum whose position does not follow the last one or whose clock goes back.
func publishTo(t *testing.T, h *quantum.Hub, c *assigner.Core, p *assigner.Proposal) {
	t.Helper()
	c.Commit(p)
	if p.Quantum != nil {
		require.NoError(t, h.Publish(*p.Quantum, p.After))
	}
}

func TestSetDistributorsBeforeTheFirstMapPublishesNothing(t *testing.T) {
	c := distCore(t)
	h := quantum.NewHub(quantum.HubConfig{}, 7, nil, 100)
	one := quantum.Distributors{"d1": "10.0.0.1:7001"}

	p := c.SetDistributors(one, distT0)
	require.NotNil(t, p, "the core must remember the set for the first map")
	assert.Nil(t, p.Quantum, "no map yet: nothing to publish")
	assert.False(t, p.Persists(), "the set lives in etcd already; the core stores nothing")
	publishTo(t, h, c, p)
	_, pos, _ := c.Assignment()
	assert.Equal(t, quantum.Position{Term: 7}, pos, "no quantum was used up")
	assert.Nil(t, c.SetDistributors(maps.Clone(one), distT0), "the same set again changes nothing")

	p, err := c.Pass(distT0)
	require.NoError(t, err)
	require.NotNil(t, p)
	require.True(t, p.Quantum.Reinitializing())
	assert.Equal(t, one, p.Quantum.Distributors, "the first map's quantum carries the set")
	publishTo(t, h, c, p)
	assert.Equal(t, one, h.Distributors())
}

func TestSetDistributorsAfterTheFirstMapIsOneReinitializingQuantum(t *testing.T) {
	c := distCore(t)
	h := quantum.NewHub(quantum.HubConfig{}, 7, nil, 100)
	p, err := c.Pass(distT0)
	require.NoError(t, err)
	publishTo(t, h, c, p)
	first := *p.Quantum
	require.NotNil(t, first.Distributors, "the first map carries the set, even empty")
	assert.Empty(t, first.Distributors)
	a, _, _ := c.Assignment()

	c.ObserveClock(130)
	two := quantum.Distributors{"d1": "10.0.0.1:7001", "d2": "10.0.0.2:7001"}
	p = c.SetDistributors(two, distT0.Add(time.Second))
	require.NotNil(t, p)
	q := p.Quantum
	require.NotNil(t, q, "a changed set is published")
	assert.True(t, q.Reinitializing(), "so that every distributor learns its nodes from one step")
	assert.Same(t, a, q.Snapshot, "the full map, unchanged")
	assert.Same(t, a, p.After)
	assert.Empty(t, q.Ops)
	assert.Equal(t, two, q.Distributors)
	assert.Equal(t, "distributors", q.Cause)
	assert.Equal(t, a.Generation(), q.Generation, "the map does not change")
	assert.Equal(t, quantum.Position{Term: 7, Seq: first.Seq + 1}, q.Position)
	assert.Equal(t, uint64(130), q.Clock, "stamped with the clock seen so far")
	assert.Equal(t, distT0.Add(time.Second), q.Time)
	assert.False(t, p.Persists())

	// Uncommitted, it changes nothing: the same set is proposed again.
	_, pos, clock := c.Assignment()
	assert.Equal(t, first.Position, pos)
	assert.Equal(t, first.Clock, clock)
	require.NotNil(t, c.SetDistributors(two, distT0))

	publishTo(t, h, c, p)
	assert.Equal(t, two, h.Distributors())
	_, pos, clock = c.Assignment()
	assert.Equal(t, q.Position, pos)
	assert.Equal(t, uint64(130), clock)
	assert.Nil(t, c.SetDistributors(maps.Clone(two), distT0), "an equal set produces nothing")
	assert.Nil(t, c.ClockQuantum(distT0), "the reinitializing quantum already carries clock 130")

	// The quanta that follow are ordered after it.
	c.ObserveClock(140)
	p = c.ClockQuantum(distT0)
	require.NotNil(t, p)
	assert.Equal(t, quantum.Position{Term: 7, Seq: q.Seq + 1}, p.Quantum.Position)
	assert.Equal(t, uint64(140), p.Quantum.Clock)
	assert.Nil(t, p.Quantum.Distributors, "only reinitializing quanta carry the set")
	publishTo(t, h, c, p)
	assert.Equal(t, two, h.Distributors(), "a quantum without a set keeps the last one")

	// A change of the map follows on the same map the distributors quantum carried.
	_, s := a.Lookup(0)
	to := assignment.NodeID("a")
	if s.Holds("a") {
		to = "b"
	}
	mv, err := c.Move(assigner.SliceRef{Hash: new(uint64)}, []assignment.NodeID{to}, distT0)
	require.NoError(t, err)
	require.NotNil(t, mv.Quantum)
	assert.Equal(t, quantum.Position{Term: 7, Seq: q.Seq + 2}, mv.Quantum.Position)
	assert.Equal(t, uint64(140), mv.Quantum.Clock)
	assert.Equal(t, a.Generation()+1, mv.Quantum.Generation, "the ops apply to the map the set came with")
	publishTo(t, h, c, mv)

	// Every distributor leaving is a change too, carried as an empty (not absent) set.
	_, before, _ := c.Assignment()
	p = c.SetDistributors(quantum.Distributors{}, distT0)
	require.NotNil(t, p)
	require.NotNil(t, p.Quantum)
	assert.NotNil(t, p.Quantum.Distributors)
	assert.Empty(t, p.Quantum.Distributors)
	assert.True(t, before.Less(p.Quantum.Position))
	assert.GreaterOrEqual(t, p.Quantum.Clock, uint64(140))
	publishTo(t, h, c, p)
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

	heartbeat := func(id string) *pb.Distributor {
		t.Helper()
		resp, err := a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: id})
		require.NoError(t, err)
		return resp.GetDistributor()
	}
	register := func(id string) *pb.Distributor {
		t.Helper()
		resp, err := a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: id}, Address: "127.0.0.1:1"})
		require.NoError(t, err)
		return resp.GetDistributor()
	}
	want := func(set quantum.Distributors, id string) *pb.Distributor {
		d, addr, ok := set.For(assignment.NodeID(id))
		if !ok {
			return nil
		}
		return &pb.Distributor{Id: d, Address: addr}
	}
	// assertServed checks that every node's heartbeat names the distributor set.For picks.
	ids := []string{"node-0", "node-1", "node-2", "node-3", "node-4", "node-5", "node-6", "node-7"}
	registered := ids[:len(ids)-1]
	assertServed := func(set quantum.Distributors) {
		t.Helper()
		for _, id := range registered {
			got := heartbeat(id)
			if w := want(set, id); w == nil {
				assert.Nil(t, got, "%s: no distributor runs", id)
			} else {
				assert.Equal(t, w.GetId(), got.GetId(), id)
				assert.Equal(t, w.GetAddress(), got.GetAddress(), id)
			}
		}
	}

	for _, id := range registered {
		assert.Nil(t, register(id), "%s: no distributor runs yet", id)
	}
	eventually(t, 10*time.Second, "a map exists", a.hasMap)
	assertServed(quantum.Distributors{})

	// One distributor: it serves every node.
	one := quantum.Distributors{"d1": "127.0.0.1:7001"}
	d1 := joinDistributor(t, c, "d1", one["d1"])
	eventually(t, 10*time.Second, "node-0's heartbeat names d1", func() bool { return heartbeat("node-0").GetId() == "d1" })
	assertServed(one)
	registered = ids
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
