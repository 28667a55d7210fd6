package load

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/assignment/assignmenttest"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

func quarters(t *testing.T, reps ...[]assignment.NodeID) *assignment.Assignment {
	t.Helper()
	a, err := assignment.Uniform(4, func(i int) []assignment.NodeID { return reps[i] })
	require.NoError(t, err)
	return a
}

func ids(s ...string) []assignment.NodeID {
	out := make([]assignment.NodeID, len(s))
	for i, x := range s {
		out[i] = assignment.NodeID(x)
	}
	return out
}

func TestProjectSpreadsStaleRangesByOverlap(t *testing.T) {
	a := quarters(t, ids("a"), ids("a"), ids("b"), ids("b"))
	q := keyspace.Equal(4)
	samples := []Sample{
		// Exactly the second slice.
		{Range: q[1], Load: 5, Keys: 50},
		// The old first half of the space, before it was split in two: half to each quarter.
		{Range: keyspace.Range{Start: 0, End: keyspace.At(1 << 63)}, Load: 8, Keys: 80},
		// An eighth straddling slices 2 and 3: a quarter of it lands in 2, three quarters in 3.
		{Range: keyspace.Range{Start: 3<<62 - 1<<59, End: keyspace.At(3<<62 + 3<<59)}, Load: 4, Keys: 0},
	}
	loads, keys, err := Project(a, samples)
	require.NoError(t, err)
	assert.InDeltaSlice(t, []float64{4, 9, 1, 3}, loads, 1e-9)
	assert.InDeltaSlice(t, []float64{40, 90, 0, 0}, keys, 1e-9)
}

func TestProjectRejectsBadSamples(t *testing.T) {
	a := quarters(t, ids("a"), ids("a"), ids("b"), ids("b"))
	for _, s := range []Sample{
		{Range: keyspace.Full(), Load: -1},
		{Range: keyspace.Full(), Load: math.NaN()},
		{Range: keyspace.Full(), Load: math.Inf(1)},
		{Range: keyspace.Full(), Keys: -3},
		{Range: keyspace.Range{Start: 9, End: keyspace.At(9)}},
	} {
		loads, _, err := Project(a, []Sample{{Range: keyspace.Full(), Load: 1}, s})
		require.ErrorIs(t, err, ErrBadSample, "%+v", s)
		assert.Contains(t, err.Error(), "sample 1")
		assert.Nil(t, loads)
	}
}

func TestProjectConservesLoad(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 50).Draw(t, "slices")
		a, err := assignment.Uniform(n, func(int) []assignment.NodeID { return ids("a") })
		if err != nil {
			t.Fatal(err)
		}
		var samples []Sample
		var total float64
		for range rapid.IntRange(0, 20).Draw(t, "samples") {
			start := rapid.Uint64().Draw(t, "start")
			r := keyspace.Range{Start: start, End: keyspace.End}
			if start < math.MaxUint64 && rapid.Bool().Draw(t, "bounded") {
				r.End = keyspace.At(rapid.Uint64Range(start+1, math.MaxUint64).Draw(t, "end"))
			}
			l := rapid.Float64Range(0, 1000).Draw(t, "load")
			samples = append(samples, Sample{Range: r, Load: l})
			total += l
		}
		loads, _, err := Project(a, samples)
		if err != nil {
			t.Fatal(err)
		}
		var sum float64
		for _, l := range loads {
			sum += l
		}
		if math.Abs(sum-total) > 1e-6*max(1, total) {
			t.Fatalf("projected %v, reported %v", sum, total)
		}
	})
}

func TestNodeLoadsSharesReplicasAndHonoursCapacity(t *testing.T) {
	a := quarters(t, ids("a"), ids("a", "b"), ids("b", "gone"), ids("gone"))
	nodes := assignment.MustNodeSet(assignment.Node{ID: "a"}, assignment.Node{ID: "b", Capacity: 2})
	got := NodeLoads(a, []float64{4, 6, 10, 100}, nodes)
	// a: 4 + 6/2 = 7. b: 6/2 + 10 (the dead replica serves nothing) = 13, over capacity 2.
	// The last slice has no live replica, so its load is counted nowhere.
	assert.InDeltaSlice(t, []float64{7, 6.5}, got, 1e-9)
}

func TestImbalance(t *testing.T) {
	assert.Equal(t, 1.0, Imbalance(nil))
	assert.Equal(t, 1.0, Imbalance([]float64{0, 0}))
	assert.Equal(t, 1.0, Imbalance([]float64{3, 3, 3}))
	assert.InDelta(t, 1.5, Imbalance([]float64{3, 1}), 1e-12)
	assert.InDelta(t, 4.0, Imbalance([]float64{8, 0, 0, 0}), 1e-12)
}

func TestReprojectFollowsSplitsAndMerges(t *testing.T) {
	from := quarters(t, ids("a"), ids("a"), ids("b"), ids("b"))
	halves, err := assignment.Uniform(2, func(int) []assignment.NodeID { return ids("a") })
	require.NoError(t, err)
	got, err := Reproject(from, []float64{1, 2, 3, 4}, halves)
	require.NoError(t, err)
	assert.InDeltaSlice(t, []float64{3, 7}, got, 1e-9)
	back, err := Reproject(halves, got, from)
	require.NoError(t, err)
	assert.InDeltaSlice(t, []float64{1.5, 1.5, 3.5, 3.5}, back, 1e-9, "a half's load spreads evenly over its quarters")

	none, err := Reproject(from, nil, halves)
	require.NoError(t, err)
	assert.Nil(t, none)
	_, err = Reproject(from, []float64{1}, halves)
	assert.ErrorIs(t, err, ErrBadSample)
	_, err = Reproject(from, []float64{1, -1, 0, 0}, halves)
	assert.ErrorIs(t, err, ErrBadSample)
}

func TestReprojectAgreesWithProject(t *testing.T) {
	gen := assignmenttest.Generator(ids("a", "b"), 40, math.MaxUint64)
	rapid.Check(t, func(t *rapid.T) {
		from, to := gen.Draw(t, "from"), gen.Draw(t, "to")
		xs := rapid.SliceOfN(rapid.Float64Range(0, 100), from.Len(), from.Len()).Draw(t, "values")
		got, err := Reproject(from, xs, to)
		if err != nil {
			t.Fatal(err)
		}
		samples := make([]Sample, from.Len())
		for i, s := range from.All() {
			samples[i] = Sample{Range: s.Range, Load: xs[i]}
		}
		want, _, err := Project(to, samples)
		if err != nil {
			t.Fatal(err)
		}
		for j := range want {
			if math.Abs(got[j]-want[j]) > 1e-9*max(1, want[j]) {
				t.Fatalf("slice %d: linear walk %v, by samples %v", j, got[j], want[j])
			}
		}
	})
}
