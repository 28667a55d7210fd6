package core

import (
	"maps"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
)

// TestZoneLabelsReachThePass: the zones that nodes register as labels reach the balancer
// through the configured label, so a slice an operator put on two nodes of one zone is spread
// by the next pass; without the setting the same map stays as it is.
func TestZoneLabelsReachThePass(t *testing.T) {
	for _, tc := range []struct {
		label   string
		spreads int
	}{{"zone", 1}, {"", 0}} {
		t.Run("label="+tc.label, func(t *testing.T) {
			// A budget that pays for moving a sixth of the keys: slice 0's, by its share of the
			// space, as no load is reported.
			params := maps.Clone(smallParams)
			params["max_churn"] = "0.2"
			c, err := New(Config{NodeTTL: time.Minute, Algorithm: "weighted-move", Params: params, ZoneLabel: tc.label,
				BreakBeforeMake: true})
			require.NoError(t, err)
			lead(t, c, 1, State{}, false, 0)
			for id, zone := range map[string]string{"a1": "za", "a2": "za", "b1": "zb"} {
				ok(t, c, t0, Register{Node: Node{Node: assignment.Node{ID: assignment.NodeID(id)}, Address: id + ":1",
					Labels: map[string]string{"zone": zone, "rack": "r1"}}})
			}
			passAt(t, c, t0) // the first map
			ok(t, c, t0, Move{Slice: SliceRef{Hash: new(uint64)}, To: []assignment.NodeID{"a1", "a2"}})

			passAt(t, c, t0.Add(time.Second))
			x := c.Explain()
			require.True(t, x.Passed)
			assert.Equal(t, tc.spreads, x.Spreads, "spreads in the pass")
			a, _, _ := c.Assignment()
			_, s := a.Lookup(0)
			zones := map[assignment.NodeID]string{"a1": "za", "a2": "za", "b1": "zb"}
			live := assignment.MustNodeSet(assignment.Node{ID: "a1"}, assignment.Node{ID: "a2"}, assignment.Node{ID: "b1"})
			if tc.label != "" {
				assert.Zero(t, balance.ZoneDeficit(s.Replicas, zones, live), "slice 0 on %v", s.Replicas)
			} else {
				assert.Equal(t, []assignment.NodeID{"a1", "a2"}, s.Replicas)
			}
		})
	}
}

func TestZoneLabelIsChecked(t *testing.T) {
	long := string(make([]byte, MaxLabelKeyBytes+1))
	assert.Error(t, Config{ZoneLabel: long}.Validate())
	assert.NoError(t, Config{ZoneLabel: "topology.kubernetes.io/zone"}.Validate())
}
