package sim

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// Engine says what runs a simulation's passes.
type Engine string

const (
	// EngineCore steps the assigner's core on simulated time: nodes register and report
	// their load, the core folds the reports with its estimator and runs its pass. What it
	// shows is what the service does.
	EngineCore Engine = "core"
	// EngineAlgorithm calls the algorithm directly with each epoch's exact loads: the
	// algorithm alone, as if the assigner knew the load of the epoch to come.
	EngineAlgorithm Engine = "algorithm"
)

// Engines lists the engines, default first.
var Engines = []Engine{EngineCore, EngineAlgorithm}

// DefaultEpoch is the simulated time of an epoch: the assigner's default pass interval, so
// that the core runs one pass per epoch.
const DefaultEpoch = time.Second

// reportedHotKeys is how many of its heaviest keys a simulated node reports, as a client
// node does by default (client.NodeConfig.HotKeys).
const reportedHotKeys = 16

// simStart is the simulated time of epoch 0; any fixed time keeps runs deterministic.
var simStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// RunCore simulates the assigner's core running algorithm name with params on the scenario.
// Each epoch is opt.Epoch of simulated time: at its start, nodes that joined register and
// nodes that left deregister; at its end, every live node reports the load it served for
// each slice it holds and its heaviest keys, and the core runs its pass (a Tick), every
// write committed at once. The map measured is built from the quanta the core publishes. It
// stops early, returning ctx's error, if ctx ends.
func RunCore(ctx context.Context, name string, params map[string]string, sc Scenario, opt Options) (Result, error) {
	r, err := newCoreRunner(name, params, sc, opt)
	if err != nil {
		return Result{}, err
	}
	return drive(ctx, Result{Algorithm: name, Engine: EngineCore}, name+" on the core", opt, r.epoch, r.undo.hold)
}

// coreRunner drives an assigner core through a scenario. The world (nodes, keys, loads) and
// the scenario's events are the algorithm runner's; the map is the core's.
type coreRunner struct {
	runner
	core       *core.Core
	epochLen   time.Duration
	registered map[assignment.NodeID]float64 // nodes registered with the core, and capacity
	// view is the map as the published quanta build it, as a watcher of the assigner sees
	// it: the map nodes serve and the simulator measures.
	view *assignment.Assignment
	// seen is the last map the undone moves were counted up to.
	seen *assignment.Assignment
}

func newCoreRunner(name string, params map[string]string, sc Scenario, opt Options) (*coreRunner, error) {
	if err := check(sc, opt); err != nil {
		return nil, err
	}
	epoch := cmp.Or(opt.Epoch, DefaultEpoch)
	if epoch < minEpoch {
		return nil, fmt.Errorf("%w: epoch %s: the assigner ignores load reports over less than %s", ErrScenario, epoch, minEpoch)
	}
	alg, err := balance.New(name, params)
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	c, err := core.New(core.Config{
		// Nodes report every epoch, which renews their lease; a removal is a Deregister.
		NodeTTL:      max(10*time.Second, 3*epoch),
		PassInterval: epoch,
		Algorithm:    name,
		Params:       params,
		Estimator:    opt.Estimator,
		// Any finite load: a trace's unit is its own, and the cap guards a service's input.
		MaxLoadRate: load.MaxRate,
		ZoneLabel:   zoneLabel(opt),
		// Simulated nodes hold every key already: a move has nothing to load, and a handoff
		// would only wait for a heartbeat the simulator does not send.
		BreakBeforeMake: true,
	})
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	r := &coreRunner{runner: runner{sc: sc, opt: opt, w: newWorld(opt.Zones), undo: newUndoTracker(holdPasses(alg)), cycles: newCycleTracker()},
		core: c, epochLen: epoch,
		registered: map[assignment.NodeID]float64{}}
	if err := r.settle(simStart.Add(-epoch), core.LeadershipGained{Term: 1}); err != nil {
		return nil, fmt.Errorf("sim: starting the core: %w", err)
	}
	r.addInitialNodes()
	return r, nil
}

// minEpoch is the shortest report window the assigner's estimator counts (its MinWindow).
const minEpoch = 100 * time.Millisecond

// check refuses a scenario that cannot run.
func check(sc Scenario, opt Options) error {
	if (sc.Workload == nil) == (sc.Trace == nil) {
		return fmt.Errorf("%w: give a workload or a trace, not both or neither", ErrScenario)
	}
	if opt.Epochs < 1 {
		return fmt.Errorf("%w: %d epochs; want at least 1", ErrScenario, opt.Epochs)
	}
	if (sc.Trace == nil || !sc.Trace.NodesAtStart) && opt.Nodes < 1 {
		return fmt.Errorf("%w: %d nodes; want at least 1", ErrScenario, opt.Nodes)
	}
	return checkZones(opt)
}

// checkZones refuses zone removals the run cannot carry out.
func checkZones(opt Options) error {
	if opt.Zones < 0 {
		return fmt.Errorf("%w: %d zones; want 0 (none) or more", ErrScenario, opt.Zones)
	}
	for _, rz := range opt.RemoveZoneAt {
		switch {
		case opt.Zones == 0:
			return fmt.Errorf("%w: zone %q removed at epoch %d, but the run has no zones", ErrScenario, rz.Zone, rz.Epoch)
		case rz.Epoch < 0 || rz.Epoch >= opt.Epochs:
			return fmt.Errorf("%w: zone %q removed at epoch %d; want an epoch in 0..%d", ErrScenario, rz.Zone, rz.Epoch,
				opt.Epochs-1)
		case !slices.Contains(zoneNames(opt.Zones), rz.Zone):
			return fmt.Errorf("%w: zone %q removed; want one of %s..%s", ErrScenario, rz.Zone, ZoneName(0),
				ZoneName(opt.Zones-1))
		}
	}
	return nil
}

func zoneNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = ZoneName(i)
	}
	return out
}

// zoneLabel is the core's zone label: ZoneLabel when the run has zones.
func zoneLabel(opt Options) string {
	if opt.Zones > 0 {
		return ZoneLabel
	}
	return ""
}

// at returns the simulated time at which epoch e starts.
func (r *coreRunner) at(e int) time.Time { return simStart.Add(time.Duration(e) * r.epochLen) }

// epoch runs epoch e: the scenario's events, the measure of the map in force against the
// core's view of it, the nodes' reports and the pass.
func (r *coreRunner) epoch(e int, th *thrashing) (Epoch, error) {
	nodes, keys, err := r.begin(e)
	if err != nil {
		return Epoch{}, err
	}
	orphans, orphanLoad := r.orphans(nodes)
	if err := r.syncNodes(r.at(e)); err != nil {
		return Epoch{}, err
	}
	if e == 0 { // the first map: the core makes it at its first pass, with nothing measured
		if err := r.settle(r.at(0), core.Tick{}); err != nil {
			return Epoch{}, err
		}
	}
	a := r.view
	if a == nil {
		return Epoch{}, fmt.Errorf("%w: the core published no map", ErrScenario)
	}
	r.a = a
	// Clean-up after the epoch's departures changes the map before it is measured.
	undone, pingPongs := r.undo.observe(e, r.seen, a, nodes, keys)
	cycles := r.cycles.observe(e, r.seen, a)
	loads, top := r.served(true)
	sp := splitLoads(a, loads, nodes, r.opt.Router)
	actual := sp.perCapacity()
	th.add(nodes, actual)
	ep := Epoch{
		Epoch:             e,
		Imbalance:         load.Imbalance(actual),
		ReportedImbalance: r.core.Status().Imbalance,
		ForecastError:     forecastError(r.forecast(nodes), actual),
		Slices:            a.Len(),
		Nodes:             nodes.Len(),
		Orphaned:          orphans,
		OrphanedLoad:      orphanLoad,
		KeyCopies:         keyCopies(a, keys, nodes),
	}
	end := r.at(e + 1)
	for _, rep := range reports(a, nodes, sp, top, r.epochLen) {
		if err := r.settle(end, core.ReportLoad{Report: rep}); err != nil {
			return Epoch{}, err
		}
	}
	if err := r.settle(end, core.Tick{}); err != nil {
		return Epoch{}, err
	}
	ep.Churn = churn(a, r.view, keys, nodes)
	u, p := r.undo.observe(e, a, r.view, nodes, keys)
	ep.UndoneMoves, ep.PingPongs = undone+u, pingPongs+p
	ep.SplitMergeCycles = cycles + r.cycles.observe(e, a, r.view)
	r.seen = r.view
	return ep, nil
}

// orphans measures the map in force before the core hears of the epoch's removals, as nodes
// served it when they left: the shares of the key space and of the epoch's load it leaves
// with no live replica. Before the first map, none.
func (r *coreRunner) orphans(nodes *assignment.NodeSet) (space, load float64) {
	if r.view == nil {
		return 0, 0
	}
	r.a = r.view
	loads, _ := r.served(false)
	return orphaned(r.view, nodes, loads)
}

// settle steps ev at now with every write committed at once, applies the quanta published
// to the view, and returns the error the core replied or the pass that failed.
func (r *coreRunner) settle(now time.Time, ev core.Event) error {
	for _, out := range r.core.Settle(now, ev) {
		if out.Reply != nil && out.Reply.Err != nil {
			return fmt.Errorf("sim: the core refused %T: %w", ev, out.Reply.Err)
		}
		if out.PassFailed {
			return fmt.Errorf("sim: the core's pass failed: %s", r.core.Explain().Error)
		}
		for _, p := range out.Publish {
			if err := r.applyQuantum(p.Quantum); err != nil {
				return err
			}
		}
	}
	return nil
}

// applyQuantum applies a published quantum to the view, checking that it leads where the core
// says: the map nodes would serve is the core's.
func (r *coreRunner) applyQuantum(q quantum.Quantum) error {
	switch {
	case q.Reinitializing():
		r.view = q.Snapshot
	case q.ClockOnly():
		return nil
	case r.view == nil:
		return fmt.Errorf("sim: quantum %v changes a map before any was published", q.Position)
	default:
		next, err := r.view.Apply(q.Ops)
		if err != nil {
			return fmt.Errorf("sim: quantum %v does not apply: %w", q.Position, err)
		}
		r.view = next
	}
	if r.view.Generation() != q.Generation {
		return fmt.Errorf("sim: quantum %v leads to generation %d, the view is at %d", q.Position, q.Generation,
			r.view.Generation())
	}
	return nil
}

// syncNodes registers the world's new nodes with the core and deregisters those that left,
// as nodes that start and shut down cleanly do.
func (r *coreRunner) syncNodes(now time.Time) error {
	live := make(map[assignment.NodeID]bool, len(r.w.live))
	for _, id := range r.w.live {
		live[id] = true
		if c, ok := r.registered[id]; ok && c == r.w.cap[id] {
			continue
		}
		n := core.Node{Node: assignment.Node{ID: id, Capacity: r.w.cap[id]}, Address: "sim-" + string(id),
			Labels: r.w.labels[id]}
		if err := r.settle(now, core.Register{Node: n}); err != nil {
			return err
		}
		r.registered[id] = r.w.cap[id]
	}
	for _, id := range slices.Sorted(maps.Keys(r.registered)) {
		if live[id] {
			continue
		}
		if err := r.settle(now, core.Deregister{Node: id}); err != nil {
			return err
		}
		delete(r.registered, id)
	}
	return nil
}

// forecast returns the core's estimate of each node's load over its capacity for the map in
// force, in the order of nodes: what it expects the epoch to bring, from the reports so far.
func (r *coreRunner) forecast(nodes *assignment.NodeSet) []float64 {
	est := make(map[assignment.NodeID]float64, nodes.Len())
	for _, n := range r.core.Nodes() {
		est[n.ID] = n.Load
	}
	out := make([]float64, nodes.Len())
	for i, n := range nodes.Nodes() {
		out[i] = est[n.ID]
	}
	return out
}

// served returns each slice of r.a's load in the epoch and, if withTop, per slice its
// heaviest keys with the whole key's load, heaviest first.
func (r *runner) served(withTop bool) (loads []float64, top [][]load.HotKey) {
	n := r.a.Len()
	loads = make([]float64, n)
	if withTop {
		top = make([][]load.HotKey, n)
	}
	r.eachKey(func(j int, h uint64, l float64) {
		loads[j] += l
		if withTop && l > 0 {
			top[j] = keepTopN(top[j], load.HotKey{Hash: h, Load: l}, reportedHotKeys)
		}
	})
	return loads, top
}

// reports builds every live node's report for an epoch, as a client node does: one sample per
// slice it holds with the load it served (its share of the slice's load in sp, the router's
// split), and its heaviest keys with the load it served for each, the same share of each key
// of the slice since the router picks a replica for the slice. The heavy hitters are exact
// where a node's sketch may understate them.
func reports(a *assignment.Assignment, nodes *assignment.NodeSet, sp *split, top [][]load.HotKey,
	window time.Duration) []load.Report {
	out := make([]load.Report, nodes.Len())
	for i, n := range nodes.Nodes() {
		out[i] = load.Report{Node: n.ID, Window: window}
	}
	for s, sl := range a.All() {
		holders, served := sp.shares(s)
		for j, i := range holders {
			share, l := sp.fraction(s, j), served[j]
			if sp.even { // the product, as before routers were modelled: the same bits
				l = sp.load[s] * share
			}
			out[i].Samples = append(out[i].Samples, load.Sample{Range: sl.Range, Load: l})
			for _, k := range top[s] {
				out[i].HotKeys = keepTopN(out[i].HotKeys, load.HotKey{Hash: k.Hash, Load: k.Load * share}, reportedHotKeys)
			}
		}
	}
	return out
}

// keepTopN adds k to the heaviest-first list top, keeping at most n entries; of keys with
// equal load, the one added first stays.
func keepTopN(top []load.HotKey, k load.HotKey, n int) []load.HotKey {
	if len(top) == n && k.Load <= top[n-1].Load {
		return top
	}
	i, _ := slices.BinarySearchFunc(top, k.Load, func(x load.HotKey, l float64) int { return cmp.Compare(l, x.Load) })
	top = slices.Insert(top, i, k)
	return top[:min(len(top), n)]
}
