package balance_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// noisyInput is four nodes, one of them (a) holding a single hot key whose load (45, a
// node's mean being 100) jumps about by a third of it, and three quieter slices; a is the
// hottest node, by 20% of the mean. jitter perturbs the quiet loads, seeded.
func noisyInput(t *testing.T, rng *rand.Rand) balance.Input {
	t.Helper()
	nodes := assignment.MustNodeSet(
		assignment.Node{ID: "a"}, assignment.Node{ID: "b"}, assignment.Node{ID: "c"}, assignment.Node{ID: "d"})
	owners := []assignment.NodeID{"a", "a", "a", "a", "b", "c", "d"}
	var ss []assignment.Slice
	for i, o := range owners {
		end := keyspace.End
		if i+1 < len(owners) {
			end = keyspace.At(keyspace.Boundary(i+1, 8))
		}
		ss = append(ss, assignment.Slice{Range: keyspace.Range{Start: keyspace.Boundary(i, 8), End: end},
			Replicas: []assignment.NodeID{o}})
	}
	a, err := assignment.New(0, ss)
	require.NoError(t, err)
	j := func() float64 { return 2 * rng.Float64() }
	return balance.Input{
		Assignment: a, Nodes: nodes,
		Load:   []float64{45, 25 + j(), 25 + j(), 25 + j(), 95 + j(), 85 + j(), 100 + j()},
		Spread: []float64{15, 2, 2, 2, 2, 2, 2},
		Keys:   []float64{1, 1000, 1000, 1000, 1000, 1000, 1000},
	}
}

// peakLoad returns the largest, over nodes, of a node's load plus k standard deviations of
// it, each slice's load and spread shared evenly by its replicas and the slices' noises
// independent.
func peakLoad(a *assignment.Assignment, loads, spread []float64, nodes *assignment.NodeSet, k float64) float64 {
	mean := make(map[assignment.NodeID]float64)
	variance := make(map[assignment.NodeID]float64)
	for i, s := range a.All() {
		r := float64(len(s.Replicas))
		for _, id := range s.Replicas {
			mean[id] += loads[i] / r
			variance[id] += (spread[i] / r) * (spread[i] / r)
		}
	}
	var top float64
	for _, id := range nodes.IDs() {
		top = max(top, mean[id]+k*math.Sqrt(variance[id]))
	}
	return top
}

// TestNoiseMarginLowersPeak checks that with noise_margin the pass replicates the hot key
// whose mean alone stays under replicate_above, and that the map it leaves has a lower peak
// (mean plus two standard deviations) on its hottest node than the pass without margin
// leaves, on seeded variations of the same input.
func TestNoiseMarginLowersPeak(t *testing.T) {
	params := map[string]string{"min_slices_per_node": "1", "initial_slices_per_node": "1", "max_slices_per_node": "8"}
	rng := rand.New(rand.NewPCG(7, 11))
	for range 20 {
		in := noisyInput(t, rng)
		peaks := map[string]float64{}
		for _, margin := range []string{"0", "2"} {
			params["noise_margin"] = margin
			alg, err := balance.New("weighted-move", params)
			require.NoError(t, err)
			res, err := alg.Rebalance(in)
			require.NoError(t, err)
			next, err := in.Assignment.Apply(res.Ops)
			require.NoError(t, err)
			loads, spread := reproject(t, in.Assignment, in.Load, next), reproject(t, in.Assignment, in.Spread, next)
			_, hot := next.Lookup(0)
			if margin == "0" {
				require.Len(t, hot.Replicas, 1, "without margin, a key at 0.45 of the mean stays whole")
			} else {
				require.Len(t, hot.Replicas, 2, "with margin, 45 + 2*15 per replica exceeds 0.5 of the mean")
			}
			peaks[margin] = peakLoad(next, loads, spread, in.Nodes, 2)
		}
		require.Less(t, peaks["2"], peaks["0"], "loads %v", in.Load)
	}
}

// TestNoiseMarginZeroIgnoresSpread checks that the default margin makes the same pass as
// an input without spreads.
func TestNoiseMarginZeroIgnoresSpread(t *testing.T) {
	in := noisyInput(t, rand.New(rand.NewPCG(1, 2)))
	alg, err := balance.New("weighted-move", map[string]string{"min_slices_per_node": "1", "initial_slices_per_node": "1", "max_slices_per_node": "8"})
	require.NoError(t, err)
	with, err := alg.Rebalance(in)
	require.NoError(t, err)
	in.Spread = nil
	without, err := alg.Rebalance(in)
	require.NoError(t, err)
	require.Equal(t, without.Ops, with.Ops)
}

// reproject carries per-slice values over to next. A slice of next lies within one slice of
// the input here (the passes only split), so spreads carry as loads do.
func reproject(t *testing.T, from *assignment.Assignment, xs []float64, next *assignment.Assignment) []float64 {
	t.Helper()
	out := make([]float64, next.Len())
	for i, s := range from.All() {
		var parts []int
		var width float64
		for j, _ := next.Lookup(s.Range.Start); j < next.Len() && s.Range.Contains(next.Slice(j).Range.Start); j++ {
			parts = append(parts, j)
			width += next.Slice(j).Range.Width()
		}
		for _, j := range parts {
			out[j] += xs[i] * next.Slice(j).Range.Width() / width
		}
	}
	return out
}
