package client

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// The client's Range answers as the keyspace.Range it stands for, and converts both ways
// without loss.
func TestRangeAgreesWithKeyspace(t *testing.T) {
	const top = 1<<64 - 1
	ranges := []Range{
		FullRange(), {Start: 0, End: BoundAt(1 << 63)}, {Start: 1 << 63, End: EndOfSpace()},
		{Start: top, End: EndOfSpace()}, {Start: 5, End: BoundAt(6)}, {Start: 5, End: BoundAt(5)},
		{Start: 7, End: BoundAt(5)}, {Start: 0, End: BoundAt(top)},
	}
	points := []uint64{0, 4, 5, 6, 1<<63 - 1, 1 << 63, top - 1, top}
	for _, r := range ranges {
		k := r.keyspace()
		require.Equal(t, r, rangeOf(k))
		assert.Equal(t, k.String(), r.String())
		assert.Equal(t, k.Valid(), r.Valid(), "%s", r)
		assert.Equal(t, k.Fraction(), r.Fraction(), "%s", r)
		for _, p := range points {
			assert.Equal(t, k.Contains(p), r.Contains(p), "%s holds %x", r, p)
		}
		for _, o := range ranges {
			want, wantOK := k.Intersect(o.keyspace())
			got, ok := r.Intersect(o)
			assert.Equal(t, wantOK, ok, "%s and %s", r, o)
			assert.Equal(t, rangeOf(want), got, "%s and %s", r, o)
			assert.Equal(t, k.Overlaps(o.keyspace()), r.Overlaps(o), "%s and %s", r, o)
			assert.Equal(t, k.End.Compare(o.End.keyspace()), r.End.Compare(o.End), "%s and %s", r.End, o.End)
			rest := r.Minus(o)
			for _, p := range points {
				in := slices.ContainsFunc(rest, func(x Range) bool { return x.Contains(p) })
				assert.Equal(t, r.Contains(p) && !o.Contains(p), in, "%s minus %s holds %x", r, o, p)
			}
		}
	}
}

func TestBoundText(t *testing.T) {
	for _, b := range []Bound{BoundAt(0), BoundAt(42), BoundAt(1<<64 - 1), EndOfSpace()} {
		text, err := b.MarshalText()
		require.NoError(t, err)
		var got Bound
		require.NoError(t, got.UnmarshalText(text))
		assert.Equal(t, b, got, "%s", text)
	}
	var b Bound
	require.NoError(t, b.UnmarshalText([]byte("17")), "decimal is read too")
	assert.Equal(t, BoundAt(17), b)
	err := b.UnmarshalText([]byte("soon"))
	require.ErrorIs(t, err, keyspace.ErrParse)
	assert.ErrorContains(t, err, "client: ")
	assert.Equal(t, BoundAt(17), b, "a failed read leaves the bound as it was")
	assert.True(t, BoundAt(3).After(2))
	assert.False(t, BoundAt(3).After(3))
	assert.True(t, EndOfSpace().After(1<<64-1))
}

func TestRangeContainsKey(t *testing.T) {
	h := Hash([]byte("user:42"))
	assert.True(t, Range{Start: h, End: BoundAt(h + 1)}.ContainsKey([]byte("user:42")))
	assert.False(t, Range{Start: h + 1, End: EndOfSpace()}.ContainsKey([]byte("user:42")))
}
