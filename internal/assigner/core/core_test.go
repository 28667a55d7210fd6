package core

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

var smallParams = map[string]string{"min_slices_per_node": "1", "initial_slices_per_node": "2", "max_slices_per_node": "8"}

// lead starts term on c from st at clock, and commits the term's claim.
func lead(t *testing.T, c *Core, term uint64, st State, found bool, clock uint64) {
	t.Helper()
	out := c.Step(t0, LeadershipGained{Term: term, State: st, Found: found, Clock: clock})
	require.Nil(t, out.Reply, "the term starts")
	require.NotNil(t, out.Write)
	assert.True(t, out.Write.SaveMeta)
	assert.Equal(t, term, out.Write.Meta.Term)
	c.Step(t0, WriteCommitted{})
}

func newCore(t *testing.T) *Core {
	t.Helper()
	c, err := New(Config{NodeTTL: 10 * time.Second, Algorithm: "weighted-move", Params: smallParams, BreakBeforeMake: true})
	require.NoError(t, err)
	lead(t, c, 7, State{}, false, 100)
	return c
}

// settled is what a chain of steps asked for, every write committed at once.
type settled struct {
	writes []Write
	pubs   []Publication
	reply  Reply
	pass   *PassDone
	failed bool
}

// settle steps ev at now and commits every write it leads to.
func settle(t *testing.T, c *Core, now time.Time, ev Event) settled {
	t.Helper()
	var s settled
	for _, out := range c.Settle(now, ev) {
		if out.Write != nil {
			s.writes = append(s.writes, *out.Write)
		}
		s.pubs = append(s.pubs, out.Publish...)
		if out.Reply != nil {
			s.reply = *out.Reply
		}
		if out.Pass != nil {
			s.pass = out.Pass
		}
		s.failed = s.failed || out.PassFailed
	}
	return s
}

// ok settles a request that must succeed.
func ok(t *testing.T, c *Core, now time.Time, ev Event) settled {
	t.Helper()
	s := settle(t, c, now, ev)
	require.NoError(t, s.reply.Err)
	return s
}

// passAt runs a pass (after the expiry of nodes) at, and commits what it proposes.
func passAt(t *testing.T, c *Core, at time.Time) settled {
	t.Helper()
	c.nextPass, c.nextClock = at, at.Add(time.Hour)
	return settle(t, c, at, Tick{})
}

// clockAt asks for a clock-only quantum at, and no pass.
func clockAt(t *testing.T, c *Core, at time.Time) settled {
	t.Helper()
	c.nextPass, c.nextClock = at.Add(time.Hour), at
	return settle(t, c, at, Tick{})
}

func register(t *testing.T, c *Core, ids ...string) {
	t.Helper()
	for _, id := range ids {
		ok(t, c, t0, Register{Node: Node{Node: assignment.Node{ID: assignment.NodeID(id)}, Address: id + ":1"}})
	}
}

func report(c *Core, at time.Time, r load.Report) error {
	return settleErr(c, at, ReportLoad{Report: r})
}

func settleErr(c *Core, at time.Time, ev Event) error {
	for _, out := range c.Settle(at, ev) {
		if out.Reply != nil {
			return out.Reply.Err
		}
	}
	return nil
}

func TestFirstMapAndPasses(t *testing.T) {
	c := newCore(t)
	s := passAt(t, c, t0)
	assert.Empty(t, s.writes, "no node, no map")
	assert.Empty(t, s.pubs)

	register(t, c, "a", "b") // each audited with a clock-only quantum
	_, before, _ := c.Assignment()
	s = passAt(t, c, t0)
	require.Len(t, s.writes, 1)
	require.True(t, s.writes[0].Init)
	require.Len(t, s.pubs, 1)
	q := s.pubs[0].Quantum
	require.NotNil(t, q.Snapshot, "the first quantum carries the whole map")
	assert.Equal(t, quantum.Position{Term: 7, Seq: before.Seq + 1}, q.Position)
	assert.Equal(t, uint64(100), q.Clock)
	a, pos, _ := c.Assignment()
	require.Equal(t, 4, a.Len())
	assert.Equal(t, before.Seq+1, pos.Seq)

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
	require.NoError(t, report(c, t0, load.Report{Node: "a", Window: time.Second, Samples: onA}))
	require.NoError(t, report(c, t0, load.Report{Node: "b", Window: time.Second, Samples: onB}))
	s = passAt(t, c, t0.Add(time.Second))
	require.Len(t, s.writes, 1)
	w := s.writes[0]
	require.NotNil(t, w.Entry)
	assert.Equal(t, uint64(1), w.Entry.Index)
	assert.NotEmpty(t, w.Entry.Moves, "the pass's moves are logged for the next leader")
	require.Len(t, s.pubs, 1)
	assert.Equal(t, before.Seq+2, s.pubs[0].Quantum.Seq)
	assert.Equal(t, s.pubs[0].Map.Generation(), w.Meta.Generation)
	require.NotNil(t, s.pass)
	assert.True(t, s.pass.Changed)
	x := c.Explain()
	require.True(t, x.Passed)
	assert.Greater(t, x.ImbalanceBefore, x.ImbalanceAfter)
	assert.Equal(t, uint64(1), c.meta.Pass)
}

func TestClockQuanta(t *testing.T) {
	c := newCore(t)
	c.Step(t0, ClockObserved{Clock: 150})
	assert.Empty(t, clockAt(t, c, t0).pubs, "no map yet: nothing to stamp")
	register(t, c, "a")
	passAt(t, c, t0)
	assert.Empty(t, clockAt(t, c, t0).pubs, "the first map already carries clock 150")
	c.Step(t0, ClockObserved{Clock: 149})
	assert.Empty(t, clockAt(t, c, t0).pubs, "a clock seen late does not go back")
	out := c.Step(t0, ClockObserved{Clock: 180})
	assert.Equal(t, c.nextClock, out.Wake, "the source moved: a clock quantum is due")
	s := clockAt(t, c, t0)
	require.Len(t, s.pubs, 1)
	assert.True(t, s.pubs[0].Quantum.ClockOnly())
	assert.Equal(t, uint64(180), s.pubs[0].Quantum.Clock)
	assert.Empty(t, s.writes, "clock quanta are not stored")

	// At most one clock quantum every ClockInterval, however often the driver ticks.
	c.Step(t0, ClockObserved{Clock: 190})
	assert.Empty(t, settle(t, c, t0.Add(time.Millisecond), Tick{}).pubs)
	assert.Len(t, settle(t, c, t0.Add(c.cfg.ClockInterval), Tick{}).pubs, 1)
	assert.Empty(t, clockAt(t, c, t0.Add(time.Second)).pubs, "nothing new to stamp")
}

// errFenced stands for the store's refusal of a deposed leader's write.
var errFenced = errors.New("fenced off: no longer the leader")

func TestFailedWritesChangeNothing(t *testing.T) {
	c := newCore(t)
	register(t, c, "a", "b")
	passAt(t, c, t0)
	a, pos, clock := c.Assignment()
	meta := c.meta
	// Changes whose writes fail are dropped: none of them may have changed the core.
	for _, ev := range []Event{
		Move{Slice: SliceRef{Hash: new(uint64)}, To: []assignment.NodeID{"b"}},
		SetAlgorithm{Name: "range"},
		Freeze{Reason: "x"},
		Register{Node: Node{Node: assignment.Node{ID: "c"}, Address: "c:1"}},
	} {
		out := c.Step(t0, ev)
		require.NotNil(t, out.Write, "%T", ev)
		assert.ErrorIs(t, c.Step(t0, GetStatus{}).Reply.Err, ErrWriteInFlight, "one write in flight at a time")
		out = c.Step(t0, WriteFailed{Err: errFenced})
		require.NotNil(t, out.Reply)
		assert.ErrorIs(t, out.Reply.Err, errFenced)
		assert.Empty(t, out.Publish)
	}
	a2, pos2, clock2 := c.Assignment()
	assert.Same(t, a, a2)
	assert.Equal(t, pos, pos2)
	assert.Equal(t, clock, clock2)
	assert.Equal(t, meta, c.meta)
	assert.Equal(t, "weighted-move", c.alg.Name())
	assert.Len(t, c.nodes, 2)
	assert.ErrorIs(t, c.Step(t0, WriteCommitted{}).Reply.Err, errNothingInFlight)
}

func TestNodesExpireAndDeregister(t *testing.T) {
	c := newCore(t)
	register(t, c, "a", "b", "c")
	for _, w := range passAt(t, c, t0.Add(10*time.Second-time.Nanosecond)).writes { // a lease lapses at the TTL
		assert.Empty(t, w.DeleteNodes, "within the lease")
	}
	ok(t, c, t0.Add(8*time.Second), Heartbeat{Node: "a"})
	require.NoError(t, report(c, t0.Add(9*time.Second), load.Report{Node: "b", Window: time.Second}))
	s := passAt(t, c, t0.Add(15*time.Second))
	require.NotEmpty(t, s.writes)
	assert.Equal(t, []assignment.NodeID{"c"}, s.writes[0].DeleteNodes, "a heartbeat or a report renews the lease")
	assert.ErrorIs(t, settle(t, c, t0, Heartbeat{Node: "c"}).reply.Err, ErrUnknownNode)

	ok(t, c, t0.Add(15*time.Second), Deregister{Node: "b"})
	assert.Len(t, c.nodes, 1)
	assert.ErrorIs(t, settle(t, c, t0, Deregister{Node: "b"}).reply.Err, ErrUnknownNode)
}

func TestRegistrationRenewalsAreNotStored(t *testing.T) {
	c := newCore(t)
	n := Node{Node: assignment.Node{ID: "a", Capacity: 2}, Address: "x:1", Labels: map[string]string{"zone": "z"}}
	s := ok(t, c, t0, Register{Node: n})
	require.Len(t, s.writes, 1)
	assert.NotNil(t, s.writes[0].PutNode)
	s = ok(t, c, t0.Add(time.Second), Register{Node: n})
	assert.Empty(t, s.writes, "the same registration only renews the lease")
	n.Address = "x:2"
	s = ok(t, c, t0, Register{Node: n})
	require.Len(t, s.writes, 1)
	assert.NotNil(t, s.writes[0].PutNode, "a changed registration is stored")

	for _, bad := range []Node{
		{Node: assignment.Node{ID: ""}},
		{Node: assignment.Node{ID: "a", Capacity: -1}},
		{Node: assignment.Node{ID: "a"}, Address: string(make([]byte, 300))},
	} {
		assert.ErrorIs(t, settle(t, c, t0, Register{Node: bad}).reply.Err, ErrInvalid)
	}
}

func TestDrainFreezeAndAlgorithm(t *testing.T) {
	c := newCore(t)
	register(t, c, "a", "b")
	passAt(t, c, t0)
	s := ok(t, c, t0, Drain{Node: "a"})
	assert.Equal(t, 2, s.reply.Held)
	assert.ErrorIs(t, settle(t, c, t0, Drain{Node: "b"}).reply.Err, ErrPrecondition,
		"draining every node would leave the slices nowhere to go")
	passAt(t, c, t0.Add(time.Second))
	assert.Zero(t, c.holds("a"), "a pass moves a draining node's slices")

	ok(t, c, t0, Freeze{Reason: "maintenance"})
	s = passAt(t, c, t0.Add(2*time.Second))
	assert.Empty(t, s.writes, "frozen: no pass")
	assert.Nil(t, s.pass)
	ok(t, c, t0, Unfreeze{})

	assert.ErrorIs(t, settle(t, c, t0, SetAlgorithm{Name: "weighted-move", Params: map[string]string{"hold_passes": "33"}}).reply.Err, ErrInvalid)
	ok(t, c, t0, SetAlgorithm{Name: "consistent-hash", Params: map[string]string{"virtual_nodes": "8"}})
	assert.Equal(t, "consistent-hash", c.alg.Name())
	assert.Equal(t, "consistent-hash", c.meta.Algorithm)
}

func TestANewLeaderContinues(t *testing.T) {
	a, err := assignment.Uniform(4, func(i int) []assignment.NodeID { return []assignment.NodeID{[]assignment.NodeID{"a", "b"}[i%2]} })
	require.NoError(t, err)
	a = a.WithGeneration(9)
	hist := []balance.Move{{Range: keyspace.Full(), From: "a", To: "b", Pass: 41}}
	st := State{
		Meta:       Meta{Term: 3, Seq: 12, Clock: 500, Generation: 9, Pass: 42, Algorithm: "weighted-move", Params: smallParams, Frozen: true},
		Assignment: a, History: hist,
		Nodes: []Node{{Node: assignment.Node{ID: "a"}}, {Node: assignment.Node{ID: "b"}}},
	}
	c, err := New(Config{})
	require.NoError(t, err)
	lead(t, c, 8, st, true, 450)
	got, pos, clock := c.Assignment()
	assert.Same(t, a, got)
	assert.Equal(t, quantum.Position{Term: 8, Seq: 0}, pos, "a new term counts from 0")
	assert.Equal(t, uint64(500), clock, "the clock never goes back")
	assert.Equal(t, uint64(42), c.meta.Pass)
	assert.Equal(t, hist, c.history)
	assert.True(t, c.meta.Frozen)
	assert.Empty(t, passAt(t, c, t0.Add(5*time.Second)).writes, "loaded nodes get a full lease to find the new leader")

	st.Meta.Algorithm = "magic"
	out := c.Step(t0, LeadershipGained{Term: 9, State: st, Found: true, Clock: 450})
	require.NotNil(t, out.Reply)
	assert.Error(t, out.Reply.Err)
	assert.Nil(t, out.Write)
	assert.ErrorIs(t, c.Step(t0, GetStatus{}).Reply.Err, ErrNotLeader)
}

// TestIdleClusterSpreadsKeySpace: with no load measured at all, passes weigh slices by
// their share of the hash space, so a node that joins an idle cluster gets slices.
func TestIdleClusterSpreadsKeySpace(t *testing.T) {
	// The default constants: slices small enough for moves within the churn budget.
	c, err := New(Config{NodeTTL: time.Hour, Algorithm: "weighted-move"})
	require.NoError(t, err)
	lead(t, c, 7, State{}, false, 100)
	register(t, c, "a")
	passAt(t, c, t0)
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
		passAt(t, c, at)
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
	passAt(t, c, t0)
	_, pos, clock := c.Assignment()

	// A change without map ops gets a clock-only quantum that says who made it.
	before, _, _ := c.Assignment()
	s := ok(t, c, t0, Freeze{Caller: Caller{Who: "spiffe://sliceplane/admin/alice"}, Reason: "maintenance"})
	require.Len(t, s.pubs, 1)
	q := s.pubs[0].Quantum
	assert.True(t, q.ClockOnly())
	assert.Equal(t, quantum.Position{Term: pos.Term, Seq: pos.Seq + 1}, q.Position)
	assert.Equal(t, clock, q.Clock)
	assert.Equal(t, "spiffe://sliceplane/admin/alice", q.By)
	assert.Equal(t, `admin: freeze balancing: "maintenance"`, q.Cause)
	after, now, _ := c.Assignment()
	assert.Same(t, before, after, "the map is the same")
	assert.Equal(t, q.Position, now)
	assert.True(t, c.Status().Frozen)
	require.NotNil(t, s.reply.Change)
	assert.Equal(t, q.Position, s.reply.Change.Position)

	// A change of the map keeps its quantum, and its log entry names the caller too.
	from := uint64(0)
	s = ok(t, c, t0, Split{Caller: Caller{Who: "spiffe://sliceplane/admin/bob"}, Slice: SliceRef{Start: &from}})
	require.Len(t, s.pubs, 1)
	assert.Len(t, s.pubs[0].Quantum.Ops, 1)
	assert.Equal(t, "spiffe://sliceplane/admin/bob", s.pubs[0].Quantum.By)
	assert.Equal(t, "spiffe://sliceplane/admin/bob", s.writes[0].Entry.By)

	// A renewal changes nothing and stays out of the history.
	s = ok(t, c, t0, Register{Caller: Caller{Who: "spiffe://sliceplane/node/a"}, Node: Node{Node: assignment.Node{ID: "a"}, Address: "a:1"}})
	assert.Empty(t, s.pubs)
}

// TestReadsChangeNothing: queries, however often, leave the core as it was; the loads they
// show are carried over to the map when it changes.
func TestReadsChangeNothing(t *testing.T) {
	c := newCore(t)
	register(t, c, "a", "b")
	passAt(t, c, t0)
	passAt(t, c, t0.Add(time.Second))
	before := *c
	for _, ev := range []Event{GetStatus{}, ListNodes{}, ListSlices{Limit: 10}, GetExplain{}} {
		out := c.Step(t0, ev)
		require.NotNil(t, out.Reply)
		require.NoError(t, out.Reply.Err)
		assert.Nil(t, out.Write)
	}
	assert.Equal(t, before, *c)
}

// TestRolesNeedMakeBeforeBreak: a cluster with primaries moves them make-before-break (the
// old primary hands its role over while its successor serves); an unknown role model is
// refused too.
func TestRolesNeedMakeBeforeBreak(t *testing.T) {
	for _, cfg := range []Config{
		{Roles: RolesPrimarySecondary, BreakBeforeMake: true},
		{Roles: "leader-follower"},
	} {
		_, err := New(cfg)
		assert.ErrorIs(t, err, ErrInvalid, "%+v", cfg)
	}
	_, err := New(Config{Roles: RolesPrimarySecondary})
	assert.NoError(t, err)
}
