package keyspace

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// probes are the points a set test looks at: the low points its ranges are drawn from, and
// the top of the space, where End matters.
var probes = []uint64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, math.MaxUint64 - 1, math.MaxUint64}

func drawBound(t *rapid.T, label string) Bound {
	return rapid.SampledFrom([]Bound{At(0), At(1), At(2), At(3), At(5), At(7), At(8), At(10),
		At(math.MaxUint64), End}).Draw(t, label)
}

func drawSet(t *rapid.T, label string) (Set, func(uint64) bool) {
	var rs []Range
	for range rapid.IntRange(0, 5).Draw(t, label+"-n") {
		start := drawBound(t, label+"-start")
		if start.IsEnd() {
			continue
		}
		rs = append(rs, Range{Start: start.Point(), End: drawBound(t, label+"-end")})
	}
	in := func(p uint64) bool {
		for _, r := range rs {
			if r.Valid() && r.Contains(p) {
				return true
			}
		}
		return false
	}
	return NewSet(rs...), in
}

func checkNormal(t *rapid.T, s Set) {
	for i, r := range s.Ranges() {
		if !r.Valid() {
			t.Fatalf("range %d %s is empty", i, r)
		}
		if i > 0 && s.Ranges()[i-1].End.Compare(At(r.Start)) >= 0 {
			t.Fatalf("ranges %d and %d overlap or touch: %s", i-1, i, s)
		}
	}
}

func TestSetOperationsMatchPointwiseModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, inA := drawSet(t, "a")
		b, inB := drawSet(t, "b")
		ops := map[string]struct {
			got  Set
			want func(p uint64) bool
		}{
			"a":       {a, inA},
			"a|b":     {a.Union(b), func(p uint64) bool { return inA(p) || inB(p) }},
			"a-b":     {a.Minus(b), func(p uint64) bool { return inA(p) && !inB(p) }},
			"a&b":     {a.Intersect(b), func(p uint64) bool { return inA(p) && inB(p) }},
			"(a-b)|b": {a.Minus(b).Union(b), func(p uint64) bool { return inA(p) || inB(p) }},
		}
		for name, op := range ops {
			checkNormal(t, op.got)
			for _, p := range probes {
				if op.got.Contains(p) != op.want(p) {
					t.Fatalf("%s = %s: Contains(%d) = %v, want %v", name, op.got, p, op.got.Contains(p), op.want(p))
				}
			}
		}
		// Normal form makes equality of points equality of sets.
		if !a.Union(b).Equal(b.Union(a)) {
			t.Fatalf("union is not commutative: %s vs %s", a.Union(b), b.Union(a))
		}
	})
}

func TestSetExamples(t *testing.T) {
	s := NewSet(Range{Start: 5, End: At(8)}, Range{Start: 0, End: At(5)}, Range{Start: 10, End: End})
	require.Equal(t, []Range{{Start: 0, End: At(8)}, {Start: 10, End: End}}, s.Ranges())
	assert.Equal(t, "{[0x0000000000000000, 0x0000000000000008) [0x000000000000000a, end)}", s.String())

	hole := s.Minus(NewSet(Range{Start: 2, End: At(3)}, Range{Start: 12, End: At(math.MaxUint64)}))
	assert.Equal(t, []Range{{Start: 0, End: At(2)}, {Start: 3, End: At(8)}, {Start: 10, End: At(12)},
		{Start: math.MaxUint64, End: End}}, hole.Ranges())
	assert.True(t, NewSet(Full()).Minus(NewSet(Full())).Empty())
	assert.True(t, Set{}.Union(Set{}).Empty())
	assert.False(t, NewSet(Range{Start: 3, End: At(3)}).Contains(3), "an empty range adds nothing")
}
