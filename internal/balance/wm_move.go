package balance

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
)

// cand is a candidate move off the hottest node.
type cand struct {
	kind                       int
	slice                      int
	from                       int32   // -1 where the kind has none
	to                         []int32 // one for a move, one or more for a replicate
	gain, cost, weight, newMax float64
	reason                     string // why the candidate is rejected; empty if it is not
	blocked                    bool   // it would undo a recent move
}

// move runs the move step: first drop replicas of slices that cooled (free), then repeatedly
// take the best-weighted move off the hottest node until the budget is spent, the imbalance
// is within the dead band, or no move helps.
func (p *wmPass) move() {
	p.on = make([][]int32, len(p.raw))
	for n := range p.on {
		p.on[n] = make([]int32, 0, p.count[n])
	}
	for i := range p.sl {
		for _, n := range p.sl[i].reps {
			p.on[n] = append(p.on[n], int32(i))
		}
	}
	p.dropCooledReplicas()
	p.spread()
	p.x.Stop = p.moveOffHottest()
	p.x.ImbalanceAfter = load.Imbalance(p.utilization())
	for _, s := range p.sl {
		if s.reassigned {
			p.ops = append(p.ops, assignment.Assign{Slice: s.r.Start, Replicas: p.names(s.reps)})
		}
	}
}

func (p *wmPass) utilization() []float64 {
	out := make([]float64, len(p.raw))
	for n := range out {
		out[n] = p.u(int32(n))
	}
	return out
}

// dropCooledReplicas removes replicas that a slice no longer needs. A slice whose load per
// replica would stay under DereplicateBelow times the mean node load even with one replica
// fewer keeps only as many replicas as ReplicateAbove asks for, on its coldest holders (and
// any holder whose replica a recent move added). It copies nothing, so it costs no churn; it
// is skipped when it would make any node hotter than the hottest node is now.
func (p *wmPass) dropCooledReplicas() {
	mean, top := p.meanU(), p.maxU()
	if mean <= 0 {
		return
	}
	for i := range p.sl {
		s := &p.sl[i]
		r := len(s.reps)
		if r <= p.minReps() || s.pinned || !s.change.allows(dereplicate) || p.peak(s)/float64(r-1) > p.cfg.DereplicateBelow*mean {
			continue
		}
		need := max(p.minReps(), int(math.Ceil(p.peak(s)/(p.cfg.ReplicateAbove*mean))))
		keep := make([]bool, r)
		for k, n := range s.reps {
			if _, blocked := p.blocker(s.r, n, -1); blocked {
				keep[k] = true
			}
		}
		p.keepersBySpread(s, keep, need)
		kept := 0
		var drop, stay []int32
		fits := true
		for k, n := range s.reps {
			if !keep[k] {
				drop = append(drop, n)
				continue
			}
			kept++
			stay = append(stay, n)
		}
		for _, n := range stay {
			if (p.raw[n]-s.load/float64(r)+s.load/float64(kept))/p.cap[n] > top {
				fits = false
			}
		}
		if kept == r || !fits || p.zoneDeficit(stay, -1) > p.zoneDeficit(s.reps, -1) {
			continue
		}
		for _, n := range drop {
			p.apply(cand{kind: dereplicate, slice: i, from: n})
		}
	}
}

const (
	reasonOneKey   = "one key: moving it would only make its destination the hottest node"
	reasonSwap     = "would make its destination the hottest node for a gain within the dead band"
	reasonNoCooler = "would not cool the hottest node"
	reasonBudget   = "over the churn budget"
	reasonPinned   = "pinned by an operator"
)

// maxReplicasAtOnce bounds how many replicas one candidate may add. A slice whose load is L
// times the mean node load cannot be helped by one more replica when L < 2, since the target
// already carries about the mean: it takes k replicas at once with k+1 > L/(L-1).
const maxReplicasAtOnce = 16

// moveOffHottest repeatedly makes the best-weighted candidate off the hottest node, or failing
// that a compound one that makes room first, and returns why it stopped.
func (p *wmPass) moveOffHottest() string {
	order := p.newCoolOrder()
	if why, ok := p.withinNoise(order.nodes[len(order.nodes)-1]); ok {
		return why
	}
	var round []cand
	limit := 4*len(p.sl) + 4*len(p.raw) + 64
	for range limit {
		h := order.nodes[len(order.nodes)-1]
		mean := p.meanU()
		if mean <= 0 {
			return "no load reported"
		}
		if imb := p.u(h) / mean; imb <= 1+p.cfg.DeadBand {
			return fmt.Sprintf("imbalance %.3f is within the dead band (%.3f)", imb, 1+p.cfg.DeadBand)
		}
		round = round[:0]
		for _, i := range p.on[h] {
			round = p.appendCandidates(round, int(i), h, mean, order)
		}
		best := bestCandidate(round)
		if best < 0 {
			if c, sheds, ok := p.bestWithRoom(h, round, order.nodes, mean); ok {
				for _, sh := range sheds {
					p.explain(sh, true)
					order.update(p.apply(sh))
				}
				p.explain(c, true)
				order.update(p.apply(c))
				continue
			}
			return p.whyStuck(h, round)
		}
		c := round[best]
		p.explain(c, true)
		for _, r := range round {
			// Record what would have beaten the chosen move but was refused for the hold
			// or the budget: that is what an operator asks about.
			if r.reason != "" && r.reason != reasonNoCooler && r.reason != reasonPinned && r.weight >= c.weight {
				p.explain(r, false)
			}
		}
		order.update(p.apply(c))
	}
	return "iteration limit reached"
}

// withinNoise reports why the move step makes no move when the hottest node h's excess
// over the mean load is one the noise of the estimates could make: within NoiseGate
// standard errors of h's load. It is asked once, as the move step begins: an excess that is
// real is then balanced down to the dead band as exact loads would be. Unlike merges and
// splits it has no allowance for the number of nodes: the uncertainty of loads that just
// changed counts part of a real change (a trend the level lags, a step) as noise, and a
// stricter gate held back real drifts (docs/BENCHMARKS.md, "Churn for noise").
func (p *wmPass) withinNoise(h int32) (string, bool) {
	mean := p.meanU()
	if p.cfg.NoiseGate == 0 || mean <= 0 || p.u(h)/mean <= 1+p.cfg.DeadBand {
		return "", false // the move loop says why it stops
	}
	excess, unc := p.u(h)-mean, p.uncU(h)
	if excess > p.cfg.NoiseGate*unc {
		return "", false
	}
	return fmt.Sprintf("imbalance %.3f is within the noise of the estimates (the hottest node's excess %.3g is within %v standard errors of %.3g)",
		p.u(h)/mean, excess, p.cfg.NoiseGate, unc), true
}

// coolOrder keeps the nodes sorted by ascending utilization, ties by index, as applied
// candidates change their loads: the pass asks for the hottest and the coldest nodes at
// every step, and re-sorting only the nodes a move touched keeps that cheap.
type coolOrder struct {
	p     *wmPass
	nodes []int32
}

func (p *wmPass) newCoolOrder() *coolOrder {
	o := &coolOrder{p: p, nodes: make([]int32, len(p.raw))}
	for n := range o.nodes {
		o.nodes[n] = int32(n)
	}
	slices.SortFunc(o.nodes, o.less)
	return o
}

func (o *coolOrder) less(a, b int32) int {
	if c := cmp.Compare(o.p.u(a), o.p.u(b)); c != 0 {
		return c
	}
	return cmp.Compare(a, b)
}

// update puts back in place the nodes whose loads changed. All of them leave the order before
// any is put back: a binary search among nodes still at their old places could land anywhere.
func (o *coolOrder) update(changed []int32) {
	o.nodes = slices.DeleteFunc(o.nodes, func(n int32) bool { return slices.Contains(changed, n) })
	for _, n := range changed {
		at, found := slices.BinarySearchFunc(o.nodes, n, o.less)
		if !found { // a node listed twice is put back once
			o.nodes = slices.Insert(o.nodes, at, n)
		}
	}
}

// coldest returns the k coldest nodes not holding reps (sorted) and, if hold, that the hold
// lets take range r: a held node is passed over for the next coolest, not given up on.
func (o *coolOrder) coldest(k int, reps []int32, r keyspace.Range, hold bool) []int32 {
	var out []int32
	for _, n := range o.nodes {
		if len(out) == k {
			break
		}
		if _, held := slices.BinarySearch(reps, n); !held && !(hold && o.p.held(r, n)) {
			out = append(out, n)
		}
	}
	return out
}

// appendCandidates appends to round the candidates that take slice i (held by the hottest
// node h) off h, in the order the explanations list them: drop h's replica, move it to the
// coldest node, add replicas.
func (p *wmPass) appendCandidates(round []cand, i int, h int32, mean float64, order *coolOrder) []cand {
	s := &p.sl[i]
	if s.pinned {
		return append(round, cand{kind: move, slice: i, from: h, reason: reasonPinned})
	}
	r := len(s.reps)
	if r > p.minReps() && s.change.allows(dereplicate) && p.zoneDeficit(s.reps, h) <= p.zoneDeficit(s.reps, -1) {
		round = append(round, p.evaluate(cand{kind: dereplicate, slice: i, from: h}, p.u(h), mean))
	}
	canReplicate := s.change.allows(replicate) && r < p.cfg.MaxReplicas && p.peak(s)/float64(r) > p.cfg.ReplicateAbove*mean
	k := 1
	if canReplicate {
		k = min(maxReplicasAtOnce, p.cfg.MaxReplicas-r)
	}
	moveTo, addTo := p.targets(s, h, k, canReplicate, true, order)
	if len(moveTo) == 0 && len(addTo) == 0 {
		// The hold keeps the slice off every node that could take it: the candidates to the
		// coolest of them say so in the explanation.
		moveTo, addTo = p.targets(s, h, k, canReplicate, false, order)
	}
	if len(moveTo) > 0 && s.change.allows(move) {
		round = append(round, p.evaluate(cand{kind: move, slice: i, from: h, to: moveTo[:1]}, p.u(h), mean))
	}
	if canReplicate && len(addTo) > 0 {
		// The fewest replicas that cool the hottest node; failing that, one.
		c := p.evaluate(cand{kind: replicate, slice: i, from: -1, to: addTo[:1]}, p.u(h), mean)
		for k := 2; c.reason == reasonNoCooler && k <= len(addTo); k++ {
			if more := p.evaluate(cand{kind: replicate, slice: i, from: -1, to: addTo[:k]}, p.u(h), mean); more.reason != reasonNoCooler {
				c = more
			}
		}
		round = append(round, c)
	}
	return round
}

// targets returns the nodes a move of slice s off h and up to k added replicas would go to,
// the coolest that the slice's zones allow and, if hold, the hold lets take it.
func (p *wmPass) targets(s *wmSlice, h int32, k int, canReplicate, hold bool, order *coolOrder) (moveTo, addTo []int32) {
	// Without zones one list serves both kinds, and candidates keep sub-slices of it; with
	// zones a move and added replicas each go where the slice's zones allow.
	if !p.z.on() {
		moveTo = order.coldest(k, s.reps, s.r, hold)
		return moveTo, moveTo
	}
	moveTo = order.pick(1, s.reps, h, s.r, hold)
	if canReplicate {
		addTo = order.pick(k, s.reps, -1, s.r, hold)
	}
	return moveTo, addTo
}

// bestCandidate returns the index of the acceptable candidate of highest weight, the first
// of equals, or -1 if none is acceptable.
func bestCandidate(round []cand) int {
	best := -1
	for j := range round {
		if round[j].reason == "" && (best < 0 || round[j].weight > round[best].weight) {
			best = j
		}
	}
	return best
}

// whyStuck explains the rejected candidates of the last round off h and returns why the
// pass stops there.
func (p *wmPass) whyStuck(h int32, round []cand) string {
	p.explainRejected(round)
	if slices.ContainsFunc(round, func(c cand) bool { return c.reason == reasonBudget }) {
		return fmt.Sprintf("the churn budget left (%.2f%% of keys) cannot pay for any move that helps",
			100*max(0, p.budget-p.balancing())/p.keys)
	}
	return fmt.Sprintf("no move off %s lowers its load without another node taking its place", p.ids[h])
}

// Making room. When no single move off the hottest node h helps, it is usually because every
// slice h could give away is larger than the room on the coolest node: the pass is stuck
// although the cluster has plenty of room spread over many nodes. A compound candidate then
// first moves some of the target's smaller slices to other cool nodes, and then makes the
// move (or adds the replica) that did not fit before. Every node it touches must end at or
// below a level under h's load: the level the move itself leaves h (and the slice's other
// holders) at, or a few lower ones; the one with the best gain per key copied wins. (A key
// whose replicas each carry more than the mean can only cool by one more replica on a node
// that gives up nearly everything else, which only the first level allows.)
const (
	roomSlices    = 16 // h's largest slices tried
	roomTargets   = 4  // coolest nodes tried as the target of each
	roomReceivers = 16 // coolest nodes that may take shed slices
)

var roomLevels = [...]float64{0.25, 0.5, 0.75} // lower levels, as fractions of the way from the mean to h's load

// bestWithRoom returns the best compound candidate off h, and the moves that make room for it.
func (p *wmPass) bestWithRoom(h int32, round []cand, order []int32, mean float64) (cand, []cand, bool) {
	top := p.u(h)
	var tried []cand
	for _, c := range round {
		if c.reason == reasonNoCooler && len(c.to) == 1 && (c.kind == move || c.kind == replicate) {
			tried = append(tried, c)
		}
	}
	share := func(c cand) float64 { return p.sl[c.slice].load / float64(len(p.sl[c.slice].reps)) }
	slices.SortStableFunc(tried, func(a, b cand) int { return cmp.Compare(share(b), share(a)) })
	var best cand
	var bestSheds []cand
	found := false
	var targets []cand
	for _, c := range tried[:min(len(tried), roomSlices)] {
		reps := p.sl[c.slice].reps
		from := int32(-1)
		if c.kind == move {
			from = h
		}
		k := 0
		for _, n := range order {
			if k == roomTargets {
				break
			}
			if _, held := slices.BinarySearch(reps, n); !held && p.zoneFits(reps, from, n) {
				alt := c
				alt.to = []int32{n}
				targets = append(targets, alt)
				k++
			}
		}
	}
	for _, c := range targets {
		floor := p.leftBehind(c, h)
		levels := []float64{max(floor, mean)}
		for _, f := range roomLevels {
			if l := mean + f*(top-mean); l > levels[0] {
				levels = append(levels, l)
			}
		}
		for _, level := range levels {
			if level >= top {
				continue
			}
			rc, sheds, ok := p.withRoom(c, h, level, top, mean, order)
			if ok && (!found || rc.weight > best.weight) {
				best, bestSheds, found = rc, sheds, true
			}
		}
	}
	return best, bestSheds, found
}

// leftBehind returns the highest utilization that candidate c leaves on the nodes it touches
// other than its target: h after a move; the slice's holders after a replica is added.
func (p *wmPass) leftBehind(c cand, h int32) float64 {
	s := &p.sl[c.slice]
	r := float64(len(s.reps))
	if c.kind == move {
		return (p.raw[h] - s.load/r) / p.cap[h]
	}
	var top float64
	for _, n := range s.reps {
		top = max(top, (p.raw[n]-s.load/r+s.load/(r+1))/p.cap[n])
	}
	return top
}

// withRoom evaluates candidate c (a move or one replica to c.to[0]) made after shedding
// enough of the target's other slices that every node touched ends at or below level.
func (p *wmPass) withRoom(c cand, h int32, level, top, mean float64, order []int32) (cand, []cand, bool) {
	s := &p.sl[c.slice]
	t := c.to[0]
	from := int32(-1)
	if c.kind == move {
		from = h
	}
	if _, blocked := p.blocker(s.r, from, t); blocked {
		return cand{}, nil, false
	}
	delta := p.directDelta(c, h) // raw load changes
	u := func(n int32) float64 { return (p.raw[n] + delta[n]) / p.cap[n] }
	for n := range delta {
		if n != t && u(n) > level {
			return cand{}, nil, false
		}
	}
	// The target's other slices that may leave, to the coolest nodes that stay at or below
	// level.
	receivers := roomReceiversFor(order, delta, s.reps)
	var sheds []cand
	cost := c.cost
	for _, j := range p.movableOff(t, c.slice) {
		if u(t) <= level {
			break
		}
		sl := &p.sl[j]
		sj := sl.load / float64(len(sl.reps))
		to := int32(-1)
		for _, n := range receivers {
			if _, held := slices.BinarySearch(sl.reps, n); held || (p.raw[n]+delta[n]+sj)/p.cap[n] > level ||
				!p.zoneFits(sl.reps, t, n) {
				continue
			}
			if _, blocked := p.blocker(sl.r, t, n); !blocked && (to < 0 || u(n) < u(to)) {
				to = n
			}
		}
		if to < 0 {
			continue
		}
		delta[t] -= sj
		delta[to] += sj
		cost += sl.keys
		sheds = append(sheds, cand{kind: move, slice: int(j), from: t, to: []int32{to}, cost: sl.keys})
	}
	if u(t) > level || p.balancing()+cost > p.budget {
		return cand{}, nil, false
	}
	c.newMax = 0
	for n := range delta {
		c.newMax = max(c.newMax, u(n))
	}
	// c keeps its own cost, since applying each shed move charges that move; the weight is
	// the compound's gain over the compound's cost.
	c.reason = ""
	c.gain = (top - max(c.newMax, mean)) / mean
	c.weight = c.gain / max(cost/p.keys, 1e-12) // in shares: keys near the smallest float would overflow
	for i := range sheds {
		sheds[i].gain, sheds[i].weight = c.gain, c.weight
	}
	return c, sheds, c.gain > 0
}

// directDelta returns the raw load changes of candidate c (a move off h or one replica to
// c.to[0]) on the nodes it touches, before any room is made.
func (p *wmPass) directDelta(c cand, h int32) map[int32]float64 {
	s := &p.sl[c.slice]
	t := c.to[0]
	delta := map[int32]float64{}
	r := float64(len(s.reps))
	share := s.load / r
	switch c.kind {
	case move:
		delta[h] -= share
		delta[t] += share
	case replicate:
		ns := s.load / (r + 1)
		for _, n := range s.reps {
			delta[n] += ns - share
		}
		delta[t] += ns
	}
	return delta
}

// movableOff returns the slices on t other than slice that may move to make room, most load
// per key first: the least churn for the room made.
func (p *wmPass) movableOff(t int32, slice int) []int32 {
	var movable []int32
	for _, j := range p.on[t] {
		if int(j) != slice && !p.sl[j].pinned && p.sl[j].change.allows(move) && p.sl[j].load > 0 {
			movable = append(movable, j)
		}
	}
	density := func(j int32) float64 {
		sl := &p.sl[j]
		return sl.load / float64(len(sl.reps)) / max(sl.keys, p.keys*1e-12)
	}
	slices.SortStableFunc(movable, func(a, b int32) int { return cmp.Compare(density(b), density(a)) })
	return movable
}

// roomReceiversFor returns the coolest nodes (order is by ascending utilization) that may
// take the slices shed to make room: none the candidate already touches (delta) nor a holder
// of its slice (reps).
func roomReceiversFor(order []int32, delta map[int32]float64, reps []int32) []int32 {
	var receivers []int32
	for _, n := range order {
		if len(receivers) == roomReceivers {
			break
		}
		if _, touched := delta[n]; !touched && !slices.Contains(reps, n) {
			receivers = append(receivers, n)
		}
	}
	return receivers
}

// evaluate fills in a candidate's effect: top is the hottest node's utilization, which every
// node the move touches must end strictly below.
func (p *wmPass) evaluate(c cand, top, mean float64) cand {
	s := &p.sl[c.slice]
	r := float64(len(s.reps))
	share := s.load / r
	newU := func(n int32, delta float64) float64 { return (p.raw[n] + delta) / p.cap[n] }
	var prev Move
	switch c.kind {
	case move:
		c.newMax = max(newU(c.from, -share), newU(c.to[0], share))
		c.cost = s.keys
		prev, c.blocked = p.blocker(s.r, c.from, c.to[0])
	case replicate:
		ns := s.load / (r + float64(len(c.to)))
		for _, n := range s.reps {
			c.newMax = max(c.newMax, newU(n, ns-share))
		}
		for _, n := range c.to {
			c.newMax = max(c.newMax, newU(n, ns))
			if m, b := p.blocker(s.r, -1, n); b && !c.blocked {
				prev, c.blocked = m, true
			}
			if m, b := p.movedAwayFrom(s, n); b && !c.blocked {
				prev, c.blocked = m, true
			}
		}
		c.cost = s.keys * float64(len(c.to))
	case dereplicate:
		ns := s.load / (r - 1)
		c.newMax = newU(c.from, -share)
		for _, n := range s.reps {
			if n != c.from {
				c.newMax = max(c.newMax, newU(n, ns-share))
			}
		}
		prev, c.blocked = p.blocker(s.r, c.from, -1)
	}
	c.gain = (top - max(c.newMax, mean)) / mean
	c.weight = c.gain / max(c.cost/p.keys, 1e-12)
	switch {
	case !(c.newMax < top*(1-1e-12)):
		c.reason = reasonNoCooler
	case c.gain <= 0:
		c.reason = "the node is already at the mean"
	case c.kind == move && newU(c.to[0], share) > newU(c.from, -share) && p.oneKey(s):
		// The key would make its destination the hottest node, and the next pass, on
		// slightly different loads, would move it back: it can only be spread by replicas.
		c.reason = reasonOneKey
	case c.kind == move && newU(c.to[0], share) > newU(c.from, -share) && c.gain <= p.cfg.DeadBand:
		c.reason = reasonSwap
	case c.cost > 0 && p.balancing()+c.cost > p.budget:
		c.reason = reasonBudget
	case c.blocked:
		c.reason = fmt.Sprintf("would undo a move of pass %d", prev.Pass)
	}
	return c
}

// movedAwayFrom returns the move of this pass that took slice s from node n to one of its
// holders, if any: a replica back on n would copy to n what it held at the start of the pass,
// which buys nothing and which the pass's churn count would charge for nothing.
func (p *wmPass) movedAwayFrom(s *wmSlice, n int32) (Move, bool) {
	if s.change != placed { // only a slice that moved in this pass and may still grow
		return Move{}, false
	}
	for _, m := range s.reps {
		for _, k := range p.undo[[2]int32{n, m}] {
			if prev := p.history[k]; prev.Pass == p.in.Pass && prev.Range.Overlaps(s.r) {
				return prev, true
			}
		}
	}
	return Move{}, false
}

// oneKey reports whether a slice holds a single key: its range is one point, or its key
// count is known to be at most one. No split can cut it finer.
func (p *wmPass) oneKey(s *wmSlice) bool {
	return s.r.Width() == 1 || p.known && s.keys <= 1
}

// apply carries out a candidate and returns the nodes whose load changed.
func (p *wmPass) apply(c cand) []int32 {
	s := &p.sl[c.slice]
	changed := slices.Clone(s.reps)
	p.place(s, -1)
	switch c.kind {
	case move, spread:
		s.reps = insertSorted(removeSorted(s.reps, c.from), c.to[0])
		s.change = moved
		if p.oneKey(s) {
			// A key worth moving whole early in the pass may become the hottest load once
			// others have cooled, and no split can cut it: it may still gain replicas, but
			// keeps the copy it was moved to.
			s.change = placed
		}
		if c.kind == spread {
			p.x.Spreads++
		} else {
			p.x.Moves++
		}
		p.remember(Move{Range: s.r, From: p.ids[c.from], To: p.ids[c.to[0]], Pass: p.in.Pass})
	case replicate:
		for _, n := range c.to {
			s.reps = insertSorted(s.reps, n)
			p.remember(Move{Range: s.r, To: p.ids[n], Pass: p.in.Pass})
		}
		if s.change != placed {
			s.change = resized
		}
		p.x.ReplicasAdded += len(c.to)
	case dereplicate:
		s.reps = removeSorted(s.reps, c.from)
		s.change = resized
		p.x.ReplicasRemoved++
		p.remember(Move{Range: s.r, From: p.ids[c.from], Pass: p.in.Pass})
	}
	p.spent.Move += c.cost
	s.reassigned = true
	p.place(s, +1)
	if c.from >= 0 {
		p.on[c.from] = removeSorted(p.on[c.from], int32(c.slice))
	}
	for _, n := range c.to {
		p.on[n] = insertSorted(p.on[n], int32(c.slice))
	}
	return append(changed, c.to...)
}

func insertSorted(xs []int32, x int32) []int32 {
	i, _ := slices.BinarySearch(xs, x)
	return slices.Insert(slices.Clip(xs), i, x)
}

func removeSorted(xs []int32, x int32) []int32 {
	i, ok := slices.BinarySearch(xs, x)
	if !ok {
		return xs
	}
	return slices.Delete(slices.Clone(xs), i, i+1)
}

func (p *wmPass) explain(c cand, chosen bool) {
	if len(p.x.Candidates) >= maxExplained {
		return
	}
	s := p.sl[c.slice]
	e := Candidate{Action: actionNames[c.kind], Slice: s.r, Gain: c.gain, Cost: c.cost / p.keys,
		Weight: c.weight, Chosen: chosen, Reason: c.reason}
	if c.from >= 0 {
		e.From = p.ids[c.from]
	}
	e.To = p.names(c.to)
	p.x.Candidates = append(p.x.Candidates, e)
}

// explainRejected records the best candidates of the last round, so that "why did nothing
// move?" has an answer.
func (p *wmPass) explainRejected(round []cand) {
	slices.SortStableFunc(round, func(a, b cand) int { return cmp.Compare(b.gain, a.gain) })
	for _, c := range round[:min(len(round), 10)] {
		p.explain(c, false)
	}
}
