package quantum

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// TestFollowersAdmitByOneRule walks the rule every follower admits quanta by, for one that
// takes every quantum (a relay) and one that skips clock ticks (a router, a distributor).
func TestFollowersAdmitByOneRule(t *testing.T) {
	a := start(t)
	move := []assignment.Op{assignment.Assign{Slice: 0, Replicas: []assignment.NodeID{"b"}}}
	moved, err := a.Apply(move)
	require.NoError(t, err)
	at := Position{Term: 2, Seq: 5}
	ops := func(term, seq uint64) Quantum {
		return Quantum{Position: Position{Term: term, Seq: seq}, Ops: move, Generation: moved.Generation()}
	}
	reinit := func(term, seq uint64) Quantum {
		return Quantum{Position: Position{Term: term, Seq: seq}, Snapshot: a, Generation: a.Generation()}
	}
	for _, tc := range []struct {
		name        string
		q           Quantum
		every, skip string // the reason each refuses it for, "" if it admits it
	}{
		{"the next operations", ops(2, 6), "", ""},
		{"operations after a skipped tick", ops(2, 7), OutOfSequence, ""},
		{"operations again", ops(2, 5), OutOfSequence, OutOfSequence},
		{"operations of the next term", ops(3, 1), OutOfSequence, OutOfSequence},
		{"operations of an older term", ops(1, 9), StaleTerm, StaleTerm},
		{"a map of an older term", reinit(1, 9), StaleTerm, StaleTerm},
		{"a map going back", reinit(2, 4), Stale, Stale},
		{"a map at the position held", reinit(2, 5), "", ""},
		{"a map of a new term", reinit(3, 1), "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for every, want := range map[bool]string{true: tc.every, false: tc.skip} {
				err := (Follower{Pos: at, Started: true, Every: every, Holder: "the follower"}).Admit(tc.q)
				if want == "" {
					assert.NoError(t, err, "every=%v", every)
					continue
				}
				refused, ok := err.(*RefusedError)
				require.True(t, ok, "every=%v: %v", every, err)
				assert.Equal(t, want, refused.Reason, "every=%v", every)
				assert.Equal(t, at, refused.Position)
			}
		})
	}
}

// TestFollowChecksTheGeneration: operations that apply but do not lead to the generation the
// quantum says are refused; a follower that missed a change finds out there.
func TestFollowChecksTheGeneration(t *testing.T) {
	a := start(t)
	f := Follower{Pos: Position{Term: 1, Seq: 1}, Started: true, Holder: "the follower"}
	q := Quantum{Position: Position{Term: 1, Seq: 2}, Generation: a.Generation() + 2,
		Ops: []assignment.Op{assignment.Assign{Slice: 0, Replicas: []assignment.NodeID{"b"}}}}
	_, err := f.Follow(a, q)
	require.ErrorContains(t, err, "leads to generation")
	q.Generation = a.Generation() + 1
	next, err := f.Follow(a, q)
	require.NoError(t, err)
	assert.Equal(t, q.Generation, next.Generation())
	_, err = (Follower{Holder: "the follower"}).Follow(nil, q)
	assert.ErrorContains(t, err, "changes a map the follower never had", "the first quantum must carry a map")
	_, err = (Follower{Holder: "the follower"}).Follow(nil, Quantum{Position: Position{Term: 1, Seq: 2}})
	assert.ErrorContains(t, err, "changes a map the follower never had", "a clock tick first, too")
}
