// Package assignment holds the slice map: which replica set of nodes holds each slice of the
// hash space. An Assignment is an immutable value; operations (Split, Merge, Assign) produce the
// next one through Apply, so every version that was ever handed out stays valid.
package assignment

import (
	"cmp"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sort"
	"strings"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// Errors that Validate, New and Apply wrap. Each error names the slice or node at fault.
var (
	ErrGap              = errors.New("assignment: gap")
	ErrOverlap          = errors.New("assignment: overlap")
	ErrEmptyRange       = errors.New("assignment: empty range")
	ErrNoReplicas       = errors.New("assignment: empty replica set")
	ErrDuplicateReplica = errors.New("assignment: duplicate replica")
	ErrUnknownNode      = errors.New("assignment: unknown node")
	ErrBadNodeID        = errors.New("assignment: bad node ID")
	ErrBadCapacity      = errors.New("assignment: bad capacity")
	ErrDuplicateNode    = errors.New("assignment: duplicate node")
	ErrNoSlice          = errors.New("assignment: no such slice")
	ErrBadOp            = errors.New("assignment: bad operation")
	ErrBadHandoff       = errors.New("assignment: bad handoff")
	ErrBadRole          = errors.New("assignment: bad role")
)

// maxReported bounds how many problems one error lists, so that a badly broken map of 150k
// slices does not produce a megabyte of text.
const maxReported = 20

// Slice is one slice of the space and the nodes that hold it.
type Slice struct {
	Range keyspace.Range
	// Replicas lists the nodes holding the slice, sorted by ID, without duplicates. Slices
	// handed out by an Assignment share this array with it: do not modify it.
	Replicas []NodeID
	// Loading lists the replicas still receiving the slice's data (make-before-break, I7):
	// they hold it but do not serve it yet. Leaving lists replicas that serve it until no
	// replica is loading, then drop it. Both are sorted subsets of Replicas, disjoint, and
	// empty unless a handoff is under way; Since is the generation at which it began (0:
	// none). See handoff.go.
	Loading, Leaving []NodeID
	Since            uint64
	// Primary is the replica that takes the slice's writes, in a cluster with roles (the
	// others are secondaries); empty in a cluster without (every replica alike), and while
	// none serves. It is a replica that does not load. Next, when set, is the replica to be
	// primary once Primary has demoted itself (a planned move of the primary role: at no
	// time are two replicas primary); empty otherwise. See roles.go.
	Primary, Next NodeID
	// Token is the fencing token of the primary's grant: the generation of the map that
	// named Primary, plus one. It only grows for any point of the space, across grants,
	// splits (both halves keep it), merges (the higher of the two) and leader terms (the
	// generation goes on), so that a store the application writes through can refuse a
	// stale primary's write (client/fence). 0 while no primary was ever named.
	Token uint64
}

// Holds reports whether node id is one of the slice's replicas.
func (s Slice) Holds(id NodeID) bool {
	_, ok := slices.BinarySearch(s.Replicas, id)
	return ok
}

// String formats the slice as its range and replica set.
func (s Slice) String() string {
	out := s.Range.String() + " " + FormatReplicas(s.Replicas)
	return out + formatHandoff(s.Loading, s.Leaving, s.Since) + formatRoles(s.Primary, s.Next, s.Token)
}

// FormatReplicas writes a replica set as a,b,c.
func FormatReplicas(ids []NodeID) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = string(id)
	}
	return strings.Join(parts, ",")
}

// Assignment maps every point of the hash space to a replica set: a sorted list of slices that
// partition the space, each with at least one replica. The zero value is not usable; build one
// with New or Uniform.
type Assignment struct {
	generation uint64
	slices     []Slice
}

// New returns the assignment of the given slices at the given generation. The slices may be in
// any order; they must partition the space, and each must have a non-empty replica set of
// well-formed node IDs without duplicates. Every problem found is reported.
func New(generation uint64, in []Slice) (*Assignment, error) {
	ss := make([]Slice, len(in))
	for i, s := range in {
		ss[i] = s.normalized()
	}
	byStart := func(a, b Slice) int { return cmp.Compare(a.Range.Start, b.Range.Start) }
	if !slices.IsSortedFunc(ss, byStart) {
		slices.SortStableFunc(ss, byStart)
	}
	var p problems
	checkPartition(ss, &p)
	for _, s := range ss {
		if err := s.check(); err != nil {
			p.add(fmt.Errorf("slice %s: %w", s.Range, err))
		}
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	return &Assignment{generation: generation, slices: ss}, nil
}

// Uniform returns an assignment of n equal slices at generation 0, where slice i is held by
// replicas(i).
func Uniform(n int, replicas func(i int) []NodeID) (*Assignment, error) {
	ranges := keyspace.Equal(n)
	ss := make([]Slice, len(ranges))
	for i, r := range ranges {
		ss[i] = Slice{Range: r, Replicas: replicas(i)}
	}
	return New(0, ss)
}

// normalize returns a sorted copy of ids. Duplicates are kept so that validation can report them.
func normalize(ids []NodeID) []NodeID {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}

func checkPartition(ss []Slice, p *problems) {
	next := keyspace.At(0) // the first point not yet covered
	for _, s := range ss {
		if !s.Range.Valid() {
			p.add(fmt.Errorf("%w: slice %s holds no point", ErrEmptyRange, s.Range))
			continue
		}
		start := keyspace.At(s.Range.Start)
		switch c := start.Compare(next); {
		case next.IsEnd():
			p.add(fmt.Errorf("%w: slice %s lies beyond the end of the space", ErrOverlap, s.Range))
			continue
		case c > 0:
			p.add(fmt.Errorf("%w: %s is not covered by any slice", ErrGap,
				keyspace.Range{Start: next.Point(), End: start}))
		case c < 0:
			p.add(fmt.Errorf("%w: slice %s starts before %s, where the previous slice ends", ErrOverlap, s.Range, next))
		}
		if s.Range.End.Compare(next) > 0 {
			next = s.Range.End
		}
	}
	if !next.IsEnd() {
		p.add(fmt.Errorf("%w: %s is not covered by any slice", ErrGap, keyspace.Range{Start: next.Point(), End: keyspace.End}))
	}
}

// checkReplicas validates a sorted replica set.
func checkReplicas(ids []NodeID) error {
	if len(ids) == 0 {
		return ErrNoReplicas
	}
	for i, id := range ids {
		if err := id.Validate(); err != nil {
			return err
		}
		if i > 0 && ids[i-1] == id {
			return fmt.Errorf("%w: node %s", ErrDuplicateReplica, id)
		}
	}
	return nil
}

// Generation returns the version number of the assignment; Apply increments it.
func (a *Assignment) Generation() uint64 { return a.generation }

// WithGeneration returns a copy of a (sharing its slices) at generation g. A new leader uses
// it to continue numbering from what it loaded.
func (a *Assignment) WithGeneration(g uint64) *Assignment {
	return &Assignment{generation: g, slices: a.slices}
}

// Len returns the number of slices.
func (a *Assignment) Len() int { return len(a.slices) }

// Slice returns the i-th slice in key order.
func (a *Assignment) Slice(i int) Slice { return a.slices[i] }

// All iterates over the slices in key order.
func (a *Assignment) All() iter.Seq2[int, Slice] {
	return func(yield func(int, Slice) bool) {
		for i, s := range a.slices {
			if !yield(i, s) {
				return
			}
		}
	}
}

// Lookup returns the index of the slice that holds point h, and that slice, in O(log n).
func (a *Assignment) Lookup(h uint64) (int, Slice) {
	// The first slice starts at 0, so the slice holding h is the last one starting at or before h.
	i := sort.Search(len(a.slices), func(i int) bool { return a.slices[i].Range.Start > h }) - 1
	return i, a.slices[i]
}

// Find returns the index of the slice that starts exactly at start, if there is one.
func (a *Assignment) Find(start uint64) (int, bool) {
	i, ok := slices.BinarySearchFunc(a.slices, start, func(s Slice, t uint64) int { return cmp.Compare(s.Range.Start, t) })
	return i, ok
}

// Validate checks the assignment against a node set: every replica must be a node of the set.
// (The partition and replica-set invariants hold by construction.) It reports every slice at
// fault, up to a limit.
func (a *Assignment) Validate(nodes *NodeSet) error {
	var p problems
	for _, s := range a.slices {
		for _, id := range s.Replicas {
			if !nodes.Has(id) {
				p.add(fmt.Errorf("%w: slice %s is held by %s, which is not a live node", ErrUnknownNode, s.Range, id))
			}
		}
	}
	return p.err()
}

// Equal reports whether a and b map the space identically (generations are not compared).
func (a *Assignment) Equal(b *Assignment) bool {
	return slices.EqualFunc(a.slices, b.slices, func(x, y Slice) bool {
		return x.Range == y.Range && x.sameHolders(y) && x.Token == y.Token
	})
}

// String formats the assignment one slice per line.
func (a *Assignment) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "generation %d, %d slices\n", a.generation, len(a.slices))
	for _, s := range a.slices {
		b.WriteString(s.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// problems collects validation failures, keeping the first maxReported.
type problems struct {
	errs    []error
	dropped int
}

func (p *problems) add(err error) {
	if len(p.errs) < maxReported {
		p.errs = append(p.errs, err)
		return
	}
	p.dropped++
}

func (p *problems) err() error {
	if p.dropped > 0 {
		p.errs = append(p.errs, fmt.Errorf("and %d more problems", p.dropped))
	}
	return errors.Join(p.errs...)
}
