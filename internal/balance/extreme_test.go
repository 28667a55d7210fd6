package balance_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/assignment/assignmenttest"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/load"
)

// maxSliceLoad is above any slice load the assigner can estimate from reports it accepts: a
// report carries at most load.MaxRate a second over load.MaxWindow on a node of capacity
// 1e6 (3.6e24), and a slice sums the reports of its holders.
const maxSliceLoad = 1e30

// drawExtremeWorld draws inputs at the edges of what the assigner accepts: capacities from
// 1e-6 to 1e6, loads from zero through the smallest float to maxSliceLoad, key counts up to
// load.MaxKeys, and up to 100 nodes.
func drawExtremeWorld(t *rapid.T) (balance.Input, *assignment.NodeSet) {
	var nodes []assignment.Node
	for i := range rapid.IntRange(1, 100).Draw(t, "live") {
		c := rapid.SampledFrom([]float64{0, 1e-6, 1e-3, 1, 7, 1e6}).Draw(t, "capacity")
		nodes = append(nodes, assignment.Node{ID: assignment.NodeID(fmt.Sprintf("n%d", i)), Capacity: c})
	}
	set := assignment.MustNodeSet(nodes...)
	a := assignmenttest.Generator(append(set.IDs(), "gone"), 40, math.MaxUint64).Draw(t, "assignment")
	extreme := rapid.SampledFrom([]float64{0, 0, math.SmallestNonzeroFloat64, 1e-300, 1, 1e6, 1e24, maxSliceLoad})
	loads, keys := make([]float64, a.Len()), make([]float64, a.Len())
	hot := make([][]balance.HotKey, a.Len())
	for i, s := range a.All() {
		loads[i] = extreme.Draw(t, "load")
		keys[i] = rapid.SampledFrom([]float64{0, 1, math.SmallestNonzeroFloat64, load.MaxKeys}).Draw(t, "keys")
		if rapid.Bool().Draw(t, "hot") {
			hot[i] = []balance.HotKey{{Hash: s.Range.Start, Load: loads[i]}}
		}
	}
	in := balance.Input{Assignment: a, Nodes: set, Load: loads, Keys: keys, HotKeys: hot, Pass: rapid.Uint64Range(0, 10).Draw(t, "pass")}
	if rapid.Bool().Draw(t, "unknown key counts") {
		in.Keys = nil
	}
	return in, set
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// TestExtremeInputsGiveFiniteOutputs: no accepted input makes an algorithm, load.NodeLoads or
// load.Imbalance produce NaN or Inf, and every pass keeps I1.
func TestExtremeInputsGiveFiniteOutputs(t *testing.T) {
	for _, name := range balance.Names() {
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				in, live := drawExtremeWorld(t)
				params := map[string]string{}
				if name == "weighted-move" {
					params = smallParams(t)
				}
				alg, err := balance.New(name, params)
				if err != nil {
					t.Fatal(err)
				}
				for _, l := range load.NodeLoads(in.Assignment, in.Load, live) {
					if !finite(l) {
						t.Fatalf("node load %v", l)
					}
				}
				res, next := pass(t, alg, in)
				if err := next.Validate(live); err != nil {
					t.Fatalf("result breaks I1: %v", err)
				}
				x := res.Explanation
				for what, v := range map[string]float64{"imbalance before": x.ImbalanceBefore, "imbalance after": x.ImbalanceAfter,
					"churn budget": x.ChurnBudget, "churn": x.Churn.Total()} {
					if !finite(v) {
						t.Fatalf("%s is %v", what, v)
					}
				}
				for _, c := range x.Candidates {
					if !finite(c.Gain) || !finite(c.Cost) || !finite(c.Weight) {
						t.Fatalf("candidate %+v is not finite", c)
					}
				}
				after, err := load.Reproject(in.Assignment, in.Load, next)
				if err != nil {
					t.Fatal(err)
				}
				if imb := load.Imbalance(load.NodeLoads(next, after, live)); !finite(imb) {
					t.Fatalf("imbalance after the pass %v", imb)
				}
			})
		})
	}
}

// TestConstantsAreBounded: constants far outside any sensible range are refused, by name.
func TestConstantsAreBounded(t *testing.T) {
	for _, tc := range []struct {
		alg, param, value string
	}{
		{"weighted-move", "dead_band", "1e308"},
		{"weighted-move", "dead_band", "11"},
		{"weighted-move", "max_slices_per_node", "100000000"},
		{"weighted-move", "split_above", "1e9"},
		{"weighted-move", "replicate_above", "1e9"},
		{"weighted-move", "max_replicas", "100000"},
		{"weighted-move", "hold_passes", "1000000000"},
		{"weighted-move", "max_churn", "NaN"},
		{"consistent-hash", "virtual_nodes", "100000000"},
		{"neighbour-offload", "threshold", "1e308"},
		{"neighbour-offload", "buckets", "100000"},
	} {
		_, err := balance.New(tc.alg, map[string]string{tc.param: tc.value})
		require.Error(t, err, "%s %s=%s", tc.alg, tc.param, tc.value)
		assert.ErrorIs(t, err, balance.ErrBadParam)
		assert.Contains(t, err.Error(), tc.param)
	}
	_, err := balance.New("weighted-move", map[string]string{"dead_band": "10"})
	assert.NoError(t, err, "the top of the range is accepted")
}
