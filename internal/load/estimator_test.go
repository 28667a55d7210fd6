package load

import (
	"math"
	"math/rand/v2"
	"slices"
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
	e := NewEstimator(EstimatorConfig{Forecast: ForecastEWMA, HalfLife: 10 * time.Second})
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

// feed reports load on the whole space from node a once a second, from t0 on, folding after
// each report, and returns the forecasts of the first slice.
func feed(t *testing.T, e *Estimator, a *assignment.Assignment, loads ...float64) []float64 {
	t.Helper()
	out := make([]float64, len(loads))
	for i, l := range loads {
		at := t0.Add(time.Duration(i) * time.Second)
		require.NoError(t, e.Add(report("a", at, Sample{Range: keyspace.Full(), Load: 4 * l})))
		out[i] = e.Fold(a, at).Loads[0]
	}
	return out
}

func repeat(x float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = x
	}
	return out
}

func everyForecast() []EstimatorConfig {
	var out []EstimatorConfig
	for _, f := range Forecasts {
		out = append(out, EstimatorConfig{Forecast: f, HalfLife: 3 * time.Second})
	}
	return out
}

func TestForecastsTrackAConstantLoadExactly(t *testing.T) {
	a := quarters(t, ids("a"), ids("a"), ids("a"), ids("a"))
	for _, cfg := range everyForecast() {
		got := feed(t, NewEstimator(cfg), a, repeat(5, 20)...)
		assert.Equal(t, repeat(5, 20), got, "%s: the first report is taken as it is, and nothing moves after", cfg.Forecast)
	}
}

func TestForecastsFollowAStepWithinTheirHorizon(t *testing.T) {
	a := quarters(t, ids("a"), ids("a"), ids("a"), ids("a"))
	loads := append(repeat(10, 10), repeat(20, 30)...)
	// Within 5% of the new load after: EWMA, about 4.3 half-lives (3 s each); Holt
	// overshoots along its new trend, then settles; the peak and, after a quiet spell, the
	// adaptive forecast (every error so far on one side), at once.
	within := map[Forecast]int{ForecastEWMA: 13, ForecastPeak: 0, ForecastHolt: 20, ForecastAdaptive: 0}
	for _, cfg := range everyForecast() {
		got := feed(t, NewEstimator(cfg), a, loads...)
		for i := 10 + within[cfg.Forecast]; i < len(loads); i++ {
			require.InDelta(t, 20, got[i], 1, "%s: %d s after the step", cfg.Forecast, i-10)
		}
		if cfg.Forecast == ForecastEWMA {
			assert.InDelta(t, 10+10*(1-math.Exp2(-1.0/3)), got[10], 1e-9, "a third of a half-life of the way")
		}
	}
}

func TestForecastAdaptiveSmoothsNoise(t *testing.T) {
	a := quarters(t, ids("a"), ids("a"), ids("a"), ids("a"))
	var loads []float64
	for i := range 40 {
		loads = append(loads, 10+float64(i%2*2-1)) // 9, 11, 9, 11...
	}
	got := feed(t, NewEstimator(EstimatorConfig{}), a, loads...)
	for _, f := range got[20:] {
		assert.InDelta(t, 10, f, 0.5, "alternating errors keep the tracking signal low")
	}
}

func TestForecastHoltFollowsARamp(t *testing.T) {
	a := quarters(t, ids("a"), ids("a"), ids("a"), ids("a"))
	var loads []float64
	for i := range 60 {
		loads = append(loads, 10+float64(i))
	}
	got := feed(t, NewEstimator(EstimatorConfig{Forecast: ForecastHolt, HalfLife: 2 * time.Second}), a, loads...)
	assert.InDelta(t, 70, got[59], 0.5, "one step ahead of the ramp")
	ewma := feed(t, NewEstimator(EstimatorConfig{Forecast: ForecastEWMA, HalfLife: 2 * time.Second}), a, loads...)
	assert.Less(t, ewma[59], 68.0, "an average lags a ramp")
}

func TestForecastPeakHoldsThePeak(t *testing.T) {
	a := quarters(t, ids("a"), ids("a"), ids("a"), ids("a"))
	loads := []float64{10, 40, 10, 10}
	got := feed(t, NewEstimator(EstimatorConfig{Forecast: ForecastPeak, HalfLife: 10 * time.Second, PeakHalfLife: time.Second}), a, loads...)
	level := feed(t, NewEstimator(EstimatorConfig{Forecast: ForecastEWMA, HalfLife: 10 * time.Second}), a, loads...)
	assert.InDeltaSlice(t, []float64{10, 40, 20}, got[:3], 1e-9, "the peak halves each second")
	assert.InDelta(t, level[3], got[3], 1e-9, "until the level is higher")
	assert.Greater(t, level[3], 10.0)
}

func TestForecastStateFollowsSplits(t *testing.T) {
	a := quarters(t, ids("a"), ids("a"), ids("a"), ids("a"))
	e := NewEstimator(EstimatorConfig{Forecast: ForecastHolt, HalfLife: time.Second})
	feed(t, e, a, 10, 20, 30, 40) // a trend of +10/s over the whole space: 2.5/s a slice
	q := keyspace.Equal(4)
	split, err := a.Apply([]assignment.Op{assignment.Split{Slice: q[1].Start, At: q[1].Start + 1<<61}})
	require.NoError(t, err)
	before := e.Fold(a, t0.Add(3*time.Second)).Loads
	after := e.Fold(split, t0.Add(3*time.Second)).Loads
	assert.InDelta(t, before[1]/2, after[1], 1e-9, "level and trend both split by overlap")
	assert.InDelta(t, before[1]/2, after[2], 1e-9)
}

func TestEstimatorConfigRefusesNonsense(t *testing.T) {
	require.NoError(t, EstimatorConfig{}.Validate())
	for _, c := range []struct {
		cfg  EstimatorConfig
		says string
	}{
		{EstimatorConfig{Forecast: "crystal-ball"}, `forecast "crystal-ball"; want one of [ewma peak holt adaptive]`},
		{EstimatorConfig{HalfLife: -time.Second}, "half-life -1s"},
		{EstimatorConfig{MaxAge: -1}, "max age"},
		{EstimatorConfig{MinWindow: -1}, "min window"},
		{EstimatorConfig{PeakHalfLife: -1}, "peak half-life"},
		{EstimatorConfig{TrendHalfLife: -1}, "trend half-life"},
		{EstimatorConfig{SignalHalfLife: -1}, "signal half-life"},
	} {
		err := c.cfg.Validate()
		require.ErrorIs(t, err, ErrBadConfig)
		assert.Contains(t, err.Error(), c.says)
		assert.Panics(t, func() { NewEstimator(c.cfg) })
	}
}

func TestForecastsAreDeterministic(t *testing.T) {
	a := quarters(t, ids("a"), ids("a"), ids("a"), ids("a"))
	loads := []float64{3, 9, 1, 0, 7, 7, 2, 30, 4}
	for _, cfg := range everyForecast() {
		assert.Equal(t, feed(t, NewEstimator(cfg), a, loads...), feed(t, NewEstimator(cfg), a, loads...), cfg.Forecast)
	}
}

func TestForecastAdaptiveCountsAReportOnce(t *testing.T) {
	a := quarters(t, ids("a"), ids("a"), ids("a"), ids("a"))
	cfg := EstimatorConfig{HalfLife: 10 * time.Second}
	noisy := []float64{9, 11, 9, 11, 9, 11, 9, 11, 9, 11, 9, 11}
	e := NewEstimator(cfg)
	got := feed(t, e, a, noisy...)
	// The last report is folded twice more, half a second apart, before the next one comes:
	// the level moves towards it by the same share both times, as the signal does not count
	// it again (were it counted, its one-sided misses would push the share towards 1).
	level, share := got[len(got)-1], []float64{}
	at := t0.Add(time.Duration(len(noisy)-1) * time.Second)
	for range 2 {
		at = at.Add(500 * time.Millisecond)
		next := e.Fold(a, at).Loads[0]
		share = append(share, (next-level)/(11-level))
		level = next
	}
	assert.InDelta(t, share[0], share[1], 1e-9)
	assert.Less(t, share[0], 0.5)
	// A fold at the same time as the last one changes nothing.
	assert.InDelta(t, level, e.Fold(a, at).Loads[0], 1e-12)
}

// sum is the total of xs.
func sum(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}

func TestEstimatorCarriesHotKeysToTheirPieceOfASplit(t *testing.T) {
	q := keyspace.Equal(4)
	for _, cfg := range everyForecast() {
		t.Run(string(cfg.Forecast), func(t *testing.T) {
			a := quarters(t, ids("a"), ids("a"), ids("a"), ids("a"))
			e := NewEstimator(cfg)
			r := report("a", t0, Sample{Range: q[0], Load: 10}, Sample{Range: q[1], Load: 3}, Sample{Range: q[3], Load: 5})
			r.HotKeys = []HotKey{{Hash: 7, Load: 6}, {Hash: q[1].Start + 5, Load: 1}}
			require.NoError(t, e.Add(r))
			before := e.Fold(a, t0).Loads
			// Cut key 7 into its own slice, and merge slice 1 (with a hot key, kept whole) with 2.
			cut, err := a.Apply([]assignment.Op{assignment.Split{Slice: 0, At: 7}, assignment.Split{Slice: 7, At: 8},
				assignment.Merge{Left: q[1].Start}})
			require.NoError(t, err)
			e.Forget("a")
			est := e.Fold(cut, t0.Add(time.Second))
			rest := 4 / float64(q[0].Width()) // the slice's load less its hot key's, per key
			assert.InDeltaSlice(t, []float64{7 * rest, 6 + rest, 4 - 8*rest, 3, 5}, est.Loads, 1e-9,
				"the hot key's piece gets the key's load; the rest spreads by width; merges sum")
			assert.InDelta(t, sum(before), sum(est.Loads), 1e-9, "the carry preserves the total load")
			assert.Equal(t, []HotKey{{Hash: 7, Load: 6}}, est.HotKeys[1])
		})
	}
}

func TestEstimatorCarriesNoMoreThanASplitSliceHas(t *testing.T) {
	q := keyspace.Equal(4)
	a := quarters(t, ids("a"), ids("a"), ids("a"), ids("a"))
	e := NewEstimator(EstimatorConfig{Forecast: ForecastPeak})
	r := report("a", t0, Sample{Range: q[0], Load: 10})
	// The hot keys add up to more than the slice (sketches overcount): they share its load.
	r.HotKeys = []HotKey{{Hash: 7, Load: 9}, {Hash: 1 << 60, Load: 3}}
	require.NoError(t, e.Add(r))
	e.Fold(a, t0)
	split, err := a.Apply([]assignment.Op{assignment.Split{Slice: 0, At: 1 << 59}})
	require.NoError(t, err)
	e.Forget("a")
	est := e.Fold(split, t0.Add(time.Second))
	assert.InDeltaSlice(t, []float64{7.5, 2.5, 0, 0, 0}, est.Loads, 1e-9)
	assert.InDelta(t, 10, sum(est.Loads), 1e-9, "the carry preserves the total load")
}

func TestEstimatorCarriesHotKeysByTheirShareOfTheReport(t *testing.T) {
	q := keyspace.Equal(4)
	a := quarters(t, ids("a"), ids("a"), ids("a"), ids("a"))
	e := NewEstimator(EstimatorConfig{Forecast: ForecastEWMA, HalfLife: 10 * time.Second})
	for i, at := range []time.Time{t0, t0.Add(10 * time.Second)} {
		r := report("a", at, Sample{Range: q[0], Load: 10 * float64(i+1)})
		r.HotKeys = []HotKey{{Hash: 7, Load: 6 * float64(i+1)}}
		require.NoError(t, e.Add(r))
		e.Fold(a, at)
	}
	// The level is 15, halfway from 10 to 20; the key was 60% of the last report.
	split, err := a.Apply([]assignment.Op{assignment.Split{Slice: 0, At: 8}})
	require.NoError(t, err)
	e.Forget("a")
	est := e.Fold(split, t0.Add(11*time.Second))
	rest := 6 / float64(q[0].Width())
	assert.InDeltaSlice(t, []float64{9 + 8*rest, 6 - 8*rest}, est.Loads[:2], 1e-9)
	assert.InDelta(t, 15, est.Loads[0]+est.Loads[1], 1e-9, "the carry preserves the total load")
}

// TestEstimatorSpreadFollowsNoise checks that Spread is about the standard deviation of a
// slice's reports around its forecast: large for a slice whose load jumps about, zero for a
// steady one, for every forecast.
func TestEstimatorSpreadFollowsNoise(t *testing.T) {
	q := keyspace.Equal(2)
	a := quarters(t, ids("a"), ids("a"), ids("b"), ids("b"))
	for _, f := range Forecasts {
		t.Run(string(f), func(t *testing.T) {
			e := NewEstimator(EstimatorConfig{Forecast: f})
			var est Estimate
			rng := rand.New(rand.NewPCG(3, 5))
			for i := range 200 {
				at := t0.Add(time.Duration(i) * time.Second)
				noisy := max(0, 100+30*rng.NormFloat64()) // a standard deviation of 30
				require.NoError(t, e.Add(report("a", at, Sample{Range: q[0], Load: noisy})))
				require.NoError(t, e.Add(report("b", at, Sample{Range: q[1], Load: 100})))
				est = e.Fold(a, at)
			}
			require.Len(t, est.Spread, 4)
			for i := range 2 { // each half of a's range carries half its load and its swing
				// Smoothed over about two reports, the estimate is itself noisy: within a
				// factor of two, but never zero.
				assert.InDelta(t, 15, est.Spread[i], 15*0.5, "slice %d: %v", i, est.Spread)
				assert.Zero(t, est.Spread[2+i], "slice %d is steady", 2+i)
			}
		})
	}
}

// TestEstimatorUncertaintyIsTheLevelsStandardError: a level that averages many noisy
// windows is known much better than one window (an EWMA's variance is a/(2-a) of the
// windows'), one that follows each window is not, a steady load is known exactly, and a
// step in a load is not taken for noise.
func TestEstimatorUncertaintyIsTheLevelsStandardError(t *testing.T) {
	q := keyspace.Equal(2)
	a := quarters(t, ids("a"), ids("a"), ids("b"), ids("b"))
	run := func(f Forecast, sigma float64, step func(i int) float64) []Estimate {
		e := NewEstimator(EstimatorConfig{Forecast: f, HalfLife: 10 * time.Second})
		rng := rand.New(rand.NewPCG(3, 5))
		var out []Estimate
		for i := range 300 {
			at := t0.Add(time.Duration(i) * time.Second)
			require.NoError(t, e.Add(report("a", at, Sample{Range: q[0], Load: max(0, step(i)+sigma*rng.NormFloat64())})))
			require.NoError(t, e.Add(report("b", at, Sample{Range: q[1], Load: 100})))
			out = append(out, e.Fold(a, at))
		}
		return out
	}
	flat := func(int) float64 { return 200 }
	alpha := 1 - math.Exp2(-0.1) // a 1 s window at a 10 s half-life
	// Each quarter of a's half carries half its load: noise of 15 a window.
	want := 15 * math.Sqrt(alpha/(2-alpha))
	ewma := run(ForecastEWMA, 30, flat)
	last := ewma[len(ewma)-1]
	for i := range 2 {
		assert.InDelta(t, want, last.Uncertainty[i], want*0.5, "slice %d: %v", i, last.Uncertainty)
		assert.Less(t, last.Uncertainty[i], last.Spread[i]/2, "an average of many windows is known better than one")
		assert.Zero(t, last.Uncertainty[2+i], "slice %d is steady", 2+i)
	}
	adaptive := run(ForecastAdaptive, 30, flat)
	assert.Greater(t, adaptive[len(adaptive)-1].Uncertainty[0], last.Uncertainty[0],
		"a level that follows the last windows more closely is less certain")

	stepped := run(ForecastEWMA, 4, func(i int) float64 { return 200 + 400*float64(i/150) })
	unc := func(e Estimate) float64 { return e.Uncertainty[0] }
	spread := func(e Estimate) float64 { return e.Spread[0] }
	before, after := unc(stepped[149]), slices.Max(mapEstimates(stepped[150:], unc))
	assert.Positive(t, before)
	// Spread counts every miss, the step's too; the noise behind Uncertainty is clipped.
	spreadGrew := slices.Max(mapEstimates(stepped[150:], spread)) / spread(stepped[149])
	assert.Less(t, after, 5*before, "a step of 100 standard deviations is not noise: %v then %v", before, after)
	assert.Greater(t, spreadGrew, 4*after/before, "the step's misses, counted as they are, would make it noise")
}

func mapEstimates(es []Estimate, f func(Estimate) float64) []float64 {
	out := make([]float64, len(es))
	for i, e := range es {
		out[i] = f(e)
	}
	return out
}
