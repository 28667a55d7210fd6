package load_test

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/sim"
)

// The forecast harness replays a workload's per-epoch key loads as load reports, one per
// node per epoch of one second (the default report and pass interval), on a fixed map, and
// scores each forecast (the loads Fold returns after epoch e) against epoch e+1's actual.

// forecastSetup is the shape of one harness run.
type forecastSetup struct {
	spec                 string
	keys, epochs, warm   int
	slices, nodes, seeds int
}

// candidate is one estimator configuration the harness scores.
type candidate struct {
	name string
	cfg  load.EstimatorConfig
}

func ewma(hl time.Duration) candidate {
	return candidate{fmt.Sprintf("ewma hl=%s", hl), load.EstimatorConfig{Forecast: load.ForecastEWMA, HalfLife: hl}}
}

func peak(hl, peakHL time.Duration) candidate {
	return candidate{fmt.Sprintf("peak hl=%s peak=%s", hl, peakHL),
		load.EstimatorConfig{Forecast: load.ForecastPeak, HalfLife: hl, PeakHalfLife: peakHL}}
}

func holt(hl, trendHL time.Duration) candidate {
	return candidate{fmt.Sprintf("holt hl=%s trend=%s", hl, trendHL),
		load.EstimatorConfig{Forecast: load.ForecastHolt, HalfLife: hl, TrendHalfLife: trendHL}}
}

// score sums one candidate's errors over the scored epochs of every seed.
type score struct {
	sliceErr, nodeErr, actual float64 // absolute errors and actual load, summed
	moved, forecast           float64 // forecast change from one epoch to the next, summed
	imbalance, oracle         float64 // greedy-placement imbalances, summed
	epochs                    int
}

func (s score) row(name string) string {
	return fmt.Sprintf("| %s | %.3f | %.3f | %.3f | %.3f | %.3f |", name, s.sliceErr/s.actual, s.nodeErr/s.actual,
		s.moved/s.forecast, s.imbalance/float64(s.epochs), s.oracle/float64(s.epochs))
}

// sliceLoads fills the workload epoch by epoch and sums its keys' loads per slice.
func sliceLoads(t testing.TB, st forecastSetup, a *assignment.Assignment, seed uint64) [][]float64 {
	t.Helper()
	w, err := sim.ParseWorkload(st.spec, st.keys, st.epochs, seed)
	require.NoError(t, err)
	slice := make([]int, st.keys)
	for k := range slice {
		slice[k], _ = a.Lookup(keyspace.HashString("key-" + strconv.Itoa(k)))
	}
	keyLoads := make([]float64, st.keys)
	out := make([][]float64, st.epochs)
	for e := range out {
		w.Fill(e, keyLoads)
		out[e] = make([]float64, a.Len())
		for k, l := range keyLoads {
			out[e][slice[k]] += l
		}
	}
	return out
}

// replay feeds one epoch's slice loads as one report per node, folds, and returns the
// forecast.
func replay(t testing.TB, est *load.Estimator, a *assignment.Assignment, nodes int, loads []float64, e int) []float64 {
	t.Helper()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(e+1) * time.Second)
	samples := make([][]load.Sample, nodes)
	for i, s := range a.All() {
		samples[i%nodes] = append(samples[i%nodes], load.Sample{Range: s.Range, Load: loads[i]})
	}
	for n := range nodes {
		require.NoError(t, est.Add(load.Report{Node: nodeID(n), At: at, Window: time.Second, Samples: samples[n]}))
	}
	return est.Fold(a, at).Loads
}

func nodeID(n int) assignment.NodeID { return assignment.NodeID("n" + strconv.Itoa(n)) }

// greedyImbalance places slices heaviest-first (by weight) on the least-loaded node and
// returns the imbalance that placement has under the actual loads: a pass with unlimited
// churn, so what is left is the forecast's doing (and the slices' granularity).
func greedyImbalance(weight, actual []float64, nodes int) float64 {
	order := make([]int, len(weight))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int { return cmp.Compare(weight[j], weight[i]) })
	planned, got := make([]float64, nodes), make([]float64, nodes)
	for _, i := range order {
		n := slices.Index(planned, slices.Min(planned))
		planned[n] += weight[i]
		got[n] += actual[i]
	}
	return load.Imbalance(got)
}

// scoreForecasts runs every candidate over the same loads, side by side.
func scoreForecasts(t testing.TB, st forecastSetup, cands []candidate) []score {
	a, err := assignment.Uniform(st.slices, func(i int) []assignment.NodeID { return []assignment.NodeID{nodeID(i % st.nodes)} })
	require.NoError(t, err)
	scores := make([]score, len(cands))
	for seed := range st.seeds {
		loads := sliceLoads(t, st, a, uint64(seed+1))
		for c, cand := range cands {
			est, prev := load.NewEstimator(cand.cfg), []float64(nil)
			for e := range st.epochs - 1 {
				f := replay(t, est, a, st.nodes, loads[e], e)
				if e >= st.warm {
					scores[c].add(f, prev, loads[e+1], st.nodes)
				}
				prev = f
			}
		}
	}
	return scores
}

func (s *score) add(f, prev, actual []float64, nodes int) {
	fNode, aNode := make([]float64, nodes), make([]float64, nodes)
	for i := range f {
		s.sliceErr += math.Abs(f[i] - actual[i])
		s.actual += actual[i]
		s.forecast += f[i]
		s.moved += math.Abs(f[i] - prev[i])
		fNode[i%nodes] += f[i]
		aNode[i%nodes] += actual[i]
	}
	for n := range fNode {
		s.nodeErr += math.Abs(fNode[n] - aNode[n])
	}
	s.imbalance += greedyImbalance(f, actual, nodes)
	s.oracle += greedyImbalance(actual, actual, nodes)
	s.epochs++
}

func adaptive(hl, signalHL time.Duration) candidate {
	return candidate{fmt.Sprintf("adaptive hl=%s signal=%s", hl, signalHL),
		load.EstimatorConfig{Forecast: load.ForecastAdaptive, HalfLife: hl, SignalHalfLife: signalHL}}
}

func allCandidates() []candidate {
	s := time.Second
	return []candidate{
		ewma(time.Millisecond), // the last epoch's load, as it is
		ewma(s), ewma(2 * s), ewma(3 * s), ewma(5 * s), ewma(10 * s),
		peak(2*s, s), peak(5*s, 2*s),
		holt(2*s, 5*s), holt(5*s, 10*s),
		adaptive(10*s, s), adaptive(10*s, 2*s), adaptive(10*s, 3*s), adaptive(2*s, 2*s), adaptive(3*s, 2*s),
	}
}

// TestForecastFigures prints the forecasting figures of docs/BENCHMARKS.md. It takes a
// few minutes, so it runs only when asked:
//
//	FORECAST_FIGURES=1 go test ./internal/load -run TestForecastFigures -v -timeout 30m
//
// FORECAST_SPECS (comma-separated) replaces the workloads.
func TestForecastFigures(t *testing.T) {
	if os.Getenv("FORECAST_FIGURES") == "" {
		t.Skip("set FORECAST_FIGURES=1 to print the forecasting figures")
	}
	specs := []string{"noisy", "noisy:1:0.25:0.01:1:50:1", "noisy:1:0.25:0.01:1:50:0.1", "noisy:1:0.5",
		"noisy:1:0.25:0.05:3", "noisy:1:0.25:0.01:1:0", "noisy:0.8", "hotspot-shift:1:10"}
	if s := os.Getenv("FORECAST_SPECS"); s != "" {
		specs = strings.Split(s, ",")
	}
	cands := allCandidates()
	all := make([][]score, len(specs))
	for w, spec := range specs {
		st := forecastSetup{spec: spec, keys: 100_000, epochs: 200, warm: 20, slices: 1000, nodes: 20, seeds: 3}
		all[w] = scoreForecasts(t, st, cands)
		lines := []string{fmt.Sprintf("%s, %d keys, %d slices, %d nodes, %d epochs x %d seeds", spec, st.keys, st.slices, st.nodes, st.epochs, st.seeds),
			"| forecast | slice error | node error | forecast change | greedy imbalance | oracle |", "|---|---|---|---|---|---|"}
		for c, cand := range cands {
			lines = append(lines, all[w][c].row(cand.name))
		}
		t.Log("\n" + strings.Join(lines, "\n"))
	}
	t.Log("\n" + summary(specs, cands, all))
}

// summary tabulates each candidate's slice error over the best candidate's, per workload,
// with the worst such ratio and the mean forecast change.
func summary(specs []string, cands []candidate, all [][]score) string {
	lines := []string{"| forecast | " + strings.Join(specs, " | ") + " | worst | forecast change |",
		strings.Repeat("|---", len(specs)+3) + "|"}
	best := make([]float64, len(specs))
	for w := range specs {
		best[w] = math.Inf(1)
		for _, s := range all[w] {
			best[w] = min(best[w], s.sliceErr/s.actual)
		}
	}
	for c, cand := range cands {
		cells, worst, change := []string{cand.name}, 0.0, 0.0
		for w := range specs {
			r := all[w][c].sliceErr / all[w][c].actual / best[w]
			cells = append(cells, fmt.Sprintf("%.2f", r))
			worst = max(worst, r)
			change += all[w][c].moved / all[w][c].forecast / float64(len(specs))
		}
		lines = append(lines, "| "+strings.Join(cells, " | ")+fmt.Sprintf(" | %.2f | %.3f |", worst, change))
	}
	return strings.Join(lines, "\n")
}

// TestDefaultForecastOnNoisyLoads keeps the figures' conclusions true on a small noisy
// workload: the default forecast errs far less than the old default (EWMA with a 10 s
// half-life), nearly as little as the last epoch's load taken as it is, while moving
// much less from one epoch to the next than that.
func TestDefaultForecastOnNoisyLoads(t *testing.T) {
	st := forecastSetup{spec: "noisy", keys: 10_000, epochs: 60, warm: 10, slices: 200, nodes: 10, seeds: 1}
	cands := []candidate{{"default", load.EstimatorConfig{}}, ewma(10 * time.Second), ewma(time.Millisecond)}
	scores := scoreForecasts(t, st, cands)
	for c, s := range scores {
		t.Log(s.row(cands[c].name))
	}
	def, old, last := scores[0], scores[1], scores[2]
	assert.Less(t, def.sliceErr, 0.8*old.sliceErr, "the old default")
	assert.Less(t, def.sliceErr, 1.1*last.sliceErr, "the last epoch's load")
	assert.Less(t, def.moved, 0.7*last.moved, "the last epoch's load")
}
