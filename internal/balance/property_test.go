package balance_test

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/assignment/assignmenttest"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
)

// world is a random but valid balancer input: live nodes, an assignment that may still name
// departed nodes, and loads, key counts, hot keys and key hashes consistent with each other.
type world struct {
	nodes *assignment.NodeSet
	in    balance.Input
	keys  []uint64 // every key's hash, sorted
}

func drawWorld(t *rapid.T) world {
	var nodes []assignment.Node
	for i := range rapid.IntRange(1, 8).Draw(t, "live") {
		c := rapid.SampledFrom([]float64{0, 0.5, 1, 2, 3}).Draw(t, "capacity")
		nodes = append(nodes, assignment.Node{ID: assignment.NodeID(fmt.Sprintf("n%d", i)), Capacity: c})
	}
	set := assignment.MustNodeSet(nodes...)
	pool := append(set.IDs(), "gone1", "gone2")

	a := assignmenttest.Generator(pool, 40, math.MaxUint64).Draw(t, "assignment")
	n := a.Len()

	// Keys with Zipf-like loads: a few heavy ones, many light ones.
	nk := rapid.IntRange(0, 300).Draw(t, "keys")
	hashes := make([]uint64, nk)
	keyLoad := make([]float64, nk)
	for i := range nk {
		hashes[i] = rapid.Uint64().Draw(t, "hash")
		keyLoad[i] = 100 / math.Pow(float64(i+1), rapid.Float64Range(0, 1.5).Draw(t, "skew"))
	}
	idx := make([]int, nk)
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(x, y int) int { return compareU64(hashes[x], hashes[y]) })
	loads := make([]float64, n)
	counts := make([]float64, n)
	hot := make([][]balance.HotKey, n)
	sorted := make([]uint64, nk)
	for k, i := range idx {
		sorted[k] = hashes[i]
		j, _ := a.Lookup(hashes[i])
		loads[j] += keyLoad[i]
		counts[j]++
		hot[j] = append(hot[j], balance.HotKey{Hash: hashes[i], Load: keyLoad[i]})
	}
	for j := range hot {
		slices.SortFunc(hot[j], func(x, y balance.HotKey) int { return compareF(y.Load, x.Load) })
		hot[j] = hot[j][:min(len(hot[j]), 3)]
	}
	in := balance.Input{
		Assignment: a, Nodes: set, Load: loads, Keys: counts, HotKeys: hot, KeyHashes: sorted,
		Pass: rapid.Uint64Range(0, 100).Draw(t, "pass"),
	}
	if rapid.Bool().Draw(t, "unknown key counts") {
		in.Keys = nil
	}
	if rapid.Bool().Draw(t, "spreads") {
		in.Spread = make([]float64, n)
		for j, l := range loads {
			in.Spread[j] = l * rapid.Float64Range(0, 1).Draw(t, "relative spread")
		}
	}
	for range rapid.IntRange(0, 2).Draw(t, "pins") {
		lo := rapid.Uint64Range(0, math.MaxUint64-1).Draw(t, "pin start")
		r := keyspace.Range{Start: lo, End: keyspace.End}
		if rapid.Bool().Draw(t, "bounded pin") {
			r.End = keyspace.At(rapid.Uint64Range(lo+1, math.MaxUint64).Draw(t, "pin end"))
		}
		in.Pinned = append(in.Pinned, r)
	}
	return world{nodes: set, in: in, keys: sorted}
}

func compareU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func compareF(a, b float64) int { return compareU64(math.Float64bits(a), math.Float64bits(b)) }

// smallParams draws constants for Weighted-Move that make every step fire on small maps.
func smallParams(t *rapid.T) map[string]string {
	maxChurn := rapid.SampledFrom([]float64{0, 0.05, 0.09, 0.3, 1}).Draw(t, "max_churn")
	return map[string]string{
		"min_slices_per_node":     "1",
		"initial_slices_per_node": "2",
		"max_slices_per_node":     fmt.Sprint(rapid.IntRange(2, 20).Draw(t, "max slices")),
		"max_churn":               fmt.Sprint(maxChurn),
		"emergency_churn":         fmt.Sprint(rapid.SampledFrom([]float64{0, 0.09, 0.3, 1}).Draw(t, "emergency_churn")),
		"severe_imbalance":        fmt.Sprint(rapid.SampledFrom([]float64{1, 1.3, 3}).Draw(t, "severe_imbalance")),
		"merge_churn":             fmt.Sprint(maxChurn * rapid.Float64Range(0, 1).Draw(t, "merge share")),
		"dead_band":               fmt.Sprint(rapid.SampledFrom([]float64{0, 0.02, 0.2}).Draw(t, "dead band")),
		"hold_passes":             fmt.Sprint(rapid.IntRange(0, 3).Draw(t, "hold")),
		"noise_margin":            fmt.Sprint(rapid.SampledFrom([]float64{0, 1, 6}).Draw(t, "noise margin")),
	}
}

// TestEveryPassKeepsTheInvariants runs every algorithm on random inputs: its operations must
// apply, the result must partition the space with every replica on a live node (I1), and the
// same input must give the same output.
func TestEveryPassKeepsTheInvariants(t *testing.T) {
	for _, name := range balance.Names() {
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				w := drawWorld(t)
				params := map[string]string{}
				if name == "weighted-move" {
					params = smallParams(t)
				}
				alg, err := balance.New(name, params)
				if err != nil {
					t.Fatal(err)
				}
				checkedPass(t, alg, w)
				first, err := alg.Initial(balance.Input{Nodes: w.nodes, KeyHashes: w.keys})
				if err != nil {
					t.Fatal(err)
				}
				if err := first.Validate(w.nodes); err != nil {
					t.Fatalf("initial assignment breaks I1: %v", err)
				}
			})
		})
	}
}

// TestWeightedMoveStaysWithinItsBudget checks, with an independent count of the keys copied to
// nodes that did not hold them, that a pass never exceeds its churn budget beyond what the
// clean-up of departed nodes forces, and that it never makes the hottest node hotter.
func TestWeightedMoveStaysWithinItsBudget(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := drawWorld(t)
		params := smallParams(t)
		alg, err := balance.New("weighted-move", params)
		if err != nil {
			t.Fatal(err)
		}
		res, next := pass(t, alg, w.in)

		keys, total := w.in.Keys, 0.0
		for _, k := range keys {
			total += k
		}
		if keys == nil || total == 0 {
			keys, total = make([]float64, w.in.Assignment.Len()), 1
			for i, s := range w.in.Assignment.All() {
				keys[i] = s.Range.Fraction()
			}
		}
		// Clean-up must give each slice without a live replica one node.
		var forced float64
		for i, s := range w.in.Assignment.All() {
			if !slices.ContainsFunc(s.Replicas, w.nodes.Has) {
				forced += keys[i]
			}
		}
		// A pass may spend the emergency budget (the larger of the two) only when it says so.
		var budget, emergency float64
		fmt.Sscan(params["max_churn"], &budget)
		fmt.Sscan(params["emergency_churn"], &emergency)
		switch x := res.Explanation.ChurnBudget; x {
		case budget:
		case max(budget, emergency):
			budget = x
		default:
			t.Fatalf("the pass claims a budget of %v; max_churn is %v, emergency_churn %v", x, budget, emergency)
		}
		added := placements(w.in.Assignment, next, keys, w.nodes)
		if added > budget*total+forced+1e-9*total {
			t.Fatalf("copied %.4f of keys; budget %.4f plus forced clean-up %.4f", added/total, budget, forced/total)
		}
		x := res.Explanation
		if math.Abs(x.Churn.Total()*total-added) > 1e-6*total {
			t.Fatalf("explanation says churn %.6f, independent count %.6f", x.Churn.Total(), added/total)
		}
		if forced == 0 {
			before := hottest(w.in.Assignment, w.in.Load, w.nodes)
			after := reprojectWithHotKeys(w.in, next)
			if hot := hottest(next, after, w.nodes); hot > before*(1+1e-9) {
				t.Fatalf("the hottest node went from %.4f to %.4f", before, hot)
			}
		}
	})
}

// reprojectWithHotKeys returns the loads of next's slices: each input slice's hot keys where
// they are, the rest of its load spread evenly over its range. A pass that cuts a hot key out
// and places the pieces apart is judged by where the load is, not by the pieces' widths.
func reprojectWithHotKeys(in balance.Input, next *assignment.Assignment) []float64 {
	out := make([]float64, next.Len())
	for i, s := range in.Assignment.All() {
		rest := in.Load[i]
		var hot []balance.HotKey
		if i < len(in.HotKeys) {
			hot = in.HotKeys[i]
		}
		for _, k := range hot {
			rest -= k.Load
		}
		rest = max(rest, 0)
		for j, n := range next.All() {
			o, ok := n.Range.Intersect(s.Range)
			if !ok {
				continue
			}
			out[j] += rest * o.Width() / s.Range.Width()
			for _, k := range hot {
				if o.Contains(k.Hash) {
					out[j] += k.Load
				}
			}
		}
	}
	return out
}

// placements counts keys copied to live nodes that did not hold them, piece by piece of the
// space, spreading each slice's keys evenly over it: a deliberately plain reference.
func placements(from, to *assignment.Assignment, keys []float64, live *assignment.NodeSet) float64 {
	points := map[uint64]bool{}
	for _, a := range []*assignment.Assignment{from, to} {
		for _, s := range a.All() {
			points[s.Range.Start] = true
		}
	}
	starts := make([]uint64, 0, len(points))
	for p := range points {
		starts = append(starts, p)
	}
	slices.Sort(starts)
	var added float64
	for k, p := range starts {
		end := keyspace.End
		if k+1 < len(starts) {
			end = keyspace.At(starts[k+1])
		}
		piece := keyspace.Range{Start: p, End: end}
		i, old := from.Lookup(p)
		_, cur := to.Lookup(p)
		for _, id := range cur.Replicas {
			if live.Has(id) && !old.Holds(id) {
				added += keys[i] * piece.Width() / old.Range.Width()
			}
		}
	}
	return added
}

// checkPins fails if a pinned piece of the space that had a live replica now has another
// replica set than its live replicas had.
func checkPins(t *rapid.T, in balance.Input, next *assignment.Assignment) {
	for _, p := range in.Pinned {
		for _, s := range in.Assignment.All() {
			o, ok := s.Range.Intersect(p)
			if !ok {
				continue
			}
			var live []assignment.NodeID
			for _, id := range s.Replicas {
				if in.Nodes.Has(id) {
					live = append(live, id)
				}
			}
			if len(live) == 0 {
				continue // clean-up had to move it
			}
			for i, _ := next.Lookup(o.Start); i < next.Len() && next.Slice(i).Range.Overlaps(o); i++ {
				if got := next.Slice(i).Replicas; !slices.Equal(got, live) {
					t.Fatalf("pinned %s (%s) moved from %v to %v", o, s.Range, live, got)
				}
			}
		}
	}
}

// pass runs one pass and applies its operations.
func pass(t *rapid.T, alg balance.Algorithm, in balance.Input) (balance.Result, *assignment.Assignment) {
	res, err := alg.Rebalance(in)
	if err != nil {
		t.Fatal(err)
	}
	next, err := in.Assignment.Apply(res.Ops)
	if err != nil {
		t.Fatalf("ops do not apply: %v", err)
	}
	return res, next
}

// checkedPass runs one pass over w and checks what every pass must hold: the result keeps I1,
// pins hold, and the same input gives the same operations and history.
func checkedPass(t *rapid.T, alg balance.Algorithm, w world) (balance.Result, *assignment.Assignment) {
	res, next := pass(t, alg, w.in)
	if err := next.Validate(w.nodes); err != nil {
		t.Fatalf("result breaks I1: %v", err)
	}
	checkPins(t, w.in, next)
	again, err := alg.Rebalance(w.in)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(again.Ops) != fmt.Sprint(res.Ops) || fmt.Sprint(again.History) != fmt.Sprint(res.History) {
		t.Fatalf("not deterministic:\n%v\n%v", res.Ops, again.Ops)
	}
	return res, next
}

func hottest(a *assignment.Assignment, loads []float64, nodes *assignment.NodeSet) float64 {
	return slices.Max(load.NodeLoads(a, loads, nodes))
}

func TestPlacementsAddedAgreesWithReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := drawWorld(t)
		alg, err := balance.New("random", nil)
		if err != nil {
			t.Fatal(err)
		}
		_, next := pass(t, alg, w.in)
		keys := make([]float64, w.in.Assignment.Len())
		for i := range keys {
			keys[i] = float64(i%7 + 1)
		}
		got := balance.PlacementsAdded(w.in.Assignment, next, keys, w.nodes)
		want := placements(w.in.Assignment, next, keys, w.nodes)
		if math.Abs(got-want) > 1e-9*max(1, want) {
			t.Fatalf("PlacementsAdded %v, reference %v", got, want)
		}
	})
}

func TestRandomPutsOneKeyPerSlice(t *testing.T) {
	nodes := assignment.MustNodeSet(assignment.Node{ID: "a"}, assignment.Node{ID: "b"}, assignment.Node{ID: "c"})
	keys := []uint64{5, 1 << 40, 1 << 41, 1<<41 + 1, 1 << 63}
	alg, err := balance.New("random", map[string]string{"seed": "7"})
	require.NoError(t, err)
	a, err := alg.Initial(balance.Input{Nodes: nodes, KeyHashes: keys})
	require.NoError(t, err)
	require.Equal(t, len(keys), a.Len())
	for i, h := range keys {
		j, _ := a.Lookup(h)
		assert.Equal(t, i, j, "key %x has a slice of its own", h)
	}

	// A key is deleted and another added: the empty slice merges away, the crowded one splits,
	// and the slices of a departed node go to live ones.
	keys2 := []uint64{5, 1 << 40, 1<<41 + 1, 1<<41 + 9, 1 << 63}
	fewer := assignment.MustNodeSet(assignment.Node{ID: "a"}, assignment.Node{ID: "b"})
	res, err := alg.Rebalance(balance.Input{Assignment: a, Nodes: fewer, KeyHashes: keys2, Pass: 1})
	require.NoError(t, err)
	b, err := a.Apply(res.Ops)
	require.NoError(t, err)
	require.NoError(t, b.Validate(fewer))
	assert.Equal(t, len(keys2), b.Len())
	for i, h := range keys2 {
		j, _ := b.Lookup(h)
		assert.Equal(t, i, j, "key %x has a slice of its own", h)
	}
}

func TestInputIsValidated(t *testing.T) {
	nodes := assignment.MustNodeSet(assignment.Node{ID: "a"})
	a, err := assignment.Uniform(2, func(int) []assignment.NodeID { return []assignment.NodeID{"a"} })
	require.NoError(t, err)
	alg, err := balance.New("weighted-move", nil)
	require.NoError(t, err)
	for _, in := range []balance.Input{
		{Assignment: a},
		{Nodes: nodes},
		{Assignment: a, Nodes: nodes, Load: []float64{1}},
		{Assignment: a, Nodes: nodes, Load: []float64{1, math.NaN()}},
		{Assignment: a, Nodes: nodes, Keys: []float64{-1, 1}},
		{Assignment: a, Nodes: nodes, KeyHashes: []uint64{3, 1}},
		{Assignment: a, Nodes: nodes, HotKeys: make([][]balance.HotKey, 3)},
	} {
		_, err := alg.Rebalance(in)
		assert.ErrorIs(t, err, balance.ErrBadInput)
	}
}
