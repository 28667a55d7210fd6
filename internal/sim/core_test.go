package sim

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

func runCore(t *testing.T, spec string, keys int, opt Options) Result {
	t.Helper()
	wl, err := ParseWorkload(spec, keys, opt.Epochs, 1)
	require.NoError(t, err)
	res, err := RunCore(context.Background(), "weighted-move", nil, Scenario{Workload: wl}, opt)
	require.NoError(t, err)
	require.Len(t, res.Epochs, opt.Epochs)
	return res
}

// TestCoreConvergesAndIsDeterministic drives the assigner's core through a uniform and a
// Zipf workload: it balances within a few epochs and stays balanced, and a run is the same
// every time for a seed.
func TestCoreConvergesAndIsDeterministic(t *testing.T) {
	for _, spec := range []string{"uniform", "zipf:1.1"} {
		t.Run(spec, func(t *testing.T) {
			opt := Options{Nodes: 10, Epochs: 12}
			res := runCore(t, spec, 20000, opt)
			assert.Equal(t, EngineCore, res.Engine)
			for _, e := range res.Epochs[4:] {
				assert.Less(t, e.Imbalance, 1.1, "epoch %d: %+v", e.Epoch, res.Epochs)
			}
			for _, e := range res.Epochs {
				assert.Equal(t, 10, e.Nodes)
				assert.LessOrEqual(t, e.Churn, 0.09+1e-9, "epoch %d: the pass keeps to its churn budget", e.Epoch)
			}
			assert.Equal(t, 1.0, res.Epochs[0].ForecastError, "nothing is measured before epoch 0")
			assert.Less(t, res.Summary.MeanForecastError, 0.05)
			assert.GreaterOrEqual(t, res.Summary.Thrashing, 0.0)
			assert.Equal(t, res, runCore(t, spec, 20000, opt), "a run is deterministic")
		})
	}
}

// TestCoreForecastIsExactOnConstantLoad checks the forecast error: once every node has
// reported a constant load, the core's estimate of each node's load is what it serves.
func TestCoreForecastIsExactOnConstantLoad(t *testing.T) {
	res := runCore(t, "uniform", 5000, Options{Nodes: 5, Epochs: 6, Epoch: 2 * time.Second})
	for _, e := range res.Epochs[1:] {
		assert.InDelta(t, 0, e.ForecastError, 1e-9, "epoch %d", e.Epoch)
		assert.InDelta(t, e.Imbalance, e.ReportedImbalance, 1e-9, "epoch %d: the core sees what nodes serve", e.Epoch)
	}
	assert.InDelta(t, 0, res.Summary.MeanForecastError, 1e-9)
	assert.InDelta(t, 0, res.Summary.Thrashing, 1e-9, "a constant, balanced load does not swing")
}

// TestCoreCleansUpARemovedNode removes a node: it deregisters, and the next pass moves every
// slice off it.
func TestCoreCleansUpARemovedNode(t *testing.T) {
	wl, err := ParseWorkload("zipf:1.1", 5000, 6, 1)
	require.NoError(t, err)
	opt := Options{Nodes: 4, Epochs: 6, RemoveNodeAt: []Removal{{Epoch: 3, Node: "n1"}}, AddNodeAt: []int{2}}
	r, err := newCoreRunner("weighted-move", nil, Scenario{Workload: wl}, opt)
	require.NoError(t, err)
	th := newThrashing()
	var nodes []int
	for e := range opt.Epochs {
		ep, err := r.epoch(e, th)
		require.NoError(t, err)
		nodes = append(nodes, ep.Nodes)
		a, _, _ := r.core.Assignment()
		require.Equal(t, a.Generation(), r.view.Generation())
		require.True(t, a.Equal(r.view), "epoch %d: the quanta published build the core's map", e)
		held := 0
		for _, s := range a.All() {
			if s.Holds("n1") {
				held++
			}
		}
		if e < 3 {
			assert.Positive(t, held, "epoch %d: n1 holds slices while it is live", e)
		} else {
			assert.Zero(t, held, "epoch %d: the pass after n1 left moved its slices", e)
		}
		live, err := r.w.nodeSet()
		require.NoError(t, err)
		require.NoError(t, a.Validate(live))
	}
	assert.Equal(t, []int{4, 4, 5, 4, 4, 4}, nodes)
	var ids []assignment.NodeID
	for _, n := range r.core.Nodes() {
		ids = append(ids, n.ID)
	}
	assert.Equal(t, []assignment.NodeID{"n0", "n2", "n3", "n4"}, ids, "n1 deregistered, n4 registered")
}

func TestRunCoreRejectsBadScenarios(t *testing.T) {
	wl, err := ParseWorkload("uniform", 100, 2, 1)
	require.NoError(t, err)
	ctx := context.Background()
	for name, c := range map[string]struct {
		sc  Scenario
		opt Options
	}{
		"no work":         {Scenario{}, Options{Nodes: 1, Epochs: 1}},
		"no epochs":       {Scenario{Workload: wl}, Options{Nodes: 1}},
		"no nodes":        {Scenario{Workload: wl}, Options{Epochs: 1}},
		"epoch too short": {Scenario{Workload: wl}, Options{Nodes: 1, Epochs: 1, Epoch: time.Millisecond}},
	} {
		_, err := RunCore(ctx, "weighted-move", nil, c.sc, c.opt)
		assert.ErrorIs(t, err, ErrScenario, name)
	}
	_, err = RunCore(ctx, "no-such-algorithm", nil, Scenario{Workload: wl}, Options{Nodes: 1, Epochs: 1})
	assert.Error(t, err)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = RunCore(cancelled, "weighted-move", nil, Scenario{Workload: wl}, Options{Nodes: 1, Epochs: 1})
	assert.ErrorIs(t, err, context.Canceled)
}

func TestThrashingDiscountsTrends(t *testing.T) {
	assert.Equal(t, 0.0, tdtv(3, 0))
	assert.Equal(t, 4.0, tdtv(2, 2))
	assert.Equal(t, tdtv(1, 5), tdtv(5, 1))
	nodes := assignment.MustNodeSet(assignment.Node{ID: "a"}, assignment.Node{ID: "b"})
	th := newThrashing()
	for range 5 { // a and b swap 1.2 and 0.8 of the mean every epoch
		th.add(nodes, []float64{12, 8})
		th.add(nodes, []float64{8, 12})
	}
	assert.InDelta(t, 0.4*8/9, th.score(), 1e-9, "swings of 0.4 of the mean, 4 up and 5 down in 9 epochs")
	th = newThrashing()
	for _, l := range []float64{30, 20, 15, 11, 10} { // a cools down towards the mean
		th.add(nodes, []float64{l, 10})
	}
	assert.InDelta(t, 0, th.score(), 1e-9)
	assert.Equal(t, 1.75, forecastError([]float64{1, 3, 5}, []float64{2, 2, 0}), "(1 + 1 + 5) / 4")
	assert.Equal(t, 0.0, forecastError([]float64{1}, []float64{0}))
}

// TestCoreRegistersTraceNodesWithCapacityAndLabels replays a trace whose nodes join with a
// capacity and labels: they register with both, and the bigger node gets more load.
func TestCoreRegistersTraceNodesWithCapacityAndLabels(t *testing.T) {
	var trace strings.Builder
	for i := range 400 {
		fmt.Fprintf(&trace, `{"epoch":0,"key":"k%d","load":1}`+"\n", i)
	}
	trace.WriteString(`{"epoch":0,"add_node":"a","capacity":1,"labels":{"zone":"x"}}` + "\n")
	trace.WriteString(`{"epoch":0,"add_node":"b","capacity":3,"labels":{"zone":"y"}}` + "\n")
	tr, err := ReadTrace(strings.NewReader(trace.String()), nil)
	require.NoError(t, err)
	opt := Options{Epochs: 8}
	r, err := newCoreRunner("weighted-move", nil, Scenario{Trace: tr}, opt)
	require.NoError(t, err)
	th := newThrashing()
	var last Epoch
	for e := range opt.Epochs {
		last, err = r.epoch(e, th)
		require.NoError(t, err)
	}
	nodes := r.core.Nodes()
	require.Len(t, nodes, 2)
	assert.Equal(t, map[string]string{"zone": "x"}, nodes[0].Labels)
	assert.Equal(t, map[string]string{"zone": "y"}, nodes[1].Labels)
	assert.Equal(t, 3.0, nodes[1].Capacity)
	assert.Less(t, last.Imbalance, 1.1, "load over capacity is balanced: b serves about 3/4 of it")
}
