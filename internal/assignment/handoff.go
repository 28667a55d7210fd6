package assignment

import (
	"fmt"
	"slices"
)

// A handoff moves a slice make-before-break (I7 in docs/DESIGN.md): the nodes that gain it
// hold it as Loading while its data arrives, the nodes that lose it keep serving it as
// Leaving, and only once every loading replica serves do the leaving ones drop it. Routers
// send reads to Serving replicas only, distributors deliver to every replica. The map
// carries the states, so that every router, distributor and later leader sees the same
// handoff; the assigner starts one with a Handoff operation and ends it with an Assign.

// Serving returns the replicas that serve reads: all but the loading ones. A slice whose
// every replica is loading (its only holder left before the handoff could end) returns
// them all, since a reader has nowhere better to go.
func (s Slice) Serving() []NodeID {
	if len(s.Loading) == 0 || len(s.Loading) == len(s.Replicas) {
		return s.Replicas
	}
	return minus(s.Replicas, s.Loading)
}

// InHandoff reports whether a handoff of the slice is under way: some replica is loading, or
// every new one serves and the leaving ones linger (they serve until they drop the slice,
// for the readers whose map does not show the new holders serving yet).
func (s Slice) InHandoff() bool { return len(s.Loading) > 0 || len(s.Leaving) > 0 }

// Lingering reports whether the slice's handoff has only its leaving replicas' drop left.
func (s Slice) Lingering() bool { return len(s.Loading) == 0 && len(s.Leaving) > 0 }

// IsLoading reports whether node id holds the slice but does not serve it yet.
func (s Slice) IsLoading(id NodeID) bool {
	_, ok := slices.BinarySearch(s.Loading, id)
	return ok
}

// Target returns the replica set the slice will have once its handoff ends: every replica
// but the leaving ones.
func (s Slice) Target() []NodeID {
	if len(s.Leaving) == 0 {
		return s.Replicas
	}
	return minus(s.Replicas, s.Leaving)
}

// formatHandoff writes a handoff's state as " loading=a leaving=b since=G", the empty parts
// left out; "" for none.
func formatHandoff(loading, leaving []NodeID, since uint64) string {
	out := ""
	if len(loading) > 0 {
		out += " loading=" + FormatReplicas(loading)
	}
	if len(leaving) > 0 {
		out += " leaving=" + FormatReplicas(leaving)
	}
	if since != 0 {
		out += fmt.Sprintf(" since=%d", since)
	}
	return out
}

// normalized returns s with its node lists sorted (copies: the caller's stay as they were).
func (s Slice) normalized() Slice {
	s.Replicas, s.Loading, s.Leaving = normalize(s.Replicas), normalizeOpt(s.Loading), normalizeOpt(s.Leaving)
	return s
}

func normalizeOpt(ids []NodeID) []NodeID {
	if len(ids) == 0 {
		return nil
	}
	return normalize(ids)
}

// check validates a normalized slice's replica set and handoff state.
func (s Slice) check() error {
	if err := checkReplicas(s.Replicas); err != nil {
		return err
	}
	for _, part := range []struct {
		name string
		ids  []NodeID
	}{{"loading", s.Loading}, {"leaving", s.Leaving}} {
		for i, id := range part.ids {
			if !s.Holds(id) {
				return fmt.Errorf("%w: %s node %s is not a replica", ErrBadHandoff, part.name, id)
			}
			if i > 0 && part.ids[i-1] == id {
				return fmt.Errorf("%w: %s node %s listed twice", ErrBadHandoff, part.name, id)
			}
		}
	}
	if err := s.checkRoles(); err != nil {
		return err
	}
	switch {
	case len(s.Loading) == 0 && len(s.Leaving) == 0 && s.Since != 0:
		return fmt.Errorf("%w: a start generation but no loading or leaving node", ErrBadHandoff)
	case s.InHandoff() && s.Since == 0:
		return fmt.Errorf("%w: loading or leaving nodes but no start generation", ErrBadHandoff)
	case len(intersect(s.Loading, s.Leaving)) > 0:
		return fmt.Errorf("%w: nodes %s both loading and leaving", ErrBadHandoff, FormatReplicas(intersect(s.Loading, s.Leaving)))
	}
	return nil
}

// sameHolders reports whether two slices have the same replicas in the same states (their
// tokens aside: a merge keeps the higher).
func (s Slice) sameHolders(t Slice) bool {
	return slices.Equal(s.Replicas, t.Replicas) && slices.Equal(s.Loading, t.Loading) &&
		slices.Equal(s.Leaving, t.Leaving) && s.Since == t.Since && s.Primary == t.Primary && s.Next == t.Next
}

// assignAt returns the Assign that gives the slice starting at start s's holders and roles.
func (s Slice) assignAt(start uint64) Assign {
	return Assign{Slice: start, Replicas: s.Replicas, Loading: s.Loading, Leaving: s.Leaving, Since: s.Since,
		Primary: s.Primary, Next: s.Next, Token: s.Token}
}

// Handoff gives the slice starting at Slice the replica set Replicas make-before-break: the
// nodes of Replicas that do not serve it yet load it, the serving nodes not in Replicas
// keep serving it until they are done. Nodes that do not serve (dead ones) are not kept:
// Live, when set, names the nodes that may stay as leaving. A Handoff whose new nodes all
// serve the slice already (a replica dropped) is a plain Assign. Resolve turns every
// Handoff into the Assign it amounts to, which is what quanta and the log carry: a Handoff
// depends on the slice's state when it applies.
type Handoff struct {
	Slice    uint64
	Replicas []NodeID
	Live     *NodeSet
}

func (o Handoff) String() string {
	return "handoff " + Assign{Slice: o.Slice, Replicas: o.Replicas}.String()[len("assign "):]
}

func (o Handoff) apply(e *editor) error {
	i, err := e.find(o.Slice)
	if err != nil {
		return err
	}
	target := normalize(o.Replicas)
	if err := checkReplicas(target); err != nil {
		return fmt.Errorf("%w: %w", ErrBadOp, err)
	}
	cur := e.cells[i].s
	var serving []NodeID
	if len(cur.Loading) < len(cur.Replicas) {
		serving = cur.Serving()
	}
	next := Assign{Slice: o.Slice, Replicas: target}
	// A drop of the live primary lingers as a handoff does, so that it hands its role over
	// before it goes (roles.go); other drops are at once.
	loading, live := minus(target, serving), func(id NodeID) bool { return o.Live == nil || o.Live.Has(id) }
	if dropsPrimary := cur.Primary != "" && !slices.Contains(target, cur.Primary) && live(cur.Primary); len(loading) > 0 || dropsPrimary {
		var leaving []NodeID
		for _, id := range minus(serving, target) {
			if live(id) {
				leaving = append(leaving, id)
			}
		}
		next.Replicas, next.Loading, next.Leaving = union(target, leaving), loading, leaving
		next.Since = e.generation
		if cur.Since != 0 && len(minus(loading, cur.Loading)) == 0 {
			next.Since = cur.Since // no node joined the handoff: those loading keep their start
		}
	}
	if err := e.assign(i, next); err != nil {
		return err
	}
	if e.resolved != nil {
		e.resolved = append(e.resolved, e.cells[i].s.assignAt(o.Slice))
	}
	return nil
}

// minus returns the sorted set a \ b.
func minus(a, b []NodeID) []NodeID {
	var out []NodeID
	for _, id := range a {
		if _, ok := slices.BinarySearch(b, id); !ok {
			out = append(out, id)
		}
	}
	return out
}

func intersect(a, b []NodeID) []NodeID {
	var out []NodeID
	for _, id := range a {
		if _, ok := slices.BinarySearch(b, id); ok {
			out = append(out, id)
		}
	}
	return out
}

func union(a, b []NodeID) []NodeID {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return slices.Compact(out)
}

// AtTarget returns the map as its handoffs will leave it: every slice in handoff at its
// Target replica set, with no handoff under way, at a's generation; a itself when no slice
// is in handoff. It copies the slices once without checking them again, as each is valid
// already, so that a balancing pass can weigh a large map with moves under way for the
// price of one copy.
func (a *Assignment) AtTarget() *Assignment {
	if !slices.ContainsFunc(a.slices, Slice.InHandoff) {
		return a
	}
	out := &Assignment{generation: a.generation, slices: slices.Clone(a.slices)}
	for i, s := range out.slices {
		if s.InHandoff() {
			out.slices[i] = Slice{Range: s.Range, Replicas: s.Target()}
		}
	}
	return out
}
