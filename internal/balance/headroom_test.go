package balance

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// headroomInput is two nodes: a holds a cold slice of 100 keys and a hot one of 10, both
// noisy; b holds two steady slices of 100 keys. The mean node load is 40.
func headroomInput(t *testing.T) Input {
	t.Helper()
	a, err := assignment.Uniform(4, func(i int) []assignment.NodeID {
		return []assignment.NodeID{[]assignment.NodeID{"a", "a", "b", "b"}[i]}
	})
	require.NoError(t, err)
	nodes, err := assignment.NewNodeSet([]assignment.Node{{ID: "a", Capacity: 1}, {ID: "b", Capacity: 1}})
	require.NoError(t, err)
	return Input{Assignment: a, Nodes: nodes, Load: []float64{10, 30, 20, 20}, Spread: []float64{2, 3, 0, 0},
		Keys: []float64{100, 10, 100, 100}, Pass: 7}
}

func TestHeadroomReplicatesTheDensestSlicesOfTheNoisiestNode(t *testing.T) {
	cfg := DefaultHeadroomConfig()
	cfg.Churn = 1
	in := headroomInput(t)
	p := newHeadroomPlan(cfg, &in)
	// a should shed 4 × (2 + 3) = 20 and shares nothing; b is steady.
	assert.InDeltaSlice(t, []float64{20, 0}, p.short, 1e-9)
	p.add()
	// The hot slice (3 per key) goes first, onto b: a can now shed its 15. The cold slice
	// would cost 100 more copies, past 1.3 copies of the 310 keys (93 spare).
	require.Len(t, p.ops, 1)
	assert.Equal(t, assignment.Assign{Slice: in.Assignment.Slice(1).Range.Start, Replicas: []assignment.NodeID{"a", "b"}}, p.ops[0])
	assert.Equal(t, []Move{{Range: in.Assignment.Slice(1).Range, To: "b", Pass: 7}}, p.moves)
	assert.InDeltaSlice(t, []float64{5, -15}, p.short, 1e-9)
	assert.InDeltaSlice(t, []float64{25, 55}, p.raw, 1e-9)

	cfg.MaxKeyCopies = 2
	p = newHeadroomPlan(cfg, &in)
	p.add()
	assert.Len(t, p.ops, 2, "with room for the copies, the cold slice too")
}

func TestHeadroomPutsNoReplicaBackWhereAMoveTookItFrom(t *testing.T) {
	cfg := DefaultHeadroomConfig()
	cfg.Churn, cfg.MaxKeyCopies = 1, 2
	in := headroomInput(t)
	// The hot slice came from b two passes ago: within hold_passes, b may not take it back.
	in.History = []Move{{Range: in.Assignment.Slice(1).Range, From: "b", To: "a", Pass: 5}}
	p := newHeadroomPlan(cfg, &in)
	p.add()
	require.Len(t, p.ops, 1)
	assert.Equal(t, assignment.Assign{Slice: in.Assignment.Slice(0).Range.Start, Replicas: []assignment.NodeID{"a", "b"}}, p.ops[0],
		"the cold slice instead")

	in.History[0].Pass = 7 - uint64(cfg.WeightedMove.HoldPasses) // the hold is over
	p = newHeadroomPlan(cfg, &in)
	p.add()
	assert.Len(t, p.ops, 2)
}

func TestHeadroomRebalancesOnTheMapItsReplicasMake(t *testing.T) {
	cfg := DefaultHeadroomConfig()
	cfg.Churn = 1
	h, err := NewHeadroom(cfg)
	require.NoError(t, err)
	in := headroomInput(t)
	res, err := h.Rebalance(in)
	require.NoError(t, err)
	require.NotEmpty(t, res.Ops)
	assert.Equal(t, assignment.Assign{Slice: in.Assignment.Slice(1).Range.Start, Replicas: []assignment.NodeID{"a", "b"}}, res.Ops[0])
	next, err := in.Assignment.Apply(res.Ops)
	require.NoError(t, err)
	require.NoError(t, next.Validate(in.Nodes))
	assert.Equal(t, HeadroomName, res.Explanation.Algorithm)
	assert.GreaterOrEqual(t, res.Explanation.ReplicasAdded, 1)
	assert.InDelta(t, 10.0/310, res.Explanation.Churn.Move, 1e-9, "the hot slice's 10 keys copied")
	assert.Contains(t, res.History, Move{Range: in.Assignment.Slice(1).Range, To: "b", Pass: 7}, "held against dereplication")
}

func TestHeadroomWithoutNoiseIsWeightedMove(t *testing.T) {
	in := headroomInput(t)
	in.Spread = nil
	h, err := NewHeadroom(DefaultHeadroomConfig())
	require.NoError(t, err)
	wm, err := NewWeightedMove(DefaultHeadroomConfig().WeightedMove)
	require.NoError(t, err)
	got, err := h.Rebalance(in)
	require.NoError(t, err)
	want, err := wm.Rebalance(in)
	require.NoError(t, err)
	assert.Equal(t, want.Ops, got.Ops, "an exact forecast buys no replica")
	assert.Equal(t, want.History, got.History)
}

func TestHeadroomIsRegisteredAndValidated(t *testing.T) {
	alg, err := New(HeadroomName, map[string]string{"headroom": "0.5", "dereplicate_below": "0.01"})
	require.NoError(t, err)
	assert.Equal(t, 0.5, alg.(*Headroom).Config().Headroom)
	assert.Equal(t, 0.01, alg.(*Headroom).Config().WeightedMove.DereplicateBelow)
	for _, bad := range []map[string]string{{"headroom": "-1"}, {"max_key_copies": "0.5"}, {"headroom_churn": "2"},
		{"headroom_sigmas": "-0.1"}, {"dereplicate_below": "0.9"}} {
		_, err := New(HeadroomName, bad)
		assert.ErrorIs(t, err, ErrBadParam, "%v", bad)
	}
}
