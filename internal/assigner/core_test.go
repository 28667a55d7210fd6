package assigner

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/store"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

var smallParams = map[string]string{"min_slices_per_node": "1", "initial_slices_per_node": "2", "max_slices_per_node": "8"}

func newCore(t *testing.T) *Core {
	t.Helper()
	c, first, err := NewCore(CoreConfig{NodeTTL: 10 * time.Second, Algorithm: "weighted-move", Params: smallParams}, 7, store.State{}, false, 100, t0)
	require.NoError(t, err)
	assert.True(t, first.SaveMeta)
	assert.Equal(t, uint64(7), first.Meta.Term)
	c.Commit(first)
	return c
}

func commit(t *testing.T, c *Core, p *Proposal, err error) *Proposal {
	t.Helper()
	require.NoError(t, err)
	require.NotNil(t, p)
	c.Commit(p)
	return p
}

// mustPass runs a pass that must propose something, and commits it.
func mustPass(t *testing.T, c *Core, at time.Time) *Proposal {
	t.Helper()
	p, err := c.Pass(at)
	return commit(t, c, p, err)
}

func register(t *testing.T, c *Core, ids ...string) {
	t.Helper()
	for _, id := range ids {
		p, err := c.Register(store.Node{Node: assignment.Node{ID: assignment.NodeID(id)}, Address: id + ":1"}, t0)
		commit(t, c, p, err)
	}
}

func TestFirstMapAndPasses(t *testing.T) {
	c := newCore(t)
	p, err := c.Pass(t0)
	require.NoError(t, err)
	assert.Nil(t, p, "no node, no map")

	register(t, c, "a", "b")
	p = mustPass(t, c, t0)
	require.True(t, p.Init)
	require.NotNil(t, p.Quantum.Snapshot, "the first quantum carries the whole map")
	assert.Equal(t, quantum.Position{Term: 7, Seq: 1}, p.Quantum.Position)
	assert.Equal(t, uint64(100), p.Quantum.Clock)
	a, pos, _ := c.Assignment()
	require.Equal(t, 4, a.Len())
	assert.Equal(t, uint64(1), pos.Seq)

	// Node a reports all of the load on its slices: the next pass moves some to b.
	// b's slices are idle but hold many keys, so that moving one of a's is within budget.
	var onA, onB []load.Sample
	for _, s := range a.All() {
		if s.Holds("a") {
			onA = append(onA, load.Sample{Range: s.Range, Load: 10, Keys: 10})
		} else {
			onB = append(onB, load.Sample{Range: s.Range, Keys: 1000})
		}
	}
	require.NoError(t, c.Report(load.Report{Node: "a", At: t0, Window: time.Second, Samples: onA}, t0))
	require.NoError(t, c.Report(load.Report{Node: "b", At: t0, Window: time.Second, Samples: onB}, t0))
	p = mustPass(t, c, t0.Add(time.Second))
	require.NotNil(t, p.Entry)
	assert.Equal(t, uint64(1), p.Entry.Index)
	assert.NotEmpty(t, p.Entry.Moves, "the pass's moves are logged for the next leader")
	assert.Equal(t, uint64(2), p.Quantum.Seq)
	assert.Equal(t, p.After.Generation(), p.Meta.Generation)
	x, ok := c.Explain()
	require.True(t, ok)
	assert.Greater(t, x.ImbalanceBefore, x.ImbalanceAfter)
	assert.Equal(t, uint64(1), c.meta.Pass)
}

func TestClockQuanta(t *testing.T) {
	c := newCore(t)
	c.ObserveClock(150)
	assert.Nil(t, c.ClockQuantum(t0), "no map yet: nothing to stamp")
	register(t, c, "a")
	mustPass(t, c, t0)
	assert.Nil(t, c.ClockQuantum(t0), "the first map already carries clock 150")
	c.ObserveClock(149)
	assert.Nil(t, c.ClockQuantum(t0), "a clock seen late does not go back")
	c.ObserveClock(180)
	p := c.ClockQuantum(t0)
	require.NotNil(t, p)
	assert.True(t, p.Quantum.ClockOnly())
	assert.Equal(t, uint64(180), p.Quantum.Clock)
	assert.False(t, p.Persists(), "clock quanta are not stored")
	c.Commit(p)
	assert.Nil(t, c.ClockQuantum(t0))
}

func TestUncommittedProposalsChangeNothing(t *testing.T) {
	c := newCore(t)
	register(t, c, "a", "b")
	mustPass(t, c, t0)
	a, pos, clock := c.Assignment()
	meta := c.meta
	// Proposals whose writes fail are dropped: none of them may have changed the core.
	_, err := c.Move(SliceRef{Hash: new(uint64)}, []assignment.NodeID{"b"}, t0)
	require.NoError(t, err)
	_, err = c.SetAlgorithm("range", nil)
	require.NoError(t, err)
	c.Freeze("x")
	_, err = c.Register(store.Node{Node: assignment.Node{ID: "c"}, Address: "c:1"}, t0)
	require.NoError(t, err)
	a2, pos2, clock2 := c.Assignment()
	assert.Same(t, a, a2)
	assert.Equal(t, pos, pos2)
	assert.Equal(t, clock, clock2)
	assert.Equal(t, meta, c.meta)
	assert.Equal(t, "weighted-move", c.alg.Name())
	assert.Len(t, c.nodes, 2)
}

func TestNodesExpireAndDeregister(t *testing.T) {
	c := newCore(t)
	register(t, c, "a", "b", "c")
	assert.Nil(t, c.Expire(t0.Add(10*time.Second)), "within the lease")
	_, err := c.Heartbeat("a", t0.Add(8*time.Second))
	require.NoError(t, err)
	require.NoError(t, c.Report(load.Report{Node: "b", At: t0, Window: time.Second}, t0.Add(9*time.Second)))
	p := c.Expire(t0.Add(15 * time.Second))
	require.NotNil(t, p)
	assert.Equal(t, []assignment.NodeID{"c"}, p.DeleteNodes, "a heartbeat or a report renews the lease")
	c.Commit(p)
	_, err = c.Heartbeat("c", t0)
	assert.ErrorIs(t, err, ErrUnknownNode)

	p, err = c.Deregister("b")
	require.NoError(t, err)
	c.Commit(p)
	assert.Len(t, c.nodes, 1)
	_, err = c.Deregister("b")
	assert.ErrorIs(t, err, ErrUnknownNode)
}

func TestRegistrationRenewalsAreNotStored(t *testing.T) {
	c := newCore(t)
	n := store.Node{Node: assignment.Node{ID: "a", Capacity: 2}, Address: "x:1", Labels: map[string]string{"zone": "z"}}
	p, err := c.Register(n, t0)
	require.NoError(t, err)
	assert.NotNil(t, p.PutNode)
	c.Commit(p)
	p, err = c.Register(n, t0.Add(time.Second))
	require.NoError(t, err)
	assert.False(t, p.Persists(), "the same registration only renews the lease")
	n.Address = "x:2"
	p, err = c.Register(n, t0)
	require.NoError(t, err)
	assert.NotNil(t, p.PutNode, "a changed registration is stored")

	for _, bad := range []store.Node{
		{Node: assignment.Node{ID: ""}},
		{Node: assignment.Node{ID: "a", Capacity: -1}},
		{Node: assignment.Node{ID: "a"}, Address: string(make([]byte, 300))},
	} {
		_, err := c.Register(bad, t0)
		assert.ErrorIs(t, err, ErrInvalid)
	}
}

func TestDrainFreezeAndAlgorithm(t *testing.T) {
	c := newCore(t)
	register(t, c, "a", "b")
	mustPass(t, c, t0)
	p, held, err := c.Drain("a", false)
	require.NoError(t, err)
	assert.Equal(t, 2, held)
	c.Commit(p)
	_, _, err = c.Drain("b", false)
	assert.ErrorIs(t, err, ErrPrecondition, "draining every node would leave the slices nowhere to go")
	mustPass(t, c, t0.Add(time.Second))
	assert.Zero(t, c.holds("a"), "a pass moves a draining node's slices")

	c.Commit(c.Freeze("maintenance"))
	p, err = c.Pass(t0.Add(2 * time.Second))
	require.NoError(t, err)
	assert.Nil(t, p, "frozen: no pass")
	c.Commit(c.Unfreeze())

	_, err = c.SetAlgorithm("weighted-move", map[string]string{"hold_passes": "33"})
	assert.ErrorIs(t, err, ErrInvalid)
	p, err = c.SetAlgorithm("consistent-hash", map[string]string{"virtual_nodes": "8"})
	require.NoError(t, err)
	c.Commit(p)
	assert.Equal(t, "consistent-hash", c.alg.Name())
	assert.Equal(t, "consistent-hash", c.meta.Algorithm)
}

func TestANewLeaderContinues(t *testing.T) {
	a, err := assignment.Uniform(4, func(i int) []assignment.NodeID { return []assignment.NodeID{[]assignment.NodeID{"a", "b"}[i%2]} })
	require.NoError(t, err)
	a = a.WithGeneration(9)
	hist := []balance.Move{{Range: keyspace.Full(), From: "a", To: "b", Pass: 41}}
	st := store.State{
		Meta:       store.Meta{Term: 3, Seq: 12, Clock: 500, Generation: 9, Pass: 42, Algorithm: "weighted-move", Params: smallParams, Frozen: true},
		Assignment: a, History: hist,
		Nodes: []store.Node{{Node: assignment.Node{ID: "a"}}, {Node: assignment.Node{ID: "b"}}},
	}
	c, first, err := NewCore(CoreConfig{}, 8, st, true, 450, t0)
	require.NoError(t, err)
	c.Commit(first)
	got, pos, clock := c.Assignment()
	assert.Same(t, a, got)
	assert.Equal(t, quantum.Position{Term: 8, Seq: 0}, pos, "a new term counts from 0")
	assert.Equal(t, uint64(500), clock, "the clock never goes back")
	assert.Equal(t, uint64(42), c.meta.Pass)
	assert.Equal(t, hist, c.history)
	assert.True(t, c.meta.Frozen)
	assert.Nil(t, c.Expire(t0.Add(5*time.Second)), "loaded nodes get a full lease to find the new leader")

	st.Meta.Algorithm = "magic"
	_, _, err = NewCore(CoreConfig{}, 8, st, true, 450, t0)
	assert.Error(t, err)
}

// TestIdleClusterSpreadsKeySpace: with no load measured at all, passes weigh slices by
// their share of the hash space, so a node that joins an idle cluster gets slices.
func TestIdleClusterSpreadsKeySpace(t *testing.T) {
	// The default constants: slices small enough for moves within the churn budget.
	c, first, err := NewCore(CoreConfig{NodeTTL: time.Hour, Algorithm: "weighted-move"}, 7, store.State{}, false, 100, t0)
	require.NoError(t, err)
	c.Commit(first)
	register(t, c, "a")
	mustPass(t, c, t0)
	register(t, c, "b")
	held := func() (a, b float64) {
		m, _, _ := c.Assignment()
		for _, s := range m.All() {
			if s.Holds("a") {
				a += s.Range.Fraction()
			}
			if s.Holds("b") {
				b += s.Range.Fraction()
			}
		}
		return a, b
	}
	_, onB := held()
	require.Zero(t, onB, "b joined after the first map")
	at := t0
	for range 40 {
		at = at.Add(time.Second)
		p, err := c.Pass(at)
		require.NoError(t, err)
		if p != nil {
			c.Commit(p)
		}
	}
	onA, onB := held()
	if c.explain != nil {
		t.Logf("last pass: stop %q, imbalance %.3f -> %.3f, candidates %v", c.explain.Stop, c.explain.ImbalanceBefore, c.explain.ImbalanceAfter, c.explain.Candidates)
	}
	assert.InDelta(t, 0.5, onB, 0.1, "b's share of the hash space after idle passes (a holds %.3f)", onA)
}

func TestAuditMarksChangesWithTheirCaller(t *testing.T) {
	c := newCore(t)
	register(t, c, "a", "b")
	mustPass(t, c, t0)
	_, pos, clock := c.Assignment()

	// A change without map ops gets a clock-only quantum that says who made it.
	p := c.Freeze("maintenance")
	c.Audit(p, "admin: "+p.Summary, "spiffe://sliceplane/admin/alice", t0)
	require.NotNil(t, p.Quantum)
	assert.True(t, p.Quantum.ClockOnly())
	assert.Equal(t, quantum.Position{Term: pos.Term, Seq: pos.Seq + 1}, p.Quantum.Position)
	assert.Equal(t, clock, p.Quantum.Clock)
	assert.Equal(t, "spiffe://sliceplane/admin/alice", p.Quantum.By)
	assert.Equal(t, `admin: freeze balancing: "maintenance"`, p.Quantum.Cause)
	before, _, _ := c.Assignment()
	c.Commit(p)
	after, now, _ := c.Assignment()
	assert.Same(t, before, after, "the map is the same")
	assert.Equal(t, p.Quantum.Position, now)
	assert.True(t, c.Status().Frozen)

	// A change of the map keeps its quantum, and its log entry names the caller too.
	from := uint64(0)
	p, err := c.Split(SliceRef{Start: &from}, nil, t0)
	require.NoError(t, err)
	c.Audit(p, "admin: "+p.Summary, "spiffe://sliceplane/admin/bob", t0)
	assert.Len(t, p.Quantum.Ops, 1)
	assert.Equal(t, "spiffe://sliceplane/admin/bob", p.Quantum.By)
	assert.Equal(t, "spiffe://sliceplane/admin/bob", p.Entry.By)
	c.Commit(p)

	// A renewal changes nothing and stays out of the history.
	p, err = c.Register(store.Node{Node: assignment.Node{ID: "a"}, Address: "a:1"}, t0)
	require.NoError(t, err)
	c.Audit(p, "node: "+p.Summary, "spiffe://sliceplane/node/a", t0)
	assert.Nil(t, p.Quantum)
}
