package sim

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func fill(t *testing.T, w Workload, e int) []float64 {
	t.Helper()
	loads := make([]float64, w.Keys())
	if h, ok := w.(hashAware); ok {
		hashes := make([]uint64, w.Keys())
		for i := range hashes {
			hashes[i] = uint64(i) * (math.MaxUint64 / uint64(w.Keys()))
		}
		h.setHashes(hashes)
	}
	w.Fill(e, loads)
	return loads
}

func sum(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}

func TestWorkloadsHaveMeanKeyLoadAboutOne(t *testing.T) {
	for _, spec := range []string{"uniform", "zipf:1.1", "zipf:0", "hotspot-shift", "hotspot-shift:0.8:3", "diurnal", "diurnal:10"} {
		w, err := ParseWorkload(spec, 1000, 20, 7)
		require.NoError(t, err, spec)
		assert.Equal(t, spec, w.Spec())
		for _, e := range []int{0, 5, 13} {
			loads := fill(t, w, e)
			assert.InDelta(t, 1000, sum(loads), 1000*0.2, "%s epoch %d", spec, e)
			for _, l := range loads {
				require.GreaterOrEqual(t, l, 0.0, spec)
			}
		}
	}
}

func TestZipfRanksKeysBySeed(t *testing.T) {
	a, _ := ParseWorkload("zipf:1.1", 1000, 20, 1)
	b, _ := ParseWorkload("zipf:1.1", 1000, 20, 1)
	c, _ := ParseWorkload("zipf:1.1", 1000, 20, 2)
	la, lb, lc := fill(t, a, 0), fill(t, b, 0), fill(t, c, 0)
	assert.Equal(t, la, lb, "the same seed gives the same workload")
	assert.NotEqual(t, la, lc, "another seed makes other keys popular")
	// The hottest key carries 1/H(1000, 1.1) of the load.
	var h float64
	for r := 1; r <= 1000; r++ {
		h += math.Pow(float64(r), -1.1)
	}
	assert.InDelta(t, 1000/h, slices.Max(la), 1e-9)
}

func TestHotspotShiftMovesTheHotKeys(t *testing.T) {
	w, err := ParseWorkload("hotspot-shift:1.1:5", 1000, 20, 1)
	require.NoError(t, err)
	hottest := func(e int) int {
		loads := fill(t, w, e)
		return slices.Index(loads, slices.Max(loads))
	}
	assert.Equal(t, hottest(0), hottest(4), "no shift within a period")
	assert.NotEqual(t, hottest(4), hottest(5), "the hot key changes at the period")
	assert.NotEqual(t, hottest(5), hottest(10))
}

func TestFlashCrowd(t *testing.T) {
	w, err := ParseWorkload("flash-crowd:4:0.6", 1000, 20, 1)
	require.NoError(t, err)
	before, during, after := fill(t, w, 4), fill(t, w, 5), fill(t, w, 10)
	assert.Equal(t, 1000.0, sum(before))
	assert.Equal(t, 1000.0, sum(after))
	// While it lasts (epochs 5..9), the crowd of 4 keys carries an extra load that is 60% of
	// all load.
	crowd := 0.0
	n := 0
	for i, l := range during {
		if l > 1 {
			crowd += l
			n++
			assert.Equal(t, 1.0, before[i])
		}
	}
	assert.Equal(t, 4, n)
	assert.InDelta(t, 0.6, (crowd-4)/sum(during), 1e-9)
}

func TestDiurnalVariesWithTime(t *testing.T) {
	w, err := ParseWorkload("diurnal:8", 100, 20, 1)
	require.NoError(t, err)
	a, b := fill(t, w, 0), fill(t, w, 2)
	assert.NotEqual(t, a, b)
	assert.InDeltaSlice(t, a, fill(t, w, 8), 1e-9, "the load repeats after a period")
}

func TestParseWorkloadRejectsBadSpecs(t *testing.T) {
	for _, spec := range []string{
		"", "zipf", "zipf:x", "zipf:1:2", "zipf:-1", "uniform:3", "pareto:1",
		"hotspot-shift:1.1:0", "hotspot-shift:1.1:2.5", "flash-crowd:0", "flash-crowd:2000",
		"flash-crowd:10:1", "flash-crowd:10:0", "diurnal:1", "zipf:NaN", "zipf:Inf",
	} {
		_, err := ParseWorkload(spec, 1000, 20, 1)
		assert.ErrorIs(t, err, ErrWorkload, "spec %q", spec)
	}
	_, err := ParseWorkload("uniform", 0, 20, 1)
	assert.ErrorIs(t, err, ErrWorkload)
}
