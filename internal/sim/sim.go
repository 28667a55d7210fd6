// Package sim runs balancing algorithms against workloads offline, one pass per epoch, and
// reports what a system would have experienced: the imbalance between nodes and the churn of
// keys copied to new nodes. It is how algorithms are compared and tuned on the same work.
//
// Two engines run the passes. RunCore (EngineCore) steps the assigner's own core on simulated
// time: nodes register, report the load they served each epoch, and the core folds the
// reports with its estimator and runs its pass, as the service does. Run (EngineAlgorithm)
// calls the algorithm alone with each epoch's exact loads: the best the algorithm can do.
//
// Each epoch: the epoch's events apply (loads change, keys and nodes come and go); the
// imbalance of the assignment in force is measured under the epoch's loads, a key's load split
// over its live replicas as Options.Router says (evenly, or as a router that prefers the less
// loaded replica would), beside what the balancer believed (its forecast of each
// node's load, and the imbalance it reported); then one pass runs, and the pass's churn is the
// number of key placements it adds (a key copied to a node that did not hold it) over the
// number of keys.
package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
)

// ErrScenario is wrapped by errors about a scenario that cannot run.
var ErrScenario = errors.New("sim: bad scenario")

// Scenario is the work to simulate: a built-in workload or a trace (exactly one of them).
type Scenario struct {
	Workload Workload
	Trace    *Trace
}

// Removal takes a node away at an epoch; with no Node, the most recently added live node.
type Removal struct {
	Epoch int
	Node  assignment.NodeID
}

// ZoneRemoval takes every live node of a zone away at an epoch.
type ZoneRemoval struct {
	Epoch int
	Zone  string
}

// ZoneLabel is the node label that carries a node's zone when Options.Zones is set.
const ZoneLabel = "zone"

// ZoneName returns the name of zone i, as Options.Zones assigns them: z0, z1, ...
func ZoneName(i int) string { return "z" + strconv.Itoa(i) }

// Options shape a run.
type Options struct {
	// Nodes is how many nodes, n0..n(N-1), exist from the start (unless a trace adds nodes
	// at epoch 0).
	Nodes int
	// Epochs is how many epochs to run.
	Epochs int
	// AddNodeAt lists epochs at which a new node (the next free nI) joins.
	AddNodeAt []int
	// RemoveNodeAt lists nodes that leave.
	RemoveNodeAt []Removal
	// Zones, if above 0, spreads the nodes the run names (nI) over zones z0..z(Zones-1), nI
	// in zone z(I%Zones), and balances with zones: the core runs with ZoneLabel, the
	// algorithm alone is given each node's zone.
	Zones int
	// RemoveZoneAt lists zones whose live nodes all leave at once; it needs Zones.
	RemoveZoneAt []ZoneRemoval
	// Epoch is the simulated time of an epoch for the core (RunCore): the window of the
	// nodes' load reports and the core's pass interval. Default DefaultEpoch.
	Epoch time.Duration
	// Estimator configures the core's load estimator (RunCore): its forecast and half-lives.
	// The zero value is the assigner's default.
	Estimator load.EstimatorConfig
	// Router is how a slice's load is split over its live replicas when the map is measured
	// and, on the core, in what each node reports it served. The zero value is RouterEven.
	Router Router
	// Progress, if set, is called after each epoch.
	Progress func(done, total int)
}

// Epoch is what one epoch measured.
//
// Imbalance is experienced: the map in force measured under the epoch's actual loads.
// ReportedImbalance is what the balancer believed of that map when the epoch began: the
// core's Status imbalance (its estimates), or for the algorithm alone the map under the
// previous epoch's loads. ForecastError is the mean absolute percentage error (as a fraction)
// of the balancer's per-node load forecast for the epoch against the epoch's actual node
// loads (see forecastError); at epoch 0 nothing was measured yet, so the forecast is 0 and the
// error 1.
type Epoch struct {
	Epoch             int     `json:"epoch"`
	Imbalance         float64 `json:"imbalance"`
	ReportedImbalance float64 `json:"reported_imbalance"`
	ForecastError     float64 `json:"forecast_error"`
	Churn             float64 `json:"churn"`
	Slices            int     `json:"slices"`
	Nodes             int     `json:"nodes"`
	// Orphaned is the share of the key space whose every replica, in the map in force, left
	// at the start of the epoch: keys no node serves until the epoch's pass places them.
	// OrphanedLoad is their share of the epoch's load, which replicating hot slices over
	// zones keeps low where the key space share barely moves.
	Orphaned     float64 `json:"orphaned"`
	OrphanedLoad float64 `json:"orphaned_load"`
	// UndoneMoves counts the slices the epoch's pass moved back onto a node that lost them
	// fewer than Summary.HoldPasses passes before; PingPongs the single-key slices it moved
	// back to where they were moved from, at any time before. See undoTracker.
	UndoneMoves int `json:"undone_moves"`
	PingPongs   int `json:"ping_pongs"`
	// SplitMergeCycles counts the boundaries between slices the epoch's pass removed (a
	// merge) fewer than cycleWindow passes after a pass made them (a split).
	SplitMergeCycles int `json:"split_merge_cycles"`
	// KeyCopies is the memory the map in force costs: the copies of keys its live replicas
	// hold, over the number of keys (1.0 when every key has one replica).
	KeyCopies float64 `json:"key_copies"`
}

// Summary condenses a run. MeanForecastError leaves out epoch 0, which no forecast could
// know. Thrashing is the oscillation score (see thrashing.score). UndoneMoves and PingPongs
// total the epochs'; HoldPasses is the window UndoneMoves counts within: the algorithm's
// hold_passes, or Weighted-Move's default for an algorithm without one.
type Summary struct {
	FinalImbalance        float64 `json:"final_imbalance"`
	MeanImbalance         float64 `json:"mean_imbalance"`
	MaxImbalance          float64 `json:"max_imbalance"`
	MeanReportedImbalance float64 `json:"mean_reported_imbalance"`
	MeanForecastError     float64 `json:"mean_forecast_error"`
	Thrashing             float64 `json:"thrashing"`
	MaxChurn              float64 `json:"max_churn"`
	TotalChurn            float64 `json:"total_churn"`
	MaxOrphaned           float64 `json:"max_orphaned"`
	MaxOrphanedLoad       float64 `json:"max_orphaned_load"`
	UndoneMoves           int     `json:"undone_moves"`
	PingPongs             int     `json:"ping_pongs"`
	SplitMergeCycles      int     `json:"split_merge_cycles"`
	HoldPasses            int     `json:"hold_passes"`
	MeanKeyCopies         float64 `json:"mean_key_copies"`
	MaxKeyCopies          float64 `json:"max_key_copies"`
}

// Result is one algorithm's run, on one engine.
type Result struct {
	Algorithm string  `json:"algorithm"`
	Engine    Engine  `json:"engine"`
	Epochs    []Epoch `json:"epochs"`
	Summary   Summary `json:"summary"`
}

// Label names the run in tables and plots: the algorithm, and the engine unless it is the
// core.
func (r Result) Label() string {
	if r.Engine == "" || r.Engine == EngineCore {
		return r.Algorithm
	}
	return r.Algorithm + " (" + string(r.Engine) + ")"
}

// Run simulates alg alone on the scenario (EngineAlgorithm): each epoch's pass sees the
// epoch's exact loads. It stops early, returning ctx's error, if ctx ends.
func Run(ctx context.Context, alg balance.Algorithm, sc Scenario, opt Options) (Result, error) {
	if err := check(sc, opt); err != nil {
		return Result{}, err
	}
	r := &runner{alg: alg, sc: sc, opt: opt, w: newWorld(opt.Zones), undo: newUndoTracker(holdPasses(alg)), cycles: newCycleTracker()}
	r.addInitialNodes()
	return drive(ctx, Result{Algorithm: alg.Name(), Engine: EngineAlgorithm}, alg.Name(), opt, r.epoch, r.undo.hold)
}

// addInitialNodes adds the nodes a run starts with, unless its trace adds them at epoch 0.
func (r *runner) addInitialNodes() {
	if r.sc.Trace == nil || !r.sc.Trace.NodesAtStart {
		for range r.opt.Nodes {
			r.w.addNode("", 1)
		}
	}
}

// drive runs the epochs of a run through epoch, one engine's, into res; what names the run
// in errors. It stops early, returning ctx's error, if ctx ends.
// hold is the undone moves' window, for the summary.
func drive(ctx context.Context, res Result, what string, opt Options, epoch func(int, *thrashing) (Epoch, error),
	hold int) (Result, error) {
	th := newThrashing()
	for e := range opt.Epochs {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		ep, err := epoch(e, th)
		if err != nil {
			return Result{}, fmt.Errorf("%s, epoch %d: %w", what, e, err)
		}
		res.Epochs = append(res.Epochs, ep)
		if opt.Progress != nil {
			opt.Progress(e+1, opt.Epochs)
		}
	}
	res.Summary = summarize(res.Epochs)
	res.Summary.Thrashing = th.score()
	res.Summary.HoldPasses = hold
	return res, nil
}

func summarize(es []Epoch) Summary {
	var s Summary
	for i, e := range es {
		s.MeanImbalance += e.Imbalance / float64(len(es))
		s.MaxImbalance = max(s.MaxImbalance, e.Imbalance)
		s.MeanReportedImbalance += e.ReportedImbalance / float64(len(es))
		if i > 0 {
			s.MeanForecastError += e.ForecastError / float64(len(es)-1)
		}
		s.MaxChurn = max(s.MaxChurn, e.Churn)
		s.TotalChurn += e.Churn
		s.MaxOrphaned = max(s.MaxOrphaned, e.Orphaned)
		s.MaxOrphanedLoad = max(s.MaxOrphanedLoad, e.OrphanedLoad)
		s.UndoneMoves += e.UndoneMoves
		s.PingPongs += e.PingPongs
		s.SplitMergeCycles += e.SplitMergeCycles
		s.MeanKeyCopies += e.KeyCopies / float64(len(es))
		s.MaxKeyCopies = max(s.MaxKeyCopies, e.KeyCopies)
	}
	s.FinalImbalance = es[len(es)-1].Imbalance
	return s
}

type runner struct {
	alg     balance.Algorithm
	sc      Scenario
	opt     Options
	w       *world
	a       *assignment.Assignment
	history []balance.Move
	undo    *undoTracker
	cycles  *cycleTracker
	next    int // the next trace event
	// forecast is each node's load over its capacity that the last pass expected for the
	// map it made: that map under the loads the pass saw.
	forecast map[assignment.NodeID]float64
}

// begin applies epoch e's events and returns the live nodes and the sorted key hashes the
// epoch is measured with.
func (r *runner) begin(e int) (*assignment.NodeSet, []uint64, error) {
	if err := r.apply(e); err != nil {
		return nil, nil, err
	}
	nodes, err := r.w.nodeSet()
	if err != nil {
		return nil, nil, err
	}
	return nodes, r.w.keys.sortedHashes(), nil
}

func (r *runner) epoch(e int, th *thrashing) (Epoch, error) {
	nodes, keys, err := r.begin(e)
	if err != nil {
		return Epoch{}, err
	}
	if r.a == nil {
		if r.a, err = r.alg.Initial(balance.Input{Nodes: nodes, KeyHashes: keys}); err != nil {
			return Epoch{}, fmt.Errorf("initial assignment: %w", err)
		}
	}
	loads, counts, hot := r.measure(nodes.Len())
	orphans, orphanLoad := orphaned(r.a, nodes, loads)
	actual := splitLoads(r.a, loads, nodes, r.opt.Router).perCapacity()
	th.add(nodes, actual)
	forecast := make([]float64, nodes.Len())
	for i, n := range nodes.Nodes() {
		forecast[i] = r.forecast[n.ID]
	}
	ep := Epoch{
		Epoch:             e,
		Imbalance:         load.Imbalance(actual),
		ReportedImbalance: load.Imbalance(forecast),
		ForecastError:     forecastError(forecast, actual),
		Slices:            r.a.Len(),
		Nodes:             nodes.Len(),
		Orphaned:          orphans,
		OrphanedLoad:      orphanLoad,
		KeyCopies:         keyCopies(r.a, keys, nodes),
	}
	res, err := r.alg.Rebalance(balance.Input{
		Assignment: r.a, Nodes: nodes, Load: loads, Keys: counts, HotKeys: hot,
		KeyHashes: keys, Pass: uint64(e), History: r.history, Zones: r.w.zones(),
	})
	if err != nil {
		return Epoch{}, err
	}
	next, err := r.a.Apply(res.Ops)
	if err != nil {
		return Epoch{}, fmt.Errorf("the pass produced operations that do not apply: %w", err)
	}
	if err := next.Validate(nodes); err != nil {
		return Epoch{}, fmt.Errorf("the pass broke an invariant: %w", err)
	}
	ep.Churn = churn(r.a, next, keys, nodes)
	ep.UndoneMoves, ep.PingPongs = r.undo.observe(e, r.a, next, nodes, keys)
	ep.SplitMergeCycles = r.cycles.observe(e, r.a, next)
	r.a, r.history = next, res.History
	r.expect(nodes)
	return ep, nil
}

// expect records what the pass just made expects of each node: the new map under the loads
// the pass saw (the keys' loads are still this epoch's).
func (r *runner) expect(nodes *assignment.NodeSet) {
	loads, _ := r.served(false)
	r.forecast = make(map[assignment.NodeID]float64, nodes.Len())
	for i, l := range load.NodeLoads(r.a, loads, nodes) {
		r.forecast[nodes.Nodes()[i].ID] = l
	}
}

// apply carries out the epoch's node changes from the options, then its events.
func (r *runner) apply(e int) error {
	for _, at := range r.opt.AddNodeAt {
		if at == e {
			r.w.addNode("", 1)
		}
	}
	for _, rm := range r.opt.RemoveNodeAt {
		if rm.Epoch == e {
			if err := r.w.removeNode(rm.Node); err != nil {
				return err
			}
		}
	}
	for _, rz := range r.opt.RemoveZoneAt {
		if rz.Epoch == e {
			if err := r.w.removeZone(rz.Zone); err != nil {
				return err
			}
		}
	}
	if wl := r.sc.Workload; wl != nil {
		if e == 0 {
			r.w.keys.addNumbered(wl.Keys())
			if h, ok := wl.(hashAware); ok {
				h.setHashes(r.w.keys.hash)
			}
		}
		wl.Fill(e, r.w.keys.load)
		return nil
	}
	evs := r.sc.Trace.Events
	for ; r.next < len(evs) && evs[r.next].Epoch == e; r.next++ {
		ev := evs[r.next]
		var err error
		switch ev.Kind {
		case SetLoad:
			r.w.keys.set(ev.Name, ev.Value)
		case DeleteKey:
			r.w.keys.remove(ev.Name)
		case AddNode:
			r.w.addNode(assignment.NodeID(ev.Name), ev.Value)
			r.w.labels[assignment.NodeID(ev.Name)] = ev.Labels
		case RemoveNode:
			err = r.w.removeNode(assignment.NodeID(ev.Name))
		}
		if err != nil {
			return fmt.Errorf("trace line %d: %w", ev.Line, err)
		}
	}
	return nil
}

// hotKeys is how many of its heaviest keys a slice reports, and hotShare the share of a mean
// node's load a key must carry to be reported, as a node's heavy-hitter sketch would (Dicer
// keeps keys of at least 1% of a node's load).
const (
	hotKeys  = 4
	hotShare = 0.01
)

// measure returns each slice's load and key count, and its heaviest keys.
func (r *runner) measure(nodes int) (loads, counts []float64, hot [][]balance.HotKey) {
	n := r.a.Len()
	loads, counts, hot = make([]float64, n), make([]float64, n), make([][]balance.HotKey, n)
	kt := &r.w.keys
	var total float64
	for _, id := range kt.order {
		total += kt.load[id]
	}
	threshold := hotShare * total / float64(nodes)
	r.eachKey(func(j int, h uint64, l float64) {
		loads[j] += l
		counts[j]++
		if l > 0 && l >= threshold {
			hot[j] = keepTopN(hot[j], balance.HotKey{Hash: h, Load: l}, hotKeys)
		}
	})
	return loads, counts, hot
}

// eachKey calls fn for every key, in hash order, with the index of the slice of r.a that
// holds it and the key's load.
func (r *runner) eachKey(fn func(slice int, hash uint64, load float64)) {
	kt := &r.w.keys
	j, end := 0, r.a.Slice(0).Range.End
	for k, id := range kt.order {
		h := kt.sorted[k]
		for !end.After(h) {
			j++
			end = r.a.Slice(j).Range.End
		}
		fn(j, h, kt.load[id])
	}
}

// churn returns the key placements the change from one map to the other adds (a key copied to
// a live node that did not hold it), over the number of keys. keys are sorted hashes.
func churn(from, to *assignment.Assignment, keys []uint64, live *assignment.NodeSet) float64 {
	if len(keys) == 0 {
		return 0
	}
	i, j, added, cached := 0, 0, 0, -1
	for _, h := range keys {
		moved := cached < 0
		for !from.Slice(i).Range.Contains(h) {
			i, moved = i+1, true
		}
		for !to.Slice(j).Range.Contains(h) {
			j, moved = j+1, true
		}
		if moved {
			cached = 0
			old := from.Slice(i)
			for _, id := range to.Slice(j).Replicas {
				if live.Has(id) && !old.Holds(id) {
					cached++
				}
			}
		}
		added += cached
	}
	return float64(added) / float64(len(keys))
}

// keyCopies returns the copies of keys the live replicas of a hold, over the number of keys:
// what replicas cost in memory. keys are sorted hashes.
func keyCopies(a *assignment.Assignment, keys []uint64, live *assignment.NodeSet) float64 {
	if len(keys) == 0 {
		return 0
	}
	i, copies, held := 0, 0, -1
	var idx []int
	for _, h := range keys {
		for !a.Slice(i).Range.Contains(h) {
			i, held = i+1, -1
		}
		if held < 0 {
			idx = live.AppendIndices(idx[:0], a.Slice(i).Replicas)
			held = len(idx)
		}
		copies += held
	}
	return float64(copies) / float64(len(keys))
}

// orphaned returns the share of the key space whose slices in a have no replica among the
// live nodes, and their share of the load, loads being those of a's slices.
func orphaned(a *assignment.Assignment, live *assignment.NodeSet, loads []float64) (space, load float64) {
	var total float64
	for i, s := range a.All() {
		total += loads[i]
		if !slices.ContainsFunc(s.Replicas, live.Has) {
			space += s.Range.Fraction()
			load += loads[i]
		}
	}
	if total > 0 {
		load /= total
	}
	return space, load
}

// world is the simulated system: its nodes and its keys.
type world struct {
	live    []assignment.NodeID // in order of arrival
	cap     map[assignment.NodeID]float64
	labels  map[assignment.NodeID]map[string]string // for the core's zones; nil for most
	set     *assignment.NodeSet                     // nil when live changed
	counter int                                     // for the names of new nodes
	nzones  int                                     // Options.Zones
	keys    keyTable
}

func newWorld(zones int) *world {
	return &world{cap: map[assignment.NodeID]float64{}, labels: map[assignment.NodeID]map[string]string{},
		nzones: zones}
}

// zones returns each live node's zone for the algorithm, or nil when the run has no zones.
func (w *world) zones() map[assignment.NodeID]string {
	if w.nzones == 0 {
		return nil
	}
	out := make(map[assignment.NodeID]string, len(w.live))
	for _, id := range w.live {
		out[id] = w.labels[id][ZoneLabel]
	}
	return out
}

// removeZone removes every live node of zone.
func (w *world) removeZone(zone string) error {
	var gone []assignment.NodeID
	for _, id := range w.live {
		if w.labels[id][ZoneLabel] == zone {
			gone = append(gone, id)
		}
	}
	if len(gone) == 0 {
		return fmt.Errorf("%w: cannot remove zone %q: it has no live node", ErrScenario, zone)
	}
	for _, id := range gone {
		if err := w.removeNode(id); err != nil {
			return fmt.Errorf("removing zone %q: %w", zone, err)
		}
	}
	return nil
}

// addNode adds a node; with no id, the next free nI.
func (w *world) addNode(id assignment.NodeID, capacity float64) {
	for id == "" {
		if c := assignment.NodeID("n" + strconv.Itoa(w.counter)); w.cap[c] == 0 {
			id = c
			if w.nzones > 0 {
				w.labels[id] = map[string]string{ZoneLabel: ZoneName(w.counter % w.nzones)}
			}
		}
		w.counter++
	}
	w.live = append(w.live, id)
	w.cap[id] = capacity
	w.set = nil
}

// removeNode removes a node; with no id, the most recently added one.
func (w *world) removeNode(id assignment.NodeID) error {
	if id == "" && len(w.live) > 0 {
		id = w.live[len(w.live)-1]
	}
	i := slices.Index(w.live, id)
	switch {
	case i < 0:
		return fmt.Errorf("%w: cannot remove node %q: it is not a live node", ErrScenario, id)
	case len(w.live) == 1:
		return fmt.Errorf("%w: cannot remove node %q: it is the last live node", ErrScenario, id)
	}
	w.live = slices.Delete(w.live, i, i+1)
	delete(w.cap, id)
	delete(w.labels, id)
	w.set = nil
	return nil
}

func (w *world) nodeSet() (*assignment.NodeSet, error) {
	if w.set != nil {
		return w.set, nil
	}
	if len(w.live) == 0 {
		return nil, fmt.Errorf("%w: no live nodes", ErrScenario)
	}
	nodes := make([]assignment.Node, len(w.live))
	for i, id := range w.live {
		nodes[i] = assignment.Node{ID: id, Capacity: w.cap[id]}
	}
	set, err := assignment.NewNodeSet(nodes)
	w.set = set
	return set, err
}

// keyTable holds every key's hash and current load, by key number, and the live keys in hash
// order. A built-in workload's keys are numbered; a trace's are named.
type keyTable struct {
	hash   []uint64
	load   []float64
	dead   []bool // per key, once any key was deleted
	names  map[string]int32
	order  []int32  // live keys by hash
	sorted []uint64 // their hashes
	dirty  bool
}

func (t *keyTable) addNumbered(n int) {
	t.hash, t.load = make([]uint64, n), make([]float64, n)
	for i := range n {
		t.hash[i] = keyspace.HashString("key-" + strconv.Itoa(i))
	}
	t.dirty = true
}

func (t *keyTable) set(name string, l float64) {
	if t.names == nil {
		t.names = map[string]int32{}
	}
	if id, ok := t.names[name]; ok {
		t.load[id] = l
		return
	}
	t.names[name] = int32(len(t.hash))
	t.hash = append(t.hash, keyspace.HashString(name))
	t.load = append(t.load, l)
	if t.dead != nil {
		t.dead = append(t.dead, false)
	}
	t.dirty = true
}

func (t *keyTable) remove(name string) {
	id, ok := t.names[name]
	if !ok {
		return // ReadTrace has already rejected deletes of unknown keys
	}
	delete(t.names, name)
	if t.dead == nil {
		t.dead = make([]bool, len(t.hash))
	}
	t.dead[id], t.load[id] = true, 0
	t.dirty = true
}

// sortedHashes returns the live keys' hashes in order, rebuilding the order if keys changed.
func (t *keyTable) sortedHashes() []uint64 {
	if !t.dirty {
		return t.sorted
	}
	t.order = t.order[:0]
	for id := range t.hash {
		if t.dead == nil || !t.dead[id] {
			t.order = append(t.order, int32(id))
		}
	}
	slices.SortFunc(t.order, func(a, b int32) int { return cmp.Compare(t.hash[a], t.hash[b]) })
	t.sorted = slices.Grow(t.sorted[:0], len(t.order))
	for _, id := range t.order {
		t.sorted = append(t.sorted, t.hash[id])
	}
	t.dirty = false
	return t.sorted
}
