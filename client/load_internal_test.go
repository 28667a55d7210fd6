package client

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/sliceplane/sliceplane/internal/load"
)

// rng returns the range [start, end).
func rng(start, end uint64) Range { return Range{Start: start, End: BoundAt(end)} }

// rngEnd returns the range [start, 2^64).
func rngEnd(start uint64) Range { return Range{Start: start, End: EndOfSpace()} }

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// sampleLoads returns the loads of a report's samples, and checks that the samples are the
// slices counted, in order.
func sampleLoads(t *testing.T, r load.Report, want []Range) []float64 {
	t.Helper()
	var got []Range
	var loads []float64
	for _, s := range r.Samples {
		got = append(got, rangeOf(s.Range))
		loads = append(loads, s.Load)
	}
	require.Equal(t, want, got, "one sample per slice counted, in order")
	return loads
}

func TestLoadCounterRecordsIntoTheSliceHoldingTheHash(t *testing.T) {
	list := []Range{rng(0, 100), rng(100, 200), rngEnd(300)}
	c := newLoadCounter(16, t0)
	c.setSlices(list)
	// The bounds of each slice: the start is in, the end is out.
	c.record(0, 1)
	c.record(99, 2)
	c.record(100, 4)
	c.record(199, 8)
	c.record(300, 16)
	c.record(math.MaxUint64, 32)
	r := c.take("n1", t0.Add(time.Second))
	assert.Equal(t, []float64{3, 12, 48}, sampleLoads(t, r, list))
}

func TestLoadCounterIgnoresLoadOutsideItsSlices(t *testing.T) {
	list := []Range{rng(10, 100), rng(100, 200), rng(300, 400)}
	c := newLoadCounter(16, t0)
	c.setSlices(list)
	for _, h := range []uint64{0, 9, 200, 250, 299, 400, math.MaxUint64} {
		c.record(h, 1000)
	}
	c.record(150, 1)
	r := c.take("n1", t0.Add(time.Second))
	assert.Equal(t, []float64{0, 1, 0}, sampleLoads(t, r, list))
	assert.Equal(t, []load.HotKey{{Hash: 150, Load: 1}}, r.HotKeys, "load not counted is no hot key either")

	// A node that holds nothing counts nothing.
	empty := newLoadCounter(16, t0)
	empty.record(5, 1)
	r = empty.take("n1", t0.Add(time.Second))
	assert.Empty(t, r.Samples)
	assert.Empty(t, r.HotKeys)
}

func TestLoadCounterSetSlicesKeepsTheLoadOfSlicesThatStay(t *testing.T) {
	c := newLoadCounter(16, t0)
	c.setSlices([]Range{rng(0, 100), rng(100, 200), rng(200, 300), rngEnd(1000)})
	c.record(50, 1)   // [0, 100): stays
	c.record(150, 2)  // [100, 200): split
	c.record(250, 4)  // [200, 300): dropped
	c.record(2000, 8) // [1000, end): stays
	next := []Range{rng(0, 100), rng(100, 150), rng(150, 200), rng(500, 600), rngEnd(1000)}
	c.setSlices(next)
	assert.Equal(t, next, c.slices())
	// The counter holds its own copy of the list.
	next[0] = rng(1, 2)
	assert.Equal(t, rng(0, 100), c.slices()[0])

	c.record(120, 16) // the new slices count from 0
	c.record(550, 32)
	r := c.take("n1", t0.Add(time.Second))
	assert.Equal(t, []float64{1, 16, 0, 32, 8}, sampleLoads(t, r, c.slices()))

	// slices returns a copy.
	got := c.slices()
	got[0] = rng(7, 8)
	assert.Equal(t, rng(0, 100), c.slices()[0])
}

func TestLoadCounterTakeReturnsTheWindowAndResets(t *testing.T) {
	list := []Range{rng(0, 100), rngEnd(100)}
	c := newLoadCounter(4, t0)
	c.setSlices(list)
	c.record(1, 2)
	c.record(200, 3)

	t1 := t0.Add(3 * time.Second)
	r := c.take("node-a", t1)
	assert.Equal(t, "node-a", string(r.Node))
	assert.Equal(t, t1, r.At)
	assert.Equal(t, 3*time.Second, r.Window)
	assert.Equal(t, []float64{2, 3}, sampleLoads(t, r, list))
	assert.Len(t, r.HotKeys, 2)

	// The next window starts where the last one ended, with nothing counted.
	t2 := t1.Add(1500 * time.Millisecond)
	r = c.take("node-a", t2)
	assert.Equal(t, 1500*time.Millisecond, r.Window)
	assert.Equal(t, []float64{0, 0}, sampleLoads(t, r, list))
	assert.Empty(t, r.HotKeys)

	c.record(201, 5)
	r = c.take("node-a", t2.Add(time.Second))
	assert.Equal(t, []float64{0, 5}, sampleLoads(t, r, list))
	assert.Equal(t, []load.HotKey{{Hash: 201, Load: 5}}, r.HotKeys)
}

func TestLoadCounterTakeSortsHotKeysByLoad(t *testing.T) {
	c := newLoadCounter(8, t0)
	c.setSlices([]Range{FullRange()})
	for _, k := range []load.HotKey{{Hash: 1, Load: 1}, {Hash: 2, Load: 5}, {Hash: 3, Load: 3}, {Hash: 4, Load: 4}, {Hash: 5, Load: 2}} {
		c.record(k.Hash, k.Load)
	}
	c.record(1, 9) // key 1 overtakes the others
	r := c.take("n1", t0.Add(time.Second))
	assert.Equal(t, []load.HotKey{{Hash: 1, Load: 10}, {Hash: 2, Load: 5}, {Hash: 4, Load: 4}, {Hash: 3, Load: 3}, {Hash: 5, Load: 2}}, r.HotKeys)
}

func TestLoadCounterWithoutHotKeys(t *testing.T) {
	c := newLoadCounter(0, t0)
	c.setSlices([]Range{FullRange()})
	c.record(1, 1)
	c.record(2, 2)
	r := c.take("n1", t0.Add(time.Second))
	assert.Equal(t, []float64{3}, sampleLoads(t, r, []Range{FullRange()}))
	assert.Empty(t, r.HotKeys)
}

// TestLoadCounterMisraGries checks the guarantees of the hot key summary against exact counts:
// with k counters, at most k keys are reported; a reported load is never more than the true
// one, and never less by more than W/(k+1) (W the total); so every key with more than W/(k+1),
// and a fortiori every key with more than 1/k of the total, is reported. The hot keys come
// sorted by load, heaviest first.
func TestLoadCounterMisraGries(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.IntRange(1, 8).Draw(t, "k")
		keys := rapid.IntRange(1, 30).Draw(t, "keys")
		// A few heavy keys among light ones, so that the interesting case comes up often.
		heavy := rapid.SliceOfN(rapid.IntRange(0, keys-1), 0, 3).Draw(t, "heavy")
		n := rapid.IntRange(0, 300).Draw(t, "n")
		c := newLoadCounter(k, t0)
		c.setSlices([]Range{FullRange()})
		truth := map[uint64]float64{}
		var total float64
		for range n {
			var key int
			if len(heavy) > 0 && rapid.Bool().Draw(t, "pick heavy") {
				key = heavy[rapid.IntRange(0, len(heavy)-1).Draw(t, "heavy key")]
			} else {
				key = rapid.IntRange(0, keys-1).Draw(t, "key")
			}
			// Integer costs: float sums stay exact, so the bounds can be checked exactly.
			cost := float64(rapid.IntRange(1, 10).Draw(t, "cost"))
			h := Hash([]byte{byte(key)}) // spread over the space
			c.record(h, cost)
			truth[h] += cost
			total += cost
		}
		r := c.take("n1", t0.Add(time.Second))
		if len(r.HotKeys) > k {
			t.Fatalf("%d hot keys reported with %d counters", len(r.HotKeys), k)
		}
		if !slices.IsSortedFunc(r.HotKeys, func(a, b load.HotKey) int {
			switch {
			case a.Load > b.Load:
				return -1
			case a.Load < b.Load:
				return 1
			}
			return 0
		}) {
			t.Fatalf("hot keys not sorted by load, heaviest first: %v", r.HotKeys)
		}
		reported := map[uint64]float64{}
		for _, hk := range r.HotKeys {
			if _, dup := reported[hk.Hash]; dup {
				t.Fatalf("key %x reported twice: %v", hk.Hash, r.HotKeys)
			}
			reported[hk.Hash] = hk.Load
			if hk.Load <= 0 || hk.Load > truth[hk.Hash] {
				t.Fatalf("key %x reported with load %v, true load %v", hk.Hash, hk.Load, truth[hk.Hash])
			}
		}
		for h, v := range truth {
			got := reported[h] // 0 if not reported
			if (v-got)*float64(k+1) > total {
				t.Fatalf("key %x: true load %v, reported %v: off by more than W/(k+1) = %v/%d", h, v, got, total, k+1)
			}
			if v*float64(k) > total && got == 0 {
				t.Fatalf("key %x has %v of %v, more than 1/%d, and is not reported: %v", h, v, total, k, r.HotKeys)
			}
		}
	})
}
