package keyspace

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestHashIsXXHash64Seed0(t *testing.T) {
	// Reference values of xxhash64 with seed 0, from the xxHash specification's test vectors.
	assert.Equal(t, uint64(0xef46db3751d8e999), Hash(nil))
	assert.Equal(t, uint64(0xd24ec4f1a98c6e5b), HashString("a"))
	assert.Equal(t, HashString("user:42"), Hash([]byte("user:42")))
}

func TestBoundCompare(t *testing.T) {
	cases := []struct {
		a, b Bound
		want int
	}{
		{At(0), At(0), 0},
		{At(1), At(2), -1},
		{At(math.MaxUint64), End, -1},
		{End, At(math.MaxUint64), 1},
		{End, End, 0},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, c.a.Compare(c.b), "%s vs %s", c.a, c.b)
	}
}

func TestParse(t *testing.T) {
	p, err := ParsePoint("0x8000000000000000")
	require.NoError(t, err)
	assert.Equal(t, uint64(1)<<63, p)
	p, err = ParsePoint(" 42 ")
	require.NoError(t, err)
	assert.Equal(t, uint64(42), p)
	b, err := ParseBound("END")
	require.NoError(t, err)
	assert.True(t, b.IsEnd())
	for _, bad := range []string{"", "0x", "0x1ffffffffffffffff", "-1", "12ab", "18446744073709551616"} {
		_, err := ParsePoint(bad)
		assert.ErrorIs(t, err, ErrParse, "input %q", bad)
	}
	for _, p := range []uint64{0, 1, 1 << 63, math.MaxUint64} {
		got, err := ParsePoint(FormatPoint(p))
		require.NoError(t, err)
		assert.Equal(t, p, got)
	}
}

func TestRangeContainsAndSize(t *testing.T) {
	full := Full()
	assert.True(t, full.Valid())
	assert.True(t, full.Contains(0))
	assert.True(t, full.Contains(math.MaxUint64))
	n, isFull := full.Size()
	assert.True(t, isFull)
	assert.Zero(t, n)
	assert.Equal(t, math.Exp2(64), full.Width())
	assert.Equal(t, 1.0, full.Fraction())

	top := Range{Start: math.MaxUint64, End: End}
	assert.True(t, top.Contains(math.MaxUint64))
	n, _ = top.Size()
	assert.Equal(t, uint64(1), n)
	_, ok := top.Midpoint()
	assert.False(t, ok, "a one-point range cannot be split")

	r := Range{Start: 10, End: At(20)}
	assert.True(t, r.Contains(10))
	assert.True(t, r.Contains(19))
	assert.False(t, r.Contains(20))
	assert.False(t, r.Contains(9))
	assert.False(t, Range{Start: 5, End: At(5)}.Valid())
}

func TestRangeSplit(t *testing.T) {
	r := Range{Start: 10, End: End}
	lo, hi, err := r.Split(11)
	require.NoError(t, err)
	assert.Equal(t, Range{Start: 10, End: At(11)}, lo)
	assert.Equal(t, Range{Start: 11, End: End}, hi)

	for _, at := range []uint64{10, 9, 0} {
		_, _, err := r.Split(at)
		assert.Error(t, err, "split at %d", at)
	}
	_, _, err = Range{Start: 10, End: At(20)}.Split(20)
	assert.Error(t, err)

	mid, ok := Full().Midpoint()
	require.True(t, ok)
	assert.Equal(t, uint64(1)<<63, mid)
	mid, ok = Range{Start: 10, End: At(13)}.Midpoint()
	require.True(t, ok)
	assert.Equal(t, uint64(11), mid)
}

func TestRangeIntersect(t *testing.T) {
	a := Range{Start: 10, End: At(20)}
	got, ok := a.Intersect(Range{Start: 15, End: End})
	require.True(t, ok)
	assert.Equal(t, Range{Start: 15, End: At(20)}, got)
	_, ok = a.Intersect(Range{Start: 20, End: At(30)})
	assert.False(t, ok, "half-open ranges that touch do not overlap")
	assert.True(t, Full().Overlaps(a))
}

func TestEqualPartitionsTheSpace(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 5000).Draw(t, "n")
		rs := Equal(n)
		if len(rs) != n {
			t.Fatalf("got %d ranges, want %d", len(rs), n)
		}
		if rs[0].Start != 0 || !rs[n-1].End.IsEnd() {
			t.Fatalf("ranges do not cover the space: first %s last %s", rs[0], rs[n-1])
		}
		var minSize, maxSize uint64 = math.MaxUint64, 0
		for i, r := range rs {
			if !r.Valid() {
				t.Fatalf("range %d %s is empty", i, r)
			}
			if i > 0 && rs[i-1].End.Compare(At(r.Start)) != 0 {
				t.Fatalf("gap or overlap between %s and %s", rs[i-1], r)
			}
			if size, full := r.Size(); !full {
				minSize, maxSize = min(minSize, size), max(maxSize, size)
			}
		}
		if n > 1 && maxSize-minSize > 1 {
			t.Fatalf("sizes differ by %d points", maxSize-minSize)
		}
	})
	assert.Nil(t, Equal(0))
}
