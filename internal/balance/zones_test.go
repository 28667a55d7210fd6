package balance_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
)

// setZone puts node id in zone z for the passes that follow.
func (h *harness) setZone(id assignment.NodeID, z string) {
	if h.zones == nil {
		h.zones = map[assignment.NodeID]string{}
	}
	h.zones[id] = z
}

// showZones lists every slice with two or more replicas, its replicas' zones ("?" for a node
// that is not live, "-" for one without a zone), and whether it is short of distinct zones (balance.ZoneDeficit).
func (h *harness) showZones() string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "slice\treplicas\tzones\tdeficit")
	short := 0
	for i, s := range h.a.All() {
		if len(s.Replicas) < 2 {
			continue
		}
		zs := make([]string, len(s.Replicas))
		for k, id := range s.Replicas {
			switch z, ok := h.zones[id]; {
			case !h.nodes.Has(id):
				zs[k] = "?"
			case !ok:
				zs[k] = "-"
			default:
				zs[k] = z
			}
		}
		d := balance.ZoneDeficit(s.Replicas, h.zones, h.nodes)
		if d > 0 {
			short++
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\n", i, assignment.FormatReplicas(s.Replicas), strings.Join(zs, ","), d)
	}
	w.Flush()
	fmt.Fprintf(&b, "slices short of zones: %d\n", short)
	return b.String()
}

// drawZones puts the world's live nodes in one to four zones, a few in none.
func drawZones(t *rapid.T, w *world) {
	n := rapid.IntRange(1, 4).Draw(t, "zones")
	w.in.Zones = map[assignment.NodeID]string{}
	for _, id := range w.nodes.IDs() {
		if rapid.IntRange(0, 9).Draw(t, "unlabelled") > 0 {
			w.in.Zones[id] = fmt.Sprintf("z%d", rapid.IntRange(0, n-1).Draw(t, "zone"))
		}
	}
}

// liveDeficit returns the zone deficit of s's live replicas.
func liveDeficit(s assignment.Slice, in balance.Input) int {
	return balance.ZoneDeficit(slices.DeleteFunc(slices.Clone(s.Replicas), func(id assignment.NodeID) bool {
		return !in.Nodes.Has(id)
	}), in.Zones, in.Nodes)
}

// TestZonesNeverGetWorse: whatever the constants, no piece of the space that is not pinned
// ends a pass with its replicas in fewer zones than they could be in and were (its zone
// deficit never rises), and a pass with zones keeps I1, the pins and determinism.
func TestZonesNeverGetWorse(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := drawWorld(t)
		drawZones(t, &w)
		alg, err := balance.New("weighted-move", smallParams(t))
		if err != nil {
			t.Fatal(err)
		}
		_, next := checkedPass(t, alg, w)
		for _, s := range next.All() {
			if w.in.Pinned != nil && slices.ContainsFunc(w.in.Pinned, s.Range.Overlaps) {
				continue
			}
			was := 0
			for i, _ := w.in.Assignment.Lookup(s.Range.Start); i < w.in.Assignment.Len() && w.in.Assignment.Slice(i).Range.Overlaps(s.Range); i++ {
				was = max(was, liveDeficit(w.in.Assignment.Slice(i), w.in))
			}
			if d := balance.ZoneDeficit(s.Replicas, w.in.Zones, w.nodes); d > was {
				t.Fatalf("%s on %v has zone deficit %d, up from %d (zones %v)", s.Range, s.Replicas, d, was, w.in.Zones)
			}
		}
	})
}

// TestZonesAreSpreadWhenTheBudgetAllows: when the budget can pay for every repair, no slice
// that is not pinned ends a pass short of zones: with k replicas and at least k zones among
// the live nodes, they are in k distinct zones.
func TestZonesAreSpreadWhenTheBudgetAllows(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := drawWorld(t)
		drawZones(t, &w)
		params := smallParams(t)
		params["max_churn"], params["emergency_churn"], params["merge_churn"] = "1", "1", "0"
		alg, err := balance.New("weighted-move", params)
		if err != nil {
			t.Fatal(err)
		}
		keys, total := keyShares(w.in)
		var need float64
		for i, s := range w.in.Assignment.All() {
			if !slices.ContainsFunc(w.in.Pinned, s.Range.Overlaps) {
				need += keys[i] * float64(liveDeficit(s, w.in))
			}
		}
		if need > total {
			t.Skip("the repairs cost more than a pass may copy")
		}
		_, next := pass(t, alg, w.in)
		for _, s := range next.All() {
			if slices.ContainsFunc(w.in.Pinned, s.Range.Overlaps) {
				continue
			}
			if d := balance.ZoneDeficit(s.Replicas, w.in.Zones, w.nodes); d > 0 {
				t.Fatalf("%s on %v is %d zones short (zones %v)", s.Range, s.Replicas, d, w.in.Zones)
			}
		}
	})
}

// keyShares returns the key count of each slice of in and their total, or each slice's share
// of the space when counts are unknown, as a pass counts churn.
func keyShares(in balance.Input) ([]float64, float64) {
	var total float64
	for _, k := range in.Keys {
		total += k
	}
	if in.Keys != nil && total > 0 {
		return in.Keys, total
	}
	keys := make([]float64, in.Assignment.Len())
	for i, s := range in.Assignment.All() {
		keys[i] = s.Range.Fraction()
	}
	return keys, 1
}

// TestSpreadKeepsTheHold: a spread does not undo a recent move. Slice 0 has both replicas in
// zone za, and a2's came from b1, the coolest node of another zone, a pass ago: the spread
// moves a1's replica instead, though a2 is the hotter.
func TestSpreadKeepsTheHold(t *testing.T) {
	nodes := assignment.MustNodeSet(assignment.Node{ID: "a1"}, assignment.Node{ID: "a2"},
		assignment.Node{ID: "b1"}, assignment.Node{ID: "c1"})
	zones := map[assignment.NodeID]string{"a1": "za", "a2": "za", "b1": "zb", "c1": "zc"}
	a, err := assignment.Uniform(4, func(i int) []assignment.NodeID {
		return [][]assignment.NodeID{{"a1", "a2"}, {"a2"}, {"b1"}, {"c1"}}[i]
	})
	require.NoError(t, err)
	in := balance.Input{Assignment: a, Nodes: nodes, Zones: zones, Load: []float64{10, 6, 1, 5}, Pass: 5,
		History: []balance.Move{{Range: a.Slice(0).Range, From: "b1", To: "a2", Pass: 4}}}
	alg, err := balance.New("weighted-move", map[string]string{"min_slices_per_node": "1",
		"initial_slices_per_node": "1", "max_churn": "0.5"})
	require.NoError(t, err)
	res, err := alg.Rebalance(in)
	require.NoError(t, err)
	next, err := a.Apply(res.Ops)
	require.NoError(t, err)
	assert.Equal(t, 1, res.Explanation.Spreads)
	_, s := next.Lookup(0)
	assert.Contains(t, s.Replicas, assignment.NodeID("a2"), "the replica a recent move placed stays")
	assert.Zero(t, balance.ZoneDeficit(s.Replicas, zones, nodes), "slice 0 on %v", s.Replicas)
}
