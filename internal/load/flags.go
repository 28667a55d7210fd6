package load

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// EstimatorFlags are the command-line flags of an EstimatorConfig: the --load-* flags of the
// assigner, which the simulator takes too, so that both parse them alike and a forecast
// tried in the simulator is the one the assigner runs.
type EstimatorFlags struct {
	HalfLife       time.Duration
	Forecast       string
	PeakHalfLife   time.Duration
	TrendHalfLife  time.Duration
	SignalHalfLife time.Duration
}

// EstimatorFlagNames lists the flags AddFlags registers, for commands that refuse them where
// they would do nothing.
var EstimatorFlagNames = []string{"load-half-life", "load-forecast", "load-peak-half-life",
	"load-trend-half-life", "load-signal-half-life"}

// AddFlags registers the --load-* flags on f, with the assigner's defaults.
func (c *EstimatorFlags) AddFlags(f *pflag.FlagSet) {
	f.DurationVar(&c.HalfLife, "load-half-life", 10*time.Second, "how fast old load measurements fade: after it, "+
		"a slice's smoothed load has moved halfway to what reports say")
	f.StringVar(&c.Forecast, "load-forecast", string(ForecastAdaptive), "how the load a pass balances is forecast from the reports: "+
		"adaptive (smoothed with --load-half-life, following faster while reports keep missing on one side; see --load-signal-half-life), "+
		"ewma (smoothed with --load-half-life), peak (ewma or the decayed peak, whichever is higher; see --load-peak-half-life), "+
		"holt (ewma plus a trend; see --load-trend-half-life)")
	f.DurationVar(&c.PeakHalfLife, "load-peak-half-life", 0, "--load-forecast peak: how fast a slice's peak fades (0: --load-half-life)")
	f.DurationVar(&c.TrendHalfLife, "load-trend-half-life", 0, "--load-forecast holt: how fast the trend follows the load's slope (0: --load-half-life)")
	f.DurationVar(&c.SignalHalfLife, "load-signal-half-life", time.Second, "--load-forecast adaptive: how fast the tracking signal follows the forecast's errors")
}

// Config returns the estimator's configuration, or an error naming the flag that is wrong.
func (c EstimatorFlags) Config() (EstimatorConfig, error) {
	cfg := EstimatorConfig{HalfLife: c.HalfLife, Forecast: Forecast(c.Forecast), PeakHalfLife: c.PeakHalfLife,
		TrendHalfLife: c.TrendHalfLife, SignalHalfLife: c.SignalHalfLife}
	for _, d := range []struct {
		flag string
		d    time.Duration
	}{{"--load-half-life", c.HalfLife}, {"--load-peak-half-life", c.PeakHalfLife},
		{"--load-trend-half-life", c.TrendHalfLife}, {"--load-signal-half-life", c.SignalHalfLife}} {
		if d.d < 0 {
			return cfg, fmt.Errorf("%w: %s %s: want a duration >= 0", ErrBadConfig, d.flag, d.d)
		}
	}
	if !slices.Contains(Forecasts, Forecast(c.Forecast)) {
		names := make([]string, len(Forecasts))
		for i, f := range Forecasts {
			names[i] = string(f)
		}
		return cfg, fmt.Errorf("%w: --load-forecast %q: want one of %s", ErrBadConfig, c.Forecast, strings.Join(names, ", "))
	}
	return cfg, nil
}
