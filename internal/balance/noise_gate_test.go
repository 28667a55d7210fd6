package balance_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// gateInput is two nodes with eight equal slices each, in order, every slice's load
// given: the mean slice load is 10 whatever the loads (their sum is kept at 160).
func gateInput(t *testing.T, loads, unc []float64) balance.Input {
	t.Helper()
	ranges := keyspace.Equal(16)
	var ss []assignment.Slice
	for i, r := range ranges {
		ss = append(ss, assignment.Slice{Range: r, Replicas: []assignment.NodeID{assignment.NodeID(fmt.Sprint("n", i/8))}})
	}
	a, err := assignment.New(0, ss)
	require.NoError(t, err)
	return balance.Input{Assignment: a, Nodes: assignment.MustNodeSet(assignment.Node{ID: "n0"}, assignment.Node{ID: "n1"}),
		Load: loads, Uncertainty: unc}
}

func countOps(ops []assignment.Op) (splits, merges int) {
	for _, op := range ops {
		switch op.(type) {
		case assignment.Split:
			splits++
		case assignment.Merge:
			merges++
		}
	}
	return splits, merges
}

// TestNoiseGateSparesMergesAndSplitsTheNoiseExplains: two cold neighbours (joint load 8,
// the merge limit being the mean slice load, 10) merge when their loads are exact, and not
// when noise of a standard error of 1 each could put them over; a hot slice (load 24, the
// split limit 20) splits when exact, and not when its load could be 20 by noise. With the
// gate off, the uncertain loads are taken as they are.
func TestNoiseGateSparesMergesAndSplitsTheNoiseExplains(t *testing.T) {
	params := map[string]string{"min_slices_per_node": "1", "initial_slices_per_node": "8", "max_slices_per_node": "16"}
	loads := []float64{4, 4, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 24, 0}
	coldUnc := make([]float64, 16)
	coldUnc[0], coldUnc[1] = 1, 1
	hotUnc := make([]float64, 16)
	hotUnc[14] = 1
	for _, c := range []struct {
		name          string
		unc           []float64
		gate          string
		split, merges int
	}{
		{"exact loads", nil, "2", 1, 1},
		{"uncertain cold pair", coldUnc, "2", 1, 0},
		{"uncertain hot slice", hotUnc, "2", 0, 1},
		{"gate off", coldUnc, "0", 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := map[string]string{"noise_gate": c.gate}
			for k, v := range params {
				p[k] = v
			}
			alg, err := balance.New("weighted-move", p)
			require.NoError(t, err)
			res, err := alg.Rebalance(gateInput(t, loads, c.unc))
			require.NoError(t, err)
			splits, merges := countOps(res.Ops)
			assert.Equal(t, c.split, splits, "splits: %v", res.Ops)
			assert.Equal(t, c.merges, merges, "merges: %v", res.Ops)
		})
	}
}

// TestUncertaintyIsValidated: an uncertainty must be a finite number >= 0 per slice.
func TestUncertaintyIsValidated(t *testing.T) {
	alg, err := balance.New("weighted-move", nil)
	require.NoError(t, err)
	loads := make([]float64, 16)
	for _, bad := range [][]float64{make([]float64, 3), append(make([]float64, 15), -1)} {
		_, err := alg.Rebalance(gateInput(t, loads, bad))
		assert.ErrorIs(t, err, balance.ErrBadInput, "%v", bad)
	}
}

// TestNoiseGateHoldsMovesTheNoiseExplains: n0 carries 88 and n1 72 (imbalance 1.1, over
// the dead band). With a standard error of 3 on each of n0's eight slices (8.5 on n0), the
// excess of 8 is within two of them and nothing moves; exact, or with the gate off, a
// slice moves.
func TestNoiseGateHoldsMovesTheNoiseExplains(t *testing.T) {
	loads := make([]float64, 16)
	unc := make([]float64, 16)
	for i := range loads {
		loads[i] = 9
		if i < 8 {
			loads[i], unc[i] = 11, 3
		}
	}
	for _, c := range []struct {
		name  string
		unc   []float64
		gate  string
		moves bool
	}{{"exact loads", nil, "2", true}, {"uncertain", unc, "2", false}, {"gate off", unc, "0", true}} {
		t.Run(c.name, func(t *testing.T) {
			alg, err := balance.New("weighted-move", map[string]string{"noise_gate": c.gate})
			require.NoError(t, err)
			res, err := alg.Rebalance(gateInput(t, loads, c.unc))
			require.NoError(t, err)
			assert.Equal(t, c.moves, res.Explanation.Churn.Move > 0, "%s: %v", res.Explanation.Stop, res.Ops)
			if !c.moves {
				assert.Contains(t, res.Explanation.Stop, "within the noise of the estimates")
			}
		})
	}
}
