package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// TestDeferMergesLeavesOutMergesOfMovedSlices checks that a pass's merge of a slice it moves
// waits (the move is a handoff, and a slice in handoff merges with nothing), with the
// operations that relied on it, while the merges of slices held alike stay.
func TestDeferMergesLeavesOutMergesOfMovedSlices(t *testing.T) {
	view, err := assignment.Uniform(6, func(i int) []assignment.NodeID {
		return []assignment.NodeID{[]assignment.NodeID{"a", "b", "a", "a", "b", "b"}[i]}
	})
	require.NoError(t, err)
	start := func(i int) uint64 { return view.Slice(i).Range.Start }
	mid, _ := view.Slice(5).Range.Midpoint()
	ops := []assignment.Op{
		assignment.Assign{Slice: start(1), Replicas: []assignment.NodeID{"a"}}, // a move, so a handoff
		assignment.Merge{Left: start(0)},                                       // joins the moved slice: waits
		assignment.Merge{Left: start(0)},                                       // the chain: waits
		assignment.Split{Slice: start(0), At: start(2) + 1},                    // relied on the merges: left out
		assignment.Merge{Left: start(2)},                                       // held alike: stays
		assignment.Assign{Slice: start(4), Replicas: []assignment.NodeID{"b", "a"}},
		assignment.Split{Slice: start(5), At: mid},                             // stays
		assignment.Assign{Slice: start(2), Replicas: []assignment.NodeID{"a"}}, // no new node: no handoff
	}
	got, deferred := deferMerges(view, ops)
	assert.Equal(t, 3, deferred)
	assert.Equal(t, []assignment.Op{ops[0], ops[4], ops[5], ops[6], ops[7]}, got)
	_, err = view.Apply(got)
	assert.NoError(t, err, "what is kept applies")
}
