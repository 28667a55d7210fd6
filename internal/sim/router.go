package sim

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// Router is how the simulated routers split a slice's load over its live replicas, which is
// what a replica buys: spread evenly, a replicated key still adds its share to whichever
// holder is hottest, while a router that prefers the less busy replica pours it into the
// holders' valleys.
type Router string

const (
	// RouterLeastOutstanding models client.LeastOutstanding, the policy the example proxy,
	// load generator and demos run with: every request goes to the replica with the fewest
	// requests in flight. In the fluid limit (many requests an epoch, in-flight counts that
	// track each node's load over its capacity) a slice's load fills its holders from the
	// least loaded up, to a common level, and no request goes to a holder above it; with
	// every slice routed so at once, the node loads are the equilibrium in which no request
	// could go to a less loaded holder (a Wardrop equilibrium), found by water-filling each
	// replicated slice in turn until nothing moves.
	RouterLeastOutstanding Router = "least-outstanding"
	// RouterPowerOfTwo models client.PowerOfTwo: a request draws two distinct replicas at
	// random and goes to the less loaded. Each pair of a slice's holders gets its share of
	// the slice's load (2 / k(k-1) of it with k holders), water-filled over the pair, so a
	// holder above every other one gets nothing and the others fill unevenly. With two
	// replicas it is RouterLeastOutstanding.
	RouterPowerOfTwo Router = "power-of-two"
	// RouterEven splits a slice's load evenly over its live replicas, as client.RoundRobin
	// does (and client.WeightedCapacity on nodes of equal capacity): the simulator's split
	// before routers were modelled, and the zero Options' for that reason.
	RouterEven Router = "even"
)

// Routers lists the routers, the command line's default first.
var Routers = []Router{RouterLeastOutstanding, RouterPowerOfTwo, RouterEven}

// ParseRouter returns the router named s; "" is RouterEven, as in Options.
func ParseRouter(s string) (Router, error) {
	if s == "" {
		return RouterEven, nil
	}
	if r := Router(s); slices.Contains(Routers, r) {
		return r, nil
	}
	names := make([]string, len(Routers))
	for i, r := range Routers {
		names[i] = string(r)
	}
	return "", fmt.Errorf("%w: unknown router %q (want %s)", ErrScenario, s, strings.Join(names, ", "))
}

// Routing iterates until no node's load moves by more than routeTolerance of the mean node
// load in a sweep, or routeSweeps sweeps: the equilibrium is approached geometrically, and a
// millionth of the mean is far below what the figures print.
const (
	routeTolerance = 1e-6
	routeSweeps    = 200
)

// split is what every live node served in an epoch: each slice's load split over its live
// replicas as a router splits it.
type split struct {
	weight []float64 // per node, its capacity weight
	served []float64 // per node, the load it served (not over capacity)
	// The entries of slice i, one per live replica in the order the map lists them, are
	// off[i]:off[i+1] of node (the replica's index among the nodes) and share (the load it
	// served of the slice).
	off   []int32
	node  []int32
	share []float64
	load  []float64 // per slice, its load
	even  bool      // the split is even: no router moved any share
}

// splitLoads splits each slice of a's load (sliceLoads) over its live replicas in nodes, as
// router would.
func splitLoads(a *assignment.Assignment, sliceLoads []float64, nodes *assignment.NodeSet, router Router) *split {
	s := &split{weight: make([]float64, nodes.Len()), served: make([]float64, nodes.Len()),
		off: make([]int32, a.Len()+1), load: sliceLoads, even: router == RouterEven || router == ""}
	for i, n := range nodes.Nodes() {
		s.weight[i] = n.Weight()
	}
	var idx []int
	for i, sl := range a.All() {
		idx = nodes.AppendIndices(idx[:0], sl.Replicas)
		for _, n := range idx {
			s.node = append(s.node, int32(n))
			s.share = append(s.share, sliceLoads[i]/float64(len(idx)))
			s.served[n] += sliceLoads[i] / float64(len(idx))
		}
		s.off[i+1] = int32(len(s.node))
	}
	if !s.even {
		s.route(sliceLoads, router)
	}
	return s
}

// perCapacity returns each node's served load over its capacity weight, as load.NodeLoads
// does.
func (s *split) perCapacity() []float64 {
	out := make([]float64, len(s.served))
	for i, l := range s.served {
		out[i] = l / s.weight[i]
	}
	return out
}

// shares returns the entries of slice i: the nodes holding it and the load each served.
func (s *split) shares(i int) (nodes []int32, loads []float64) {
	return s.node[s.off[i]:s.off[i+1]], s.share[s.off[i]:s.off[i+1]]
}

// fraction returns the part of slice i's load that its j-th live replica served. The even
// split's is 1/k exactly, as the simulator always reported it.
func (s *split) fraction(i, j int) float64 {
	k := s.off[i+1] - s.off[i]
	switch {
	case s.even:
		return 1 / float64(k)
	case s.load[i] <= 0:
		return 0
	}
	return s.share[int(s.off[i])+j] / s.load[i]
}

// block is a share of one slice's load that a router pours over some of its holders at
// once: the whole slice for least-outstanding, a pair of holders for power-of-two. Its
// members are entries of the split, members[first:first+n] of the blocks' arrays.
type block struct {
	first, n int32
	load     float64
}

// blocks holds the blocks of a split and the load each member of each block takes.
type blocks struct {
	list   []block
	member []int32   // an entry of the split
	take   []float64 // the load that member takes of its block
}

// route replaces the even split of every replicated slice by router's equilibrium.
func (s *split) route(sliceLoads []float64, router Router) {
	b := s.blocks(sliceLoads, router)
	if len(b.list) == 0 {
		return
	}
	var total float64
	for _, l := range s.served {
		total += l
	}
	tol := routeTolerance * total / float64(len(s.served))
	var f filler
	for range routeSweeps {
		if b.sweep(s, &f) <= tol {
			break
		}
	}
	// Each entry's share is the sum of what its blocks gave it.
	for _, blk := range b.list {
		for _, e := range b.member[blk.first : blk.first+blk.n] {
			s.share[e] = 0
		}
	}
	for k, e := range b.member {
		s.share[e] += b.take[k]
	}
}

// blocks lays out the blocks of router over the replicated slices, each starting from the
// even split.
func (s *split) blocks(sliceLoads []float64, router Router) *blocks {
	b := &blocks{}
	add := func(load float64, entries ...int32) {
		b.list = append(b.list, block{first: int32(len(b.member)), n: int32(len(entries)), load: load})
		for _, e := range entries {
			b.member = append(b.member, e)
			b.take = append(b.take, load/float64(len(entries)))
		}
	}
	var all []int32
	for i, l := range sliceLoads {
		lo, hi := s.off[i], s.off[i+1]
		k := hi - lo
		if k < 2 || l <= 0 {
			continue
		}
		if router == RouterLeastOutstanding || k == 2 {
			all = all[:0]
			for e := lo; e < hi; e++ {
				all = append(all, e)
			}
			add(l, all...)
			continue
		}
		pair := l * 2 / float64(k*(k-1))
		for x := lo; x < hi; x++ {
			for y := x + 1; y < hi; y++ {
				add(pair, x, y)
			}
		}
	}
	return b
}

// sweep water-fills every block once, in order, over its members' nodes as the other blocks
// leave them, and returns the largest change of a node's load it made.
func (b *blocks) sweep(s *split, f *filler) float64 {
	var moved float64
	for _, blk := range b.list {
		members := b.member[blk.first : blk.first+blk.n]
		take := b.take[blk.first : blk.first+blk.n]
		f.reset(len(members))
		for j, e := range members {
			n := s.node[e]
			s.served[n] -= take[j]
			f.base[j], f.weight[j] = s.served[n]/s.weight[n], s.weight[n]
		}
		f.fill(blk.load)
		for j, e := range members {
			moved = max(moved, math.Abs(f.out[j]-take[j]))
			take[j] = f.out[j]
			s.served[s.node[e]] += take[j]
		}
	}
	return moved
}

// filler water-fills one block; its slices are reused from block to block.
type filler struct {
	base, weight, out []float64
	order             []int
}

func (f *filler) reset(n int) {
	f.base, f.weight, f.out = slices.Grow(f.base[:0], n)[:n], slices.Grow(f.weight[:0], n)[:n], slices.Grow(f.out[:0], n)[:n]
	f.order = slices.Grow(f.order[:0], n)[:n]
}

// fill pours load over the holders whose loads over capacity are f.base, the least loaded
// first: every holder that takes some ends at one level h, and every holder that takes none
// is at h or above. A holder of weight w takes w × (h - base). Ties are broken by position,
// so that the result does not depend on the sort.
func (f *filler) fill(load float64) {
	for j := range f.order {
		f.order[j] = j
		f.out[j] = 0
	}
	slices.SortFunc(f.order, func(x, y int) int { return cmp.Or(cmp.Compare(f.base[x], f.base[y]), cmp.Compare(x, y)) })
	// With the m least loaded filled to h: W h - Σ w base = load.
	var w, wb, h float64
	m := 0
	for m < len(f.order) {
		j := f.order[m]
		if m > 0 && h <= f.base[j] {
			break
		}
		w += f.weight[j]
		wb += f.weight[j] * f.base[j]
		h = (load + wb) / w
		m++
	}
	for _, j := range f.order[:m] {
		f.out[j] = max(0, f.weight[j]*(h-f.base[j]))
	}
}
