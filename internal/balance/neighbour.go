package balance

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// NeighbourOffloadConfig holds the constants of the neighbour-offload baseline. The defaults
// are the middle of the grid the seed swept (thresholds 10–45%, 3–9 buckets).
type NeighbourOffloadConfig struct {
	// Threshold is T: a node whose load exceeds the mean by this fraction offloads, and hands
	// over at least this fraction of its keys.
	Threshold float64
	// Buckets is how many equal buckets (slices) a node's range is cut into.
	Buckets int
}

// DefaultNeighbourOffloadConfig returns T=25%, 6 buckets.
func DefaultNeighbourOffloadConfig() NeighbourOffloadConfig {
	return NeighbourOffloadConfig{Threshold: 0.25, Buckets: 6}
}

func (c *NeighbourOffloadConfig) params() []Param {
	return []Param{
		floatParam("threshold", "offload when load exceeds the mean by this fraction, handing over at least this fraction of keys", &c.Threshold),
		intParam("buckets", "buckets per node range", &c.Buckets),
	}
}

// NeighbourOffload is the key-range bucket scheme of a seed: every node owns one arc of the
// ring cut into Buckets buckets. A node whose load exceeds the mean by Threshold hands whole
// buckets, at least Threshold of its keys, to its less loaded ring neighbour, and both re-cut
// their arcs into equal buckets. A departed node's arc goes to its less loaded neighbour; a
// new node takes the upper half of the hottest arc.
type NeighbourOffload struct{ cfg NeighbourOffloadConfig }

// NewNeighbourOffload returns the neighbour-offload baseline.
func NewNeighbourOffload(cfg NeighbourOffloadConfig) (*NeighbourOffload, error) {
	var errs []error
	if !(cfg.Threshold > 0 && cfg.Threshold < 1) {
		errs = append(errs, fmt.Errorf("threshold=%v: want 0 < T < 1", cfg.Threshold))
	}
	if cfg.Buckets < 2 || cfg.Buckets > 4096 {
		errs = append(errs, fmt.Errorf("buckets=%d: want 2..4096 (one bucket cannot be handed over)", cfg.Buckets))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &NeighbourOffload{cfg: cfg}, nil
}

// Name implements Algorithm.
func (*NeighbourOffload) Name() string { return "neighbour-offload" }

// Initial implements Algorithm: equal arcs in ID order, each cut into equal buckets.
func (o *NeighbourOffload) Initial(in Input) (*assignment.Assignment, error) {
	if err := in.validate(false); err != nil {
		return nil, err
	}
	ids := in.Nodes.IDs()
	return assignment.Uniform(len(ids)*o.cfg.Buckets, func(i int) []assignment.NodeID {
		j := i / o.cfg.Buckets
		return ids[j : j+1]
	})
}

// Rebalance implements Algorithm.
func (o *NeighbourOffload) Rebalance(in Input) (Result, error) {
	if err := in.validate(true); err != nil {
		return Result{}, err
	}
	keys, _, _ := in.keyCounts()
	g := &ring{in: in, loads: in.sliceLoads(), keys: keys, buckets: o.cfg.Buckets}
	if !g.derive() {
		// Not a map of one arc per node (another algorithm made it): start over.
		target, err := o.Initial(in)
		if err != nil {
			return Result{}, err
		}
		return towards(o.Name(), in, target), nil
	}
	g.dropDeparted()
	g.addArrived()
	g.offload(o.cfg.Threshold)
	target, err := g.assignment()
	if err != nil {
		return Result{}, err
	}
	return towards(o.Name(), in, target), nil
}

// arc is one node's part of the ring: from start up to the next arc's start, wrapping.
type arc struct {
	node  assignment.NodeID
	start uint64
	// buckets are the current slices tiling the arc, in ring order; a touched arc is re-cut
	// into equal buckets instead.
	buckets []int
	touched bool
}

type ring struct {
	in      Input
	loads   []float64
	keys    []float64
	buckets int
	arcs    []*arc // by start, which is ring order
}

// derive reads the arcs off the assignment: runs of slices held by one node. It fails unless
// every slice has one replica and every node owns one run (the runs at both ends of the space
// count as one when they have the same owner: that arc wraps around).
func (g *ring) derive() bool {
	a := g.in.Assignment
	for i, s := range a.All() {
		if len(s.Replicas) != 1 {
			return false
		}
		if i == 0 || s.Replicas[0] != g.arcs[len(g.arcs)-1].node {
			g.arcs = append(g.arcs, &arc{node: s.Replicas[0], start: s.Range.Start})
		}
		last := g.arcs[len(g.arcs)-1]
		last.buckets = append(last.buckets, i)
	}
	if n := len(g.arcs); n > 1 && g.arcs[0].node == g.arcs[n-1].node {
		g.arcs[n-1].buckets = append(g.arcs[n-1].buckets, g.arcs[0].buckets...)
		g.arcs = g.arcs[1:]
	}
	seen := make(map[assignment.NodeID]bool, len(g.arcs))
	for _, a := range g.arcs {
		if seen[a.node] {
			return false
		}
		seen[a.node] = true
	}
	return true
}

func (g *ring) index(a *arc) int { return slices.Index(g.arcs, a) }

func (g *ring) neighbours(a *arc) (prev, next *arc) {
	i, n := g.index(a), len(g.arcs)
	return g.arcs[(i+n-1)%n], g.arcs[(i+1)%n]
}

// span returns the arc's width in points; full means the whole ring (2^64 points).
func (g *ring) span(a *arc) (width uint64, full bool) {
	if len(g.arcs) == 1 {
		return 0, true
	}
	_, next := g.neighbours(a)
	return next.start - a.start, false // modulo 2^64: wraps correctly
}

// pieces returns the arc as ranges of the linear space: two when it wraps past the end.
func (g *ring) pieces(a *arc) []keyspace.Range {
	w, full := g.span(a)
	end := a.start + w
	switch {
	case full && a.start == 0, !full && end == 0:
		return []keyspace.Range{{Start: a.start, End: keyspace.End}}
	case full:
		return []keyspace.Range{{Start: a.start, End: keyspace.End}, {Start: 0, End: keyspace.At(a.start)}}
	case end < a.start:
		return []keyspace.Range{{Start: a.start, End: keyspace.End}, {Start: 0, End: keyspace.At(end)}}
	}
	return []keyspace.Range{{Start: a.start, End: keyspace.At(end)}}
}

// util returns the arc's load over its node's capacity; departed nodes count as infinitely
// loaded, so that nobody hands them anything.
func (g *ring) util(a *arc) float64 {
	i, ok := g.in.Nodes.Index(a.node)
	if !ok {
		return inf
	}
	var l float64
	for _, r := range g.pieces(a) {
		for j, _ := g.in.Assignment.Lookup(r.Start); j < g.in.Assignment.Len(); j++ {
			s := g.in.Assignment.Slice(j).Range
			overlap, ok := s.Intersect(r)
			if !ok {
				break
			}
			l += g.loads[j] * overlap.Width() / s.Width()
		}
	}
	return l / g.in.Nodes.Nodes()[i].Weight()
}

var inf = math.Inf(1)

func (g *ring) resort() {
	slices.SortFunc(g.arcs, func(a, b *arc) int { return cmp.Compare(a.start, b.start) })
}

// dropDeparted gives each departed node's arc to its less loaded neighbour.
func (g *ring) dropDeparted() {
	for {
		i := slices.IndexFunc(g.arcs, func(a *arc) bool { return !g.in.Nodes.Has(a.node) })
		if i < 0 {
			return
		}
		dead := g.arcs[i]
		if len(g.arcs) == 1 {
			g.arcs[0] = &arc{node: g.in.Nodes.IDs()[0], start: dead.start, touched: true}
			continue
		}
		prev, next := g.neighbours(dead)
		if g.util(prev) <= g.util(next) {
			prev.touched = true // prev's arc now runs up to next
		} else {
			next.start, next.touched = dead.start, true
		}
		g.arcs = slices.Delete(g.arcs, i, i+1)
		g.resort()
	}
}

// addArrived gives each new node the upper half of the hottest arc.
func (g *ring) addArrived() {
	in := make(map[assignment.NodeID]bool, len(g.arcs))
	for _, a := range g.arcs {
		in[a.node] = true
	}
	for _, id := range g.in.Nodes.IDs() {
		if in[id] {
			continue
		}
		hot := slices.MaxFunc(g.arcs, func(a, b *arc) int { return cmp.Compare(g.util(a), g.util(b)) })
		w, full := g.span(hot)
		mid := hot.start + w/2
		if full {
			mid = hot.start + 1<<63
		}
		if mid == hot.start {
			continue // a one-point arc cannot be halved; the node stays idle
		}
		hot.touched = true
		g.arcs = append(g.arcs, &arc{node: id, start: mid, touched: true})
		g.resort()
	}
}

// offload lets every node over the mean by threshold hand buckets to its less loaded
// neighbour, hottest first; a node takes part in one handover per pass.
func (g *ring) offload(threshold float64) {
	util := make(map[*arc]float64, len(g.arcs))
	var mean float64
	for _, a := range g.arcs {
		util[a] = g.util(a)
		mean += util[a] / float64(len(g.arcs))
	}
	order := slices.Clone(g.arcs)
	slices.SortStableFunc(order, func(a, b *arc) int { return cmp.Compare(util[b], util[a]) })
	for _, a := range order {
		if a.touched || len(a.buckets) < 2 || !(util[a] > mean*(1+threshold)) || len(g.arcs) < 2 {
			continue
		}
		prev, next := g.neighbours(a)
		to := next
		if next.touched || (!prev.touched && util[prev] < util[next]) {
			to = prev
		}
		if to.touched {
			continue
		}
		var total float64
		for _, b := range a.buckets {
			total += g.keys[b]
		}
		// Hand over whole buckets from the side facing the neighbour until at least
		// threshold of the keys went, keeping at least one bucket.
		var moved float64
		n := 0
		for n < len(a.buckets)-1 && (n == 0 || moved < threshold*total) {
			b := a.buckets[len(a.buckets)-1-n]
			if to == prev {
				b = a.buckets[n]
			}
			moved += g.keys[b]
			n++
		}
		if to == next {
			next.start = g.in.Assignment.Slice(a.buckets[len(a.buckets)-n]).Range.Start
		} else {
			a.start = g.in.Assignment.Slice(a.buckets[n]).Range.Start
		}
		a.touched, to.touched = true, true
		g.resort()
	}
}

// assignment writes the ring as slices: untouched arcs keep their buckets, touched ones are cut
// into equal buckets; a bucket that wraps past the end of the space is cut there.
func (g *ring) assignment() (*assignment.Assignment, error) {
	type bucket struct {
		start uint64
		owner assignment.NodeID
	}
	var bs []bucket
	for _, a := range g.arcs {
		if !a.touched {
			for _, i := range a.buckets {
				bs = append(bs, bucket{g.in.Assignment.Slice(i).Range.Start, a.node})
			}
			continue
		}
		w, full := g.span(a)
		for k := range g.buckets {
			var off uint64
			if full {
				off = keyspace.Boundary(k, g.buckets)
			} else {
				hi, lo := bits.Mul64(uint64(k), w)
				off, _ = bits.Div64(hi, lo, uint64(g.buckets)) // k*w/buckets; hi < buckets since k < buckets
			}
			bs = append(bs, bucket{a.start + off, a.node})
		}
	}
	slices.SortStableFunc(bs, func(a, b bucket) int { return cmp.Compare(a.start, b.start) })
	// Equal starts come from empty buckets of a tiny arc: keep the last, which is not empty.
	kept := bs[:0]
	for i, b := range bs {
		if i+1 == len(bs) || bs[i+1].start != b.start {
			kept = append(kept, b)
		}
	}
	bs = kept
	starts := make([]uint64, 0, len(bs)+1)
	owners := make([][]assignment.NodeID, 0, len(bs)+1)
	if bs[0].start != 0 { // the space before the first bucket belongs to the arc that wraps
		starts, owners = append(starts, 0), append(owners, []assignment.NodeID{bs[len(bs)-1].owner})
	}
	for _, b := range bs {
		starts, owners = append(starts, b.start), append(owners, []assignment.NodeID{b.owner})
	}
	return fromStarts(starts, owners)
}
