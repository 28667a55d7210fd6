package slicectl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// run executes slicectl with args and returns its stdout and stderr.
func run(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := Execute(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), err
}

type report struct {
	Runs []struct {
		Algorithm string `json:"algorithm"`
		Epochs    []struct {
			Epoch     int     `json:"epoch"`
			Imbalance float64 `json:"imbalance"`
			Churn     float64 `json:"churn"`
			Nodes     int     `json:"nodes"`
		} `json:"epochs"`
		Summary struct {
			FinalImbalance float64 `json:"final_imbalance"`
		} `json:"summary"`
	} `json:"runs"`
}

func TestSimComparesAllAlgorithmsAndPlots(t *testing.T) {
	plot := filepath.Join(t.TempDir(), "out.svg")
	out, _, err := run(t, "sim", "--algorithm", "all", "--workload", "zipf:1.1", "--keys", "20000",
		"--nodes", "10", "--epochs", "6", "--plot", plot, "--format", "json")
	require.NoError(t, err)
	var r report
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	var names []string
	for _, run := range r.Runs {
		names = append(names, run.Algorithm)
		assert.Len(t, run.Epochs, 6)
	}
	assert.Equal(t, []string{"consistent-hash", "neighbour-offload", "random", "range", "weighted-move", "weighted-move-headroom"}, names)
	wm := r.Runs[4]
	assert.Less(t, wm.Summary.FinalImbalance, 1.1, "Weighted-Move balances the Zipf load")
	for _, base := range r.Runs[:4] {
		assert.Greater(t, base.Summary.FinalImbalance, wm.Summary.FinalImbalance, base.Algorithm)
	}
	svg, err := os.ReadFile(plot)
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix(bytes.TrimSpace(svg), []byte("<?xml")) || bytes.Contains(svg[:200], []byte("<svg")))
}

func TestSimTraceAndNodeChanges(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "t.jsonl")
	require.NoError(t, os.WriteFile(trace, []byte(`{"epoch":0,"key":"a","load":5}
{"epoch":0,"key":"b","load":1}
{"epoch":2,"add_node":"extra"}
{"epoch":3,"key":"c","load":2}
`), 0o644))
	out, _, err := run(t, "sim", "--trace", trace, "--nodes", "3", "--algorithm", "range,consistent-hash",
		"--remove-node-at", "1:n2", "--format", "json")
	require.NoError(t, err)
	var r report
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Len(t, r.Runs, 2)
	var nodes []int
	for _, e := range r.Runs[0].Epochs {
		nodes = append(nodes, e.Nodes)
	}
	assert.Equal(t, []int{3, 2, 3, 3}, nodes, "epochs run up to the trace's last event")

	_, errOut, err := run(t, "sim", "--trace", trace, "--epochs", "2", "--format", "csv")
	require.NoError(t, err)
	assert.Contains(t, errOut, "running only 2 epochs")
}

// TestSimRunsTheCoreByDefaultAndComparesEngines runs sim end to end: by default on the
// assigner's core, and with --engine on both, the core and the algorithm alone, per algorithm.
func TestSimRunsTheCoreByDefaultAndComparesEngines(t *testing.T) {
	type simRun struct {
		Algorithm string `json:"algorithm"`
		Engine    string `json:"engine"`
		Epochs    []struct {
			Imbalance         float64 `json:"imbalance"`
			ReportedImbalance float64 `json:"reported_imbalance"`
			ForecastError     float64 `json:"forecast_error"`
		} `json:"epochs"`
		Summary struct {
			FinalImbalance    float64 `json:"final_imbalance"`
			MeanForecastError float64 `json:"mean_forecast_error"`
			Thrashing         float64 `json:"thrashing"`
		} `json:"summary"`
	}
	args := []string{"sim", "--workload", "zipf:1.1", "--keys", "20000", "--nodes", "10", "--epochs", "8", "-o", "json"}
	out, _, err := run(t, args...)
	require.NoError(t, err)
	var def struct{ Runs []simRun }
	require.NoError(t, json.Unmarshal([]byte(out), &def))
	require.Len(t, def.Runs, 1)
	core := def.Runs[0]
	assert.Equal(t, "core", core.Engine, "the core is the default engine")
	assert.Less(t, core.Summary.FinalImbalance, 1.1)
	assert.Equal(t, 1.0, core.Epochs[0].ForecastError)
	assert.Less(t, core.Summary.MeanForecastError, 0.1)

	out, _, err = run(t, append(args, "--engine", "core,algorithm", "--epoch", "2s", "--half-life", "4s")...)
	require.NoError(t, err)
	var both struct{ Runs []simRun }
	require.NoError(t, json.Unmarshal([]byte(out), &both))
	require.Len(t, both.Runs, 2)
	assert.Equal(t, []string{"core", "algorithm"}, []string{both.Runs[0].Engine, both.Runs[1].Engine})
	for _, r := range both.Runs {
		assert.Equal(t, "weighted-move", r.Algorithm)
		assert.Len(t, r.Epochs, 8)
		assert.Less(t, r.Summary.FinalImbalance, 1.1, r.Engine)
	}

	out, _, err = run(t, "sim", "--keys", "1000", "--nodes", "4", "--epochs", "3", "--engine", "algorithm", "--engine", "core")
	require.NoError(t, err)
	assert.Contains(t, out, "weighted-move (algorithm) imbalance")
	assert.Regexp(t, `(?m)^\s*weighted-move\s+core\s`, out)
}

func TestSimRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte(`{"epoch":0,"key":"a","load":1}`+"\n"+`{"epoch":0,"key":"a"}`+"\n"), 0o644))
	cases := []struct {
		args  []string
		want  string
		usage bool
	}{
		{[]string{"--algorithm", "magic"}, `--algorithm "magic"`, true},
		{[]string{"--param", "max_churn=0.05", "--algorithm", "range"}, "no selected algorithm has that parameter", true},
		{[]string{"--param", "max_churn"}, "is not name=value", true},
		{[]string{"--param", "max_churn=2"}, "max_churn=2: want 0..1", true},
		{[]string{"--param", "range:virtual_nodes=3"}, "no selected algorithm", true},
		{[]string{"--workload", "zipf"}, "give the exponent", true},
		{[]string{"--keys", "0"}, "--keys 0", true},
		{[]string{"--nodes", "0"}, "--nodes 0", true},
		{[]string{"--epochs", "0"}, "--epochs 0", true},
		{[]string{"--format", "xml"}, `--format "xml"`, true},
		{[]string{"--plot", "x.pdf"}, ".svg or .png", true},
		{[]string{"--remove-node-at", "x"}, `--remove-node-at "x"`, true},
		{[]string{"--remove-node-at", "1:a b"}, "bad node ID", true},
		{[]string{"--add-node-at", "-1"}, "--add-node-at -1", true},
		{[]string{"--remove-zone", "1:z0"}, `--remove-zone "1:z0": needs --zones`, true},
		{[]string{"--zones", "3", "--remove-zone", "1:z3"}, `zone "z3": want one of z0..z2`, true},
		{[]string{"--zones", "3", "--remove-zone", "1:zone1"}, `want one of z0..z2`, true},
		{[]string{"--zones", "3", "--remove-zone", "1:z01"}, `want one of z0..z2`, true},
		{[]string{"--zones", "3", "--remove-zone", "3:z0"}, "epoch 3 is past the last, 2", true},
		{[]string{"--zones", "3", "--remove-zone", "z0"}, "want EPOCH:ZONE", true},
		{[]string{"--zones", "-1"}, "--zones -1", true},
		{[]string{"--nodes", "1", "--zones", "1", "--remove-zone", "1:z0"}, "last live node", false},
		{[]string{"--trace", bad, "--workload", "uniform"}, "give one or the other", true},
		{[]string{"--trace", bad}, `line 2: key "a" has no "load"`, false},
		{[]string{"--trace", filepath.Join(dir, "missing.jsonl")}, "opening the trace", false},
		{[]string{"--nodes", "1", "--remove-node-at", "1"}, "last live node", false},
		{[]string{"--engine", "magic"}, `--engine "magic"`, true},
		{[]string{"--epoch", "10ms"}, "--epoch 10ms", true},
		{[]string{"--half-life", "-1s"}, "--half-life -1s", true},
		{[]string{"--load-forecast", "crystal-ball"}, `--load-forecast "crystal-ball": want one of ewma, peak, holt, adaptive`, true},
		{[]string{"--load-peak-half-life", "-1s"}, "--load-peak-half-life -1s", true},
		{[]string{"--load-half-life", "2s", "--half-life", "3s"}, "give one or the other", true},
		{[]string{"--engine", "algorithm", "--load-forecast", "holt"}, "--load-forecast shapes the core's load forecast", true},
		{[]string{"--engine", "algorithm", "--half-life", "1s"}, "--half-life shapes the core's load forecast", true},
		{[]string{"--bogus"}, "unknown flag", true},
		{[]string{"extra-arg"}, "unknown command", true},
	}
	for _, c := range cases {
		args := append([]string{"sim", "--keys", "100", "--epochs", "3"}, c.args...)
		out, _, err := run(t, args...)
		require.Error(t, err, strings.Join(c.args, " "))
		assert.Empty(t, out, "nothing ran: %s", strings.Join(c.args, " "))
		assert.Contains(t, err.Error(), c.want, strings.Join(c.args, " "))
		assert.Equal(t, c.usage, errorsIsUsage(err), "usage error? %s: %v", strings.Join(c.args, " "), err)
	}
}

// TestSimLoadForecastShapesTheCore checks that the assigner's --load-* flags reach the
// core's estimator: on the same seeded workload, each forecast errs differently.
func TestSimLoadForecastShapesTheCore(t *testing.T) {
	type simRun struct {
		Epochs []struct {
			ForecastError float64 `json:"forecast_error"`
		} `json:"epochs"`
	}
	errs := map[string][]float64{}
	for _, forecast := range []string{"adaptive", "ewma", "peak", "holt"} {
		out, _, err := run(t, "sim", "--workload", "hotspot-shift:1.1:3", "--keys", "5000", "--nodes", "8",
			"--epochs", "8", "--seed", "3", "--load-forecast", forecast, "--load-half-life", "5s", "-o", "json")
		require.NoError(t, err, forecast)
		var r struct{ Runs []simRun }
		require.NoError(t, json.Unmarshal([]byte(out), &r))
		require.Len(t, r.Runs, 1)
		for _, e := range r.Runs[0].Epochs {
			errs[forecast] = append(errs[forecast], e.ForecastError)
		}
	}
	assert.NotEqual(t, errs["adaptive"], errs["ewma"])
	assert.NotEqual(t, errs["ewma"], errs["peak"])
	assert.NotEqual(t, errs["ewma"], errs["holt"])

	out, _, err := run(t, "sim", "--workload", "hotspot-shift:1.1:3", "--keys", "5000", "--nodes", "8",
		"--epochs", "8", "--seed", "3", "--load-half-life", "5s", "-o", "json")
	require.NoError(t, err)
	var def struct{ Runs []simRun }
	require.NoError(t, json.Unmarshal([]byte(out), &def))
	var got []float64
	for _, e := range def.Runs[0].Epochs {
		got = append(got, e.ForecastError)
	}
	assert.Equal(t, errs["adaptive"], got, "adaptive is the default, as in the assigner")

	out, _, err = run(t, "sim", "--help")
	require.NoError(t, err)
	for _, flag := range []string{"--load-forecast", "--load-half-life", "--load-peak-half-life", "--load-trend-half-life",
		"--load-signal-half-life"} {
		assert.Contains(t, out, flag)
	}
}

func TestUnknownCommandIsAUsageError(t *testing.T) {
	_, _, err := run(t, "frobnicate")
	require.ErrorIs(t, err, ErrUsage)
	assert.Contains(t, err.Error(), `unknown command "frobnicate"`)
}

func TestSimHelpListsParameters(t *testing.T) {
	out, _, err := run(t, "sim", "--help")
	require.NoError(t, err)
	for _, s := range []string{"max_churn", "virtual_nodes", "threshold", "--workload", "Example", "--engine",
		"forecast err", "thrashing", "reported", "undone moves", "ping-pongs"} {
		assert.Contains(t, out, s)
	}
}

func errorsIsUsage(err error) bool { return errors.Is(err, ErrUsage) }

// TestSimLosesAZone removes a zone on both engines: the nodes of z1 leave at once, the
// replicated hot slices keep a live replica, and the run recovers.
func TestSimLosesAZone(t *testing.T) {
	out, _, err := run(t, "sim", "--workload", "zipf:1.1", "--keys", "20000", "--nodes", "9", "--epochs", "10",
		"--zones", "3", "--remove-zone", "5:z1", "--engine", "core,algorithm", "--format", "json")
	require.NoError(t, err)
	var r struct {
		Runs []struct {
			Engine string `json:"engine"`
			Epochs []struct {
				Imbalance float64 `json:"imbalance"`
				Nodes     int     `json:"nodes"`
				Orphaned  float64 `json:"orphaned"`
				OrphLoad  float64 `json:"orphaned_load"`
			} `json:"epochs"`
		} `json:"runs"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Len(t, r.Runs, 2)
	for _, run := range r.Runs {
		eps := run.Epochs
		require.Len(t, eps, 10)
		assert.Equal(t, 9, eps[4].Nodes, run.Engine)
		assert.Equal(t, 6, eps[5].Nodes, "%s: z1's three nodes left at epoch 5", run.Engine)
		for e, ep := range eps {
			if e != 5 {
				assert.Zero(t, ep.Orphaned, "%s, epoch %d", run.Engine, e)
			}
		}
		assert.Less(t, eps[5].Orphaned, 1.0/3, "%s: replicated slices are not orphaned", run.Engine)
		assert.Less(t, eps[5].OrphLoad, eps[5].Orphaned, "%s: the hot slices, replicated, kept a replica", run.Engine)
		assert.Less(t, eps[9].Imbalance, 1.2, "%s: the run recovers", run.Engine)
	}

	help, _, err := run(t, "sim", "--help")
	require.NoError(t, err)
	for _, s := range []string{"--zones", "--remove-zone", "orphaned"} {
		assert.Contains(t, help, s)
	}
}
