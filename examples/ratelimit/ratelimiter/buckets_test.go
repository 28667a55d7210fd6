package ratelimiter

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
)

// clock is a hand-moved clock for buckets.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newBuckets(t *testing.T, rate, burst float64) (*Buckets, *clock) {
	t.Helper()
	b, err := NewBuckets(rate, burst, nil)
	require.NoError(t, err)
	c := &clock{t: time.Unix(1_000_000, 0)}
	b.now = c.now
	return b, c
}

func TestABucketStartsFullAndFillsAtTheRate(t *testing.T) {
	b, c := newBuckets(t, 2, 5)
	assert.Equal(t, 5.0, b.Peek("k"), "a key never taken from is full")
	ok, left, err := b.Take("k", 0)
	require.NoError(t, err)
	assert.True(t, ok, "0 tokens takes 1")
	assert.Equal(t, 4.0, left)
	ok, left, err = b.Take("k", 4)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, 0.0, left)
	ok, left, err = b.Take("k", 1)
	require.NoError(t, err)
	assert.False(t, ok, "an empty bucket refuses")
	assert.Equal(t, 0.0, left)

	c.advance(750 * time.Millisecond) // 1.5 tokens at 2 a second
	ok, left, err = b.Take("k", 2)
	require.NoError(t, err)
	assert.False(t, ok, "all or none: 1.5 tokens do not give 2")
	assert.InDelta(t, 1.5, left, 1e-9, "a refusal takes nothing")
	ok, left, err = b.Take("k", 1)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.InDelta(t, 0.5, left, 1e-9)
	c.advance(time.Hour)
	assert.Equal(t, 5.0, b.Peek("k"), "a bucket fills up to the burst, no further")
	assert.Equal(t, 5.0, b.Peek("other"), "keys have buckets of their own")

	_, _, err = b.Take("k", 6)
	require.ErrorIs(t, err, ErrTooMany, "more than the burst never goes through")
	assert.Equal(t, 5.0, b.Peek("k"))
}

func TestNewBucketsRefusesWhatCannotLimit(t *testing.T) {
	for _, c := range []struct{ rate, burst float64 }{{0, 5}, {-1, 5}, {1, 0.5}, {math.NaN(), 5}, {1, math.NaN()}} {
		_, err := NewBuckets(c.rate, c.burst, nil)
		assert.Error(t, err, "rate %g burst %g", c.rate, c.burst)
	}
}

// keysIn returns n keys whose points r contains, and n it does not.
func keysIn(r client.Range, n int) (in, out []string) {
	for i := 0; len(in) < n || len(out) < n; i++ {
		k := fmt.Sprintf("key-%d", i)
		if r.ContainsKey([]byte(k)) {
			in = append(in, k)
		} else {
			out = append(out, k)
		}
	}
	in, out = in[:n], out[:n]
	return in, out
}

func TestARangeLeavingOrDemotedDropsItsBuckets(t *testing.T) {
	b, c := newBuckets(t, 1, 10)
	half := client.Range{Start: 0, End: client.BoundAt(1 << 63)}
	in, out := keysIn(half, 5)
	takeAll := func() {
		for _, k := range append(append([]string(nil), in...), out...) {
			ok, _, err := b.Take(k, 10)
			require.NoError(t, err)
			require.True(t, ok)
		}
	}
	full := func(keys []string) bool {
		for _, k := range keys {
			if b.Peek(k) != 10 {
				return false
			}
		}
		return true
	}
	ctx := t.Context()
	takeAll()
	require.NoError(t, b.Release(ctx, half))
	assert.True(t, full(in), "a released range's buckets are gone: a later holder starts them full")
	assert.True(t, !full(out) && b.Len() == len(out), "the other keys keep theirs")

	c.advance(time.Minute) // every bucket full again
	takeAll()
	require.NoError(t, b.ChangeRole(ctx, half, client.Grant{Role: client.RolePrimary, Token: 9}))
	assert.False(t, full(in), "a new token for a primary range (a merge) keeps its buckets")
	require.NoError(t, b.ChangeRole(ctx, half, client.Grant{Role: client.RoleSecondary}))
	assert.True(t, full(in), "a demoted range's buckets are gone")
	assert.False(t, full(out))
}

func TestSweepDropsOnlyFullBuckets(t *testing.T) {
	b, c := newBuckets(t, 1, 10)
	for _, k := range []string{"a", "b"} {
		_, _, err := b.Take(k, 10)
		require.NoError(t, err)
	}
	c.advance(5 * time.Second)
	_, _, err := b.Take("b", 5)
	require.NoError(t, err)
	c.advance(5 * time.Second) // a is full again, b holds 5
	b.Sweep()
	assert.Equal(t, 1, b.Len())
	assert.Equal(t, 10.0, b.Peek("a"))
	assert.InDelta(t, 5.0, b.Peek("b"), 1e-9)
	assert.Equal(t, 10*time.Second, b.RefillTime())
}
