// Package keyspace holds the 64-bit hash space that Sliceplane shards: how application keys map
// to points of the space, and half-open ranges of it.
//
// The space is [0, 2^64). Its end, 2^64, does not fit in a uint64, yet the last slice of every
// assignment must say that it reaches it; Bound carries the end as a distinct value so that no
// range ever has to pretend that 2^64-1 is exclusive.
package keyspace

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Hash returns the point of the space that key maps to: xxhash64 with seed 0. Hashing spreads
// neighbouring keys apart, so a hot prefix does not land in one slice.
func Hash(key []byte) uint64 { return xxhash.Sum64(key) }

// HashString is Hash for a string key, without copying it.
func HashString(key string) uint64 { return xxhash.Sum64String(key) }

// Bound is a boundary of a range: a point of the space, or End.
// The zero value is the point 0, the start of the space.
type Bound struct {
	point uint64
	end   bool
}

// End is the exclusive end of the space, 2^64.
var End = Bound{end: true}

// At returns the bound at point p.
func At(p uint64) Bound { return Bound{point: p} }

// IsEnd reports whether b is the end of the space.
func (b Bound) IsEnd() bool { return b.end }

// Point returns the point of b. It is only meaningful when !b.IsEnd().
func (b Bound) Point() uint64 { return b.point }

// Compare returns -1, 0 or +1 as b is before, equal to or after c.
func (b Bound) Compare(c Bound) int {
	switch {
	case b.end && c.end:
		return 0
	case b.end:
		return 1
	case c.end:
		return -1
	case b.point < c.point:
		return -1
	case b.point > c.point:
		return 1
	}
	return 0
}

// After reports whether the bound lies strictly after point p.
func (b Bound) After(p uint64) bool { return b.end || b.point > p }

// String formats b as FormatPoint does, or as "end".
func (b Bound) String() string {
	if b.end {
		return "end"
	}
	return FormatPoint(b.point)
}

// FormatPoint formats a point as 0x followed by 16 hex digits, so that points sort as text.
func FormatPoint(p uint64) string { return fmt.Sprintf("0x%016x", p) }

// ErrParse is returned for text that is not a point or bound.
var ErrParse = errors.New("keyspace: not a point of the hash space")

// ParsePoint parses a point written as 0x-prefixed hex (as FormatPoint writes it) or decimal.
func ParsePoint(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	var (
		p   uint64
		err error
	)
	if rest, ok := strings.CutPrefix(strings.ToLower(t), "0x"); ok {
		p, err = strconv.ParseUint(rest, 16, 64)
	} else {
		p, err = strconv.ParseUint(t, 10, 64)
	}
	if err != nil {
		return 0, fmt.Errorf("%w: %q (want 0x-prefixed hex or decimal below 2^64)", ErrParse, s)
	}
	return p, nil
}

// ParseBound parses a point as ParsePoint does, or "end".
func ParseBound(s string) (Bound, error) {
	if strings.EqualFold(strings.TrimSpace(s), "end") {
		return End, nil
	}
	p, err := ParsePoint(s)
	if err != nil {
		return Bound{}, err
	}
	return At(p), nil
}

// Range is the half-open interval [Start, End) of the space. A valid range is not empty.
type Range struct {
	Start uint64
	End   Bound
}

// Full returns the whole space.
func Full() Range { return Range{Start: 0, End: End} }

// Valid reports whether r holds at least one point.
func (r Range) Valid() bool { return r.End.After(r.Start) }

// Contains reports whether point p lies in r.
func (r Range) Contains(p uint64) bool { return p >= r.Start && r.End.After(p) }

// Size returns the number of points in r. The whole space has 2^64 points, which does not fit
// in a uint64; Size reports it as full=true with n=0.
func (r Range) Size() (n uint64, full bool) {
	if r.End.end {
		if r.Start == 0 {
			return 0, true
		}
		return -r.Start, false // 2^64 - Start, computed modulo 2^64
	}
	return r.End.point - r.Start, false
}

// Width returns the number of points in r as a float64, for proportions of the space.
func (r Range) Width() float64 {
	n, full := r.Size()
	if full {
		return math.Exp2(64)
	}
	return float64(n)
}

// Fraction returns the share of the whole space that r covers.
func (r Range) Fraction() float64 { return r.Width() / math.Exp2(64) }

// Midpoint returns the point that splits r into two halves of equal size (the upper half is
// one point larger when the size is odd). It returns false when r has fewer than two points
// and so cannot be split.
func (r Range) Midpoint() (uint64, bool) {
	n, full := r.Size()
	if full {
		return 1 << 63, true
	}
	if n < 2 {
		return 0, false
	}
	return r.Start + n/2, true
}

// Split divides r at point at into [Start, at) and [at, End). It fails unless at lies strictly
// inside r, since both halves must be non-empty.
func (r Range) Split(at uint64) (lo, hi Range, err error) {
	if at <= r.Start || !r.End.After(at) {
		return Range{}, Range{}, fmt.Errorf("keyspace: split point %s is not strictly inside %s", FormatPoint(at), r)
	}
	return Range{Start: r.Start, End: At(at)}, Range{Start: at, End: r.End}, nil
}

// Intersect returns the overlap of r and o, and whether they overlap at all.
func (r Range) Intersect(o Range) (Range, bool) {
	out := Range{Start: max(r.Start, o.Start), End: r.End}
	if o.End.Compare(r.End) < 0 {
		out.End = o.End
	}
	return out, out.Valid()
}

// Overlaps reports whether r and o share at least one point.
func (r Range) Overlaps(o Range) bool {
	_, ok := r.Intersect(o)
	return ok
}

// String formats r as [start, end).
func (r Range) String() string { return "[" + FormatPoint(r.Start) + ", " + r.End.String() + ")" }

// Equal divides the whole space into n contiguous ranges whose sizes differ by at most one
// point, in order. It returns nil for n < 1.
func Equal(n int) []Range {
	if n < 1 {
		return nil
	}
	out := make([]Range, n)
	for i := range n {
		out[i] = Range{Start: Boundary(i, n), End: End}
		if i > 0 {
			out[i-1].End = At(out[i].Start)
		}
	}
	return out
}

// Boundary returns the start of the i-th of n equal parts of the space, floor(i * 2^64 / n),
// for 0 <= i < n.
func Boundary(i, n int) uint64 {
	q, _ := bits.Div64(uint64(i), 0, uint64(n)) // (i<<64)/n; cannot overflow since i < n
	return q
}

// QuoteMax is how many bytes of a client's string an error quotes.
const QuoteMax = 64

// Quote quotes s for an error message, cut to its first QuoteMax bytes (then "..."), so that
// an error never echoes unbounded input back.
func Quote(s string) string {
	if len(s) <= QuoteMax {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:QuoteMax]) + "..."
}
