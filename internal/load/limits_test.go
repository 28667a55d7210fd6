package load_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/assignment/assignmenttest"
	"github.com/sliceplane/sliceplane/internal/load"
)

// TestAcceptedReportsKeepEstimatesFinite: whatever reports Check accepts, at the highest cap
// the assigner can be configured with, the estimator's loads, key counts and hot keys, the
// node loads and the imbalance stay finite.
func TestAcceptedReportsKeepEstimatesFinite(t *testing.T) {
	maxCap := load.Cap(load.MaxRate, load.MaxWindow, 1e6)
	rapid.Check(t, func(t *rapid.T) {
		var ids []assignment.NodeID
		var nodes []assignment.Node
		for i := range rapid.IntRange(1, 50).Draw(t, "nodes") {
			id := assignment.NodeID(fmt.Sprintf("n%d", i))
			ids = append(ids, id)
			nodes = append(nodes, assignment.Node{ID: id, Capacity: rapid.SampledFrom([]float64{0, 1e-6, 1, 1e6}).Draw(t, "capacity")})
		}
		live := assignment.MustNodeSet(nodes...)
		a := assignmenttest.Generator(ids, 30, math.MaxUint64).Draw(t, "assignment")
		e := load.NewEstimator(load.EstimatorConfig{})
		at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		value := rapid.SampledFrom([]float64{0, math.SmallestNonzeroFloat64, 1, maxCap / 2, maxCap})
		for round := range rapid.IntRange(1, 4).Draw(t, "rounds") {
			at = at.Add(time.Duration(rapid.IntRange(0, 3600).Draw(t, "gap")) * time.Second)
			for _, id := range ids {
				r := load.Report{Node: id, At: at, Window: load.MaxWindow}
				for _, s := range a.All() {
					if s.Holds(id) && rapid.Bool().Draw(t, "reports") {
						r.Samples = append(r.Samples, load.Sample{Range: s.Range, Load: value.Draw(t, "load"),
							Keys: rapid.SampledFrom([]float64{0, 1, load.MaxKeys}).Draw(t, "keys")})
						r.HotKeys = append(r.HotKeys, load.HotKey{Hash: s.Range.Start, Load: value.Draw(t, "hot")})
					}
				}
				if r.Check(maxCap) != nil {
					continue // refused whole, as the assigner does
				}
				if err := e.Add(r); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
			}
			est := e.Fold(a, at)
			for i := range est.Loads {
				if !finite(est.Loads[i]) || !finite(est.Keys[i]) {
					t.Fatalf("slice %d: load %v, keys %v", i, est.Loads[i], est.Keys[i])
				}
				for _, k := range est.HotKeys[i] {
					if !finite(k.Load) {
						t.Fatalf("slice %d: hot key load %v", i, k.Load)
					}
				}
			}
			nl := load.NodeLoads(a, est.Loads, live)
			for _, l := range nl {
				if !finite(l) {
					t.Fatalf("node load %v", l)
				}
			}
			if imb := load.Imbalance(nl); !finite(imb) {
				t.Fatalf("imbalance %v of %v", imb, nl)
			}
		}
	})
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

func TestImbalanceOfTinyLoadsIsFinite(t *testing.T) {
	// The mean of these underflows to 0; max over mean was +Inf.
	imb := load.Imbalance([]float64{math.SmallestNonzeroFloat64, 0, 0})
	if imb != 3 {
		t.Fatalf("imbalance %v; want 3", imb)
	}
}
