package keyspace

import (
	"slices"
	"strings"
)

// Set is a set of points of the space, held as its maximal ranges: sorted, disjoint and not
// adjacent, so that two sets holding the same points are equal range by range. The zero Set
// is empty. A node's data is kept this way: what it holds is a set of points, whichever way
// the assigner happens to cut them into slices.
type Set struct {
	rs []Range
}

// NewSet returns the set of the points of rs, which may overlap or touch; invalid ranges
// add nothing.
func NewSet(rs ...Range) Set {
	in := make([]Range, 0, len(rs))
	for _, r := range rs {
		if r.Valid() {
			in = append(in, r)
		}
	}
	slices.SortFunc(in, func(a, b Range) int {
		switch {
		case a.Start < b.Start:
			return -1
		case a.Start > b.Start:
			return 1
		}
		return 0
	})
	var out []Range
	for _, r := range in {
		if n := len(out); n > 0 && !out[n-1].End.Before(r.Start) {
			if r.End.Compare(out[n-1].End) > 0 {
				out[n-1].End = r.End
			}
			continue
		}
		out = append(out, r)
	}
	return Set{rs: out}
}

// Before reports whether the bound lies strictly before point p.
func (b Bound) Before(p uint64) bool { return !b.end && b.point < p }

// Ranges returns the maximal ranges of s, in order. The caller must not modify them.
func (s Set) Ranges() []Range { return s.rs }

// Empty reports whether s holds no point.
func (s Set) Empty() bool { return len(s.rs) == 0 }

// Contains reports whether p lies in s, in O(log n).
func (s Set) Contains(p uint64) bool {
	i, _ := slices.BinarySearchFunc(s.rs, p, func(r Range, p uint64) int {
		if r.Start > p {
			return 1
		}
		return -1
	})
	return i > 0 && s.rs[i-1].Contains(p)
}

// Equal reports whether s and o hold the same points.
func (s Set) Equal(o Set) bool { return slices.Equal(s.rs, o.rs) }

// Union returns the points in s or o.
func (s Set) Union(o Set) Set { return NewSet(append(slices.Clone(s.rs), o.rs...)...) }

// Minus returns the points in s and not in o.
func (s Set) Minus(o Set) Set {
	var out []Range
	j := 0
	for _, r := range s.rs {
		for j < len(o.rs) && !o.rs[j].End.After(r.Start) {
			j++ // o.rs[j] ends before r starts, so before every later range of s too
		}
		cur := r
		for k := j; k < len(o.rs) && cur.End.After(o.rs[k].Start); k++ {
			cut := o.rs[k]
			if cut.Start > cur.Start {
				out = append(out, Range{Start: cur.Start, End: At(cut.Start)})
			}
			if cut.End.IsEnd() || !cur.End.After(cut.End.Point()) {
				cur = Range{} // nothing of r is left
				break
			}
			cur.Start = cut.End.Point()
		}
		if cur.Valid() {
			out = append(out, cur)
		}
	}
	return Set{rs: out}
}

// Intersect returns the points in both s and o.
func (s Set) Intersect(o Set) Set { return s.Minus(s.Minus(o)) }

func (s Set) String() string {
	parts := make([]string, len(s.rs))
	for i, r := range s.rs {
		parts[i] = r.String()
	}
	return "{" + strings.Join(parts, " ") + "}"
}
