package balance

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// TestWeightedMoveKeepsTheReplicaFloor gives Weighted-Move four slices, each on two of three
// nodes, two of them cold: it drops the replicas the cold ones do not need, but none below
// Input.MinReplicas.
func TestWeightedMoveKeepsTheReplicaFloor(t *testing.T) {
	pairs := [][]assignment.NodeID{{"a", "b"}, {"b", "c"}, {"a", "c"}, {"a", "b"}}
	a, err := assignment.Uniform(4, func(i int) []assignment.NodeID { return pairs[i] })
	require.NoError(t, err)
	nodes, err := assignment.NewNodeSet([]assignment.Node{{ID: "a", Capacity: 1}, {ID: "b", Capacity: 1}, {ID: "c", Capacity: 1}})
	require.NoError(t, err)
	wm, err := New("weighted-move", nil)
	require.NoError(t, err)
	replicas := func(minReplicas int) int {
		in := Input{Assignment: a, Nodes: nodes, Load: []float64{0.01, 0.01, 10, 10}, Keys: []float64{100, 100, 100, 100}, MinReplicas: minReplicas}
		res, err := wm.Rebalance(in)
		require.NoError(t, err)
		next, err := a.Apply(res.Ops)
		require.NoError(t, err)
		fewest := 99
		for _, s := range next.All() {
			fewest = min(fewest, len(s.Replicas))
		}
		return fewest
	}
	require.Equal(t, 1, replicas(0), "without a floor, a cold slice keeps one replica")
	require.Equal(t, 2, replicas(2), "with a floor of two, none drops below it")
}
