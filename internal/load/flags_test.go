package load

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEstimatorFlags(t *testing.T) {
	var ef EstimatorFlags
	f := pflag.NewFlagSet("x", pflag.ContinueOnError)
	ef.AddFlags(f)
	require.NoError(t, f.Parse(nil))
	cfg, err := ef.Config()
	require.NoError(t, err)
	assert.Equal(t, EstimatorConfig{HalfLife: 10 * time.Second, Forecast: ForecastAdaptive, SignalHalfLife: time.Second}, cfg,
		"the defaults are the assigner's")
	for _, name := range EstimatorFlagNames {
		assert.NotNil(t, f.Lookup(name), name)
	}

	require.NoError(t, f.Parse([]string{"--load-forecast", "holt", "--load-trend-half-life", "3s"}))
	cfg, err = ef.Config()
	require.NoError(t, err)
	assert.Equal(t, ForecastHolt, cfg.Forecast)
	assert.Equal(t, 3*time.Second, cfg.TrendHalfLife)

	require.NoError(t, f.Parse([]string{"--load-forecast", "guess"}))
	_, err = ef.Config()
	assert.ErrorIs(t, err, ErrBadConfig)
	assert.ErrorContains(t, err, `--load-forecast "guess": want one of ewma, peak, holt, adaptive`)

	require.NoError(t, f.Parse([]string{"--load-forecast", "peak", "--load-peak-half-life", "-1s"}))
	_, err = ef.Config()
	assert.ErrorContains(t, err, "--load-peak-half-life -1s")
}
