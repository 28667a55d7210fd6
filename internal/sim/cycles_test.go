package sim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// TestCycleTrackerCountsMergesOfRecentSplits follows a boundary made by a split: merged
// away within the window it is a cycle, later not, and a boundary of the first map never is.
func TestCycleTrackerCountsMergesOfRecentSplits(t *testing.T) {
	on := []assignment.NodeID{"a"}
	whole, err := assignment.New(1, []assignment.Slice{{Range: keyspace.Full(), Replicas: on}})
	require.NoError(t, err)
	halves := keyspace.Equal(2)
	two, err := assignment.New(1, []assignment.Slice{{Range: halves[0], Replicas: on}, {Range: halves[1], Replicas: on}})
	require.NoError(t, err)

	tr := newCycleTracker()
	assert.Zero(t, tr.observe(0, two, whole), "a boundary of the first map was made by no pass seen")
	assert.Zero(t, tr.observe(1, whole, two), "a split")
	assert.Equal(t, 1, tr.observe(3, two, whole), "merged 2 passes after the split")
	assert.Zero(t, tr.observe(4, whole, two), "split again")
	assert.Zero(t, tr.observe(4+cycleWindow, two, whole), "merged once the window is over")
	assert.Zero(t, tr.observe(20, whole, whole), "no change")
}
