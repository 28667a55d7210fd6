package sim

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
)

// routedMap returns equal slices, slice i held by holders[i], over nodes of the given capacities
// (named a, b, c, ... in order).
func routedMap(t *testing.T, capacity []float64, holders ...[]assignment.NodeID) (*assignment.Assignment, *assignment.NodeSet) {
	t.Helper()
	a, err := assignment.Uniform(len(holders), func(i int) []assignment.NodeID { return holders[i] })
	require.NoError(t, err)
	nodes := make([]assignment.Node, len(capacity))
	for i, c := range capacity {
		nodes[i] = assignment.Node{ID: assignment.NodeID(rune('a' + i)), Capacity: c}
	}
	set, err := assignment.NewNodeSet(nodes)
	require.NoError(t, err)
	return a, set
}

func ids(s ...string) []assignment.NodeID {
	out := make([]assignment.NodeID, len(s))
	for i, x := range s {
		out[i] = assignment.NodeID(x)
	}
	return out
}

func TestRoutersPourAHotKeyIntoTheValley(t *testing.T) {
	// a serves 6 of its own, b 2; the hot slice of 8 is on both. Spread evenly, a is at 10
	// and b at 6; a router that prefers the less loaded replica sends b 6 of the 8.
	a, nodes := routedMap(t, []float64{1, 1}, ids("a"), ids("a", "b"), ids("b"))
	loads := []float64{6, 8, 2}
	even := splitLoads(a, loads, nodes, RouterEven).perCapacity()
	assert.Equal(t, []float64{10, 6}, even)
	assert.InDelta(t, 1.25, load.Imbalance(even), 1e-12)
	for _, r := range []Router{RouterLeastOutstanding, RouterPowerOfTwo} {
		sp := splitLoads(a, loads, nodes, r)
		assert.InDeltaSlice(t, []float64{8, 8}, sp.perCapacity(), 1e-9, "%s", r)
		holders, served := sp.shares(1)
		assert.Equal(t, []int32{0, 1}, holders)
		assert.InDeltaSlice(t, []float64{2, 6}, served, 1e-9, "%s", r)
		assert.InDelta(t, 0.75, sp.fraction(1, 1), 1e-9, "%s", r)
	}

	// A hot key too light to level its holders all goes to the less loaded.
	sp := splitLoads(a, []float64{10, 2, 0}, nodes, RouterLeastOutstanding)
	assert.InDeltaSlice(t, []float64{10, 2}, sp.perCapacity(), 1e-9)
}

func TestLeastOutstandingReachesTheEquilibriumOverChainedReplicas(t *testing.T) {
	// {a,b} and {b,c} share b: only routing both at once levels all three nodes at 5.
	a, nodes := routedMap(t, []float64{1, 1, 1}, ids("a", "b"), ids("b", "c"), ids("a"))
	got := splitLoads(a, []float64{6, 6, 3}, nodes, RouterLeastOutstanding).perCapacity()
	assert.InDeltaSlice(t, []float64{5, 5, 5}, got, 1e-5)

	// Levels are loads over capacity: a node of twice the capacity takes twice the load.
	a, nodes = routedMap(t, []float64{2, 1}, ids("a", "b"))
	sp := splitLoads(a, []float64{3}, nodes, RouterLeastOutstanding)
	assert.InDeltaSlice(t, []float64{2, 1}, sp.served, 1e-9)
	assert.InDeltaSlice(t, []float64{1, 1}, sp.perCapacity(), 1e-9)
}

func TestPowerOfTwoSplitsByPairs(t *testing.T) {
	// Own loads 0, 5, 10, and a slice of 6 on all three. Least-outstanding levels a and b at
	// 5.5. Power-of-two gives each pair 2: {a,c} and {b,c} go to a and b, {a,b} to a.
	a, nodes := routedMap(t, []float64{1, 1, 1}, ids("a", "b", "c"), ids("b"), ids("c"))
	loads := []float64{6, 5, 10}
	assert.InDeltaSlice(t, []float64{5.5, 5.5, 10}, splitLoads(a, loads, nodes, RouterLeastOutstanding).perCapacity(), 1e-9)
	p2c := splitLoads(a, loads, nodes, RouterPowerOfTwo)
	assert.InDeltaSlice(t, []float64{4, 7, 10}, p2c.perCapacity(), 1e-9)
	_, served := p2c.shares(0)
	assert.InDeltaSlice(t, []float64{4, 2, 0}, served, 1e-9)
}

// randomMap returns a map of n slices over the nodes, each slice on 1 to 3 of them (some gone
// from the live set), and random slice loads.
func randomMap(t *testing.T, rnd *rand.Rand, n int) (*assignment.Assignment, *assignment.NodeSet, []float64) {
	t.Helper()
	all := ids("a", "b", "c", "d", "e", "f")
	a, err := assignment.Uniform(n, func(int) []assignment.NodeID {
		p := rnd.Perm(len(all))
		out := []assignment.NodeID{all[p[0]]}
		for _, j := range p[1 : 1+rnd.IntN(3)] {
			out = append(out, all[j])
		}
		return out
	})
	require.NoError(t, err)
	live := make([]assignment.Node, 0, len(all))
	for i, id := range all[:5] { // f has left
		live = append(live, assignment.Node{ID: id, Capacity: float64(1 + i%2)})
	}
	nodes, err := assignment.NewNodeSet(live)
	require.NoError(t, err)
	loads := make([]float64, n)
	for i := range loads {
		loads[i] = rnd.ExpFloat64() * 100
	}
	return a, nodes, loads
}

func TestEvenSplitIsTheSimulatorsOld(t *testing.T) {
	a, nodes, loads := randomMap(t, rand.New(rand.NewPCG(1, 2)), 200)
	sp := splitLoads(a, loads, nodes, RouterEven)
	assert.Equal(t, load.NodeLoads(a, loads, nodes), sp.perCapacity(), "bit for bit")
	r, err := ParseRouter("")
	require.NoError(t, err)
	assert.Equal(t, RouterEven, r, "the zero Options measure as before")
	_, err = ParseRouter("round-robin")
	assert.ErrorIs(t, err, ErrScenario)
}

func TestRoutedSplitsAreDeterministicAndKeepEverySlicesLoad(t *testing.T) {
	for _, r := range []Router{RouterLeastOutstanding, RouterPowerOfTwo} {
		a, nodes, loads := randomMap(t, rand.New(rand.NewPCG(3, 4)), 300)
		first := splitLoads(a, loads, nodes, r)
		again := splitLoads(a, loads, nodes, r)
		assert.Equal(t, first.perCapacity(), again.perCapacity(), "%s: the same split twice", r)
		assert.Equal(t, first.share, again.share, "%s", r)
		for i := range loads {
			_, served := first.shares(i)
			var sum float64
			for _, x := range served {
				assert.GreaterOrEqual(t, x, 0.0)
				sum += x
			}
			if len(served) > 0 {
				assert.InDelta(t, loads[i], sum, 1e-9*loads[i], "%s: slice %d served in full", r, i)
			}
		}
		even := load.Imbalance(splitLoads(a, loads, nodes, RouterEven).perCapacity())
		assert.LessOrEqual(t, load.Imbalance(first.perCapacity()), even, "%s: routing never makes the hottest node hotter", r)
	}
}

func TestNodesReportWhatTheRouterSentThem(t *testing.T) {
	a, nodes := routedMap(t, []float64{1, 1}, ids("a"), ids("a", "b"), ids("b"))
	sp := splitLoads(a, []float64{6, 8, 2}, nodes, RouterLeastOutstanding)
	hot := load.HotKey{Hash: a.Slice(1).Range.Start, Load: 8}
	reps := reports(a, nodes, sp, [][]load.HotKey{nil, {hot}, nil}, time.Second)
	require.Len(t, reps, 2)
	assert.InDelta(t, 2, reps[0].Samples[1].Load, 1e-9, "a served 2 of the hot slice")
	assert.InDelta(t, 6, reps[1].Samples[0].Load, 1e-9, "b served 6 of it")
	assert.InDelta(t, 6, reps[1].HotKeys[0].Load, 1e-9, "and as much of its hot key")
}

func TestKeyCopiesCountLiveReplicasPerKey(t *testing.T) {
	a, nodes := routedMap(t, []float64{1, 1, 1}, ids("a"), ids("a", "b"), ids("a", "b", "c", "gone"))
	q := keyspace.Equal(3)
	keys := []uint64{q[0].Start, q[0].Start + 1, q[1].Start, q[2].Start, q[2].Start + 5} // 1, 1, 2, 3, 3 copies
	assert.InDelta(t, 10.0/5, keyCopies(a, keys, nodes), 1e-12)
	assert.Equal(t, 0.0, keyCopies(a, nil, nodes))
	one, _ := routedMap(t, []float64{1}, ids("a"), ids("a"), ids("a"))
	assert.Equal(t, 1.0, keyCopies(one, keys, nodes))
}

func TestRunsWithARouterAreDeterministic(t *testing.T) {
	run := func(engine Engine, r Router) Result {
		wl, err := ParseWorkload("noisy:1.1:0.25:0:1:1000000:0.1", 2000, 8, 1)
		require.NoError(t, err)
		opt := Options{Nodes: 4, Epochs: 8, Router: r}
		params := map[string]string{"replicate_above": "0.1", "dereplicate_below": "0.05"}
		var res Result
		if engine == EngineCore {
			res, err = RunCore(context.Background(), "weighted-move", params, Scenario{Workload: wl}, opt)
		} else {
			res, err = Run(context.Background(), algorithm(t, "weighted-move", params), Scenario{Workload: wl}, opt)
		}
		require.NoError(t, err)
		return res
	}
	for _, engine := range Engines {
		routed := run(engine, RouterLeastOutstanding)
		assert.Equal(t, routed, run(engine, RouterLeastOutstanding), "%s: the same run twice", engine)
		assert.Greater(t, routed.Summary.MaxKeyCopies, 1.0, "%s: hot keys got replicas", engine)
		even := run(engine, RouterEven)
		assert.Less(t, routed.Summary.MeanImbalance, even.Summary.MeanImbalance, "%s: the router levels what an even split cannot", engine)
	}
}
