// Package balance holds the balancing algorithms: pure, deterministic functions from an
// assignment, its loads and the live nodes to the operations of one pass.
//
// Nothing here reads a clock, draws from a global random source, logs, or does I/O. An
// algorithm that needs randomness seeds it from its configuration and the pass number, so the
// same input always yields the same output, and a pass can be replayed from its input alone.
// State that must survive from one pass to the next (recent moves, for anti-oscillation) is an
// explicit input and output, so that the driver can persist it.
package balance

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
)

// ErrBadInput is wrapped by every error about an unusable Input.
var ErrBadInput = errors.New("balance: bad input")

// HotKey is a key that carries a noticeable share of its slice's load.
type HotKey = load.HotKey

// Move records one change of a slice's placement: From lost it, To gained it. A replica added
// has no From; a replica dropped has no To.
type Move struct {
	Range    keyspace.Range
	From, To assignment.NodeID
	Pass     uint64
}

func (m Move) String() string {
	from, to := string(m.From), string(m.To)
	if from == "" {
		from = "-"
	}
	if to == "" {
		to = "-"
	}
	return fmt.Sprintf("pass %d %s %s->%s", m.Pass, m.Range, from, to)
}

// Input is everything one pass may look at.
type Input struct {
	// Assignment is the current map. It may name nodes that have left; clean-up moves their
	// slices. Required except for Initial.
	Assignment *assignment.Assignment
	// Nodes are the live nodes. Required, at least one.
	Nodes *assignment.NodeSet
	// Load is the load of each slice of Assignment, indexed like it; nil means no load known.
	Load []float64
	// Spread is the standard deviation of each slice's load around Load, indexed like it: how
	// much it may differ in the window the pass balances for; nil means none known, as if
	// every load were exact. Weighted-Move's noise_margin keeps headroom for it.
	Spread []float64
	// Uncertainty is the standard error of each slice's Load as an estimate of its load,
	// indexed like it: how far Load may be off from noise alone, were the load to hold
	// still; nil means none known, as if every load were exact. Weighted-Move's noise_gate
	// makes no move, merge or split that a difference this size could explain.
	Uncertainty []float64
	// Keys is the number of keys in each slice; nil means unknown, and the share of the key
	// space stands in for the share of keys when counting churn.
	Keys []float64
	// HotKeys lists, per slice, its heaviest keys (optional; nil or shorter is fine).
	HotKeys [][]HotKey
	// KeyHashes is the sorted list of every key's hash, when the driver knows it (the
	// simulator does; the assigner does not). Only the random baseline needs it.
	KeyHashes []uint64
	// Pass numbers the pass; it seeds randomness and ages History.
	Pass uint64
	// History is what the previous pass returned as Result.History.
	History []Move
	// Pinned ranges are left where they are: a slice overlapping one is not moved, merged,
	// split or given or relieved of replicas, unless clean-up must move it off a departed node.
	Pinned []keyspace.Range
	// Zones names the zone (a failure domain: a zone, a rack) of each live node, so that a
	// slice's replicas are spread over distinct zones; nil means placement ignores zones. A
	// live node missing from it is in the zone "", like any other name. It is a map beside
	// Nodes rather than a field of assignment.Node because a zone is not part of a node's
	// identity: it is read from whichever label the driver is configured with, may change
	// with that setting, and is not stored with the map. A pass maps it onto node indices
	// once.
	Zones map[assignment.NodeID]string
	// MinReplicas is the least number of replicas a slice keeps (the driver tops up those
	// short of it): an algorithm drops no replica below it. 0 counts as 1.
	MinReplicas int
}

// pinned reports whether r overlaps a pinned range.
func (in *Input) pinned(r keyspace.Range) bool {
	for _, p := range in.Pinned {
		if p.Overlaps(r) {
			return true
		}
	}
	return false
}

// pinSweep answers whether ranges, asked in increasing order of start, overlap a pin, in
// amortized constant time rather than O(pins): a map with many slices in handoff pins them all.
type pinSweep struct {
	union []keyspace.Range // the pins' union: disjoint, sorted, not adjacent
	next  int              // the first range of union that may overlap the next range asked
}

func newPinSweep(pins []keyspace.Range) *pinSweep {
	sorted := slices.SortedFunc(slices.Values(pins), func(a, b keyspace.Range) int { return cmp.Compare(a.Start, b.Start) })
	var union []keyspace.Range
	for _, p := range sorted {
		if n := len(union); n > 0 && !union[n-1].End.Before(p.Start) {
			if p.End.Compare(union[n-1].End) > 0 {
				union[n-1].End = p.End
			}
			continue
		}
		union = append(union, p)
	}
	return &pinSweep{union: union}
}

// overlaps reports whether r overlaps a pin; r's start must not be below the last one's.
func (s *pinSweep) overlaps(r keyspace.Range) bool {
	for s.next < len(s.union) && !s.union[s.next].End.After(r.Start) {
		s.next++
	}
	return s.next < len(s.union) && s.union[s.next].Overlaps(r)
}

// Result is the outcome of one pass.
type Result struct {
	// Ops transform Input.Assignment into the new map; Apply them in order.
	Ops []assignment.Op
	// History is the state to pass to the next pass as Input.History.
	History []Move
	// Explanation says what the pass saw, did and declined to do.
	Explanation Explanation
}

// Explanation answers "why did (or didn't) this pass move things".
type Explanation struct {
	Algorithm string
	Pass      uint64
	// ImbalanceBefore is max/mean node load of the input map under the input loads;
	// ImbalanceAfter is the same for the output map, as predicted from the same loads.
	ImbalanceBefore, ImbalanceAfter float64
	// ChurnBudget is the share of keys the pass may copy to new nodes, clean-up aside
	// (0 for algorithms that do not limit churn). Weighted-Move's depends on the map: its
	// emergency budget when the map is severely imbalanced, else its ordinary one.
	ChurnBudget float64
	// Churn is the share of keys each step copied to nodes that did not hold them.
	Churn Churn
	// Counts of what the pass did. Spreads are moves made to spread a slice's replicas
	// over distinct zones (Input.Zones), not for load.
	Splits, Merges, Moves, ReplicasAdded, ReplicasRemoved, Reassigned, Spreads int
	// Stop says why the move step ended.
	Stop string
	// Candidates lists moves the pass weighed: the ones it made, then the best ones it
	// rejected in its last round, with the reason.
	Candidates []Candidate
}

// Churn is a pass's key churn by step, each a share of all keys.
type Churn struct {
	Cleanup, Merge, Move float64
}

// Total returns the churn of the whole pass.
func (c Churn) Total() float64 { return c.Cleanup + c.Merge + c.Move }

// Candidate is one move the pass weighed.
type Candidate struct {
	Action string // move, replicate, dereplicate, spread
	Slice  keyspace.Range
	// From is the node that gives the slice up (none for a replicate); To the nodes that
	// gain it (one for a move, one or more for a replicate, none for a dereplicate).
	From assignment.NodeID
	To   []assignment.NodeID
	// Gain is the drop in imbalance the move would bring; Cost the share of keys it copies;
	// Weight is Gain/Cost, the order in which moves are taken.
	Gain, Cost, Weight float64
	Chosen             bool
	// Reason says why a candidate was not taken.
	Reason string
}

// Algorithm is a balancing algorithm.
type Algorithm interface {
	// Name returns the algorithm's registry name.
	Name() string
	// Initial returns the first assignment for in.Nodes, before any load is known.
	// in.Assignment is ignored; in.KeyHashes may be used.
	Initial(in Input) (*assignment.Assignment, error)
	// Rebalance runs one pass. The output, applied to in.Assignment, is a valid assignment
	// whose every replica is a live node.
	Rebalance(in Input) (Result, error)
}

// validate checks what every pass relies on; full=false skips the assignment (for Initial).
func (in *Input) validate(full bool) error {
	if in.Nodes == nil || in.Nodes.Len() == 0 {
		return fmt.Errorf("%w: no live nodes to assign slices to", ErrBadInput)
	}
	if !slices.IsSorted(in.KeyHashes) {
		return fmt.Errorf("%w: key hashes are not sorted", ErrBadInput)
	}
	if !full {
		return nil
	}
	if in.Assignment == nil {
		return fmt.Errorf("%w: no assignment", ErrBadInput)
	}
	n := in.Assignment.Len()
	for _, v := range []struct {
		name string
		xs   []float64
	}{{"load", in.Load}, {"spread", in.Spread}, {"uncertainty", in.Uncertainty}, {"key count", in.Keys}} {
		if v.xs == nil {
			continue
		}
		if len(v.xs) != n {
			return fmt.Errorf("%w: %d %s values for %d slices", ErrBadInput, len(v.xs), v.name, n)
		}
		for i, x := range v.xs {
			if !(x >= 0) || math.IsInf(x, 1) {
				return fmt.Errorf("%w: slice %s has %s %v; want a finite number >= 0",
					ErrBadInput, in.Assignment.Slice(i).Range, v.name, x)
			}
		}
	}
	for _, p := range in.Pinned {
		if !p.Valid() {
			return fmt.Errorf("%w: pinned range %s is empty", ErrBadInput, p)
		}
	}
	if len(in.HotKeys) > n {
		return fmt.Errorf("%w: hot keys for %d slices, but there are %d", ErrBadInput, len(in.HotKeys), n)
	}
	return nil
}

// sliceLoads returns in.Load, or zeros when no load is known.
func (in *Input) sliceLoads() []float64 {
	if in.Load != nil {
		return in.Load
	}
	return make([]float64, in.Assignment.Len())
}

// keyCounts returns the key count of each slice and their total, with known=true; or, when
// counts are unknown (or all zero), each slice's share of the key space, which totals 1.
func (in *Input) keyCounts() (keys []float64, total float64, known bool) {
	for _, k := range in.Keys {
		total += k
	}
	if in.Keys != nil && total > 0 {
		return in.Keys, total, true
	}
	keys = make([]float64, in.Assignment.Len())
	for i, s := range in.Assignment.All() {
		keys[i] = s.Range.Fraction()
	}
	return keys, 1, false
}

// imbalance returns the imbalance of a under per-slice loads.
func imbalance(a *assignment.Assignment, loads []float64, nodes *assignment.NodeSet) float64 {
	return load.Imbalance(load.NodeLoads(a, loads, nodes))
}

// towards is the pass of the baselines, which compute the map they want and move straight to
// it, without a churn budget: the ops are assignment.Diff, and the explanation measures what
// that costs.
func towards(name string, in Input, target *assignment.Assignment) Result {
	target = keepPinned(in, target)
	ops := assignment.Diff(in.Assignment, target)
	loads := in.sliceLoads()
	keys, total, _ := in.keyCounts()
	x := Explanation{
		Algorithm:       name,
		Pass:            in.Pass,
		ImbalanceBefore: imbalance(in.Assignment, loads, in.Nodes),
		ImbalanceAfter:  imbalance(target, mustReproject(in.Assignment, loads, target), in.Nodes),
		Churn:           Churn{Move: PlacementsAdded(in.Assignment, target, keys, in.Nodes) / total},
		Stop:            "moved straight to the target map (no churn budget)",
	}
	for _, op := range ops {
		switch op.(type) {
		case assignment.Split:
			x.Splits++
		case assignment.Merge:
			x.Merges++
		case assignment.Assign:
			x.Reassigned++
		}
	}
	return Result{Ops: ops, Explanation: x}
}

// keepPinned returns target with every pinned range held as in the current map: the pieces
// of the current slices that overlap a pin keep their replica set (or, if none is live, take
// the target's).
func keepPinned(in Input, target *assignment.Assignment) *assignment.Assignment {
	if len(in.Pinned) == 0 {
		return target
	}
	// Boundaries: the target's, plus the current map's inside pins, plus the pins' ends.
	points := map[uint64]bool{}
	for _, s := range target.All() {
		points[s.Range.Start] = true
	}
	for _, s := range in.Assignment.All() {
		for _, p := range in.Pinned {
			if o, ok := s.Range.Intersect(p); ok {
				points[o.Start] = true
				if !o.End.IsEnd() {
					points[o.End.Point()] = true
				}
			}
		}
	}
	starts := slices.Sorted(maps.Keys(points))
	owners := make([][]assignment.NodeID, len(starts))
	for i, st := range starts {
		_, t := target.Lookup(st)
		owners[i] = t.Replicas
		if _, cur := in.Assignment.Lookup(st); slices.ContainsFunc(in.Pinned, func(p keyspace.Range) bool { return p.Contains(st) }) {
			if live := liveReplicas(cur.Replicas, in.Nodes); len(live) > 0 {
				owners[i] = live
			}
		}
	}
	out, err := fromStarts(starts, owners)
	if err != nil {
		panic(fmt.Sprintf("balance: keeping pins produced an invalid map: %v", err))
	}
	return out
}

// mustReproject is load.Reproject for loads that validate has checked.
func mustReproject(from *assignment.Assignment, xs []float64, to *assignment.Assignment) []float64 {
	out, err := load.Reproject(from, xs, to)
	if err != nil {
		panic(fmt.Sprintf("balance: reprojecting validated loads failed: %v", err))
	}
	return out
}

// PlacementsAdded counts the keys that the change from one map to the other copies to live
// nodes that did not hold them: for each piece of the space, its keys (from's per-slice counts,
// spread evenly over each slice) times the live nodes that hold it in to but not in from.
func PlacementsAdded(from, to *assignment.Assignment, keys []float64, live *assignment.NodeSet) float64 {
	var added float64
	i, j := 0, 0
	start := uint64(0)
	for {
		fs, ts := from.Slice(i), to.Slice(j)
		end := fs.Range.End
		if ts.Range.End.Compare(end) < 0 {
			end = ts.Range.End
		}
		piece := keyspace.Range{Start: start, End: end}
		newNodes := 0
		for _, id := range ts.Replicas {
			if live.Has(id) && !fs.Holds(id) {
				newNodes++
			}
		}
		added += keys[i] * piece.Width() / fs.Range.Width() * float64(newNodes)
		if end.IsEnd() {
			return added
		}
		if fs.Range.End.Compare(end) == 0 {
			i++
		}
		if ts.Range.End.Compare(end) == 0 {
			j++
		}
		start = end.Point()
	}
}
