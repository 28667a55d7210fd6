package sim

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNoisyIsDeterministicWhateverTheOrderOfEpochs(t *testing.T) {
	a, err := ParseWorkload("noisy", 2000, 100, 3)
	require.NoError(t, err)
	b, _ := ParseWorkload("noisy", 2000, 100, 3)
	c, _ := ParseWorkload("noisy", 2000, 100, 4)
	fill(t, a, 30)
	assert.Equal(t, fill(t, b, 12), fill(t, a, 12), "filling epoch 30 first changes nothing")
	assert.Equal(t, fill(t, b, 13), fill(t, a, 13))
	assert.NotEqual(t, fill(t, a, 13), fill(t, c, 13), "another seed, another workload")
}

func TestNoisyHasMeanKeyLoadAboutOne(t *testing.T) {
	for _, spec := range []string{"noisy", "noisy:0.8:0.5:0.05:3:10:0", "noisy:1.2:0:0:0:0:100"} {
		w, err := ParseWorkload(spec, 5000, 100, 7)
		require.NoError(t, err, spec)
		assert.Equal(t, spec, w.Spec())
		for e := range 60 {
			loads := fill(t, w, e)
			assert.InDelta(t, 5000, sum(loads), 5000*0.2, "%s epoch %d", spec, e)
			require.GreaterOrEqual(t, slices.Min(loads), 0.0, spec)
		}
	}
}

func TestNoisyKeysAppearVanishAndVary(t *testing.T) {
	w, err := ParseWorkload("noisy:1:0.25:0.05:1:0:0", 1000, 100, 1)
	require.NoError(t, err)
	before, after := fill(t, w, 10), fill(t, w, 11)
	var vanished, appeared, varied int
	for i := range before {
		switch {
		case before[i] > 0 && after[i] == 0:
			vanished++
		case before[i] == 0 && after[i] > 0:
			appeared++
		case before[i] != after[i]:
			varied++
		}
	}
	// 5% of about 800 live keys vanish and as many appear; the others' loads are noisy.
	assert.InDelta(t, 40, vanished, 20)
	assert.InDelta(t, 40, appeared, 20)
	assert.Greater(t, varied, 700)
}

func TestNoisyBurstsAndPhases(t *testing.T) {
	// No noise, no churn: only bursts and phase changes move loads.
	w, err := ParseWorkload("noisy:1.1:0:0:1:10:0", 1000, 100, 1)
	require.NoError(t, err)
	// changed counts the keys whose load changed other than by the common scale, which
	// bursts move as they take their share from every other key.
	changed := func(a, b []float64) (n int) {
		ratios := make([]float64, len(a))
		for i := range a {
			ratios[i] = b[i] / a[i]
		}
		slices.Sort(ratios)
		common := ratios[len(ratios)/2]
		for i := range a {
			if math.Abs(b[i]/a[i]-common) > 1e-9 {
				n++
			}
		}
		return n
	}
	e3, e4, e5 := fill(t, w, 3), fill(t, w, 4), fill(t, w, 5)
	assert.LessOrEqual(t, changed(e3, e4), 12, "within a phase, only bursting keys change")
	assert.Positive(t, changed(e3, e4)+changed(e4, e5), "bursts come and go")
	e9, e10 := fill(t, w, 9), fill(t, w, 10)
	assert.Greater(t, changed(e9, e10), 900, "at the phase change popularity is reshuffled")
	hottest := func(l []float64) int { return slices.Index(l, slices.Max(l)) }
	assert.NotEqual(t, hottest(e9), hottest(e10))
}

func TestNoisyRefusesBadParameters(t *testing.T) {
	for _, spec := range []string{"noisy:-1", "noisy:1:4", "noisy:1:0.2:1.5", "noisy:1:0.2:0.1:-1",
		"noisy:1:0.2:0.1:1:2.5", "noisy:1:0.2:0.1:1:10:-3", "noisy:1:1:1:1:1:1:1", "noisy:x"} {
		_, err := ParseWorkload(spec, 1000, 10, 1)
		assert.ErrorIs(t, err, ErrWorkload, spec)
	}
}
