package balance

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// The baselines compute the map they want from the live nodes (and, for random, the keys) and
// move straight to it. They ignore load, and none of them limits churn: they are here so that
// Weighted-Move is always compared with them on the same work.

// fromStarts builds an assignment from sorted, distinct slice starts (the first being 0) and
// the replica set of each slice.
func fromStarts(starts []uint64, owners [][]assignment.NodeID) (*assignment.Assignment, error) {
	ss := make([]assignment.Slice, len(starts))
	for i, s := range starts {
		end := keyspace.End
		if i+1 < len(starts) {
			end = keyspace.At(starts[i+1])
		}
		ss[i] = assignment.Slice{Range: keyspace.Range{Start: s, End: end}, Replicas: owners[i]}
	}
	return assignment.New(0, ss)
}

// ConsistentHashConfig holds the constants of consistent hashing.
type ConsistentHashConfig struct {
	// VirtualNodes is the number of points each node has on the ring.
	VirtualNodes int
}

// DefaultConsistentHashConfig returns 128 virtual nodes per node.
func DefaultConsistentHashConfig() ConsistentHashConfig {
	return ConsistentHashConfig{VirtualNodes: 128}
}

func (c *ConsistentHashConfig) params() []Param {
	return []Param{intParam("virtual_nodes", "points per node on the ring", &c.VirtualNodes)}
}

// ConsistentHash places each node at VirtualNodes points of the ring, hash(id#i), and gives
// every key to the first point at or after it, wrapping around. It moves only what a node's
// arrival or departure forces.
type ConsistentHash struct{ cfg ConsistentHashConfig }

// NewConsistentHash returns consistent hashing with the given constants.
func NewConsistentHash(cfg ConsistentHashConfig) (*ConsistentHash, error) {
	if cfg.VirtualNodes < 1 || cfg.VirtualNodes > 1<<16 {
		return nil, fmt.Errorf("virtual_nodes=%d: want 1..65536", cfg.VirtualNodes)
	}
	return &ConsistentHash{cfg: cfg}, nil
}

// Name implements Algorithm.
func (*ConsistentHash) Name() string { return "consistent-hash" }

// Initial implements Algorithm.
func (c *ConsistentHash) Initial(in Input) (*assignment.Assignment, error) {
	if err := in.validate(false); err != nil {
		return nil, err
	}
	return c.ring(in.Nodes)
}

// Rebalance implements Algorithm.
func (c *ConsistentHash) Rebalance(in Input) (Result, error) {
	if err := in.validate(true); err != nil {
		return Result{}, err
	}
	target, err := c.ring(in.Nodes)
	if err != nil {
		return Result{}, err
	}
	return towards(c.Name(), in, target), nil
}

func (c *ConsistentHash) ring(nodes *assignment.NodeSet) (*assignment.Assignment, error) {
	type point struct {
		at   uint64
		node assignment.NodeID
	}
	points := make([]point, 0, nodes.Len()*c.cfg.VirtualNodes)
	for _, id := range nodes.IDs() {
		for v := range c.cfg.VirtualNodes {
			points = append(points, point{keyspace.HashString(string(id) + "#" + strconv.Itoa(v)), id})
		}
	}
	slices.SortFunc(points, func(a, b point) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.node, b.node))
	})
	// A point owns (previous point, point], that is the half-open [previous+1, point+1); the
	// keys after the last point wrap around to the first.
	var starts []uint64
	var owners [][]assignment.NodeID
	add := func(start uint64, owner assignment.NodeID) {
		if len(owners) > 0 && owners[len(owners)-1][0] == owner {
			return // the previous slice simply extends
		}
		starts, owners = append(starts, start), append(owners, []assignment.NodeID{owner})
	}
	start := uint64(0)
	for j, p := range points {
		if j > 0 && p.at == points[j-1].at {
			continue // the first of equal points owns it
		}
		add(start, p.node)
		if p.at == ^uint64(0) {
			return fromStarts(starts, owners) // nothing lies after the last point of the space
		}
		start = p.at + 1
	}
	add(start, points[0].node)
	return fromStarts(starts, owners)
}

// StaticRange splits the space into one equal range per node, in ID order. Any change of the
// node set shifts every boundary, which is why nobody balances this way; it is the baseline.
type StaticRange struct{}

// Name implements Algorithm.
func (StaticRange) Name() string { return "range" }

// Initial implements Algorithm.
func (StaticRange) Initial(in Input) (*assignment.Assignment, error) {
	if err := in.validate(false); err != nil {
		return nil, err
	}
	ids := in.Nodes.IDs()
	return assignment.Uniform(len(ids), func(i int) []assignment.NodeID { return ids[i : i+1] })
}

// Rebalance implements Algorithm.
func (s StaticRange) Rebalance(in Input) (Result, error) {
	if err := in.validate(true); err != nil {
		return Result{}, err
	}
	target, err := s.Initial(in)
	if err != nil {
		return Result{}, err
	}
	return towards(s.Name(), in, target), nil
}

// RandomConfig holds the seed of the random baseline.
type RandomConfig struct {
	// Seed seeds the choice of nodes, together with the pass number.
	Seed uint64
}

// DefaultRandomConfig returns seed 1.
func DefaultRandomConfig() RandomConfig { return RandomConfig{Seed: 1} }

func (c *RandomConfig) params() []Param {
	return []Param{uintParam("seed", "seed of the random node choice", &c.Seed)}
}

// Random is the seed thesis's random balancer: a slice holding several keys is split into
// one-key slices, each on a random node; a slice with no key merges into its left neighbour;
// a one-key slice stays where it is unless its node left. It needs Input.KeyHashes; without
// them it only sends the slices of departed nodes to random nodes.
type Random struct{ cfg RandomConfig }

// NewRandom returns the random baseline.
func NewRandom(cfg RandomConfig) (*Random, error) { return &Random{cfg: cfg}, nil }

// Name implements Algorithm.
func (*Random) Name() string { return "random" }

// Initial implements Algorithm: every key on a random node.
func (r *Random) Initial(in Input) (*assignment.Assignment, error) {
	if err := in.validate(false); err != nil {
		return nil, err
	}
	// One slice over the whole space with no replica yet, which the rule splits per key.
	return r.target(in, []assignment.Slice{{Range: keyspace.Full()}})
}

// Rebalance implements Algorithm.
func (r *Random) Rebalance(in Input) (Result, error) {
	if err := in.validate(true); err != nil {
		return Result{}, err
	}
	cur := make([]assignment.Slice, in.Assignment.Len())
	for i, s := range in.Assignment.All() {
		cur[i] = s
	}
	target, err := r.target(in, cur)
	if err != nil {
		return Result{}, err
	}
	return towards(r.Name(), in, target), nil
}

func (r *Random) target(in Input, cur []assignment.Slice) (*assignment.Assignment, error) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, in.Pass))
	ids := in.Nodes.IDs()
	var starts []uint64
	var owners [][]assignment.NodeID
	keys := in.KeyHashes
	k := 0 // the first key not before the current slice
	for _, s := range cur {
		live := liveReplicas(s.Replicas, in.Nodes)
		if keys == nil {
			if len(live) == 0 {
				live = randomNode(rng, ids)
			}
			starts, owners = append(starts, s.Range.Start), append(owners, live)
			continue
		}
		first := k
		for k < len(keys) && s.Range.Contains(keys[k]) {
			k++
		}
		switch n := k - first; {
		case n == 0:
			// No key: the slice merges into its left neighbour by not starting a slice of
			// its own (the first slice's space goes to the next one, see below).
		case n == 1 && len(live) > 0:
			starts, owners = append(starts, s.Range.Start), append(owners, live)
		default:
			starts, owners = append(starts, s.Range.Start), append(owners, randomNode(rng, ids))
			for _, h := range keys[first+1 : k] {
				if h != starts[len(starts)-1] { // keys with equal hashes share a slice
					starts, owners = append(starts, h), append(owners, randomNode(rng, ids))
				}
			}
		}
	}
	if len(starts) == 0 { // no keys at all
		starts, owners = []uint64{0}, [][]assignment.NodeID{randomNode(rng, ids)}
	}
	starts[0] = 0
	return fromStarts(starts, owners)
}

func randomNode(rng *rand.Rand, ids []assignment.NodeID) []assignment.NodeID {
	i := rng.IntN(len(ids))
	return ids[i : i+1 : i+1]
}

func liveReplicas(reps []assignment.NodeID, nodes *assignment.NodeSet) []assignment.NodeID {
	out := make([]assignment.NodeID, 0, len(reps))
	for _, id := range reps {
		if nodes.Has(id) {
			out = append(out, id)
		}
	}
	return out
}
