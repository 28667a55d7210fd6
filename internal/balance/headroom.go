package balance

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// HeadroomConfig configures Weighted-Move with headroom ("weighted-move-headroom").
//
// A router that sends each request to the less busy replica (least-outstanding, power of two
// choices) moves a replicated slice's load between its holders within an epoch: a node whose
// other load rises unforeseen sheds its share of its replicated slices to their other
// holders. The load a node holds in replicated slices is thus headroom that needs no pass.
// Weighted-Move only replicates a slice when it fills much of a node; this step first gives
// every node enough shareable load for the surprise its forecast leaves open, buying it with
// the slices that carry the most load per key, so that the memory it costs is small.
type HeadroomConfig struct {
	// WeightedMove is the pass that runs after the headroom step.
	WeightedMove WeightedMoveConfig
	// Headroom is the load every node should be able to shed, as a share of the mean node
	// load (times its capacity weight): the surprise no forecast sees coming, a key that
	// bursts or appears hot.
	Headroom float64
	// Sigmas adds that many standard deviations of the node's unshared load to what it should
	// be able to shed: its single-replica slices' Input.Spread, summed. Summed, not in
	// quadrature as independent noises would add: what surprises a node is mostly one slice
	// (a key that bursts, a key that appears hot), not many small errors averaging out, and
	// the sum bounds the node's error whatever its slices' errors share.
	Sigmas float64
	// MaxKeyCopies caps the memory the step spends: it adds no replica that would take the
	// map's key copies (keys held, over keys) above this.
	MaxKeyCopies float64
	// Churn is the share of keys one pass may copy to add replicas for headroom, on top of
	// Weighted-Move's own budget.
	Churn float64
}

// headroomKeep: a replica is added only to a slice whose load is at least this many times
// Weighted-Move's dereplicate_below threshold, so that Weighted-Move does not drop it again
// at its next pass unless the slice's load halves.
const headroomKeep = 2

// DefaultHeadroomConfig returns Weighted-Move's constants, with replicas kept down to 0.5% of
// the mean node load (dereplicate_below 0.005: the step replicates slices of a percent of a
// node, and Weighted-Move must not drop them again), and headroom for four spreads of each
// node's unshared load, within 1.3 copies of every key. No fixed headroom: where the
// forecast is exact, a replica buys nothing.
func DefaultHeadroomConfig() HeadroomConfig {
	wm := DefaultWeightedMoveConfig()
	wm.DereplicateBelow = 0.005
	return HeadroomConfig{WeightedMove: wm, Headroom: 0, Sigmas: 4, MaxKeyCopies: 1.3, Churn: 0.02}
}

func (c *HeadroomConfig) params() []Param {
	return append(c.WeightedMove.params(),
		floatParam("headroom", "share of the mean node load every node should be able to shed to other replicas", &c.Headroom),
		floatParam("headroom_sigmas", "spreads of a node's unreplicated slices (summed) it should be able to shed too", &c.Sigmas),
		floatParam("max_key_copies", "add no replica for headroom past this many copies per key", &c.MaxKeyCopies),
		floatParam("headroom_churn", "share of keys a pass may copy for headroom, beyond max_churn", &c.Churn))
}

// Validate reports whether the constants are usable.
func (c HeadroomConfig) Validate() error {
	var errs []error
	if err := c.WeightedMove.Validate(); err != nil {
		errs = append(errs, err)
	}
	if !(c.Headroom >= 0 && c.Headroom <= MaxFactor) {
		errs = append(errs, fmt.Errorf("headroom=%v: want 0..%v", c.Headroom, MaxFactor))
	}
	if !(c.Sigmas >= 0 && c.Sigmas <= MaxFactor) {
		errs = append(errs, fmt.Errorf("headroom_sigmas=%v: want 0..%v", c.Sigmas, MaxFactor))
	}
	if !(c.MaxKeyCopies >= 1 && c.MaxKeyCopies <= MaxReplicasLimit) {
		errs = append(errs, fmt.Errorf("max_key_copies=%v: want 1..%d", c.MaxKeyCopies, MaxReplicasLimit))
	}
	if !(c.Churn >= 0 && c.Churn <= 1) {
		errs = append(errs, fmt.Errorf("headroom_churn=%v: want 0..1", c.Churn))
	}
	return errors.Join(errs...)
}

// Headroom is Weighted-Move after a step that replicates slices for headroom (see
// HeadroomConfig).
type Headroom struct {
	cfg HeadroomConfig
	wm  *WeightedMove
}

// NewHeadroom returns Weighted-Move with headroom with the given constants.
func NewHeadroom(cfg HeadroomConfig) (*Headroom, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	wm, err := NewWeightedMove(cfg.WeightedMove)
	if err != nil {
		return nil, err
	}
	return &Headroom{cfg: cfg, wm: wm}, nil
}

// HeadroomName is the registry name of Weighted-Move with headroom.
const HeadroomName = "weighted-move-headroom"

// Name implements Algorithm.
func (*Headroom) Name() string { return HeadroomName }

// Config returns the constants in use.
func (h *Headroom) Config() HeadroomConfig { return h.cfg }

// Initial implements Algorithm: Weighted-Move's.
func (h *Headroom) Initial(in Input) (*assignment.Assignment, error) { return h.wm.Initial(in) }

// Rebalance implements Algorithm: the headroom step's replicas, then Weighted-Move's pass on
// the map they make. The step adds replicas without moving any slice boundary, so the
// input's per-slice loads, spreads, keys and hot keys still describe that map; its additions
// enter the history, so that Weighted-Move does not drop them within hold_passes.
func (h *Headroom) Rebalance(in Input) (Result, error) {
	if err := in.validate(true); err != nil {
		return Result{}, err
	}
	before := imbalance(in.Assignment, in.sliceLoads(), in.Nodes)
	plan := newHeadroomPlan(h.cfg, &in)
	plan.add()
	if len(plan.ops) > 0 {
		next, err := in.Assignment.Apply(plan.ops)
		if err != nil {
			return Result{}, fmt.Errorf("balance: headroom: %w", err)
		}
		in.Assignment = next
		in.History = append(slices.Clip(in.History), plan.moves...)
	}
	res, err := h.wm.Rebalance(in)
	if err != nil {
		return Result{}, err
	}
	res.Ops = append(plan.ops, res.Ops...)
	res.Explanation.Algorithm = h.Name()
	res.Explanation.ImbalanceBefore = before
	res.Explanation.ReplicasAdded += len(plan.ops)
	res.Explanation.Churn.Move += plan.copied / plan.total
	return res, nil
}

// headroomPlan is the state of one headroom step: the nodes' forecast loads (each slice's
// load split evenly over its live replicas, as the pass believes it) and what each still
// lacks in shareable load.
type headroomPlan struct {
	cfg    HeadroomConfig
	in     *Input
	load   []float64 // per slice
	keys   []float64 // per slice
	holder []int32   // per slice, its only replica's node index, or -1 if it has another (or none)
	raw    []float64 // per node, its forecast load
	short  []float64 // per node, the shareable load it lacks
	weight []float64 // per node
	zone   []string  // per node; nil without zones
	// left lists, per node, the ranges a move within hold_passes took off it: the step puts
	// no replica back there, which would undo the move (and Weighted-Move would undo it again).
	left   [][]keyspace.Range
	mean   float64 // the mean node load per capacity
	budget float64 // the keys the step may still copy
	total  float64 // the keys in all
	ops    []assignment.Op
	moves  []Move
	copied float64
}

// newHeadroomPlan measures the input map: every node's load, shareable load and noise.
func newHeadroomPlan(cfg HeadroomConfig, in *Input) *headroomPlan {
	keys, total, _ := in.keyCounts()
	n := in.Nodes.Len()
	p := &headroomPlan{cfg: cfg, in: in, load: in.sliceLoads(), keys: keys, total: total,
		holder: make([]int32, in.Assignment.Len()), raw: make([]float64, n), short: make([]float64, n),
		weight: make([]float64, n)}
	shared, noise := make([]float64, n), make([]float64, n)
	var copies, capacity float64
	var idx []int
	for i, s := range in.Assignment.All() {
		idx = in.Nodes.AppendIndices(idx[:0], s.Replicas)
		copies += keys[i] * float64(len(idx))
		p.holder[i] = -1
		if len(idx) == 1 && len(s.Replicas) == 1 {
			p.holder[i] = int32(idx[0])
		}
		for _, j := range idx {
			share := p.load[i] / float64(len(idx))
			p.raw[j] += share
			if len(idx) > 1 {
				shared[j] += share
			} else if in.Spread != nil {
				noise[j] += in.Spread[i]
			}
		}
	}
	for j, node := range in.Nodes.Nodes() {
		p.weight[j] = node.Weight()
		capacity += p.weight[j]
		p.mean += p.raw[j]
	}
	p.mean /= capacity
	for j := range p.short {
		p.short[j] = cfg.Headroom*p.mean*p.weight[j] + cfg.Sigmas*noise[j] - shared[j]
	}
	p.budget = min(cfg.Churn*total, cfg.MaxKeyCopies*total-copies)
	p.left = make([][]keyspace.Range, n)
	for _, m := range in.History {
		if j, ok := in.Nodes.Index(m.From); ok && withinHold(m, in.Pass, cfg.WeightedMove.HoldPasses) {
			p.left[j] = append(p.left[j], m.Range)
		}
	}
	if in.Zones != nil {
		p.zone = make([]string, n)
		for j, node := range in.Nodes.Nodes() {
			p.zone[j] = in.Zones[node.ID]
		}
	}
	return p
}

// add replicates, for each node from the one that lacks the most shareable load, its
// single-replica slices with the most load per key onto the least loaded nodes, until it
// lacks none or the budget is spent.
func (p *headroomPlan) add() {
	if p.mean <= 0 || p.budget <= 0 || p.cfg.WeightedMove.MaxReplicas == 1 || len(p.raw) < 2 {
		return
	}
	floor := headroomKeep * p.cfg.WeightedMove.DereplicateBelow * p.mean
	var cands []int
	for i, n := range p.holder {
		if n >= 0 && p.load[i] >= floor*p.weight[n] && !p.in.pinned(p.in.Assignment.Slice(i).Range) {
			cands = append(cands, i)
		}
	}
	density := func(i int) float64 { return p.load[i] / max(p.keys[i], 1e-12) }
	slices.SortFunc(cands, func(a, b int) int { return cmp.Or(cmp.Compare(density(b), density(a)), cmp.Compare(a, b)) })
	byNode := make([][]int, len(p.raw))
	for _, i := range cands {
		byNode[p.holder[i]] = append(byNode[p.holder[i]], i)
	}
	order := make([]int, len(p.raw))
	for j := range order {
		order[j] = j
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(p.short[b]/p.weight[b], p.short[a]/p.weight[a]), cmp.Compare(a, b))
	})
	for _, n := range order {
		for _, i := range byNode[n] {
			if p.short[n] <= 0 || p.budget <= 0 {
				break
			}
			if p.keys[i] <= p.budget {
				p.replicate(i, n)
			}
		}
	}
}

// replicate adds a replica of slice i, held by node n alone, on the least loaded node by
// capacity that did not lose it recently (in another zone than n's when one is live), and
// books what it shares and costs. A slice no node may take now waits for a later pass.
func (p *headroomPlan) replicate(i, n int) {
	s := p.in.Assignment.Slice(i)
	to := -1
	for pass := 0; pass < 2 && to < 0; pass++ {
		for j := range p.raw {
			if j == n || (pass == 0 && p.zone != nil && p.zone[j] == p.zone[n]) ||
				slices.ContainsFunc(p.left[j], s.Range.Overlaps) {
				continue
			}
			if to < 0 || p.raw[j]/p.weight[j] < p.raw[to]/p.weight[to] {
				to = j
			}
		}
	}
	if to < 0 {
		return
	}
	half := p.load[i] / 2
	p.raw[n] -= half
	p.raw[to] += half
	p.short[n] -= half
	p.short[to] -= half
	p.budget -= p.keys[i]
	p.copied += p.keys[i]
	ids := p.in.Nodes.Nodes()
	p.ops = append(p.ops, assignment.Assign{Slice: s.Range.Start, Replicas: []assignment.NodeID{ids[n].ID, ids[to].ID}})
	p.moves = append(p.moves, Move{Range: s.Range, To: ids[to].ID, Pass: p.in.Pass})
}
