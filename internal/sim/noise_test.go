package sim

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// settledFrom is the epoch from which a stationary run is counted as converged.
const settledFrom = 20

// settled returns a run's mean experienced imbalance, mean churn per pass and split/merge
// cycles over the epochs from settledFrom on.
func settled(res Result) (imbalance, churn float64, cycles int) {
	es := res.Epochs[settledFrom:]
	for _, e := range es {
		imbalance += e.Imbalance / float64(len(es))
		churn += e.Churn / float64(len(es))
		cycles += e.SplitMergeCycles
	}
	return imbalance, churn, cycles
}

// TestCountingNoiseBuysNoChurn runs the core on a load that never changes but is counted
// from 1,000 requests a window over 10,000 keys (Zipf 1.1): all the change the core sees
// is counting noise. With the noise gate, churn after convergence stays under 0.05% of the
// keys per pass, with no split/merge cycle, at the imbalance of the gate off, which spends
// more than ten times that.
func TestCountingNoiseBuysNoChurn(t *testing.T) {
	seeds := []uint64{1, 2, 3}
	var on, off struct {
		imbalance, churn float64
		cycles           int
	}
	for _, seed := range seeds {
		wl, err := ParseWorkload("noisy:1.1:0:0:0:1000000:0.1", 10000, 120, seed)
		require.NoError(t, err)
		for _, run := range []struct {
			gate string
			sum  *struct {
				imbalance, churn float64
				cycles           int
			}
		}{{"2", &on}, {"0", &off}} {
			res, err := RunCore(context.Background(), "weighted-move", map[string]string{"noise_gate": run.gate},
				Scenario{Workload: wl}, Options{Nodes: 4, Epochs: 120})
			require.NoError(t, err)
			imb, churn, cycles := settled(res)
			run.sum.imbalance += imb / float64(len(seeds))
			run.sum.churn += churn / float64(len(seeds))
			run.sum.cycles += cycles
		}
	}
	t.Logf("gate on: imbalance %.4f churn %.4f%% cycles %d; off: imbalance %.4f churn %.4f%% cycles %d",
		on.imbalance, 100*on.churn, on.cycles, off.imbalance, 100*off.churn, off.cycles)
	assert.LessOrEqual(t, on.churn, 0.0005, "churn per pass after convergence")
	assert.Zero(t, on.cycles, "split/merge cycles after convergence")
	assert.LessOrEqual(t, on.imbalance, off.imbalance+0.01, "the imbalance of the gate off")
	assert.Greater(t, off.churn, 10*on.churn, "without the gate, noise buys churn")
}
