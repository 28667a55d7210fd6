package sim

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// TestUndoTrackerCounts follows one slice, holding a single key, through a hand-made run on
// nodes a, b and c, its neighbour staying on c.
func TestUndoTrackerCounts(t *testing.T) {
	halves := keyspace.Equal(2)
	key := halves[0].Start + 7             // alone in the first half
	keys := []uint64{key, halves[1].Start} // a second key in the other half
	nodes, err := assignment.NewNodeSet([]assignment.Node{{ID: "a"}, {ID: "b"}, {ID: "c"}})
	require.NoError(t, err)
	withoutA, err := assignment.NewNodeSet([]assignment.Node{{ID: "b"}, {ID: "c"}})
	require.NoError(t, err)
	mapOf := func(first ...assignment.NodeID) *assignment.Assignment {
		a, err := assignment.New(1, []assignment.Slice{{Range: halves[0], Replicas: first},
			{Range: halves[1], Replicas: []assignment.NodeID{"c"}}})
		require.NoError(t, err)
		return a
	}
	lo, hi, err := halves[0].Split(halves[0].Start + 100)
	require.NoError(t, err)
	split, err := assignment.New(1, []assignment.Slice{{Range: lo, Replicas: []assignment.NodeID{"a"}},
		{Range: hi, Replicas: []assignment.NodeID{"a"}}, {Range: halves[1], Replicas: []assignment.NodeID{"c"}}})
	require.NoError(t, err)

	steps := []struct {
		pass             int
		from, to         *assignment.Assignment
		live             *assignment.NodeSet
		undone, pingPong int
		why              string
	}{
		{1, mapOf("a"), mapOf("b"), nodes, 0, 0, "a -> b"},
		{2, mapOf("b"), mapOf("a"), nodes, 1, 1, "b -> a: back on a one pass later, and a ping-pong"},
		{3, mapOf("a"), mapOf("c"), nodes, 0, 0, "a -> c"},
		{4, mapOf("c"), mapOf("b"), nodes, 1, 0, "c -> b: back on b, which lost it at pass 2, by way of a and c"},
		{9, mapOf("b"), mapOf("a"), nodes, 0, 1, "b -> a: a lost it 6 passes ago, past the hold; still a ping-pong"},
		{10, mapOf("a"), split, nodes, 0, 0, "a split moves nothing"},
		{11, split, mapOf("a", "b"), nodes, 1, 0, "a replica on b, which lost it 2 passes ago, merging the split"},
		{12, mapOf("a", "b"), mapOf("a"), nodes, 0, 0, "b dropped"},
		{13, mapOf("a"), mapOf("a", "b"), nodes, 1, 0, "b re-added a pass after it was dropped"},
		{14, mapOf("a", "b"), mapOf("a"), nodes, 0, 0, "b dropped"},
		{19, mapOf("a"), mapOf("b"), nodes, 0, 1, "a -> b: b back past the hold, but b -> a reversed"},
	}
	tr := newUndoTracker(4)
	total := 0
	for _, s := range steps {
		undone, pp := tr.observe(s.pass, s.from, s.to, s.live, keys)
		assert.Equal(t, s.undone, undone, "pass %d, undone: %s", s.pass, s.why)
		assert.Equal(t, s.pingPong, pp, "pass %d, ping-pongs: %s", s.pass, s.why)
		total += undone
	}
	assert.Equal(t, 4, total)
	assert.Equal(t, 2, tr.direct, "passes 2 and 13 reverse a loss; 4 and 11 bring the slice back by other ways")
	assert.Empty(t, tr.left["c"], "c's loss at pass 4 is past the hold")

	// A node that left loses its slices to clean-up: they may come back to it if it returns.
	tr = newUndoTracker(4)
	tr.observe(1, mapOf("a"), mapOf("b"), withoutA, keys)
	undone, _ := tr.observe(2, mapOf("b"), mapOf("a"), nodes, keys)
	assert.Zero(t, undone, "a lost the slice because it left")

	// With no hold, nothing is undone too early; ping-pongs are counted all the same.
	tr = newUndoTracker(0)
	tr.observe(1, mapOf("a"), mapOf("b"), nodes, keys)
	undone, pp := tr.observe(2, mapOf("b"), mapOf("a"), nodes, keys)
	assert.Zero(t, undone)
	assert.Equal(t, 1, pp)
}

// runCoreUndo runs the assigner's core with Weighted-Move's defaults on a seeded workload
// and returns the run and its undone-move tracker.
func runCoreUndo(t *testing.T, spec string, seed uint64) (Result, *undoTracker) {
	t.Helper()
	wl, err := ParseWorkload(spec, 20000, 24, seed)
	require.NoError(t, err)
	opt := Options{Nodes: 10, Epochs: 24}
	r, err := newCoreRunner("weighted-move", nil, Scenario{Workload: wl}, opt)
	require.NoError(t, err)
	res, err := drive(context.Background(), Result{}, spec, opt, r.epoch, r.undo.hold)
	require.NoError(t, err)
	return res, r.undo
}

// TestCoreReversesNoMoveWithinHoldPasses runs the assigner's core on workloads whose hot keys
// move (hotspot-shift) and whose traffic is noisy: at the service level, no slice or piece of
// one comes back within Weighted-Move's hold_passes to a node that lost it, neither by the
// reverse move (B to A after A to B, a dropped replica re-added) nor by any other way (A to B,
// B to C, C to A; a replica added where a move took one).
func TestCoreReversesNoMoveWithinHoldPasses(t *testing.T) {
	for _, spec := range []string{"hotspot-shift:1.1:5", "noisy"} {
		t.Run(spec, func(t *testing.T) {
			res, tr := runCoreUndo(t, spec, 1)
			assert.Equal(t, 4, res.Summary.HoldPasses, "Weighted-Move's default")
			var undone int
			for _, e := range res.Epochs {
				undone += e.UndoneMoves
			}
			assert.Equal(t, undone, res.Summary.UndoneMoves)
			assert.Zero(t, tr.direct, "moves reversed within %d passes", res.Summary.HoldPasses)
			assert.Zero(t, res.Summary.UndoneMoves, "slices back within %d passes, by any way", res.Summary.HoldPasses)
			t.Logf("ping-pongs: %d", res.Summary.PingPongs)
		})
	}
}
