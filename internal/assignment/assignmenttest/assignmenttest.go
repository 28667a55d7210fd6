// Package assignmenttest generates random valid assignments for property tests.
package assignmenttest

import (
	"slices"

	"pgregory.net/rapid"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// Generator draws valid assignments of 1 to maxSlices slices, at a random generation, whose
// boundaries are distinct points in 1..maxPoint and whose replica sets are 1 to 3 distinct
// nodes of pool (which must hold at least one node).
func Generator(pool []assignment.NodeID, maxSlices int, maxPoint uint64) *rapid.Generator[*assignment.Assignment] {
	return rapid.Custom(func(t *rapid.T) *assignment.Assignment {
		n := rapid.IntRange(1, maxSlices).Draw(t, "slices")
		bounds := rapid.SliceOfNDistinct(rapid.Uint64Range(1, maxPoint), n-1, n-1, rapid.ID[uint64]).Draw(t, "bounds")
		slices.Sort(bounds)
		starts := append([]uint64{0}, bounds...)
		ss := make([]assignment.Slice, n)
		for i, s := range starts {
			end := keyspace.End
			if i+1 < n {
				end = keyspace.At(starts[i+1])
			}
			reps := rapid.SliceOfNDistinct(rapid.SampledFrom(pool), 1, min(3, len(pool)), rapid.ID[assignment.NodeID]).Draw(t, "replicas")
			ss[i] = assignment.Slice{Range: keyspace.Range{Start: s, End: end}, Replicas: reps}
		}
		a, err := assignment.New(rapid.Uint64().Draw(t, "generation"), ss)
		if err != nil {
			t.Fatalf("assignmenttest: drew an invalid assignment: %v", err)
		}
		return a
	})
}
