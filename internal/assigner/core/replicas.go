package core

import (
	"slices"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// Warm secondaries (Config.MinReplicas, --min-replicas). A slice held by one member has
// nobody to take over when that member dies: its keys wait for the member's lease to lapse
// and for a successor to load them. With a floor of two replicas, a primary's death promotes
// a secondary that already holds the range, in the change that takes the dead member out.
// The floor is kept by the clean-up, outside the churn budget: it tops up every slice that
// is short of it (a replica's node left, the floor was raised, the first map), each new
// replica loading make-before-break beside those that serve; and algorithms are told the
// floor (balance.Input.MinReplicas) so that they drop no replica below it.

// maxMinReplicas bounds --min-replicas: each replica is a copy of the slice's state.
const maxMinReplicas = 16

// replicasWanted returns how many replicas every slice keeps with the live nodes given.
func (c *Core) replicasWanted(live *assignment.NodeSet) int {
	return max(1, min(c.cfg.MinReplicas, live.Len()))
}

// short reports whether a slice of the map has fewer live replicas than the floor, and is
// free to be topped up: not in handoff (its target is topped up once the handoff ends), not
// held by Nobody (quarantined).
func (c *Core) short(live *assignment.NodeSet) bool {
	want := c.replicasWanted(live)
	if want <= 1 || c.a == nil {
		return false
	}
	for _, s := range c.a.All() {
		if shortOf(s, live, want) {
			return true
		}
	}
	return false
}

// shortOf reports whether slice s has fewer live replicas than want and is free to be topped
// up: not in handoff, not held by Nobody.
func shortOf(s assignment.Slice, live *assignment.NodeSet, want int) bool {
	return !s.InHandoff() && !nobodyHolds(s) && countLive(s.Replicas, live) < want
}

// countLive returns how many of ids are live.
func countLive(ids []assignment.NodeID, live *assignment.NodeSet) int {
	n := 0
	for _, id := range ids {
		if live.Has(id) {
			n++
		}
	}
	return n
}

// topUp returns keep with replicas added on live nodes until it has want of them: each on
// the node that adds a zone the slice lacks, if any, then holds the fewest slices (held,
// which it updates), the first by ID on a tie.
func topUp(keep []assignment.NodeID, want int, live *assignment.NodeSet, held map[assignment.NodeID]int,
	zones map[assignment.NodeID]string) []assignment.NodeID {
	for len(keep) < want {
		var best assignment.NodeID
		bestNew := false
		for _, n := range live.Nodes() {
			if slices.Contains(keep, n.ID) {
				continue
			}
			isNew := zones != nil && !slices.ContainsFunc(keep, func(id assignment.NodeID) bool { return zones[id] == zones[n.ID] })
			if best == "" || isNew && !bestNew || isNew == bestNew && held[n.ID] < held[best] {
				best, bestNew = n.ID, isNew
			}
		}
		if best == "" {
			return keep
		}
		keep = append(keep, best)
		held[best]++
	}
	return keep
}

// withMinReplicas returns the first map a with every slice topped up to the floor.
func (c *Core) withMinReplicas(a *assignment.Assignment, live *assignment.NodeSet) (*assignment.Assignment, error) {
	want := c.replicasWanted(live)
	if want <= 1 {
		return a, nil
	}
	held, zones := heldCounts(a, live), c.zones(live)
	var ops []assignment.Op
	for _, s := range a.All() {
		if len(s.Replicas) < want {
			reps := topUp(slices.Clone(s.Replicas), want, live, held, zones)
			ops = append(ops, assignment.Assign{Slice: s.Range.Start, Replicas: reps})
		}
	}
	next, err := a.Apply(ops)
	if err != nil {
		return nil, err
	}
	return next.WithGeneration(a.Generation()), nil
}
