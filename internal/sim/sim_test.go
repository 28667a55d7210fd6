package sim

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

func algorithm(t *testing.T, name string, params map[string]string) balance.Algorithm {
	t.Helper()
	a, err := balance.New(name, params)
	require.NoError(t, err)
	return a
}

// TestRunMeasuresWhatTheAssignmentInForceServes replays a trace on the static range
// algorithm, whose map is known (n0 holds the lower half of the space, n1 the upper), and
// checks every figure against loads computed here from the keys' hashes.
func TestRunMeasuresWhatTheAssignmentInForceServes(t *testing.T) {
	var trace strings.Builder
	loads := map[string]float64{}
	for i := range 8 {
		k := fmt.Sprintf("k%d", i)
		loads[k] = float64(i + 1)
		fmt.Fprintf(&trace, `{"epoch":0,"key":%q,"load":%v}`+"\n", k, loads[k])
	}
	trace.WriteString(`{"epoch":1,"remove_node":"n1"}` + "\n")
	trace.WriteString(`{"epoch":2,"key":"k0","load":0}` + "\n")
	tr, err := ReadTrace(strings.NewReader(trace.String()), []assignment.NodeID{"n0", "n1"})
	require.NoError(t, err)

	var lower, upper float64
	upperKeys := 0
	for k, l := range loads {
		if keyspace.HashString(k) < 1<<63 {
			lower += l
		} else {
			upper += l
			upperKeys++
		}
	}
	require.NotZero(t, upperKeys, "the fixture needs keys in both halves")

	res, err := Run(context.Background(), algorithm(t, "range", nil), Scenario{Trace: tr}, Options{Nodes: 2, Epochs: 3})
	require.NoError(t, err)
	require.Len(t, res.Epochs, 3)
	e0, e1, e2 := res.Epochs[0], res.Epochs[1], res.Epochs[2]

	assert.InDelta(t, max(lower, upper)/((lower+upper)/2), e0.Imbalance, 1e-12)
	// Nothing was measured before epoch 0: the forecast is 0, its error 100%.
	assert.Equal(t, Epoch{Epoch: 0, Imbalance: e0.Imbalance, ReportedImbalance: 1, ForecastError: 1, Churn: 0, Slices: 2, Nodes: 2,
		KeyCopies: 1}, e0)
	// n1 left: the map in force still gives it the upper half, whose load nobody serves; the
	// pass then gives n0 everything, copying the upper half's keys to it.
	assert.Equal(t, 1.0, e1.Imbalance)
	assert.InDelta(t, float64(upperKeys)/8, e1.Churn, 1e-12)
	assert.Equal(t, 1, e1.Nodes)
	assert.Equal(t, 2, e1.Slices)
	// The keys of n1's half have no live replica: memory the map in force no longer holds.
	assert.InDelta(t, float64(8-upperKeys)/8, e1.KeyCopies, 1e-12)
	// The pass of epoch 1 expected n0 to serve all 36 of epoch 1's load; k0 went idle, so it
	// served 35.
	assert.Equal(t, Epoch{Epoch: 2, Imbalance: 1, ReportedImbalance: 1, ForecastError: 1.0 / 35, Churn: 0, Slices: 1, Nodes: 1,
		KeyCopies: 1}, e2)

	s := res.Summary
	assert.Equal(t, 1.0, s.FinalImbalance)
	assert.InDelta(t, (e0.Imbalance+2)/3, s.MeanImbalance, 1e-12)
	assert.Equal(t, e0.Imbalance, s.MaxImbalance)
	assert.Equal(t, e1.Churn, s.MaxChurn)
	assert.Equal(t, e1.Churn, s.TotalChurn)
}

func TestMeasureAndChurnCountEveryKeyAndReplica(t *testing.T) {
	r := &runner{w: newWorld(0)}
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		r.w.keys.set(k, 10)
	}
	r.w.keys.set("hot", 1000)
	hashes := r.w.keys.sortedHashes()
	var err error
	r.a, err = assignment.New(0, []assignment.Slice{
		{Range: keyspace.Range{Start: 0, End: keyspace.At(1 << 63)}, Replicas: []assignment.NodeID{"x"}},
		{Range: keyspace.Range{Start: 1 << 63, End: keyspace.End}, Replicas: []assignment.NodeID{"x", "y"}},
	})
	require.NoError(t, err)
	loads, counts, hot := r.measure(2)
	var wantLoads, wantCounts [2]float64
	for k, id := range r.w.keys.names {
		half := 0
		if keyspace.HashString(k) >= 1<<63 {
			half = 1
		}
		wantLoads[half] += r.w.keys.load[id]
		wantCounts[half]++
	}
	assert.Equal(t, wantLoads[:], loads)
	assert.Equal(t, wantCounts[:], counts)
	hotHash := keyspace.HashString("hot")
	i, _ := r.a.Lookup(hotHash)
	require.NotEmpty(t, hot[i])
	assert.Equal(t, balance.HotKey{Hash: hotHash, Load: 1000}, hot[i][0], "the heaviest key is reported first")

	// Moving the upper half from {x,y} to {y,z} copies its keys to z only; a departed node
	// counts for nothing.
	next, err := r.a.Apply([]assignment.Op{assignment.Assign{Slice: 1 << 63, Replicas: []assignment.NodeID{"y", "z", "gone"}}})
	require.NoError(t, err)
	live := assignment.MustNodeSet(assignment.Node{ID: "x"}, assignment.Node{ID: "y"}, assignment.Node{ID: "z"})
	assert.InDelta(t, wantCounts[1]/float64(len(hashes)), churn(r.a, next, hashes, live), 1e-12)
	assert.Zero(t, churn(r.a, r.a, hashes, live))
}

func TestKeepTopKeepsTheHeaviest(t *testing.T) {
	var top []balance.HotKey
	for i, l := range []float64{3, 9, 1, 7, 5, 8} {
		top = keepTopN(top, balance.HotKey{Hash: uint64(i), Load: l}, hotKeys)
	}
	assert.Equal(t, []balance.HotKey{{Hash: 1, Load: 9}, {Hash: 5, Load: 8}, {Hash: 3, Load: 7}, {Hash: 4, Load: 5}}, top)
}

func TestNodeChanges(t *testing.T) {
	wl, err := ParseWorkload("uniform", 1000, 6, 1)
	require.NoError(t, err)
	res, err := Run(context.Background(), algorithm(t, "consistent-hash", nil), Scenario{Workload: wl}, Options{
		Nodes: 3, Epochs: 6, AddNodeAt: []int{1, 1}, RemoveNodeAt: []Removal{{Epoch: 3}, {Epoch: 4, Node: "n0"}},
	})
	require.NoError(t, err)
	var nodes []int
	for _, e := range res.Epochs {
		nodes = append(nodes, e.Nodes)
	}
	assert.Equal(t, []int{3, 5, 5, 4, 3, 3}, nodes)
	assert.Zero(t, res.Epochs[0].Churn)
	assert.Positive(t, res.Epochs[1].Churn, "new nodes take keys")
	assert.Positive(t, res.Epochs[3].Churn, "a departed node's keys move")

	for _, rm := range []Removal{{Epoch: 0, Node: "n9"}, {Epoch: 0}} {
		opt := Options{Nodes: 1, Epochs: 2, RemoveNodeAt: []Removal{rm}}
		_, err := Run(context.Background(), algorithm(t, "range", nil), Scenario{Workload: wl}, opt)
		assert.ErrorIs(t, err, ErrScenario, "%+v", rm)
	}
}

func TestRunRejectsBadScenarios(t *testing.T) {
	wl, _ := ParseWorkload("uniform", 10, 2, 1)
	alg := algorithm(t, "range", nil)
	for _, c := range []struct {
		sc  Scenario
		opt Options
	}{
		{Scenario{}, Options{Nodes: 1, Epochs: 1}},
		{Scenario{Workload: wl, Trace: &Trace{}}, Options{Nodes: 1, Epochs: 1}},
		{Scenario{Workload: wl}, Options{Nodes: 0, Epochs: 1}},
		{Scenario{Workload: wl}, Options{Nodes: 1, Epochs: 0}},
	} {
		_, err := Run(context.Background(), alg, c.sc, c.opt)
		assert.ErrorIs(t, err, ErrScenario)
	}
}

func TestRunStopsWhenCancelled(t *testing.T) {
	wl, _ := ParseWorkload("uniform", 10, 100, 1)
	ctx, cancel := context.WithCancel(context.Background())
	epochs := 0
	_, err := Run(ctx, algorithm(t, "range", nil), Scenario{Workload: wl}, Options{
		Nodes: 2, Epochs: 100, Progress: func(done, _ int) {
			epochs = done
			if done == 3 {
				cancel()
			}
		},
	})
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 3, epochs)
}

func TestRunIsDeterministic(t *testing.T) {
	run := func() Result {
		wl, err := ParseWorkload("hotspot-shift:1.1:4", 20000, 10, 3)
		require.NoError(t, err)
		res, err := Run(context.Background(), algorithm(t, "weighted-move", nil), Scenario{Workload: wl},
			Options{Nodes: 10, Epochs: 10, AddNodeAt: []int{6}})
		require.NoError(t, err)
		return res
	}
	assert.Equal(t, run(), run())
}

// TestWeightedMoveMeetsTheBalanceTarget is the acceptance check of the foundation issue, at
// its full scale: on zipf:1.1 with 1M keys and 100 nodes, Weighted-Move reaches max/mean <=
// 1.10 within 5 epochs and stays there; after a hotspot shift it is back within 5 epochs and
// stays again; no pass copies more than 9% of the keys.
func TestWeightedMoveMeetsTheBalanceTarget(t *testing.T) {
	keys := 1_000_000
	if testing.Short() {
		keys = 100_000
	}
	wl, err := ParseWorkload("hotspot-shift:1.1:10", keys, 20, 1)
	require.NoError(t, err)
	res, err := Run(context.Background(), algorithm(t, "weighted-move", nil), Scenario{Workload: wl}, Options{Nodes: 100, Epochs: 20})
	require.NoError(t, err)
	for _, phase := range []struct{ start, end int }{{0, 10}, {10, 20}} {
		reached := -1
		for _, e := range res.Epochs[phase.start:phase.end] {
			if e.Imbalance <= 1.10 && reached < 0 {
				reached = e.Epoch
			}
			if reached >= 0 {
				assert.LessOrEqual(t, e.Imbalance, 1.10, "epoch %d: imbalance came back up", e.Epoch)
			}
		}
		require.GreaterOrEqual(t, reached, 0, "never balanced in epochs %d..%d: %+v", phase.start, phase.end-1, res.Epochs)
		assert.LessOrEqual(t, reached-phase.start, 5, "took %d epochs", reached-phase.start)
	}
	for _, e := range res.Epochs {
		assert.LessOrEqual(t, e.Churn, 0.09+1e-9, "epoch %d", e.Epoch)
	}
}
