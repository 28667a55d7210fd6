package client

// Tests of the replica policies, and of the Router's handling of quanta and node lists
// without a network: they feed the router what its watch and its node refresh would.

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// ids makes a replica set.
func ids(names ...string) []assignment.NodeID {
	out := make([]assignment.NodeID, len(names))
	for i, n := range names {
		out[i] = assignment.NodeID(n)
	}
	return out
}

// halves is a map of two slices: [0, 2^63) held by left and [2^63, end) by right.
func halves(t *testing.T, generation uint64, left, right []assignment.NodeID) *assignment.Assignment {
	t.Helper()
	a, err := assignment.New(generation, []assignment.Slice{
		{Range: keyspace.Range{Start: 0, End: keyspace.At(1 << 63)}, Replicas: left},
		{Range: keyspace.Range{Start: 1 << 63, End: keyspace.End}, Replicas: right},
	})
	require.NoError(t, err)
	return a
}

// reinit is the reinitializing quantum carrying a at position term.seq.
func reinit(a *assignment.Assignment, term, seq, clock uint64) quantum.Quantum {
	return quantum.Quantum{Position: quantum.Position{Term: term, Seq: seq}, Clock: clock, Generation: a.Generation(), Snapshot: a}
}

// newTestRouter returns a router that knows nodes and applied map a, with a seeded random
// source. It counts as running, for the calls a test sends through it: the test feeds it
// maps as Run would.
func newTestRouter(t testing.TB, p Policy, a *assignment.Assignment, nodes map[assignment.NodeID]nodeInfo) *Router {
	t.Helper()
	r, err := NewRouter(RouterConfig{Assigners: []string{"127.0.0.1:1"}, Policy: p})
	require.NoError(t, err)
	close(r.started)
	r.rand = rand.New(rand.NewPCG(1, 2)).Uint64
	if nodes != nil {
		r.setNodes(nodes)
	}
	require.NoError(t, r.apply(reinit(a, 1, 1, 10)))
	return r
}

// everywhere is a map of one slice held by the given nodes.
func everywhere(t *testing.T, names ...string) *assignment.Assignment {
	t.Helper()
	a, err := assignment.New(1, []assignment.Slice{{Range: keyspace.Full(), Replicas: ids(names...)}})
	require.NoError(t, err)
	return a
}

// picks returns how many of n picks went to each node.
func picks(t *testing.T, r *Router, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for i := range n {
		rep, err := r.Pick([]byte{byte(i), byte(i >> 8)})
		require.NoError(t, err)
		out[rep.ID]++
	}
	return out
}

func TestParsePolicy(t *testing.T) {
	assert.Equal(t, []string{"round-robin", "capacity", "least-outstanding", "power-of-two"}, Policies())
	for _, p := range []Policy{RoundRobin, WeightedCapacity, LeastOutstanding, PowerOfTwo} {
		got, err := ParsePolicy(p.String())
		require.NoError(t, err)
		assert.Equal(t, p, got)
		got, err = ParsePolicy(" " + strings.ToUpper(p.String()) + " ")
		require.NoError(t, err, "case and spaces do not matter")
		assert.Equal(t, p, got)
	}
	for _, bad := range []string{"", "random", "least_outstanding", "round robin"} {
		_, err := ParsePolicy(bad)
		require.Error(t, err, "%q", bad)
		assert.EqualError(t, err, `client: unknown replica policy "`+bad+`"; use one of round-robin, capacity, least-outstanding, power-of-two`)
	}
	assert.Equal(t, "policy(7)", Policy(7).String())
	assert.Equal(t, "policy(-1)", Policy(-1).String())
	// Policies returns a copy: changing it changes nothing.
	Policies()[0] = "x"
	assert.Equal(t, "round-robin", RoundRobin.String())
}

func TestRoundRobinCycles(t *testing.T) {
	r := newTestRouter(t, RoundRobin, everywhere(t, "c", "a", "b"), nil)
	var seq []string
	for i := range 9 {
		rep, err := r.Pick([]byte{byte(i)})
		require.NoError(t, err)
		seq = append(seq, rep.ID)
	}
	assert.Equal(t, []string{"a", "b", "c", "a", "b", "c", "a", "b", "c"}, seq, "replicas in turn, in ID order")

	// A slice with one replica always gets it.
	r = newTestRouter(t, RoundRobin, everywhere(t, "solo"), nil)
	assert.Equal(t, map[string]int{"solo": 10}, picks(t, r, 10))
}

func TestWeightedCapacityFollowsCapacities(t *testing.T) {
	nodes := map[assignment.NodeID]nodeInfo{"a": {address: "a:1", capacity: 1}, "b": {address: "b:1", capacity: 2}, "c": {address: "c:1", capacity: 5}}
	r := newTestRouter(t, WeightedCapacity, everywhere(t, "a", "b", "c"), nodes)
	const n = 80_000
	got := picks(t, r, n)
	// One standard deviation of a share is at most sqrt(0.25/n) < 0.002: a tolerance of 0.01
	// is five of them, and the seed is fixed anyway.
	for id, want := range map[string]float64{"a": 1.0 / 8, "b": 2.0 / 8, "c": 5.0 / 8} {
		assert.InDelta(t, want, float64(got[id])/n, 0.01, "the share of %s: %v", id, got)
	}

	// Equal capacities (and nodes the router does not know, which count as 1) share evenly.
	r = newTestRouter(t, WeightedCapacity, everywhere(t, "x", "y"), nil)
	got = picks(t, r, n)
	assert.InDelta(t, 0.5, float64(got["x"])/n, 0.01, "%v", got)
}

func TestLeastOutstandingPicksTheIdleReplica(t *testing.T) {
	r := newTestRouter(t, LeastOutstanding, everywhere(t, "a", "b", "c"), nil)
	// All idle: ties go round-robin, so each takes a turn.
	assert.Equal(t, map[string]int{"a": 2, "b": 2, "c": 2}, picks(t, r, 6))

	doneA := r.Begin("a")
	doneB := r.Begin("b")
	assert.Equal(t, map[string]int{"c": 10}, picks(t, r, 10), "c is the only idle replica")

	doneA()
	doneA() // done is idempotent: a is idle once, not "minus one"
	assert.Equal(t, int64(0), r.loadOf("a").n.Load())
	got := picks(t, r, 10)
	assert.Equal(t, map[string]int{"a": 5, "c": 5}, got, "a and c are idle and take turns; b is busy")

	// c gets two requests, a one: b (one) and a tie, and c is never chosen.
	doneC1, doneC2, doneA2 := r.Begin("c"), r.Begin("c"), r.Begin("a")
	got = picks(t, r, 10)
	assert.Zero(t, got["c"], "%v", got)
	assert.Equal(t, 10, got["a"]+got["b"], "%v", got)
	doneB()
	assert.Equal(t, map[string]int{"b": 10}, picks(t, r, 10), "b finished its request")
	doneC1()
	doneC2()
	doneA2()
	for _, id := range []string{"a", "b", "c"} {
		assert.Zero(t, r.loadOf(id).n.Load(), "%s has nothing in flight", id)
	}
}

func TestPowerOfTwoNeverPicksTheBusierOfTwo(t *testing.T) {
	r := newTestRouter(t, PowerOfTwo, everywhere(t, "n0", "n1", "n2", "n3"), nil)
	// n<k> has k requests in flight.
	for k, id := range []string{"n0", "n1", "n2", "n3"} {
		for range k {
			defer r.Begin(id)()
		}
	}
	const n = 60_000
	got := picks(t, r, n)
	// Of the 6 pairs of distinct replicas drawn uniformly, n0 is in 3 and wins them all, n1
	// wins the 2 without n0, n2 the one with n3, and n3, the busier of every pair, none.
	assert.Zero(t, got["n3"], "the busiest replica is never picked: %v", got)
	for id, want := range map[string]float64{"n0": 3.0 / 6, "n1": 2.0 / 6, "n2": 1.0 / 6} {
		assert.InDelta(t, want, float64(got[id])/n, 0.01, "the share of %s: %v", id, got)
	}

	// With two replicas, both are always drawn: the idle one wins every time.
	r = newTestRouter(t, PowerOfTwo, everywhere(t, "a", "b"), nil)
	done := r.Begin("a")
	assert.Equal(t, map[string]int{"b": 100}, picks(t, r, 100))
	done()
	defer r.Begin("b")()
	assert.Equal(t, map[string]int{"a": 100}, picks(t, r, 100))
}

func TestRouterAppliesQuanta(t *testing.T) {
	r, err := NewRouter(RouterConfig{Assigners: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	_, err = r.LookupHash(0)
	require.ErrorIs(t, err, ErrNotReady)
	_, err = r.Pick([]byte("k"))
	require.ErrorIs(t, err, ErrNotReady)
	select {
	case <-r.ready:
		t.Fatal("ready before any map")
	default:
	}

	// Operations before any map cannot apply.
	err = r.apply(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 1}, Generation: 1,
		Ops: []assignment.Op{assignment.Split{Slice: 0, At: 5}}})
	require.ErrorContains(t, err, "changes a map the router never had")
	assert.Nil(t, r.view.Load())

	a := halves(t, 4, ids("n1"), ids("n2"))
	require.NoError(t, r.apply(reinit(a, 2, 7, 100)))
	<-r.ready // closed by the first map
	route := func(h uint64) Route {
		t.Helper()
		rt, err := r.LookupHash(h)
		require.NoError(t, err)
		return rt
	}
	assert.Equal(t, Route{Hash: 42, Slice: rangeOf(a.Slice(0).Range), Replicas: []Replica{{ID: "n1", Capacity: 1, Role: RoleReplica}}, Generation: 4}, route(42),
		"a node the router does not know has no address and capacity 1")
	assert.Equal(t, []Replica{{ID: "n2", Capacity: 1, Role: RoleReplica}}, route(1<<63).Replicas)
	term, seq := r.Position()
	assert.Equal(t, [3]uint64{2, 7, 100}, [3]uint64{term, seq, r.Clock()})
	assert.Equal(t, uint64(4), r.Generation())

	// Operations: split the upper half at 3<<62 and give the top quarter to n1 and n3.
	ops := quantum.Quantum{Position: quantum.Position{Term: 2, Seq: 9}, Clock: 120, Generation: 5, Ops: []assignment.Op{
		assignment.Split{Slice: 1 << 63, At: 3 << 62}, assignment.Assign{Slice: 3 << 62, Replicas: ids("n3", "n1")},
	}}
	require.NoError(t, r.apply(ops))
	assert.Equal(t, uint64(5), r.Generation())
	term, seq = r.Position()
	assert.Equal(t, [3]uint64{2, 9, 120}, [3]uint64{term, seq, r.Clock()})
	top := route(3 << 62)
	assert.Equal(t, Range{Start: 3 << 62, End: EndOfSpace()}, top.Slice)
	assert.Equal(t, []Replica{{ID: "n1", Capacity: 1, Role: RoleReplica}, {ID: "n3", Capacity: 1, Role: RoleReplica}}, top.Replicas)
	assert.Equal(t, Range{Start: 1 << 63, End: BoundAt(3 << 62)}, route(1<<63).Slice)
	assert.Equal(t, uint64(5), top.Generation)

	// A clock-only quantum moves the clock and the position, not the map.
	before := r.view.Load()
	require.NoError(t, r.apply(quantum.Quantum{Position: quantum.Position{Term: 2, Seq: 10}, Clock: 130, Generation: 5}))
	after := r.view.Load()
	assert.Same(t, before.a, after.a)
	assert.Equal(t, uint64(130), r.Clock())
	term, seq = r.Position()
	assert.Equal(t, [2]uint64{2, 10}, [2]uint64{term, seq})

	checkRefusesUnfollowingQuanta(t, r, after)

	// A reinitializing quantum replaces the map, whatever the position: a new leader's term.
	b := everywhere(t, "n9")
	require.NoError(t, r.apply(reinit(b, 3, 0, 140)))
	assert.Equal(t, []Replica{{ID: "n9", Capacity: 1, Role: RoleReplica}}, route(0).Replicas)
	assert.Equal(t, FullRange(), route(0).Slice)
	term, seq = r.Position()
	assert.Equal(t, [3]uint64{3, 0, 140}, [3]uint64{term, seq, r.Clock()})

	// Except a deposed leader's, of an older term.
	now := r.view.Load()
	require.ErrorContains(t, r.apply(reinit(a, 2, 11, 150)), "quantum 2.11 refused (stale_term): the router is at 3.0")
	assert.Same(t, now, r.view.Load(), "the map did not change")
}

// unfollowingQuanta do not follow the map that TestRouterAppliesQuanta has built by then, at
// 2.10 and generation 5.
var unfollowingQuanta = []struct {
	name string
	q    quantum.Quantum
	want string
}{
	{"an old position", quantum.Quantum{Position: quantum.Position{Term: 2, Seq: 10}, Generation: 6,
		Ops: []assignment.Op{assignment.Split{Slice: 0, At: 1}}}, "refused (out_of_sequence): the router is at 2.10"},
	{"another term", quantum.Quantum{Position: quantum.Position{Term: 3, Seq: 1}, Generation: 6,
		Ops: []assignment.Op{assignment.Split{Slice: 0, At: 1}}}, "refused (out_of_sequence): the router is at 2.10"},
	{"an op on no slice", quantum.Quantum{Position: quantum.Position{Term: 2, Seq: 11}, Generation: 6,
		Ops: []assignment.Op{assignment.Split{Slice: 0, At: 1}, assignment.Merge{Left: 12345}}}, "does not apply to generation 5"},
	{"a generation skipped", quantum.Quantum{Position: quantum.Position{Term: 2, Seq: 11}, Generation: 7,
		Ops: []assignment.Op{assignment.Split{Slice: 0, At: 1}}}, "leads to generation 7, but applied to the router's map it gives 6"},
}

// checkRefusesUnfollowingQuanta checks that quanta that do not follow the map change nothing.
func checkRefusesUnfollowingQuanta(t *testing.T, r *Router, after *view) {
	bad := unfollowingQuanta
	for _, tc := range bad {
		err := r.apply(tc.q)
		require.Error(t, err, tc.name)
		assert.ErrorContains(t, err, tc.want, tc.name)
		assert.Same(t, after, r.view.Load(), "%s: the map did not change", tc.name)
	}
	if err := r.apply(bad[2].q); assert.Error(t, err) {
		assert.ErrorIs(t, err, assignment.ErrNoSlice, "the cause is kept")
	}
}

func TestRouterTakesAddressesFromTheNodeList(t *testing.T) {
	r := newTestRouter(t, RoundRobin, halves(t, 1, ids("a", "b"), ids("b")), nil)
	select {
	case <-r.kick:
	default:
		t.Fatal("a map naming unknown nodes asks for the node list")
	}
	r.setNodes(map[assignment.NodeID]nodeInfo{"a": {address: "10.0.0.1:80", capacity: 2}, "b": {address: "10.0.0.2:80", capacity: 1}})
	rt, err := r.LookupHash(0)
	require.NoError(t, err)
	assert.Equal(t, []Replica{{ID: "a", Address: "10.0.0.1:80", Capacity: 2, Role: RoleReplica}, {ID: "b", Address: "10.0.0.2:80", Capacity: 1, Role: RoleReplica}}, rt.Replicas)
	assert.Equal(t, uint64(1), rt.Generation, "new addresses do not change the generation")

	// Round-robin keeps its turn when the node list changes.
	first := pickIn(t, r, 0)
	r.setNodes(map[assignment.NodeID]nodeInfo{"a": {address: "10.0.0.1:81", capacity: 2}, "b": {address: "10.0.0.2:80", capacity: 1}})
	second := pickIn(t, r, 0)
	assert.NotEqual(t, first.ID, second.ID, "the turn moved on")
	assert.Equal(t, "10.0.0.1:81", pickIn(t, r, 0).Address, "the new address")

	// Known nodes: no need to ask for the node list.
	require.NoError(t, r.apply(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 2}, Generation: 2,
		Ops: []assignment.Op{assignment.Assign{Slice: 1 << 63, Replicas: ids("a")}}}))
	select {
	case <-r.kick:
		t.Fatal("the node list was asked for, though every node is known")
	default:
	}
	// A new node: ask.
	require.NoError(t, r.apply(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 3}, Generation: 3,
		Ops: []assignment.Op{assignment.Assign{Slice: 1 << 63, Replicas: ids("c")}}}))
	select {
	case <-r.kick:
	default:
		t.Fatal("a map naming an unknown node asks for the node list")
	}
	rt, err = r.LookupHash(1 << 63)
	require.NoError(t, err)
	assert.Equal(t, []Replica{{ID: "c", Capacity: 1, Role: RoleReplica}}, rt.Replicas, "an unknown node is returned, without an address")
}

// pickIn picks a replica of the slice holding hash h (for tests that need one slice).
func pickIn(t *testing.T, r *Router, h uint64) Replica {
	t.Helper()
	v := r.view.Load()
	set := v.sets[v.find(h)]
	return set.replicas[set.pick(r.cfg.Policy, r.rand)]
}

func TestRouterForgetsTheLoadOfNodesGone(t *testing.T) {
	r := newTestRouter(t, LeastOutstanding, everywhere(t, "a"), map[assignment.NodeID]nodeInfo{"a": {}, "gone": {}, "busy": {}})
	r.Begin("gone")()
	done := r.Begin("busy")
	r.setNodes(map[assignment.NodeID]nodeInfo{"a": {address: "x", capacity: 1}})
	_, ok := r.loads.Load("gone")
	assert.False(t, ok, "an idle node neither listed nor in the map is forgotten")
	_, ok = r.loads.Load("busy")
	assert.True(t, ok, "a node with requests in flight is kept")
	_, ok = r.loads.Load("a")
	assert.True(t, ok, "a node in the map is kept")
	done()
}

func TestRouterLookupDoesNotAllocate(t *testing.T) {
	a, err := assignment.Uniform(1000, func(i int) []assignment.NodeID { return ids("a", "b", "c")[i%3 : i%3+1] })
	require.NoError(t, err)
	for _, p := range []Policy{RoundRobin, WeightedCapacity, LeastOutstanding, PowerOfTwo} {
		r := newTestRouter(t, p, a, nil)
		key := []byte("some key")
		assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = r.Lookup(key) }), "Lookup")
		assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = r.Pick(key) }), "Pick by %s", p)
	}
	// Slices held by the same nodes share their replicas.
	r := newTestRouter(t, RoundRobin, a, nil)
	v := r.view.Load()
	assert.Same(t, v.sets[0], v.sets[3])
	assert.Len(t, r.sets, 3)
}

// TestRouterNamesThePrimary: a route tells each replica's role, Primary answers the replica
// that takes writes, and a slice whose primary hands the role over has none meanwhile.
func TestRouterNamesThePrimary(t *testing.T) {
	a, err := assignment.New(1, []assignment.Slice{
		{Range: keyspace.Range{Start: 0, End: keyspace.At(1 << 63)}, Replicas: ids("a", "b"), Primary: "b"},
		{Range: keyspace.Range{Start: 1 << 63, End: keyspace.End}, Replicas: ids("a", "b"), Primary: "a"},
	})
	require.NoError(t, err)
	r := newTestRouter(t, RoundRobin, a, nil)
	rt, err := r.LookupHash(0)
	require.NoError(t, err)
	assert.Equal(t, []Role{RoleSecondary, RolePrimary}, []Role{rt.Replicas[0].Role, rt.Replicas[1].Role})
	rt, err = r.LookupHash(1 << 63)
	require.NoError(t, err)
	assert.Equal(t, []Role{RolePrimary, RoleSecondary}, []Role{rt.Replicas[0].Role, rt.Replicas[1].Role},
		"the same replicas with another primary are another set")

	key := keyAt(t, r, 0)
	p, err := r.Primary(key)
	require.NoError(t, err)
	assert.Equal(t, "b", p.ID)

	// b hands the role over to a: neither takes writes until a is promoted.
	require.NoError(t, r.apply(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 2}, Generation: 2,
		Ops: []assignment.Op{assignment.Assign{Slice: 0, Replicas: ids("a", "b"), Primary: "b", Next: "a"}}}))
	_, err = r.Primary(key)
	require.ErrorIs(t, err, ErrNoPrimary)
	rt, err = r.LookupHash(0)
	require.NoError(t, err)
	assert.Equal(t, []Role{RoleSecondary, RoleSecondary}, []Role{rt.Replicas[0].Role, rt.Replicas[1].Role})
	require.NoError(t, r.apply(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 3}, Generation: 3,
		Ops: []assignment.Op{assignment.Assign{Slice: 0, Replicas: ids("a", "b"), Primary: "a"}}}))
	p, err = r.Primary(key)
	require.NoError(t, err)
	assert.Equal(t, "a", p.ID)

	// A cluster without roles has no primary.
	r = newTestRouter(t, RoundRobin, everywhere(t, "a", "b"), nil)
	_, err = r.Primary(key)
	require.ErrorIs(t, err, ErrNoPrimary)
	p, err = r.Pick(key)
	require.NoError(t, err)
	assert.Equal(t, RoleReplica, p.Role)
}

// TestRouterGivesEachSliceItsPrimarysToken: slices with the same replicas and primary under
// grants of different tokens each carry their own, also when a token changes in a later map.
func TestRouterGivesEachSliceItsPrimarysToken(t *testing.T) {
	third := func(i uint64) keyspace.Bound { return keyspace.At(i * (1 << 62)) }
	a, err := assignment.New(5, []assignment.Slice{
		{Range: keyspace.Range{Start: 0, End: third(1)}, Replicas: ids("a", "b"), Primary: "a", Token: 3},
		{Range: keyspace.Range{Start: 1 << 62, End: third(2)}, Replicas: ids("a", "c"), Primary: "a", Token: 4},
		{Range: keyspace.Range{Start: 1 << 63, End: keyspace.End}, Replicas: ids("a", "b"), Primary: "a", Token: 5},
	})
	require.NoError(t, err)
	r := newTestRouter(t, RoundRobin, a, nil)
	tokens := func() []uint64 {
		var out []uint64
		for _, h := range []uint64{0, 1 << 62, 1 << 63} {
			rt, err := r.LookupHash(h)
			require.NoError(t, err)
			out = append(out, rt.Replicas[0].Token)
		}
		return out
	}
	assert.Equal(t, []uint64{3, 4, 5}, tokens())
	require.NoError(t, r.apply(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 2}, Generation: 6,
		Ops: []assignment.Op{assignment.Assign{Slice: 0, Replicas: ids("a", "b"), Primary: "a", Token: 6}}}))
	assert.Equal(t, []uint64{6, 4, 5}, tokens(), "a new grant's token replaces the old one's")
}

// keyAt returns a key whose hash lies in the slice of r's map that holds h.
func keyAt(t *testing.T, r *Router, h uint64) []byte {
	t.Helper()
	want, err := r.LookupHash(h)
	require.NoError(t, err)
	for i := range 1000 {
		key := []byte(fmt.Sprintf("k%d", i))
		if rt, err := r.Lookup(key); err == nil && rt.Slice == want.Slice {
			return key
		}
	}
	t.Fatal("no key in the slice")
	return nil
}

// TestAQuarantinedKeyIsUnavailable checks that a key in a range held by Nobody (quarantined
// by the assigner) is answered as quarantined, and the keys beside it as ever.
func TestAQuarantinedKeyIsUnavailable(t *testing.T) {
	lo, hi, err := keyspace.Full().Split(1 << 63)
	require.NoError(t, err)
	a, err := assignment.New(1, []assignment.Slice{{Range: lo, Replicas: ids("a")}, {Range: hi, Replicas: []assignment.NodeID{assignment.Nobody}}})
	require.NoError(t, err)
	r := newTestRouter(t, RoundRobin, a, nil)
	_, err = r.Pick(keyAt(t, r, 1<<63))
	require.ErrorIs(t, err, ErrQuarantined)
	_, err = r.Primary(keyAt(t, r, 1<<63))
	require.ErrorIs(t, err, ErrQuarantined)
	p, err := r.Pick(keyAt(t, r, 0))
	require.NoError(t, err)
	assert.Equal(t, "a", p.ID)
}
