package sim

import (
	"slices"
	"sort"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// undoTracker counts, from the maps a run goes through and nothing the balancer says about
// itself, the moves it undoes: what a service would see as oscillation.
//
// An undone move is a slice, or a piece of one, that a node held, lost while it stayed live,
// and got back fewer than hold passes later: the moves Weighted-Move's hold_passes forbids.
// It is counted once per slice and node of the map that undoes it. A ping-pong is a slice of a
// single key moved from a node X to a node Y when that key, alone in its slice, was moved from
// Y to X before, however long before in the run.
type undoTracker struct {
	hold int
	// direct counts the undone moves that reverse the loss: B to A after A to B, or a replica
	// re-added on A after A's was dropped; those are what Weighted-Move's hold looks for. The
	// others come back by way of another node, or as a replica added where a move took it.
	direct int
	left   map[assignment.NodeID][]leftPiece
	moves  map[uint64][]nodePair // per key that was alone in a slice that moved, its moves
}

// leftPiece is a range a node stopped holding at a pass, and the nodes it went to.
type leftPiece struct {
	r    keyspace.Range
	pass int
	to   []assignment.NodeID
}

type nodePair struct{ from, to assignment.NodeID }

func newUndoTracker(hold int) *undoTracker {
	return &undoTracker{hold: hold, left: map[assignment.NodeID][]leftPiece{}, moves: map[uint64][]nodePair{}}
}

// holdPasses is the window within which a return counts as undoing a move: the algorithm's
// hold_passes, or for an algorithm without one, Weighted-Move's default, so that runs of
// different algorithms are counted alike.
func holdPasses(alg balance.Algorithm) int {
	switch a := alg.(type) {
	case *balance.WeightedMove:
		return a.Config().HoldPasses
	case *balance.Headroom:
		return a.Config().WeightedMove.HoldPasses
	}
	return balance.DefaultWeightedMoveConfig().HoldPasses
}

// observe records the change from map from to map to made at pass pass, live being the live
// nodes after it and keys the sorted hashes of the keys, and returns the moves it undid and
// the ping-pongs it made.
func (t *undoTracker) observe(pass int, from, to *assignment.Assignment, live *assignment.NodeSet,
	keys []uint64) (undone, pingPongs int) {
	if from == nil || to == nil || from == to {
		return 0, 0
	}
	t.forget(pass)
	returned := map[int][]assignment.NodeID{} // per slice of to, the nodes it returned to
	eachPiece(from, to, func(r keyspace.Range, before, after assignment.Slice) {
		j, _ := to.Lookup(r.Start)
		for _, id := range after.Replicas {
			if before.Holds(id) || slices.Contains(returned[j], id) {
				continue
			}
			if p, ok := t.leftRecently(id, r); ok {
				returned[j] = append(returned[j], id)
				undone++
				if lost := gained(after, before); len(lost) == 0 && len(p.to) == 0 ||
					slices.ContainsFunc(lost, func(x assignment.NodeID) bool { return slices.Contains(p.to, x) }) {
					t.direct++
				}
			}
		}
		for _, id := range before.Replicas {
			// Pieces are disjoint: what a node loses here cannot count as a return in this pass.
			if !after.Holds(id) && live.Has(id) && t.hold > 0 {
				t.left[id] = append(t.left[id], leftPiece{r: r, pass: pass, to: gained(before, after)})
			}
		}
	})
	return undone, t.pingPongs(from, to, keys)
}

// forget drops the pieces that left too long ago for their return to undo anything at pass.
func (t *undoTracker) forget(pass int) {
	for id, ps := range t.left {
		ps = slices.DeleteFunc(ps, func(p leftPiece) bool { return pass-p.pass >= t.hold })
		if len(ps) == 0 {
			delete(t.left, id)
		} else {
			t.left[id] = ps
		}
	}
}

// leftRecently returns the latest loss by node id of part of r within the hold window.
func (t *undoTracker) leftRecently(id assignment.NodeID, r keyspace.Range) (leftPiece, bool) {
	ps := t.left[id]
	for i := len(ps) - 1; i >= 0; i-- {
		if ps[i].r.Overlaps(r) {
			return ps[i], true
		}
	}
	return leftPiece{}, false
}

// gained returns the nodes of after that before does not hold.
func gained(before, after assignment.Slice) []assignment.NodeID {
	var out []assignment.NodeID
	for _, id := range after.Replicas {
		if !before.Holds(id) {
			out = append(out, id)
		}
	}
	return out
}

// pingPongs records the moves of the single-key slices of to and counts those that reverse
// an earlier move of the same key.
func (t *undoTracker) pingPongs(from, to *assignment.Assignment, keys []uint64) int {
	n := 0
	for _, s := range to.All() {
		lo := sort.Search(len(keys), func(i int) bool { return keys[i] >= s.Range.Start })
		if lo == len(keys) || !s.Range.Contains(keys[lo]) || (lo+1 < len(keys) && s.Range.Contains(keys[lo+1])) {
			continue // no key, or more than one
		}
		h := keys[lo]
		_, before := from.Lookup(h)
		for _, x := range before.Replicas {
			if s.Holds(x) {
				continue
			}
			for _, y := range s.Replicas {
				if before.Holds(y) {
					continue
				}
				if slices.Contains(t.moves[h], nodePair{from: y, to: x}) {
					n++
				}
				t.moves[h] = append(t.moves[h], nodePair{from: x, to: y})
			}
		}
	}
	return n
}

// eachPiece calls fn for every range on which neither map changes slice, in key order, with
// the slice of each map that holds it.
func eachPiece(from, to *assignment.Assignment, fn func(r keyspace.Range, before, after assignment.Slice)) {
	i, j := 0, 0
	for i < from.Len() && j < to.Len() {
		a, b := from.Slice(i), to.Slice(j)
		if r, ok := a.Range.Intersect(b.Range); ok {
			fn(r, a, b)
		}
		switch a.Range.End.Compare(b.Range.End) {
		case -1:
			i++
		case 1:
			j++
		default:
			i, j = i+1, j+1
		}
	}
}
