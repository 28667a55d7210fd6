package balance

import (
	"cmp"
	"math"
	"slices"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// Zones. A slice with k replicas should have them in min(k, Z) distinct zones, Z being the
// zones of the live nodes: then losing any one zone leaves every slice that has two or more
// replicas with a live one. How many zones a replica set is short of that is its deficit.
// Weighted-Move keeps it in three ways:
//
//   - every replica it places goes to a zone that holds the fewest of the slice's other
//     replicas (among zones with a node free to take it), and a move never takes a zone's
//     last replica into a zone the slice holds, so a move or an added replica never raises
//     the deficit, and adds go to a zone the slice lacks whenever one exists;
//   - a replica is dropped only if the deficit does not rise;
//   - a pass repairs a deficit it finds (a map made before zones were configured, nodes
//     relabelled) by moving a crowded zone's replica to a zone the slice lacks: a "spread",
//     charged to the churn budget like any move; and clean-up gives a slice that lost
//     replicas with a departed node (a lost zone) the replicas its load still needs back, in
//     the zones it lacks.
//
// With fewer than two zones among the live nodes there is nothing to spread over and the pass
// runs as if no zones were given.

// zoneMap is the zones of the live nodes, by node index.
type zoneMap struct {
	of   []int32 // the zone of each node; nil when placement ignores zones
	size []int32 // live nodes per zone
	free []*tally
}

func newZoneMap(in Input) zoneMap {
	if in.Zones == nil {
		return zoneMap{}
	}
	index := map[string]int32{}
	of := make([]int32, in.Nodes.Len())
	var size []int32
	for i, n := range in.Nodes.Nodes() {
		name := in.Zones[n.ID]
		z, ok := index[name]
		if !ok {
			z = int32(len(size))
			index[name] = z
			size = append(size, 0)
		}
		of[i] = z
		size[z]++
	}
	if len(size) < 2 {
		return zoneMap{}
	}
	return zoneMap{of: of, size: size}
}

func (z *zoneMap) on() bool { return z.of != nil }

// tally counts a slice's replicas per zone, as they would be with one replica (from) gone.
type tally struct {
	z        *zoneMap
	kept     []int32 // replicas per zone, from left out
	held     []int32 // nodes per zone that hold the slice, from included: not free to take it
	distinct int     // zones with a kept replica
	total    int     // kept replicas
	fromZone int32   // the zone of from, -1 for none
}

// tally counts reps without node from (-1 for none). Give it back with release: tallies are
// reused, since a pass with zones takes one for every candidate it weighs.
func (z *zoneMap) tally(reps []int32, from int32) *tally {
	var t *tally
	if n := len(z.free); n > 0 {
		t = z.free[n-1]
		z.free = z.free[:n-1]
		clear(t.kept)
		clear(t.held)
		t.distinct, t.total = 0, 0
	} else {
		t = &tally{z: z, kept: make([]int32, len(z.size)), held: make([]int32, len(z.size))}
	}
	t.fromZone = -1
	if from >= 0 {
		t.fromZone = z.of[from]
	}
	for _, n := range reps {
		t.held[z.of[n]]++
		if n != from {
			t.add(n)
			t.held[z.of[n]]--
		}
	}
	return t
}

func (z *zoneMap) release(t *tally) { z.free = append(z.free, t) }

// add counts node n as one more replica.
func (t *tally) add(n int32) {
	z := t.z.of[n]
	if t.kept[z] == 0 {
		t.distinct++
	}
	t.kept[z]++
	t.held[z]++
	t.total++
}

// deficit returns how many zones the counted replicas are short of min(their count, zones).
func (t *tally) deficit() int { return min(t.total, len(t.z.size)) - t.distinct }

// least returns the fewest replicas a zone with a node free to take one holds, or -1 when no
// node is free.
func (t *tally) least() int32 {
	least := int32(-1)
	for z, size := range t.z.size {
		if size > t.held[z] && (least < 0 || t.kept[z] < least) {
			least = t.kept[z]
		}
	}
	return least
}

// fits reports whether a node of zone z may take the replica: z holds the fewest replicas
// (least, from t.least), and if from was its zone's last replica, z holds none, since the
// slice would otherwise end in fewer zones (a zone whose every node holds the slice has no
// free node, so least alone does not see it).
func (t *tally) fits(z, least int32) bool {
	return t.kept[z] == least && !(t.fromZone >= 0 && t.kept[t.fromZone] == 0 && t.kept[z] > 0)
}

// zoneFits reports whether node n (not a holder) may take slice reps in place of from (-1
// for an added replica): n's zone holds the fewest of the other replicas.
func (p *wmPass) zoneFits(reps []int32, from, n int32) bool {
	if !p.z.on() {
		return true
	}
	t := p.z.tally(reps, from)
	defer p.z.release(t)
	return t.fits(p.z.of[n], t.least())
}

// zoneDeficit returns the deficit of reps without node from (-1 for none); 0 when zones are
// ignored.
func (p *wmPass) zoneDeficit(reps []int32, from int32) int {
	if !p.z.on() {
		return 0
	}
	t := p.z.tally(reps, from)
	defer p.z.release(t)
	return t.deficit()
}

// pick returns up to k of the coolest nodes to take slice reps (over range r) in place of
// from (-1 for added replicas), chosen one at a time from a zone holding the fewest of its
// replicas, passing over the nodes the hold keeps r off if hold.
func (o *coolOrder) pick(k int, reps []int32, from int32, r keyspace.Range, hold bool) []int32 {
	z := &o.p.z
	if !z.on() {
		return o.coldest(k, reps, r, hold)
	}
	t := z.tally(reps, from)
	defer z.release(t)
	var out []int32
	// While the fewest replicas a zone holds stays the same, every node before pos is taken,
	// held, or of a zone holding more: the scan goes on from there, and starts over only when
	// the fewest grows.
	pos, last := 0, int32(-1)
	for len(out) < k {
		least := t.least()
		if least < 0 {
			break
		}
		if least != last {
			pos, last = 0, least
		}
		next := int32(-1)
		for ; pos < len(o.nodes) && next < 0; pos++ {
			n := o.nodes[pos]
			if !t.fits(z.of[n], least) || slices.Contains(out, n) {
				continue
			}
			if _, held := slices.BinarySearch(reps, n); !held && !(hold && o.p.held(r, n)) {
				next = n
			}
		}
		if next < 0 {
			break
		}
		out = append(out, next)
		t.add(next)
	}
	return out
}

// spread repairs the slices whose replicas are short of distinct zones, heaviest first, while
// the budget lasts: each step moves a replica out of the zone holding most of them to the
// coolest node of a zone holding fewest. A pinned slice keeps its replicas, and a replica
// this pass placed stays where it was copied (so that no key is charged twice); a slice
// placed by clean-up or merged may still spread its other replicas.
func (p *wmPass) spread() {
	if !p.z.on() {
		return
	}
	var todo []int
	for i := range p.sl {
		s := &p.sl[i]
		if len(s.reps) > 1 && !s.pinned && p.zoneDeficit(s.reps, -1) > 0 {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return
	}
	slices.SortStableFunc(todo, func(a, b int) int { return cmp.Compare(p.sl[b].load, p.sl[a].load) })
	order := p.newCoolOrder()
	for _, i := range todo {
		for p.zoneDeficit(p.sl[i].reps, -1) > 0 {
			c, ok := p.spreadCandidate(i, order)
			if !ok {
				break
			}
			if c.reason != "" {
				p.explain(c, false)
				break
			}
			p.explain(c, true)
			order.update(p.apply(c))
		}
	}
}

// spreadCandidate returns the move that lowers slice i's zone deficit: the hottest replica of
// its most crowded zone to the coolest node of a zone holding fewest, not undoing a recent
// move; with a reason if the budget cannot pay for it.
func (p *wmPass) spreadCandidate(i int, order *coolOrder) (cand, bool) {
	s := &p.sl[i]
	t := p.z.tally(s.reps, -1)
	defer p.z.release(t)
	froms := slices.Clone(s.reps)
	// A replica a recent move placed goes last among its zone's: moving it on would copy the
	// same keys twice within the hold.
	recent := make(map[int32]bool, len(froms))
	for _, n := range froms {
		_, recent[n] = p.placedOn(s.r, n, false)
	}
	slices.SortStableFunc(froms, func(a, b int32) int {
		if c := cmp.Compare(t.kept[p.z.of[b]], t.kept[p.z.of[a]]); c != 0 {
			return c
		}
		if recent[a] != recent[b] {
			if recent[a] {
				return 1
			}
			return -1
		}
		return cmp.Compare(p.u(b), p.u(a))
	})
	for _, from := range froms {
		if t.kept[p.z.of[from]] < 2 {
			break
		}
		if p.placedThisPass(s, from) {
			continue
		}
		to := order.pick(1, s.reps, from, s.r, true)
		if len(to) == 0 || p.zoneDeficit(append(removeSorted(s.reps, from), to[0]), -1) >= t.deficit() {
			continue
		}
		if _, blocked := p.blocker(s.r, from, to[0]); blocked {
			continue
		}
		c := cand{kind: spread, slice: i, from: from, to: to, cost: s.keys}
		if p.balancing()+c.cost > p.budget {
			c.reason = reasonBudget
		}
		return c, true
	}
	return cand{}, false
}

// placedThisPass reports whether this pass copied slice s to node n.
func (p *wmPass) placedThisPass(s *wmSlice, n int32) bool {
	_, ok := p.placedOn(s.r, n, true)
	return ok
}

// keepersBySpread returns the replicas of s to keep when it drops to need of them: those that
// keep is already set for, then the coldest of a zone not yet kept, then the coldest.
func (p *wmPass) keepersBySpread(s *wmSlice, keep []bool, need int) {
	kept := 0
	for _, k := range keep {
		if k {
			kept++
		}
	}
	byCold := make([]int, len(s.reps))
	for k := range byCold {
		byCold[k] = k
	}
	slices.SortStableFunc(byCold, func(x, y int) int { return cmp.Compare(p.u(s.reps[x]), p.u(s.reps[y])) })
	var zones []int32
	if p.z.on() {
		for k, n := range s.reps {
			if keep[k] {
				zones = append(zones, p.z.of[n])
			}
		}
		for _, k := range byCold {
			if z := p.z.of[s.reps[k]]; kept < need && !keep[k] && !slices.Contains(zones, z) {
				keep[k], kept = true, kept+1
				zones = append(zones, z)
			}
		}
	}
	for _, k := range byCold {
		if kept < need && !keep[k] {
			keep[k], kept = true, kept+1
		}
	}
}

// refill gives a slice that lost replicas with departed nodes but kept a live one back the
// replicas its load still needs (as the move step counts need: ReplicateAbove times the mean
// node load per replica), at most as many as it had, each on the least loaded node of a zone
// holding fewest of its replicas. It runs only with zones: the replicas of a lost zone come
// back in the others at once, so that the next zone lost still leaves a live replica. Like
// the rest of clean-up it is charged as clean-up churn, not to the pass's budget.
func (p *wmPass) refill(lost []int) {
	mean := p.meanU()
	if !p.z.on() || mean <= 0 {
		return
	}
	for i, had := range lost {
		s := &p.sl[i]
		if had == 0 || s.pinned || s.change == moved {
			continue
		}
		need := min(had, p.cfg.MaxReplicas, int(math.Ceil(p.peak(s)/(p.cfg.ReplicateAbove*mean))))
		for len(s.reps) < need {
			n := p.coolestFit(s.reps, s.r)
			if n < 0 {
				break
			}
			p.place(s, -1)
			s.reps = insertSorted(s.reps, n)
			p.place(s, +1)
			s.change = moved
			p.spent.Cleanup += s.keys
			p.x.ReplicasAdded++
			p.remember(Move{Range: s.r, To: p.ids[n], Pass: p.in.Pass})
		}
	}
}

// coolestFit returns the least loaded node that may take another replica of reps (over range
// r), or -1: one the hold allows if any.
func (p *wmPass) coolestFit(reps []int32, r keyspace.Range) int32 {
	t := p.z.tally(reps, -1)
	defer p.z.release(t)
	least := t.least()
	best, free := int32(-1), false
	for n := range int32(len(p.raw)) {
		if _, held := slices.BinarySearch(reps, n); held || t.kept[p.z.of[n]] != least {
			continue
		}
		if nFree := !p.held(r, n); best < 0 || nFree && !free || nFree == free && p.u(n) < p.u(best) {
			best, free = n, nFree
		}
	}
	return best
}

// ZoneDeficit returns how many zones the replica set reps is short of min(len(reps), the
// number of distinct zones among live): 0 when the replicas are spread as far as the zones
// allow. Drivers and tests use it to count slices a zone outage would hit harder than needed.
func ZoneDeficit(reps []assignment.NodeID, zones map[assignment.NodeID]string, live *assignment.NodeSet) int {
	all := map[string]bool{}
	for _, n := range live.Nodes() {
		all[zones[n.ID]] = true
	}
	held := map[string]bool{}
	for _, id := range reps {
		held[zones[id]] = true
	}
	return min(len(reps), len(all)) - len(held)
}
