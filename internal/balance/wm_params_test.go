package balance_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/balance"
)

// TestSeverityParamsAreSettable checks that the severity budget is tuned like every other
// constant (the assigner's --param and `slicectl algorithm set` go through balance.New), with
// its defaults listed and nonsense refused.
func TestSeverityParamsAreSettable(t *testing.T) {
	ps, err := balance.Params("weighted-move")
	require.NoError(t, err)
	defaults := map[string]string{}
	for _, p := range ps {
		defaults[p.Name] = p.Default
	}
	assert.Equal(t, "1.3", defaults["severe_imbalance"])
	assert.Equal(t, "0.3", defaults["emergency_churn"])

	alg, err := balance.New("weighted-move", map[string]string{"severe_imbalance": "1.5", "emergency_churn": "0.4"})
	require.NoError(t, err)
	cfg := alg.(*balance.WeightedMove).Config()
	assert.Equal(t, 1.5, cfg.SevereImbalance)
	assert.Equal(t, 0.4, cfg.EmergencyChurn)

	for _, bad := range []map[string]string{
		{"severe_imbalance": "0.9"}, {"severe_imbalance": "NaN"}, {"emergency_churn": "1.5"}, {"emergency_churn": "-0.1"},
	} {
		_, err := balance.New("weighted-move", bad)
		assert.ErrorIs(t, err, balance.ErrBadParam, "%v", bad)
	}
}
