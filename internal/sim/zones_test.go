package sim

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
)

// TestCoreSurvivesLosingAZone spreads nodes over three zones, lets the core replicate the hot
// slices of a skewed workload, and removes a whole zone: every slice replicated over distinct
// zones keeps a live replica, the orphaned share is exactly the key space of the slices held
// only in that zone, and the next passes bring the imbalance back down.
func TestCoreSurvivesLosingAZone(t *testing.T) {
	const lost = 6
	wl, err := ParseWorkload("zipf:1.1", 20000, 12, 1)
	require.NoError(t, err)
	opt := Options{Nodes: 9, Epochs: 12, Zones: 3, RemoveZoneAt: []ZoneRemoval{{Epoch: lost, Zone: "z1"}}}
	r, err := newCoreRunner("weighted-move", nil, Scenario{Workload: wl}, opt)
	require.NoError(t, err)
	th := newThrashing()
	var eps []Epoch
	for e := range opt.Epochs {
		if e == lost {
			replicated, want := zoneLoss(t, r.view, "z1")
			assert.Positive(t, replicated, "hot slices are replicated over zones before the loss")
			ep, err := r.epoch(e, th)
			require.NoError(t, err)
			assert.InDelta(t, want, ep.Orphaned, 1e-12, "only slices held in z1 alone are orphaned")
			eps = append(eps, ep)
			continue
		}
		ep, err := r.epoch(e, th)
		require.NoError(t, err)
		eps = append(eps, ep)
	}
	for _, id := range []assignment.NodeID{"n1", "n4", "n7"} {
		assert.False(t, r.w.set.Has(id), "%s, in z1, left", id)
	}
	for e, ep := range eps {
		if e != lost {
			assert.Zero(t, ep.Orphaned, "epoch %d: no node left", e)
		}
	}
	assert.Equal(t, 6, eps[len(eps)-1].Nodes)
	assert.Less(t, eps[len(eps)-1].Imbalance, 1.2, "the run recovers after the loss: %+v", eps)
}

// zoneLoss checks that every slice of a with replicas in two zones or more keeps one outside
// zone, and returns how many such slices there are and the share of the key space held in
// zone alone.
func zoneLoss(t *testing.T, a *assignment.Assignment, zone string) (replicated int, orphaned float64) {
	t.Helper()
	zoneOf := func(id assignment.NodeID) string {
		var i int
		_, err := fmt.Sscanf(string(id), "n%d", &i)
		require.NoError(t, err)
		return ZoneName(i % 3)
	}
	for _, s := range a.All() {
		zones := map[string]bool{}
		for _, id := range s.Replicas {
			zones[zoneOf(id)] = true
		}
		if len(zones) >= 2 {
			replicated++
		}
		if len(zones) == 1 && zones[zone] {
			orphaned += s.Range.Fraction()
		}
	}
	return replicated, orphaned
}

// TestZonesAreDeterministic runs the same zone loss twice on each engine.
func TestZonesAreDeterministic(t *testing.T) {
	wl := func() Scenario {
		w, err := ParseWorkload("zipf:1.1", 5000, 6, 1)
		require.NoError(t, err)
		return Scenario{Workload: w}
	}
	opt := Options{Nodes: 6, Epochs: 6, Zones: 3, AddNodeAt: []int{2}, RemoveZoneAt: []ZoneRemoval{{Epoch: 3, Zone: "z0"}}}
	a, err := RunCore(context.Background(), "weighted-move", nil, wl(), opt)
	require.NoError(t, err)
	b, err := RunCore(context.Background(), "weighted-move", nil, wl(), opt)
	require.NoError(t, err)
	assert.Equal(t, a, b)
	assert.Equal(t, 4, a.Epochs[3].Nodes, "n0 and n3 left with z0, n6 (z0 too) joined at 2 and left")
}

func TestZoneOptionsAreChecked(t *testing.T) {
	wl, err := ParseWorkload("uniform", 100, 4, 1)
	require.NoError(t, err)
	sc := Scenario{Workload: wl}
	for _, tc := range []struct {
		opt  Options
		want string
	}{
		{Options{Nodes: 3, Epochs: 4, RemoveZoneAt: []ZoneRemoval{{Epoch: 1, Zone: "z0"}}}, "the run has no zones"},
		{Options{Nodes: 3, Epochs: 4, Zones: 3, RemoveZoneAt: []ZoneRemoval{{Epoch: 4, Zone: "z0"}}}, "want an epoch in 0..3"},
		{Options{Nodes: 3, Epochs: 4, Zones: 3, RemoveZoneAt: []ZoneRemoval{{Epoch: 1, Zone: "z3"}}}, "want one of z0..z2"},
		{Options{Nodes: 3, Epochs: 4, Zones: -1}, "-1 zones"},
	} {
		_, err := RunCore(context.Background(), "weighted-move", nil, sc, tc.opt)
		require.ErrorIs(t, err, ErrScenario)
		assert.ErrorContains(t, err, tc.want)
		alg, err := balance.New("weighted-move", nil)
		require.NoError(t, err)
		_, err = Run(context.Background(), alg, sc, tc.opt)
		assert.ErrorContains(t, err, tc.want, "the algorithm engine checks the same")
	}
}
