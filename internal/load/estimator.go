package load

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// HotKey is a key that carries a noticeable share of its slice's load, as a node's
// heavy-hitter sketch reports it.
type HotKey struct {
	Hash uint64
	Load float64
}

// Report is what one node measured over one window.
type Report struct {
	Node assignment.NodeID
	// At is when the window ended; Window is its length.
	At     time.Time
	Window time.Duration
	// Samples give the load of each range the node holds. A node with replicas reports its
	// own share: the requests it served.
	Samples []Sample
	// HotKeys lists the heaviest keys the node saw, with the load it served for each.
	HotKeys []HotKey
}

// EstimatorConfig tunes how reports become estimates. The zero value takes every default.
type EstimatorConfig struct {
	// HalfLife is how fast old measurements fade: after HalfLife, a slice's level has moved
	// halfway to what the reports say. Default 10 s (Dicer's).
	HalfLife time.Duration
	// MaxAge ignores reports older than this. Default 6 half-lives.
	MaxAge time.Duration
	// MinWindow ignores reports measured over less time than this: too noisy. Default 100 ms.
	MinWindow time.Duration
	// Forecast is how the load a pass balances is predicted from the reports so far; see
	// Forecast. Default ForecastAdaptive, chosen by the figures of docs/BENCHMARKS.md.
	Forecast Forecast
	// PeakHalfLife is how fast ForecastPeak forgets a slice's peak. Default HalfLife.
	PeakHalfLife time.Duration
	// TrendHalfLife is how fast ForecastHolt's trend follows the level's slope. Default
	// HalfLife.
	TrendHalfLife time.Duration
	// SignalHalfLife is how fast ForecastAdaptive's tracking signal follows the errors.
	// Default 1 s.
	SignalHalfLife time.Duration
}

// Forecast names a way of predicting a slice's load in the next window from its reports.
// Every forecast is a deterministic function of the reports and the fold times.
type Forecast string

// The forecasts. Each keeps a level: the reports' exponentially weighted moving average,
// fading with HalfLife.
const (
	// ForecastEWMA predicts the level.
	ForecastEWMA Forecast = "ewma"
	// ForecastPeak predicts the larger of the level and the slice's decayed peak: the highest
	// load reported, fading with PeakHalfLife. It errs on the high side for slices whose load
	// jumps about, so that a pass does not pile them onto one node.
	ForecastPeak Forecast = "peak"
	// ForecastHolt is Holt's linear trend: the level, extrapolated one fold interval ahead
	// along a trend (the level's slope, smoothed with TrendHalfLife), never below 0.
	ForecastHolt Forecast = "holt"
	// ForecastAdaptive is Trigg and Leach's adaptive smoothing: the level moves towards each
	// report by at least what HalfLife gives, and by more while the reports keep falling on
	// the same side of it: by |E|/M, the tracking signal, where E and M are the errors and
	// their absolute values, smoothed with SignalHalfLife. Noise (errors of either sign)
	// is smoothed away; a load that stepped elsewhere (errors of one sign) is followed within
	// a few reports.
	ForecastAdaptive Forecast = "adaptive"
)

// Forecasts lists the forecasts, for help texts.
var Forecasts = []Forecast{ForecastEWMA, ForecastPeak, ForecastHolt, ForecastAdaptive}

// ErrBadConfig is wrapped by errors about an unusable EstimatorConfig.
var ErrBadConfig = errors.New("load: bad estimator config")

// Validate reports whether the configuration is usable. Zero values take defaults; negative
// durations and unknown forecasts are refused.
func (c EstimatorConfig) Validate() error {
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"half-life", c.HalfLife}, {"max age", c.MaxAge}, {"min window", c.MinWindow},
		{"peak half-life", c.PeakHalfLife}, {"trend half-life", c.TrendHalfLife}, {"signal half-life", c.SignalHalfLife}} {
		if d.d < 0 {
			return fmt.Errorf("%w: %s %s; want >= 0 (0 takes the default)", ErrBadConfig, d.name, d.d)
		}
	}
	if c.Forecast != "" && !slices.Contains(Forecasts, c.Forecast) {
		return fmt.Errorf("%w: forecast %q; want one of %v", ErrBadConfig, c.Forecast, Forecasts)
	}
	return nil
}

func (c *EstimatorConfig) fill() {
	if c.HalfLife <= 0 {
		c.HalfLife = 10 * time.Second
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 6 * c.HalfLife
	}
	if c.MinWindow <= 0 {
		c.MinWindow = 100 * time.Millisecond
	}
	if c.Forecast == "" {
		c.Forecast = ForecastAdaptive
	}
	if c.PeakHalfLife <= 0 {
		c.PeakHalfLife = c.HalfLife
	}
	if c.TrendHalfLife <= 0 {
		c.TrendHalfLife = c.HalfLife
	}
	if c.SignalHalfLife <= 0 {
		c.SignalHalfLife = time.Second
	}
}

// ErrBadReport is wrapped by errors about unusable reports.
var ErrBadReport = errors.New("load: bad report")

// Estimator folds nodes' load reports into an estimate of each slice's load. It keeps the
// latest report of each node; at each Fold, every slice that a fresh report covers moves
// towards what its holders report, by an amount that grows with the time since the last
// fold, and every other slice keeps its last estimate.
//
// Only the reports of nodes that hold a slice count for it. So while a slice moves, the node
// that gave it up no longer counts it, and until the new holder reports it the slice keeps its
// estimate, which the map attributes to the new holder: moves in flight count where they go,
// and nothing is counted twice.
//
// The load Fold returns is a forecast of each slice's load in the next window (see
// Forecast), made from the reports so far: it is what a pass balances, and what the next
// window's reports should be compared with to measure the forecast's error.
//
// Estimator is not safe for concurrent use; it reads no clock (times are arguments).
type Estimator struct {
	cfg      EstimatorConfig
	reports  map[assignment.NodeID]Report
	basis    *assignment.Assignment // the map the estimates are indexed by
	loads    []float64              // the level of each slice
	trend    []float64              // ForecastHolt: the level's slope, in load per second
	peak     []float64              // ForecastPeak: the decayed peak
	err      []float64              // the level's smoothed error (ForecastAdaptive's signal)
	absErr   []float64              // the smoothed absolute error (the signal's scale)
	dev      []float64              // the level's absolute error smoothed with HalfLife (Spread)
	noise    []float64              // the windows' noise: a robust mean absolute residual (Uncertainty)
	vari     []float64              // the variance of the level as an estimate (Uncertainty)
	signalAt []time.Time            // the newest report in the smoothed errors
	keys     []float64
	hot      [][]HotKey
	measured []float64 // the load of the last fresh report, of which the hot keys are part
	seen     []bool    // the slice has had an estimate
	lastFold time.Time
	interval time.Duration // between the last two folds: ForecastHolt's horizon
}

// NewEstimator returns an estimator with no reports. It panics if cfg.Validate fails:
// configurations come from flags and are validated where they are parsed.
func NewEstimator(cfg EstimatorConfig) *Estimator {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	cfg.fill()
	return &Estimator{cfg: cfg, reports: map[assignment.NodeID]Report{}}
}

// Add records a node's report, replacing its previous one. An invalid report (see
// Report.Validate) is refused whole, and changes nothing.
func (e *Estimator) Add(r Report) error {
	if err := r.Validate(); err != nil {
		return err
	}
	e.reports[r.Node] = r
	return nil
}

// Validate reports whether the estimator would take r: it names a node, has a window, and
// its samples and hot keys are well formed.
func (r Report) Validate() error {
	if err := r.Node.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadReport, err)
	}
	if r.Window <= 0 {
		return fmt.Errorf("%w: window %s; want > 0", ErrBadReport, r.Window)
	}
	for i, s := range r.Samples {
		if err := s.Validate(); err != nil {
			return fmt.Errorf("%w: sample %d: %w", ErrBadReport, i, err)
		}
	}
	for i, k := range r.HotKeys {
		if !finiteNonNegative(k.Load) {
			return fmt.Errorf("%w: hot key %d has load %v; want a finite number >= 0", ErrBadReport, i, k.Load)
		}
	}
	return nil
}

// Forget drops a node's report (the node left).
func (e *Estimator) Forget(node assignment.NodeID) { delete(e.reports, node) }

// Estimate is the estimated load, key count and heaviest keys of every slice of a map.
type Estimate struct {
	Loads, Keys []float64
	HotKeys     [][]HotKey
	// Spread is each slice's estimated standard deviation of load around its level: the
	// level's absolute error, smoothed with HalfLife, times sqrt(pi/2), which is the
	// standard deviation of a normal error with that mean absolute value. It is what a pass
	// may keep as headroom for a slice whose load jumps about from one window to the next.
	Spread []float64
	// Uncertainty is each slice's standard error of its level as an estimate of the load
	// to come, were the load to hold still: the noise of the windows the level averages,
	// which is all a smoothed level knows of it. Each fold that moves the level a share a
	// towards a window whose noise has standard deviation s makes its variance
	// (1-a)^2 v + a^2 s^2: a level that follows each window (a near 1) is as noisy as one
	// window, one that averages many is much less so. s is not Spread, which counts every
	// miss, but a robust measure of the noise alone (noiseResidual). A pass weighs a gain
	// against it: a difference between nodes smaller than their uncertainties may be noise.
	Uncertainty []float64
}

// spreadPerAbsErr turns a mean absolute error into the standard deviation of a normal error.
var spreadPerAbsErr = math.Sqrt(math.Pi / 2)

// maxHotKeys is how many keys per slice an estimate keeps.
const maxHotKeys = 4

// Fold updates the estimates with the reports and returns them for the slices of a. now is
// the time of the fold. The returned Loads are the forecast of each slice's load in the
// next window; a slice that no fresh report covers keeps its forecast.
func (e *Estimator) Fold(a *assignment.Assignment, now time.Time) Estimate {
	e.rebase(a)
	f := e.gather(a, now)
	dt := time.Duration(0)
	if !e.lastFold.IsZero() {
		dt = now.Sub(e.lastFold)
	}
	if dt > 0 {
		e.interval = dt
	}
	e.lastFold = now
	for i := range a.Len() {
		if f.reporters[i] == 0 {
			continue // no fresh report: the slice keeps its estimate
		}
		scale := float64(len(a.Slice(i).Replicas)) / float64(f.reporters[i]) // holders that did not report served as much
		e.update(i, f.share[i]*scale, f.keys[i]/float64(f.reporters[i]), dt, f.newest[i])
		e.measured[i] = f.share[i] * scale
		e.hot[i] = e.hot[i][:0]
		for _, k := range f.hot[i] {
			e.hot[i] = append(e.hot[i], HotKey{Hash: k.Hash, Load: k.Load * scale})
		}
	}
	return Estimate{Loads: e.forecast(), Keys: slices.Clone(e.keys), HotKeys: slices.Clone(e.hot), Spread: e.spread(),
		Uncertainty: e.uncertainty()}
}

// uncertainty returns each slice's Estimate.Uncertainty.
func (e *Estimator) uncertainty() []float64 {
	out := make([]float64, len(e.vari))
	for i, v := range e.vari {
		out[i] = math.Sqrt(v)
	}
	return out
}

// spread returns each slice's Estimate.Spread.
func (e *Estimator) spread() []float64 {
	out := make([]float64, len(e.dev))
	for i, a := range e.dev {
		out[i] = a * spreadPerAbsErr
	}
	return out
}

// fresh is what the fresh reports say about each slice of a map.
type fresh struct {
	share     []float64   // sum of the shares reported by holders
	keys      []float64   // sum of the key counts reported by holders
	reporters []int32     // holders that reported
	newest    []time.Time // the end of the newest window reported
	hot       [][]HotKey  // summed over reporters, unscaled
}

// gather sums, for each slice of a, what the fresh reports of its holders say.
func (e *Estimator) gather(a *assignment.Assignment, now time.Time) fresh {
	n := a.Len()
	f := fresh{share: make([]float64, n), keys: make([]float64, n), reporters: make([]int32, n), hot: make([][]HotKey, n),
		newest: make([]time.Time, n)}
	last := make([]int32, n)                                    // 1 + the last report that counted for the slice
	for ri, node := range slices.Sorted(maps.Keys(e.reports)) { // sorted: Fold is deterministic
		r := e.reports[node]
		if now.Sub(r.At) > e.cfg.MaxAge || r.Window < e.cfg.MinWindow {
			continue
		}
		hint := 0 // samples usually come in key order: search from the last one
		for _, s := range r.Samples {
			width := s.Range.Width()
			hint = lookupFrom(a, s.Range.Start, hint)
			for i := hint; i < n; i++ {
				sl := a.Slice(i)
				overlap, ok := sl.Range.Intersect(s.Range)
				if !ok {
					break
				}
				if !sl.Holds(node) {
					continue
				}
				w := overlap.Width() / width
				f.share[i] += s.Load * w
				f.keys[i] += s.Keys * w
				if last[i] != int32(ri)+1 {
					last[i], f.reporters[i] = int32(ri)+1, f.reporters[i]+1
					f.newest[i] = later(f.newest[i], r.At)
				}
			}
		}
		for _, k := range r.HotKeys {
			i, sl := a.Lookup(k.Hash)
			if sl.Holds(node) {
				f.hot[i] = addHot(f.hot[i], k)
			}
		}
	}
	return f
}

// update moves slice i's state towards a fresh load x and key count k, measured dt after the
// previous fold, in reports whose newest window ended at newest. A slice's first estimate
// takes the report as it is; a fold at the time of the last one (or before it) changes nothing.
func (e *Estimator) update(i int, x, k float64, dt time.Duration, newest time.Time) {
	if !e.seen[i] {
		e.loads[i], e.keys[i], e.trend[i], e.peak[i], e.err[i], e.absErr[i], e.dev[i], e.seen[i] = x, k, 0, x, 0, 0, 0, true
		e.vari[i], e.noise[i] = 0, 0 // one window, of unknown noise: a pass must be free to balance the first map
		e.signalAt[i] = newest
		return
	}
	if dt <= 0 {
		return
	}
	alpha := 1 - fade(dt, e.cfg.HalfLife)
	e.keys[i] += alpha * (k - e.keys[i])
	miss := x - e.loads[i]
	// A report folded again (passes more often than reports, or a late report) is no new
	// evidence: counting its miss twice would look like errors all on one side.
	if newest.After(e.signalAt[i]) {
		e.noise[i] += alpha * (noiseResidual(miss, e.err[i], e.noise[i]) - e.noise[i])
		phi := 1 - fade(dt, e.cfg.SignalHalfLife)
		e.err[i] += phi * (miss - e.err[i])
		e.absErr[i] += phi * (math.Abs(miss) - e.absErr[i])
		e.signalAt[i] = newest
		// Spread: smoothed as slowly as the level, since the signal's scale follows the
		// last report or two and would make a noisy slice look calm one window in three.
		e.dev[i] += alpha * (math.Abs(miss) - e.dev[i])
	}
	switch e.cfg.Forecast {
	case ForecastEWMA:
		e.loads[i] += alpha * (x - e.loads[i])
	case ForecastPeak:
		e.loads[i] += alpha * (x - e.loads[i])
		e.peak[i] = max(x, e.peak[i]*fade(dt, e.cfg.PeakHalfLife))
	case ForecastHolt:
		// Holt's method for irregular intervals: predict the level along the trend, correct
		// the prediction towards x, then move the trend towards the level's observed slope.
		secs := dt.Seconds()
		prev := e.loads[i]
		predicted := prev + e.trend[i]*secs
		e.loads[i] = max(0, predicted+alpha*(x-predicted)) // a load is never negative
		beta := 1 - fade(dt, e.cfg.TrendHalfLife)
		e.trend[i] += beta * ((e.loads[i]-prev)/secs - e.trend[i])
	case ForecastAdaptive:
		if e.absErr[i] > 0 {
			alpha = max(alpha, min(1, math.Abs(e.err[i])/e.absErr[i]))
		}
		e.loads[i] += alpha * miss
	}
	sd := e.noise[i] * spreadPerAbsErr
	e.vari[i] = (1-alpha)*(1-alpha)*e.vari[i] + alpha*alpha*sd*sd
}

// noiseClip bounds, in units of the noise measured so far, what one window's residual adds
// to it.
const noiseClip = 3

// noiseResidual is what a window's miss says of the noise: the part of it that the errors
// just before it (bias, the tracking signal) did not foretell, so that a trend the level
// lags is not taken for noise, clipped at noiseClip times the noise so far, so that a step
// in the load, which no smoothing foretells either, is not taken for noise: noise that
// really grows still raises the measure by a share of its clip each window.
func noiseResidual(miss, bias, noise float64) float64 {
	r := math.Abs(miss - bias)
	if noise > 0 {
		r = min(r, noiseClip*noise)
	}
	return r
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// fade is how much of a measurement is left after dt with half-life hl.
func fade(dt, hl time.Duration) float64 { return math.Exp2(-float64(dt) / float64(hl)) }

// base returns slice i's forecast.
func (e *Estimator) base(i int) float64 {
	switch e.cfg.Forecast {
	case ForecastPeak:
		return max(e.loads[i], e.peak[i])
	case ForecastHolt:
		return max(0, e.loads[i]+e.trend[i]*e.interval.Seconds())
	}
	return e.loads[i]
}

// forecast returns each slice's forecast load for the next window.
func (e *Estimator) forecast() []float64 {
	out := make([]float64, len(e.loads))
	for i := range out {
		out[i] = e.base(i)
	}
	return out
}

// rebase carries the estimates over to the slices of a, by overlap, when the map changed.
// Levels, trends, peaks and errors are all loads (or loads per second) of ranges, so they
// spread by overlap as loads do, except that a split slice's levels and peaks first give
// each of its hot keys' load to the piece holding the key (see carry): a hot key cut into
// its own slice would otherwise get only its width's share, and the next pass would balance
// a slice it believes cold. Trends and errors stay spread by width: they are not measured
// per key, and pinning them to a key would guess.
func (e *Estimator) rebase(a *assignment.Assignment) {
	if e.basis == a {
		return
	}
	if e.basis == nil {
		n := a.Len()
		e.loads, e.trend, e.peak, e.keys = make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
		e.err, e.absErr, e.measured, e.dev = make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
		e.vari, e.noise = make([]float64, n), make([]float64, n)
		e.hot, e.seen, e.signalAt = make([][]HotKey, n), make([]bool, n), make([]time.Time, n)
		e.basis = a
		return
	}
	var errs [6]error
	moved := make([][]float64, 6)
	moved[0], errs[0] = e.carry(e.loads, a)
	moved[1], errs[1] = e.carry(e.peak, a)
	measured, errM := e.carry(e.measured, a)
	// A slice's swing is mostly its hot keys' (Poisson noise is relatively smallest on the
	// heaviest keys, but their rates vary the most in absolute terms), so it goes where its
	// load goes. Merged slices add their swings, which overstates independent noises.
	dev, errD := e.carry(e.dev, a)
	// A level's variance splits as its load does (a count's variance is its mean) and
	// adds up where slices merge.
	vari, errV := e.carry(e.vari, a)
	noise, errN := e.carry(e.noise, a)
	errs[0] = errors.Join(errs[0], errM, errD, errV, errN)
	moved[2], errs[2] = Reproject(e.basis, e.keys, a)
	moved[3], errs[3] = Reproject(e.basis, e.absErr, a)
	moved[4], errs[4] = reprojectSigned(e.basis, e.trend, a)
	moved[5], errs[5] = reprojectSigned(e.basis, e.err, a)
	if err := errors.Join(errs[:]...); err != nil {
		panic(fmt.Sprintf("load: estimates built from validated reports are invalid: %v", err))
	}
	seen, signalAt := make([]bool, a.Len()), make([]time.Time, a.Len())
	hot := make([][]HotKey, a.Len())
	for i, s := range e.basis.All() {
		if !e.seen[i] {
			continue
		}
		for j, _ := a.Lookup(s.Range.Start); j < a.Len() && a.Slice(j).Range.Overlaps(s.Range); j++ {
			seen[j], signalAt[j] = true, later(signalAt[j], e.signalAt[i])
		}
		for _, k := range e.hot[i] {
			j, _ := a.Lookup(k.Hash)
			hot[j] = addHot(hot[j], k)
		}
	}
	e.basis, e.loads, e.peak, e.keys, e.absErr, e.trend, e.err = a, moved[0], moved[1], moved[2], moved[3], moved[4], moved[5]
	e.seen, e.hot, e.signalAt, e.measured, e.dev, e.vari, e.noise = seen, hot, signalAt, measured, dev, vari, noise
}

// carry is Reproject for a load of each slice of e.basis, but a slice that a splits gives
// each of its hot keys the piece of a holding the key, and spreads only the rest by width.
// The hot keys were measured in the slice's last fresh report while xs[i] is smoothed, so
// what the keys take is their share of that report (all of it at most, as sketches
// overcount) times xs[i]: the slice carries exactly xs[i], and the total is preserved.
// Slices that a keeps whole, or merges, carry xs[i] as Reproject does.
func (e *Estimator) carry(xs []float64, a *assignment.Assignment) ([]float64, error) {
	type pin struct {
		slice int
		load  float64
	}
	var rest []float64 // allocated only when some split slice has hot keys
	var pins []pin
	for i, s := range e.basis.All() {
		if len(e.hot[i]) == 0 || !finiteNonNegative(xs[i]) {
			continue // nothing to pin; Reproject refuses invalid values
		}
		if _, t := a.Lookup(s.Range.Start); t.Range.End.Compare(s.Range.End) >= 0 {
			continue // kept whole or merged: its load all goes to one slice
		}
		if rest == nil {
			rest = slices.Clone(xs)
		}
		pinned := min(xs[i], hotSum(e.hot[i]))
		if m := e.measured[i]; m > 0 {
			pinned = xs[i] * min(1, hotSum(e.hot[i])/m)
		}
		rest[i] = xs[i] - pinned
		pins = append(pins, pin{i, pinned})
	}
	if rest == nil {
		return Reproject(e.basis, xs, a)
	}
	out, err := Reproject(e.basis, rest, a)
	if err != nil {
		return nil, err
	}
	for _, p := range pins {
		hot := hotSum(e.hot[p.slice])
		if hot == 0 {
			continue // nothing was pinned
		}
		for _, k := range e.hot[p.slice] {
			j, _ := a.Lookup(k.Hash) // within the old slice: hot keys are kept where they fall
			out[j] += p.load * (k.Load / hot)
		}
	}
	return out, nil
}

// hotSum returns the total load of hot keys.
func hotSum(hot []HotKey) float64 {
	var sum float64
	for _, k := range hot {
		sum += k.Load
	}
	return sum
}

// reprojectSigned is Reproject for values of either sign, such as trends: it spreads the
// rises and the falls separately.
func reprojectSigned(from *assignment.Assignment, xs []float64, to *assignment.Assignment) ([]float64, error) {
	up, down := make([]float64, len(xs)), make([]float64, len(xs))
	for i, x := range xs {
		up[i], down[i] = max(x, 0), max(-x, 0)
	}
	up, err1 := Reproject(from, up, to)
	down, err2 := Reproject(from, down, to)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	for i := range up {
		up[i] -= down[i]
	}
	return up, nil
}

// lookupFrom returns the index of the slice holding point p, looking first just after hint.
func lookupFrom(a *assignment.Assignment, p uint64, hint int) int {
	for i := hint; i < min(hint+4, a.Len()); i++ {
		if a.Slice(i).Range.Contains(p) {
			return i
		}
	}
	i, _ := a.Lookup(p)
	return i
}

// addHot adds k to a heaviest-first list, summing the loads of equal hashes and keeping the
// heaviest maxHotKeys.
func addHot(top []HotKey, k HotKey) []HotKey {
	if i := slices.IndexFunc(top, func(h HotKey) bool { return h.Hash == k.Hash }); i >= 0 {
		k.Load += top[i].Load
		top = slices.Delete(top, i, i+1)
	}
	i, _ := slices.BinarySearchFunc(top, k.Load, func(h HotKey, l float64) int { return cmp.Compare(l, h.Load) })
	top = slices.Insert(top, i, k)
	return top[:min(len(top), maxHotKeys)]
}
