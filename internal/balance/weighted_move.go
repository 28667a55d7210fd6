package balance

import (
	"errors"
	"fmt"
	"math"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// WeightedMoveConfig holds the constants of Weighted-Move. The defaults are Slicer's.
type WeightedMoveConfig struct {
	// InitialSlicesPerNode is how many equal slices per node the first assignment has.
	InitialSlicesPerNode int
	// MinSlicesPerNode: a merge may only take a slice from a node that holds more than this.
	MinSlicesPerNode int
	// MaxSlicesPerNode: a slice is only split while every node holding it has fewer than this.
	MaxSlicesPerNode int
	// MaxChurn is the share of keys one pass may copy to new nodes, merges included and the
	// clean-up of departed nodes (which is never optional) excluded.
	MaxChurn float64
	// MergeChurn is the share of keys merges may copy, out of MaxChurn.
	MergeChurn float64
	// SplitAbove: a slice whose load exceeds this multiple of the mean slice load is split.
	SplitAbove float64
	// MergeBelow: adjacent slices merge while their joint load stays under this multiple of
	// the mean slice load. It must be below SplitAbove, or merges and splits would undo
	// each other.
	MergeBelow float64
	// DeadBand: no moves are made while max/mean node load is within 1+DeadBand, so that
	// noise in the reports does not cause churn.
	DeadBand float64
	// ReplicateAbove: a slice may get another replica when the load each replica serves
	// exceeds this multiple of the mean node load, that is when it fills much of a node, and
	// moving it whole would only make another node the hottest.
	ReplicateAbove float64
	// DereplicateBelow: a replica is dropped while the load each remaining replica would
	// serve stays below this multiple of the mean node load. Below ReplicateAbove, for
	// hysteresis.
	DereplicateBelow float64
	// MaxReplicas caps a slice's replica set; 0 means the number of live nodes.
	MaxReplicas int
	// HoldPasses: a move is not undone within this many passes: no part of a slice goes back
	// to a node that lost it, straight back, by way of other nodes or as a replica, and a
	// replica added is not dropped.
	HoldPasses int
	// HotKeyShare: a split cuts a key into a slice of its own when that key carries at least
	// this share of its slice's load, since only then can replication spread it.
	HotKeyShare float64
	// SevereImbalance: when max/mean node load (by capacity, after clean-up) exceeds this, a
	// pass may copy up to EmergencyChurn of the keys instead of MaxChurn: a map that far off
	// (a new hot key on one node, a node that joined empty) costs more in overload than the
	// extra copying does.
	SevereImbalance float64
	// NoiseMargin is how many standard deviations of a slice's load (Input.Spread) the
	// replica thresholds add to it: a slice gets replicas while its load plus NoiseMargin
	// spreads, per replica, exceeds ReplicateAbove times the mean node load, and drops them
	// only while that stays under DereplicateBelow; a hot key is cut out on the same sum. A
	// hot single-key slice whose load jumps about from one window to the next thus gets the
	// replicas that its peaks, not its mean, need. 0 (the default) ignores Spread.
	NoiseMargin float64
	// NoiseGate is how many standard errors of the loads (Input.Uncertainty) a difference
	// must exceed before a pass spends churn on it: the move step starts only while the
	// hottest node's excess over the mean exceeds NoiseGate standard errors of its load;
	// adjacent slices merge only while their joint load stays NoiseGate + sqrt(2 ln n)
	// standard errors under the merge limit, and a slice splits only while it stays that
	// many over the split limit, n the slices (the largest of n noises reaches about
	// sqrt(2 ln n) by itself). Counting noise and a forecast's error thus buy no churn;
	// exact loads (no uncertainty) are balanced as before. 0 turns the gate off.
	NoiseGate float64
	// EmergencyChurn is the budget of a pass above SevereImbalance, merges included and
	// clean-up excluded, like MaxChurn; below MaxChurn it is MaxChurn.
	EmergencyChurn float64
}

// DefaultWeightedMoveConfig returns Slicer's constants.
func DefaultWeightedMoveConfig() WeightedMoveConfig {
	return WeightedMoveConfig{
		InitialSlicesPerNode: 100,
		MinSlicesPerNode:     50,
		MaxSlicesPerNode:     150,
		MaxChurn:             0.09,
		MergeChurn:           0.01,
		SplitAbove:           2,
		MergeBelow:           1,
		DeadBand:             0.02,
		ReplicateAbove:       0.5,
		DereplicateBelow:     0.25,
		HoldPasses:           4,
		HotKeyShare:          0.5,
		SevereImbalance:      1.3,
		EmergencyChurn:       0.3,
		NoiseGate:            2,
	}
}

func (c *WeightedMoveConfig) params() []Param {
	return []Param{
		intParam("initial_slices_per_node", "equal slices per node in the first assignment", &c.InitialSlicesPerNode),
		intParam("min_slices_per_node", "merges only take slices from nodes holding more than this", &c.MinSlicesPerNode),
		intParam("max_slices_per_node", "splits only while the slice's nodes hold fewer than this", &c.MaxSlicesPerNode),
		floatParam("max_churn", "share of keys a pass may copy, merges included", &c.MaxChurn),
		floatParam("merge_churn", "share of keys merges may copy", &c.MergeChurn),
		floatParam("split_above", "split slices hotter than this multiple of the mean slice load", &c.SplitAbove),
		floatParam("merge_below", "merge neighbours while their joint load is under this multiple of the mean slice load", &c.MergeBelow),
		floatParam("dead_band", "no moves while max/mean node load <= 1 + dead_band", &c.DeadBand),
		floatParam("replicate_above", "add a replica when per-replica load exceeds this multiple of the mean node load", &c.ReplicateAbove),
		floatParam("dereplicate_below", "drop a replica while per-replica load stays under this multiple of the mean node load", &c.DereplicateBelow),
		intParam("max_replicas", "most replicas per slice (0: number of nodes)", &c.MaxReplicas),
		intParam("hold_passes", "passes during which a move is not undone", &c.HoldPasses),
		floatParam("hot_key_share", "cut a key into its own slice when it carries this share of its slice's load", &c.HotKeyShare),
		floatParam("severe_imbalance", "above this max/mean node load a pass may spend emergency_churn", &c.SevereImbalance),
		floatParam("emergency_churn", "share of keys a pass may copy above severe_imbalance, merges included", &c.EmergencyChurn),
		floatParam("noise_margin", "replica thresholds count a slice's load plus this many standard deviations of it", &c.NoiseMargin),
		floatParam("noise_gate", "no move, merge or split for a difference within this many standard errors of the loads (plus sqrt(2 ln N)); 0: off", &c.NoiseGate),
	}
}

// Upper bounds of Weighted-Move's constants.
const (
	MaxSlicesPerNodeLimit = 100000
	MaxFactor             = 1000 // split_above, replicate_above: multiples of a mean
	MaxDeadBand           = 10   // max/mean node load <= 11
	MaxReplicasLimit      = 1024
	MaxHoldPasses         = 1 << 20
	MaxNoiseMargin        = 10 // standard deviations
)

// Validate rejects constants that cannot work together.
func (c WeightedMoveConfig) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	// Upper bounds keep every constant where it means something: a dead band of 1e308 is a
	// freeze in disguise, and slice counts beyond MaxSlicesPerNodeLimit per node would make
	// maps no assigner can hold.
	check(c.MinSlicesPerNode >= 1, "min_slices_per_node=%d: want >= 1", c.MinSlicesPerNode)
	check(c.MaxSlicesPerNode <= MaxSlicesPerNodeLimit, "max_slices_per_node=%d: want at most %d", c.MaxSlicesPerNode, MaxSlicesPerNodeLimit)
	check(c.SplitAbove <= MaxFactor, "split_above=%v: want at most %v", c.SplitAbove, MaxFactor)
	check(c.ReplicateAbove <= MaxFactor, "replicate_above=%v: want at most %v", c.ReplicateAbove, MaxFactor)
	check(c.DeadBand <= MaxDeadBand, "dead_band=%v: want 0..%v (freeze balancing to stop moves)", c.DeadBand, MaxDeadBand)
	check(c.MaxReplicas <= MaxReplicasLimit, "max_replicas=%d: want 0..%d", c.MaxReplicas, MaxReplicasLimit)
	check(c.HoldPasses <= MaxHoldPasses, "hold_passes=%d: want 0..%d", c.HoldPasses, MaxHoldPasses)
	check(c.MinSlicesPerNode <= c.InitialSlicesPerNode && c.InitialSlicesPerNode <= c.MaxSlicesPerNode,
		"want min_slices_per_node <= initial_slices_per_node <= max_slices_per_node, have %d, %d, %d",
		c.MinSlicesPerNode, c.InitialSlicesPerNode, c.MaxSlicesPerNode)
	check(c.MaxChurn >= 0 && c.MaxChurn <= 1, "max_churn=%v: want 0..1", c.MaxChurn)
	check(c.MergeChurn >= 0 && c.MergeChurn <= c.MaxChurn, "merge_churn=%v: want 0..max_churn (%v)", c.MergeChurn, c.MaxChurn)
	check(c.MergeBelow > 0 && c.MergeBelow < c.SplitAbove, "want 0 < merge_below (%v) < split_above (%v)", c.MergeBelow, c.SplitAbove)
	check(c.DeadBand >= 0, "dead_band=%v: want >= 0", c.DeadBand)
	check(c.DereplicateBelow > 0 && c.DereplicateBelow < c.ReplicateAbove,
		"want 0 < dereplicate_below (%v) < replicate_above (%v)", c.DereplicateBelow, c.ReplicateAbove)
	check(c.MaxReplicas >= 0, "max_replicas=%d: want >= 0", c.MaxReplicas)
	check(c.HoldPasses >= 0, "hold_passes=%d: want >= 0", c.HoldPasses)
	check(c.HotKeyShare > 0 && c.HotKeyShare <= 1, "hot_key_share=%v: want 0 < x <= 1", c.HotKeyShare)
	check(c.SevereImbalance >= 1 && c.SevereImbalance <= MaxFactor, "severe_imbalance=%v: want 1..%v", c.SevereImbalance, MaxFactor)
	check(c.EmergencyChurn >= 0 && c.EmergencyChurn <= 1, "emergency_churn=%v: want 0..1", c.EmergencyChurn)
	check(c.NoiseMargin >= 0 && c.NoiseMargin <= MaxNoiseMargin, "noise_margin=%v: want 0..%v", c.NoiseMargin, MaxNoiseMargin)
	check(c.NoiseGate >= 0 && c.NoiseGate <= MaxNoiseMargin, "noise_gate=%v: want 0..%v", c.NoiseGate, MaxNoiseMargin)
	for _, f := range []float64{c.MaxChurn, c.MergeChurn, c.SplitAbove, c.MergeBelow, c.DeadBand, c.ReplicateAbove, c.DereplicateBelow, c.HotKeyShare, c.SevereImbalance, c.EmergencyChurn, c.NoiseMargin, c.NoiseGate} {
		check(!math.IsNaN(f) && !math.IsInf(f, 0), "%v is not a finite number", f)
	}
	return errors.Join(errs...)
}

// WeightedMove is Slicer's balancing algorithm. Each pass runs five steps:
//
//  1. clean-up: slices of departed nodes go to the least loaded live nodes; what it copies is
//     not charged to the budget of the steps after it, which balance as if it were free;
//  2. merge: adjacent cold slices merge, within a small churn budget;
//  3. hot keys: a key that alone needs replicas is cut into a slice of its own now, so that
//     the move step can replicate it in this same pass (wm_split.go);
//  4. move: the pass's budget is MaxChurn, or EmergencyChurn when the map is severely
//     imbalanced; replicas that cooled are dropped first (it costs nothing), and slices whose
//     replicas are short of zones are spread (wm_zones.go); then, since only
//     the hottest node's slices can lower the imbalance, moves off it are taken in order of
//     gain per key copied until the churn budget is spent: a slice to the coldest node, a
//     replica dropped, or replicas added (several at once when one alone cannot help); when
//     no single move helps, a compound move first sheds a cool node's small slices to make
//     room (wm_move.go);
//  5. split: hot slices split in two, or cut out a key that dominates them, so that the next
//     pass has finer pieces to move; split halves do not move in the pass that made them.
//
// The steps live in wm_pass.go (state, clean-up, merge), wm_move.go and wm_split.go.
type WeightedMove struct{ cfg WeightedMoveConfig }

// NewWeightedMove returns Weighted-Move with the given constants.
func NewWeightedMove(cfg WeightedMoveConfig) (*WeightedMove, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &WeightedMove{cfg: cfg}, nil
}

// Name implements Algorithm.
func (*WeightedMove) Name() string { return "weighted-move" }

// Config returns the constants in use.
func (w *WeightedMove) Config() WeightedMoveConfig { return w.cfg }

// Initial implements Algorithm: equal slices, dealt to the nodes in turn, so that every node
// holds slices from all over the space. Each has one replica, so zones constrain nothing yet.
func (w *WeightedMove) Initial(in Input) (*assignment.Assignment, error) {
	if err := in.validate(false); err != nil {
		return nil, err
	}
	ids := in.Nodes.IDs()
	return assignment.Uniform(len(ids)*w.cfg.InitialSlicesPerNode, func(i int) []assignment.NodeID {
		return []assignment.NodeID{ids[i%len(ids)]}
	})
}

// Rebalance implements Algorithm.
func (w *WeightedMove) Rebalance(in Input) (Result, error) {
	if err := in.validate(true); err != nil {
		return Result{}, err
	}
	p := newWMPass(w.cfg, in)
	p.cleanup()
	p.merge()
	p.cutHotKeys()
	p.setBudget()
	p.move()
	p.split()
	return p.result(), nil
}
