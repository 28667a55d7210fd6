package load

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func report(node string, at time.Time, samples ...Sample) Report {
	return Report{Node: assignment.NodeID(node), At: at, Window: time.Second, Samples: samples}
}

func TestEstimatorScalesReplicasAndIgnoresNonHolders(t *testing.T) {
	q := keyspace.Equal(4)
	// Slice 1 is held by a and b; slice 3 by c.
	a := quarters(t, ids("a"), ids("a", "b"), ids("b"), ids("c"))
	e := NewEstimator(EstimatorConfig{})
	require.NoError(t, e.Add(report("a", t0, Sample{Range: q[0], Load: 4, Keys: 40}, Sample{Range: q[1], Load: 3, Keys: 100})))
	// b reports nothing for slice 1 yet; c reports slice 0, which it does not hold (it gave it
	// up, or has not been told yet): that sample must not count.
	require.NoError(t, e.Add(report("c", t0, Sample{Range: q[0], Load: 50}, Sample{Range: q[3], Load: 7, Keys: 70})))
	est := e.Fold(a, t0)
	// Slice 1: a served 3, b did not report, so b is assumed to have served as much.
	assert.InDeltaSlice(t, []float64{4, 6, 0, 7}, est.Loads, 1e-9)
	assert.InDeltaSlice(t, []float64{40, 100, 0, 70}, est.Keys, 1e-9, "each replica holds every key of its slice")
}

func TestEstimatorDecaysByHalfLife(t *testing.T) {
	a := quarters(t, ids("a"), ids("a"), ids("a"), ids("a"))
	e := NewEstimator(EstimatorConfig{HalfLife: 10 * time.Second})
	require.NoError(t, e.Add(report("a", t0, Sample{Range: keyspace.Full(), Load: 8})))
	assert.InDeltaSlice(t, []float64{2, 2, 2, 2}, e.Fold(a, t0).Loads, 1e-9, "the first fold takes the report as it is")

	at := t0.Add(10 * time.Second)
	require.NoError(t, e.Add(report("a", at, Sample{Range: keyspace.Full(), Load: 16})))
	assert.InDeltaSlice(t, []float64{3, 3, 3, 3}, e.Fold(a, at).Loads, 1e-9, "one half-life later, halfway to the new value")

	at = at.Add(20 * time.Second)
	require.NoError(t, e.Add(report("a", at, Sample{Range: keyspace.Full(), Load: 16})))
	assert.InDeltaSlice(t, []float64{3.75, 3.75, 3.75, 3.75}, e.Fold(a, at).Loads, 1e-9, "two half-lives: three quarters of the way")
}

func TestEstimatorKeepsEstimatesWithoutFreshReports(t *testing.T) {
	q := keyspace.Equal(4)
	a := quarters(t, ids("a"), ids("b"), ids("a"), ids("b"))
	e := NewEstimator(EstimatorConfig{HalfLife: time.Second, MinWindow: time.Second})
	require.NoError(t, e.Add(report("a", t0, Sample{Range: q[0], Load: 5}, Sample{Range: q[2], Load: 1})))
	require.NoError(t, e.Add(report("b", t0, Sample{Range: q[1], Load: 9}, Sample{Range: q[3], Load: 2})))
	e.Fold(a, t0)

	// Slice 0 moves from a to b. a's next report still has it (it has not applied the move)
	// and b's does not yet: the slice keeps its estimate, now counted on b.
	moved, err := a.Apply([]assignment.Op{assignment.Assign{Slice: q[0].Start, Replicas: ids("b")}})
	require.NoError(t, err)
	at := t0.Add(time.Second)
	require.NoError(t, e.Add(report("a", at, Sample{Range: q[0], Load: 50}, Sample{Range: q[2], Load: 1})))
	require.NoError(t, e.Add(report("b", at, Sample{Range: q[1], Load: 9}, Sample{Range: q[3], Load: 2})))
	est := e.Fold(moved, at)
	assert.InDelta(t, 5, est.Loads[0], 1e-9)
	assert.InDeltaSlice(t, []float64{1, 16}, NodeLoads(moved, est.Loads, assignment.MustNodeSet(assignment.Node{ID: "a"}, assignment.Node{ID: "b"})), 1e-9, "slice 0 counts on b, its new holder")

	// Reports too old or over too short a window do not count either.
	later := at.Add(time.Hour)
	short := report("b", later, Sample{Range: q[1], Load: 1000})
	short.Window = time.Millisecond
	require.NoError(t, e.Add(short))
	assert.InDelta(t, 9, e.Fold(moved, later).Loads[1], 1e-9)
	e.Forget("b")
	assert.InDelta(t, 9, e.Fold(moved, later.Add(time.Second)).Loads[1], 1e-9)
}

func TestEstimatorFollowsSplitsAndMerges(t *testing.T) {
	a := quarters(t, ids("a"), ids("a"), ids("a"), ids("a"))
	e := NewEstimator(EstimatorConfig{})
	require.NoError(t, e.Add(report("a", t0, Sample{Range: keyspace.Full(), Load: 8}, Sample{Range: keyspace.Full(), Keys: 800})))
	e.Fold(a, t0)
	q := keyspace.Equal(4)
	split, err := a.Apply([]assignment.Op{assignment.Split{Slice: q[1].Start, At: q[1].Start + 1<<61}, assignment.Merge{Left: q[2].Start}})
	require.NoError(t, err)
	e.Forget("a")
	est := e.Fold(split, t0.Add(time.Second))
	assert.InDeltaSlice(t, []float64{2, 1, 1, 4}, est.Loads, 1e-9)
	assert.InDeltaSlice(t, []float64{200, 100, 100, 400}, est.Keys, 1e-9)
}

func TestEstimatorSumsAndScalesHotKeys(t *testing.T) {
	a := quarters(t, ids("a", "b"), ids("a"), ids("a"), ids("a"))
	e := NewEstimator(EstimatorConfig{})
	r := report("a", t0, Sample{Range: keyspace.Equal(4)[0], Load: 10})
	r.HotKeys = []HotKey{{Hash: 7, Load: 6}, {Hash: 9, Load: 1}, {Hash: 1 << 62, Load: 2}}
	require.NoError(t, e.Add(r))
	est := e.Fold(a, t0)
	// Slice 0 has two replicas and only a reported: its keys' loads are doubled.
	assert.Equal(t, []HotKey{{Hash: 7, Load: 12}, {Hash: 9, Load: 2}}, est.HotKeys[0])
	assert.Empty(t, est.HotKeys[1], "slice 1 had no fresh sample, so no fresh hot keys")
}

func TestEstimatorRefusesBadReportsWhole(t *testing.T) {
	a := quarters(t, ids("a"), ids("a"), ids("a"), ids("a"))
	e := NewEstimator(EstimatorConfig{})
	good := report("a", t0, Sample{Range: keyspace.Full(), Load: 4})
	require.NoError(t, e.Add(good))
	for _, bad := range []Report{
		report("a", t0, Sample{Range: keyspace.Full(), Load: math.NaN()}),
		report("a", t0, Sample{Range: keyspace.Full(), Load: 1}, Sample{Range: keyspace.Full(), Load: -1}),
		{Node: "a", At: t0, Window: 0},
		{Node: "a b", At: t0, Window: time.Second},
		{Node: "a", At: t0, Window: time.Second, HotKeys: []HotKey{{Load: math.Inf(1)}}},
	} {
		assert.ErrorIs(t, e.Add(bad), ErrBadReport)
	}
	assert.InDeltaSlice(t, []float64{1, 1, 1, 1}, e.Fold(a, t0).Loads, 1e-9, "the good report still stands")
}
