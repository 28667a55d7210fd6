// Package sim runs balancing algorithms against workloads offline, one pass per epoch, and
// reports what a system would have experienced: the imbalance between nodes and the churn of
// keys copied to new nodes. It is how algorithms are compared and tuned on the same work.
//
// Each epoch: the epoch's events apply (loads change, keys and nodes come and go); the
// imbalance of the assignment in force is measured under the epoch's loads, a key's load split
// evenly over its live replicas; then the algorithm runs one pass with those loads, and the
// pass's churn is the number of key placements it adds (a key copied to a node that did not
// hold it) over the number of keys.
package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

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
	// Progress, if set, is called after each epoch.
	Progress func(done, total int)
}

// Epoch is what one epoch measured.
type Epoch struct {
	Epoch     int     `json:"epoch"`
	Imbalance float64 `json:"imbalance"`
	Churn     float64 `json:"churn"`
	Slices    int     `json:"slices"`
	Nodes     int     `json:"nodes"`
}

// Summary condenses a run.
type Summary struct {
	FinalImbalance float64 `json:"final_imbalance"`
	MeanImbalance  float64 `json:"mean_imbalance"`
	MaxImbalance   float64 `json:"max_imbalance"`
	MaxChurn       float64 `json:"max_churn"`
	TotalChurn     float64 `json:"total_churn"`
}

// Result is one algorithm's run.
type Result struct {
	Algorithm string  `json:"algorithm"`
	Epochs    []Epoch `json:"epochs"`
	Summary   Summary `json:"summary"`
}

// Run simulates alg on the scenario. It stops early, returning ctx's error, if ctx ends.
func Run(ctx context.Context, alg balance.Algorithm, sc Scenario, opt Options) (Result, error) {
	if (sc.Workload == nil) == (sc.Trace == nil) {
		return Result{}, fmt.Errorf("%w: give a workload or a trace, not both or neither", ErrScenario)
	}
	if opt.Epochs < 1 {
		return Result{}, fmt.Errorf("%w: %d epochs; want at least 1", ErrScenario, opt.Epochs)
	}
	r := &runner{alg: alg, sc: sc, opt: opt, w: newWorld()}
	if sc.Trace == nil || !sc.Trace.NodesAtStart {
		if opt.Nodes < 1 {
			return Result{}, fmt.Errorf("%w: %d nodes; want at least 1", ErrScenario, opt.Nodes)
		}
		for range opt.Nodes {
			r.w.addNode("", 1)
		}
	}
	res := Result{Algorithm: alg.Name()}
	for e := range opt.Epochs {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		ep, err := r.epoch(e)
		if err != nil {
			return Result{}, fmt.Errorf("%s, epoch %d: %w", alg.Name(), e, err)
		}
		res.Epochs = append(res.Epochs, ep)
		if opt.Progress != nil {
			opt.Progress(e+1, opt.Epochs)
		}
	}
	res.Summary = summarize(res.Epochs)
	return res, nil
}

func summarize(es []Epoch) Summary {
	var s Summary
	for _, e := range es {
		s.MeanImbalance += e.Imbalance / float64(len(es))
		s.MaxImbalance = max(s.MaxImbalance, e.Imbalance)
		s.MaxChurn = max(s.MaxChurn, e.Churn)
		s.TotalChurn += e.Churn
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
	next    int // the next trace event
}

func (r *runner) epoch(e int) (Epoch, error) {
	if err := r.apply(e); err != nil {
		return Epoch{}, err
	}
	nodes, err := r.w.nodeSet()
	if err != nil {
		return Epoch{}, err
	}
	keys := r.w.keys.sortedHashes()
	if r.a == nil {
		if r.a, err = r.alg.Initial(balance.Input{Nodes: nodes, KeyHashes: keys}); err != nil {
			return Epoch{}, fmt.Errorf("initial assignment: %w", err)
		}
	}
	loads, counts, hot := r.measure(nodes.Len())
	ep := Epoch{
		Epoch:     e,
		Imbalance: load.Imbalance(load.NodeLoads(r.a, loads, nodes)),
		Slices:    r.a.Len(),
		Nodes:     nodes.Len(),
	}
	res, err := r.alg.Rebalance(balance.Input{
		Assignment: r.a, Nodes: nodes, Load: loads, Keys: counts, HotKeys: hot,
		KeyHashes: keys, Pass: uint64(e), History: r.history,
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
	r.a, r.history = next, res.History
	return ep, nil
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
	j, end := 0, r.a.Slice(0).Range.End
	for k, id := range kt.order {
		h := kt.sorted[k]
		for !end.After(h) {
			j++
			end = r.a.Slice(j).Range.End
		}
		l := kt.load[id]
		loads[j] += l
		counts[j]++
		if l > 0 && l >= threshold {
			hot[j] = keepTop(hot[j], balance.HotKey{Hash: h, Load: l})
		}
	}
	return loads, counts, hot
}

// keepTop adds k to the heaviest-first list top, keeping at most hotKeys entries.
func keepTop(top []balance.HotKey, k balance.HotKey) []balance.HotKey {
	i, _ := slices.BinarySearchFunc(top, k.Load, func(x balance.HotKey, l float64) int { return cmp.Compare(l, x.Load) })
	if i >= hotKeys {
		return top
	}
	top = slices.Insert(top, i, k)
	return top[:min(len(top), hotKeys)]
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

// world is the simulated system: its nodes and its keys.
type world struct {
	live    []assignment.NodeID // in order of arrival
	cap     map[assignment.NodeID]float64
	set     *assignment.NodeSet // nil when live changed
	counter int                 // for the names of new nodes
	keys    keyTable
}

func newWorld() *world { return &world{cap: map[assignment.NodeID]float64{}} }

// addNode adds a node; with no id, the next free nI.
func (w *world) addNode(id assignment.NodeID, capacity float64) {
	for id == "" {
		if c := assignment.NodeID("n" + strconv.Itoa(w.counter)); w.cap[c] == 0 {
			id = c
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
