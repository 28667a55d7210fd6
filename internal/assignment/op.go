package assignment

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// Op is one operation on an assignment. Operations name the slice they act on by its start
// point, which identifies a slice uniquely within one version of the map; they are applied in
// order, each to the result of the previous one.
type Op interface {
	fmt.Stringer
	apply(e *editor) error
}

// Split divides the slice starting at Slice into [Slice, At) and [At, end). Both halves keep
// the slice's replica set, so a split moves no data.
type Split struct {
	Slice uint64
	At    uint64
}

// Merge joins the slice starting at Left with the slice after it. Both must have the same
// replica set; to merge slices held by different nodes, Assign one of them first.
type Merge struct {
	Left uint64
}

// Assign gives the slice starting at Slice a new replica set, at once: with no Loading
// node, no handoff is under way (see Handoff for make-before-break). Loading, Leaving and
// Since set the handoff state exactly, as a resolved Handoff does (see Slice).
type Assign struct {
	Slice            uint64
	Replicas         []NodeID
	Loading, Leaving []NodeID
	Since            uint64
	// Primary and Next set the slice's roles exactly (see Slice): empty, none. Token sets
	// the primary's fencing token; 0 keeps the slice's (a token never goes back).
	Primary, Next NodeID
	Token         uint64
}

func (o Split) String() string {
	return "split " + keyspace.FormatPoint(o.Slice) + " at " + keyspace.FormatPoint(o.At)
}

func (o Merge) String() string { return "merge " + keyspace.FormatPoint(o.Left) + " with next" }

func (o Assign) String() string {
	out := "assign " + keyspace.FormatPoint(o.Slice) + " to " + FormatReplicas(o.Replicas)
	return out + formatHandoff(o.Loading, o.Leaving, o.Since) + formatRoles(o.Primary, o.Next, o.Token)
}

// Apply returns the assignment that results from applying ops in order, at the next
// generation. If any operation is invalid it returns an error naming it and a is unchanged
// (assignments are immutable). Applying no operations returns a itself.
func (a *Assignment) Apply(ops []Op) (*Assignment, error) {
	next, _, err := a.Resolve(ops)
	return next, err
}

// Resolve is Apply that also returns the operations with every Handoff replaced by the
// Assign it amounts to, so that applying those to a gives the same map: what quanta and the
// log carry, since a Handoff's effect depends on the state it finds.
func (a *Assignment) Resolve(ops []Op) (*Assignment, []Op, error) {
	if len(ops) == 0 {
		return a, ops, nil
	}
	e := newEditor(a)
	e.resolved = make([]Op, 0, len(ops))
	for i, op := range ops {
		if err := op.apply(e); err != nil {
			return nil, nil, fmt.Errorf("op %d (%s): %w", i, op, err)
		}
		if _, ok := op.(Handoff); !ok {
			e.resolved = append(e.resolved, op)
		}
	}
	return &Assignment{generation: e.generation, slices: e.result()}, e.resolved, nil
}

// editor applies operations to a copy of an assignment's slices in O(log n) each: the slices
// form a linked list, found by binary search among the original starts or, for slices that
// splits created, by a map. Rebuilding the sorted array happens once, at the end.
type editor struct {
	generation uint64 // of the map being made
	resolved   []Op   // the operations so far, each Handoff as the Assign it made
	cells      []cell
	base       int              // cells[:base] are the original slices, sorted by start
	added      map[uint64]int32 // start -> cell of slices created by splits
}

type cell struct {
	s    Slice
	next int32 // index of the following slice, -1 at the end of the space
	dead bool  // merged into its left neighbour
}

func newEditor(a *Assignment) *editor {
	e := &editor{generation: a.generation + 1, cells: make([]cell, len(a.slices)), base: len(a.slices)}
	for i, s := range a.slices {
		e.cells[i] = cell{s: s, next: int32(i + 1)}
	}
	e.cells[len(e.cells)-1].next = -1
	return e
}

// find returns the live cell whose slice starts at start.
func (e *editor) find(start uint64) (int32, error) {
	if i, ok := e.added[start]; ok {
		return i, nil
	}
	i, ok := slices.BinarySearchFunc(e.cells[:e.base], start, func(c cell, t uint64) int { return cmp.Compare(c.s.Range.Start, t) })
	if !ok || e.cells[i].dead {
		return 0, fmt.Errorf("%w: no slice starts at %s", ErrNoSlice, keyspace.FormatPoint(start))
	}
	return int32(i), nil
}

func (e *editor) result() []Slice {
	out := make([]Slice, 0, len(e.cells))
	for i := int32(0); i >= 0; i = e.cells[i].next { // cell 0 holds point 0 and is never merged away
		out = append(out, e.cells[i].s)
	}
	return out
}

func (o Split) apply(e *editor) error {
	i, err := e.find(o.Slice)
	if err != nil {
		return err
	}
	c := &e.cells[i]
	lo, hi, err := c.s.Range.Split(o.At)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadOp, err)
	}
	if e.added == nil {
		e.added = make(map[uint64]int32)
	}
	j := int32(len(e.cells))
	piece := c.s // the half keeps the replica set and any handoff under way
	piece.Range = hi
	e.cells = append(e.cells, cell{s: piece, next: c.next})
	c = &e.cells[i] // append may have moved the array
	c.s.Range, c.next = lo, j
	e.added[hi.Start] = j
	return nil
}

func (o Merge) apply(e *editor) error {
	i, err := e.find(o.Left)
	if err != nil {
		return err
	}
	left := &e.cells[i]
	if left.next < 0 {
		return fmt.Errorf("%w: slice %s is the last one and has no right neighbour", ErrBadOp, left.s.Range)
	}
	right := &e.cells[left.next]
	if !left.s.sameHolders(right.s) {
		return fmt.Errorf("%w: slices %s (%s) and %s (%s) have different replica sets, handoffs or primaries; assign one first",
			ErrBadOp, left.s.Range, FormatReplicas(left.s.Replicas), right.s.Range, FormatReplicas(right.s.Replicas))
	}
	left.s.Range.End = right.s.Range.End
	left.s.Token = max(left.s.Token, right.s.Token) // no point's token goes back
	left.next = right.next
	right.dead = true
	delete(e.added, right.s.Range.Start)
	return nil
}

func (o Assign) apply(e *editor) error {
	i, err := e.find(o.Slice)
	if err != nil {
		return err
	}
	return e.assign(i, o)
}

// assign gives cell i the replica set and handoff state of o, once they check out.
func (e *editor) assign(i int32, o Assign) error {
	s := Slice{Range: e.cells[i].s.Range, Replicas: o.Replicas, Loading: o.Loading, Leaving: o.Leaving, Since: o.Since,
		Primary: o.Primary, Next: o.Next, Token: o.Token}.normalized()
	if s.Token == 0 {
		s.Token = e.cells[i].s.Token
	}
	if err := s.check(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadOp, err)
	}
	if err := e.checkToken(e.cells[i].s, s); err != nil {
		return fmt.Errorf("%w: %w", ErrBadOp, err)
	}
	e.cells[i].s = s
	return nil
}

// Diff returns operations that turn from into to: splits at every boundary of to that from
// lacks, assignments of every piece whose replica set differs, then merges of every boundary
// of from that to lacks. Applying them to from yields a map Equal to to.
func Diff(from, to *Assignment) []Op {
	var splits, assigns, merges []Op
	i, j := 0, 0 // current slices of from and to
	piece := uint64(0)
	for {
		fs, ts := from.slices[i], to.slices[j]
		if !fs.sameHolders(ts) || fs.Token != ts.Token {
			assigns = append(assigns, ts.assignAt(piece))
		}
		// The piece ends at the nearer of the two slice ends.
		switch fs.Range.End.Compare(ts.Range.End) {
		case 0:
			if fs.Range.End.IsEnd() {
				return append(append(splits, assigns...), merges...)
			}
			i, j = i+1, j+1
		case -1: // from has a boundary that to lacks: merge it away after assigning
			merges = append(merges, Merge{Left: ts.Range.Start})
			i++
		case 1: // to has a boundary that from lacks: split there first
			splits = append(splits, Split{Slice: piece, At: ts.Range.End.Point()})
			j++
		}
		piece = max(from.slices[i].Range.Start, to.slices[j].Range.Start)
	}
}
