package client

import (
	"fmt"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// Hash returns the point of the 64-bit hash space an item's key maps to: its xxhash64 with
// seed 0. Items are placed by this hash, so neighbouring keys land in unrelated slices.
func Hash(key []byte) uint64 { return keyspace.Hash(key) }

// Bound is the exclusive end of a Range: a point of the hash space, or the end of the space,
// 2^64, which does not fit in a uint64 yet is where the last slice of every map ends. The
// zero Bound is the point 0. Bounds compare with ==.
type Bound struct {
	point uint64
	end   bool
}

// BoundAt returns the bound at point p.
func BoundAt(p uint64) Bound { return Bound{point: p} }

// EndOfSpace returns the bound past the last point of the space, 2^64.
func EndOfSpace() Bound { return Bound{end: true} }

// IsEnd reports whether b is the end of the space.
func (b Bound) IsEnd() bool { return b.end }

// Point returns the point of b; it is 0, and means nothing, when b.IsEnd().
func (b Bound) Point() uint64 { return b.point }

// Compare returns -1, 0 or +1 as b is before, equal to or after c.
func (b Bound) Compare(c Bound) int { return b.keyspace().Compare(c.keyspace()) }

// After reports whether b lies strictly after point p: whether a range ending at b holds p,
// as far as its end is concerned.
func (b Bound) After(p uint64) bool { return b.end || b.point > p }

// String formats b as 0x and 16 hex digits (so that bounds sort as text), or as "end".
func (b Bound) String() string { return b.keyspace().String() }

// MarshalText writes b as String does.
func (b Bound) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText reads a bound written by MarshalText, a point in decimal, or "end".
func (b *Bound) UnmarshalText(text []byte) error {
	k, err := keyspace.ParseBound(string(text))
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	*b = boundOf(k)
	return nil
}

// Range is a slice of the hash space: the half-open interval [Start, End), where End is a
// point (BoundAt) or the end of the space (EndOfSpace). A node holds an item when the Hash
// of its key lies in one of its slices. A valid Range holds at least one point. Ranges
// compare with ==.
type Range struct {
	Start uint64
	End   Bound
}

// FullRange returns the whole space, [0, 2^64).
func FullRange() Range { return Range{End: EndOfSpace()} }

// Valid reports whether r holds at least one point.
func (r Range) Valid() bool { return r.End.After(r.Start) }

// Contains reports whether point h, typically the Hash of a key, lies in r.
func (r Range) Contains(h uint64) bool { return h >= r.Start && r.End.After(h) }

// ContainsKey reports whether the item with this key belongs to r.
func (r Range) ContainsKey(key []byte) bool { return r.Contains(Hash(key)) }

// Fraction returns the share of the whole space that r covers, from 0 to 1: with keys
// spread evenly by the hash, the expected share of the items too.
func (r Range) Fraction() float64 { return r.keyspace().Fraction() }

// Intersect returns the points that r and o share, and whether there is any.
func (r Range) Intersect(o Range) (Range, bool) {
	in, ok := r.keyspace().Intersect(o.keyspace())
	return rangeOf(in), ok
}

// Overlaps reports whether r and o share at least one point.
func (r Range) Overlaps(o Range) bool { return r.keyspace().Overlaps(o.keyspace()) }

// Minus returns the parts of r outside o, in order: none, one or two ranges.
func (r Range) Minus(o Range) []Range {
	var out []Range
	for _, k := range keyspace.NewSet(r.keyspace()).Minus(keyspace.NewSet(o.keyspace())).Ranges() {
		out = append(out, rangeOf(k))
	}
	return out
}

// String formats r as [start, end), its bounds as Bound.String writes them.
func (r Range) String() string { return r.keyspace().String() }

// The client's types mirror those of package keyspace, which the rest of Sliceplane uses, so
// that its internals can change without changing this package's API. These convert.

func (b Bound) keyspace() keyspace.Bound {
	if b.end {
		return keyspace.End
	}
	return keyspace.At(b.point)
}

func boundOf(k keyspace.Bound) Bound {
	if k.IsEnd() {
		return EndOfSpace()
	}
	return BoundAt(k.Point())
}

func (r Range) keyspace() keyspace.Range {
	return keyspace.Range{Start: r.Start, End: r.End.keyspace()}
}

func rangeOf(k keyspace.Range) Range { return Range{Start: k.Start, End: boundOf(k.End)} }
