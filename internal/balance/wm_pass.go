package balance

import (
	"cmp"
	"math"
	"slices"
	"sort"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// Kinds of move, in the order that breaks ties between equally weighted candidates: dropping
// a replica copies nothing, so it goes first.
const (
	dereplicate = iota
	move
	replicate
	spread // a move that spreads a slice's replicas over more zones (wm_zones.go)
)

var actionNames = [...]string{dereplicate: "dereplicate", move: "move", replicate: "replicate", spread: "spread"}

// maxExplained bounds the candidates an explanation lists.
const maxExplained = 32

type wmSlice struct {
	r          keyspace.Range
	reps       []int32 // live replicas, as ascending node indices (so in ID order)
	load, keys float64
	spread     float64 // standard deviation of load (Input.Spread), 0 if unknown
	unc        float64 // standard error of load (Input.Uncertainty), 0 if unknown
	hot        []HotKey
	pinned     bool // an operator pinned it: only clean-up may move it
	change     change
	reassigned bool // the move step changed reps: emit one Assign for the slice
}

// change is how a slice's replica set has changed in this pass. A slice moves at most once
// and then no longer changes; replicas may be added and dropped, but a pass never undoes its
// own step (see relevant). Both rules stop churn that buys nothing, like copying keys to a node
// and dropping them again, and they keep the churn count exact: every key charged stays where
// it was copied.
type change uint8

const (
	unchanged change = iota
	moved            // moved whole, by the move step, a merge or clean-up
	resized          // replicas added or dropped
	cutAround        // what is left around a hot key cut out in this pass: it stays put
	placed           // a single key moved in this pass (or the hot key cut from a moved slice): it may only gain replicas
)

// allows reports whether a slice in state c may take a candidate of the given kind.
func (c change) allows(kind int) bool {
	switch c {
	case cutAround:
		return false
	case placed:
		return kind == replicate
	}
	if kind == move {
		return c == unchanged
	}
	return c != moved
}

// heldRange is a history move's range and its index in the history: the hold's look-ups scan
// these per node, in one array, and read the move only when its range overlaps.
type heldRange struct {
	r  keyspace.Range
	at int
}

// wmPass is the working state of one pass. Nodes are indices into the live node set.
type wmPass struct {
	cfg     WeightedMoveConfig
	in      Input
	z       zoneMap
	ids     []assignment.NodeID
	cap     []float64
	raw     []float64 // per node: the sum of its shares of slice loads
	sumU    float64   // the sum over nodes of raw/cap, kept up to date by addLoad
	count   []int     // slices per node
	on      [][]int32 // per node, the slices it holds, ascending; built by the move step
	sl      []wmSlice
	load    float64   // total
	keys    float64   // total, the unit of churn
	known   bool      // key counts are real, not shares of the space
	inKeys  []float64 // key count of each slice of the input map
	spent   Churn     // in keys
	budget  float64   // in keys, for merges and moves; clean-up is not charged to it
	ops     []assignment.Op
	history []Move
	undo    map[[2]int32][]int // history indices by (from, to) node index, -1 for none
	left    [][]heldRange      // per live node, the history moves that took a range off it
	came    [][]heldRange      // per live node, the history moves that put a range on it
	x       Explanation
}

// minReps returns the least number of replicas a slice keeps (Input.MinReplicas).
func (p *wmPass) minReps() int { return max(1, p.in.MinReplicas) }

func newWMPass(cfg WeightedMoveConfig, in Input) *wmPass {
	if cfg.MaxReplicas == 0 || cfg.MaxReplicas > in.Nodes.Len() {
		cfg.MaxReplicas = in.Nodes.Len()
	}
	n := in.Nodes.Len()
	p := &wmPass{
		cfg: cfg, in: in, z: newZoneMap(in), ids: in.Nodes.IDs(),
		cap: make([]float64, n), raw: make([]float64, n), count: make([]int, n),
		sl:   make([]wmSlice, in.Assignment.Len()),
		undo: make(map[[2]int32][]int), left: make([][]heldRange, n), came: make([][]heldRange, n),
	}
	for i, node := range in.Nodes.Nodes() {
		p.cap[i] = node.Weight()
	}
	loads := in.sliceLoads()
	keys, total, known := in.keyCounts()
	p.keys, p.known, p.inKeys = total, known, keys
	pins := newPinSweep(in.Pinned)
	for i, s := range in.Assignment.All() {
		p.sl[i] = wmSlice{r: s.Range, load: loads[i], keys: keys[i], pinned: pins.overlaps(s.Range)}
		if in.Spread != nil {
			p.sl[i].spread = in.Spread[i]
		}
		if in.Uncertainty != nil {
			p.sl[i].unc = in.Uncertainty[i]
		}
		if i < len(in.HotKeys) {
			p.sl[i].hot = in.HotKeys[i]
		}
		p.load += loads[i]
	}
	for _, m := range in.History {
		if p.relevant(m, in.Pass) {
			p.remember(m)
		}
	}
	p.x = Explanation{
		Algorithm:       "weighted-move",
		Pass:            in.Pass,
		ImbalanceBefore: imbalance(in.Assignment, loads, in.Nodes),
		ChurnBudget:     cfg.MaxChurn,
	}
	return p
}

func (p *wmPass) u(n int32) float64 { return p.raw[n] / p.cap[n] }

// gate returns how many standard errors a difference must exceed to be acted on when it is
// the largest of n candidates: NoiseGate plus the expected maximum of n standard normal
// noises, about sqrt(2 ln n); 0 with the gate off.
func (p *wmPass) gate(n int) float64 {
	if p.cfg.NoiseGate == 0 {
		return 0
	}
	return p.cfg.NoiseGate + math.Sqrt(2*math.Log(float64(max(n, 1))))
}

// uncU returns the standard error of node n's utilization: the slices it holds, each served
// in equal shares by its replicas, with independent errors.
func (p *wmPass) uncU(n int32) float64 {
	var v float64
	for _, i := range p.on[n] {
		s := &p.sl[i]
		e := s.unc / float64(len(s.reps))
		v += e * e
	}
	return math.Sqrt(v) / p.cap[n]
}

// peak is the load the replica thresholds weigh for a slice: its load plus NoiseMargin
// standard deviations of it.
func (p *wmPass) peak(s *wmSlice) float64 { return s.load + p.cfg.NoiseMargin*s.spread }

// keysIn counts the keys of range r as the churn of a pass counts them (PlacementsAdded):
// each input slice's keys spread evenly over its range.
func (p *wmPass) keysIn(r keyspace.Range) float64 {
	var n float64
	for i, _ := p.in.Assignment.Lookup(r.Start); i < p.in.Assignment.Len(); i++ {
		s := p.in.Assignment.Slice(i)
		o, ok := s.Range.Intersect(r)
		if !ok {
			break
		}
		n += p.inKeys[i] * o.Width() / s.Range.Width()
	}
	return n
}

// balancing returns the keys the merge and move steps have copied: what the budget limits.
func (p *wmPass) balancing() float64 { return p.spent.Merge + p.spent.Move }

// setBudget sets the budget of the move step from the imbalance that clean-up, merges and
// hot-key cuts left: EmergencyChurn above SevereImbalance, else MaxChurn. Clean-up has
// already copied what it must; a pass that also lost a node still balances in full.
func (p *wmPass) setBudget() {
	share := p.cfg.MaxChurn
	if mean := p.meanU(); mean > 0 && p.maxU()/mean > p.cfg.SevereImbalance {
		share = max(share, p.cfg.EmergencyChurn)
	}
	p.budget = share * p.keys
	p.x.ChurnBudget = share
}

// relevant reports whether move m still blocks its undoing in pass pass. A pass's own moves
// always do, whatever HoldPasses says.
func (p *wmPass) relevant(m Move, pass uint64) bool {
	return m.Pass == pass || withinHold(m, pass, p.cfg.HoldPasses)
}

// withinHold reports whether move m is fewer than holdPasses passes older than pass.
func withinHold(m Move, pass uint64, holdPasses int) bool {
	return int64(pass)-int64(m.Pass) < int64(holdPasses)
}

// remember records move m, so that it is not undone while it is relevant.
func (p *wmPass) remember(m Move) {
	p.history = append(p.history, m)
	from, fromLive := p.index(m.From)
	to, toLive := p.index(m.To)
	if fromLive && toLive { // a move involving a departed node can never be undone
		k := [2]int32{from, to}
		p.undo[k] = append(p.undo[k], len(p.history)-1)
	}
	if fromLive && from >= 0 {
		p.left[from] = append(p.left[from], heldRange{m.Range, len(p.history) - 1})
	}
	if toLive && to >= 0 {
		p.came[to] = append(p.came[to], heldRange{m.Range, len(p.history) - 1})
	}
}

// index returns the node index of id, -1 for no node, and whether id is "" or a live node.
func (p *wmPass) index(id assignment.NodeID) (int32, bool) {
	if id == "" {
		return -1, true
	}
	n, ok := p.in.Nodes.Index(id)
	return int32(n), ok
}

// blocker returns the earlier move that moving the slice over r from node from to node to
// (-1 for none) would undo, if any. Putting any part of r on a node that lost it recently
// undoes that loss, whichever node it comes from: a move straight back, a return by way of a
// third node, or a replica re-added where a move or a drop took one. Dropping from's replica
// undoes only a recent copy of it to from.
func (p *wmPass) blocker(r keyspace.Range, from, to int32) (Move, bool) {
	if to >= 0 {
		return p.tookOff(r, to)
	}
	for _, k := range p.undo[[2]int32{to, from}] {
		if prev := p.history[k]; prev.Range.Overlaps(r) {
			return prev, true
		}
	}
	return Move{}, false
}

// tookOff returns the latest relevant move that took part of r off node n, if any.
func (p *wmPass) tookOff(r keyspace.Range, n int32) (Move, bool) {
	ms := p.left[n]
	for i := len(ms) - 1; i >= 0; i-- {
		if meets(ms[i].r, r) {
			return p.history[ms[i].at], true
		}
	}
	return Move{}, false
}

// placedOn returns the latest relevant move that put part of r on node n, if any; with
// thisPass, only a move of this pass.
func (p *wmPass) placedOn(r keyspace.Range, n int32, thisPass bool) (Move, bool) {
	ms := p.came[n]
	for i := len(ms) - 1; i >= 0; i-- {
		if prev := &p.history[ms[i].at]; meets(ms[i].r, r) && (!thisPass || prev.Pass == p.in.Pass) {
			return *prev, true
		}
	}
	return Move{}, false
}

// meets is Range.Overlaps for non-empty ranges, without building their intersection: the
// hold asks it of every node a target search passes.
func meets(a, b keyspace.Range) bool { return a.End.After(b.Start) && b.End.After(a.Start) }

// held reports whether the hold keeps any part of r off node n.
func (p *wmPass) held(r keyspace.Range, n int32) bool {
	_, ok := p.tookOff(r, n)
	return ok
}

// addLoad changes node n's load by delta, keeping sumU up to date.
func (p *wmPass) addLoad(n int32, delta float64) {
	p.sumU += delta / p.cap[n]
	p.raw[n] += delta
}

func (p *wmPass) meanU() float64 { return p.sumU / float64(len(p.raw)) }

func (p *wmPass) maxU() float64 {
	var top float64
	for n := range p.raw {
		top = max(top, p.u(int32(n)))
	}
	return top
}

// cleanup drops replicas on departed nodes and gives every slice left without one to the
// least loaded live node, heaviest slices first (the classic greedy for balanced packing).
// With zones, a slice that kept a replica gets back those its load still needs (refill).
func (p *wmPass) cleanup() {
	var orphans []int
	changed := make([]bool, len(p.sl))
	var had []int // the replicas of a slice that lost some, for refill
	if p.z.on() {
		had = make([]int, len(p.sl))
	}
	total := 0
	for _, s := range p.in.Assignment.All() {
		total += len(s.Replicas)
	}
	backing := make([]int32, 0, total) // one array for all replica sets, cut with cap = len
	for i, s := range p.in.Assignment.All() {
		start := len(backing)
		for _, id := range s.Replicas {
			if n, ok := p.in.Nodes.Index(id); ok {
				backing = append(backing, int32(n))
			}
		}
		p.sl[i].reps = backing[start:len(backing):len(backing)]
		changed[i] = len(p.sl[i].reps) != len(s.Replicas)
		if changed[i] && had != nil {
			had[i] = len(s.Replicas)
		}
		if len(p.sl[i].reps) == 0 {
			orphans = append(orphans, i)
			continue
		}
		p.place(&p.sl[i], +1)
	}
	slices.SortStableFunc(orphans, func(a, b int) int { return cmp.Compare(p.sl[b].load, p.sl[a].load) })
	for _, i := range orphans {
		// The least loaded node the hold allows, or failing that the least loaded: an
		// orphan must go somewhere.
		best, free := int32(0), false
		for n := range int32(len(p.raw)) {
			nFree := !p.held(p.sl[i].r, n)
			if n == 0 || nFree && !free || nFree == free && p.u(n) < p.u(best) {
				best, free = n, nFree
			}
		}
		p.sl[i].reps = []int32{best}
		p.sl[i].change = moved
		p.place(&p.sl[i], +1)
		p.spent.Cleanup += p.sl[i].keys
	}
	p.refill(had)
	for i, s := range p.sl {
		if changed[i] {
			p.ops = append(p.ops, assignment.Assign{Slice: s.r.Start, Replicas: p.names(s.reps)})
			p.x.Reassigned++
		}
	}
}

// place adds (sign +1) or removes (-1) a slice's load shares and slice counts on its nodes.
func (p *wmPass) place(s *wmSlice, sign int) {
	share := s.load / float64(len(s.reps))
	for _, n := range s.reps {
		p.addLoad(n, float64(sign)*share)
		p.count[n] += sign
	}
}

func (p *wmPass) names(reps []int32) []assignment.NodeID {
	out := make([]assignment.NodeID, len(reps))
	for i, n := range reps {
		out[i] = p.ids[n]
	}
	return out
}

// merge joins adjacent cold slices, left to right, while their joint load stays under the
// mean slice load. Slices on the same replica set merge for free; single-replica slices on
// different nodes merge by moving the one with fewer keys, within the merge churn budget,
// provided the receiving node does not become the hottest.
func (p *wmPass) merge() {
	if len(p.sl) < 2 || p.load <= 0 {
		return
	}
	limit := p.cfg.MergeBelow * p.load / float64(len(p.sl))
	budget := p.cfg.MergeChurn * p.keys
	top := p.maxU()
	z := p.gate(len(p.sl))
	w, cur := 0, p.sl[0] // compact in place: w never passes the slice being read
	for _, next := range p.sl[1:] {
		joint := cur.load + next.load + z*math.Hypot(cur.unc, next.unc)
		if cur.pinned || next.pinned || !(joint < limit) || !p.tryMerge(&cur, next, budget, top) {
			p.sl[w] = cur
			w++
			cur = next
		}
	}
	p.sl[w] = cur
	p.sl = p.sl[:w+1]
}

func (p *wmPass) tryMerge(cur *wmSlice, next wmSlice, budget, top float64) bool {
	if slices.Equal(cur.reps, next.reps) {
		for _, n := range cur.reps {
			if p.count[n] <= p.cfg.MinSlicesPerNode {
				return false
			}
		}
		for _, n := range cur.reps {
			p.count[n]--
		}
		p.ops = append(p.ops, assignment.Merge{Left: cur.r.Start})
		p.joined(cur, next)
		return true
	}
	if len(cur.reps) != 1 || len(next.reps) != 1 {
		return false // replicated slices merge once they have cooled down to one replica
	}
	mover, stayer := next, *cur
	if cur.keys < next.keys {
		mover, stayer = *cur, next
	}
	from, to := mover.reps[0], stayer.reps[0]
	if p.count[from] <= p.cfg.MinSlicesPerNode || mover.change != unchanged ||
		p.spent.Merge+mover.keys > budget ||
		(p.raw[to]+mover.load)/p.cap[to] > top {
		return false
	}
	if _, blocked := p.blocker(mover.r, from, to); blocked {
		return false
	}
	m := Move{Range: mover.r, From: p.ids[from], To: p.ids[to], Pass: p.in.Pass}
	p.addLoad(from, -mover.load)
	p.addLoad(to, mover.load)
	p.count[from]--
	p.spent.Merge += mover.keys
	p.remember(m)
	p.ops = append(p.ops,
		assignment.Assign{Slice: mover.r.Start, Replicas: p.names(stayer.reps)},
		assignment.Merge{Left: cur.r.Start})
	cur.reps = stayer.reps
	p.joined(cur, next)
	cur.change = moved
	return true
}

// joined extends cur over next, its right neighbour.
func (p *wmPass) joined(cur *wmSlice, next wmSlice) {
	cur.r.End = next.r.End
	cur.load += next.load
	cur.spread = math.Hypot(cur.spread, next.spread) // independent noises
	cur.unc = math.Hypot(cur.unc, next.unc)
	cur.keys += next.keys
	cur.hot = append(slices.Clip(cur.hot), next.hot...)
	cur.change = max(cur.change, next.change) // only unchanged and moved occur before the move step
	p.x.Merges++
}

func (p *wmPass) result() Result {
	var history []Move
	for _, m := range p.history {
		if p.relevant(m, p.in.Pass+1) {
			history = append(history, m)
		}
	}
	sort.SliceStable(history, func(i, j int) bool { return history[i].Pass < history[j].Pass })
	p.x.Churn = Churn{Cleanup: p.spent.Cleanup / p.keys, Merge: p.spent.Merge / p.keys, Move: p.spent.Move / p.keys}
	return Result{Ops: p.ops, History: history, Explanation: p.x}
}
