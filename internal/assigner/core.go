// Package assigner is the assigner service: it keeps the slice map, runs balancing passes on
// the load that nodes report, and streams each change as a quantum stamped with a Lamport
// clock.
//
// Core is the decision logic, passive and deterministic: it turns events (a node registers,
// reports load, a pass is due, an operator moves a slice) into proposals, which say what to
// persist and what to publish. It does no I/O and reads no clock. Server is the driver: it
// holds leadership in etcd, persists each proposal with a fenced write and only then commits
// it to the core and publishes its quantum.
package assigner

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/store"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// Errors of the core, which the API maps to status codes.
var (
	ErrInvalid      = errors.New("assigner: invalid request")
	ErrUnknownNode  = errors.New("assigner: unknown node")
	ErrPrecondition = errors.New("assigner: not possible now")
	ErrNoMap        = fmt.Errorf("%w: there is no assignment yet, as no node has registered", ErrPrecondition)
	ErrNotLeader    = errors.New("assigner: not the leader")
)

// CoreConfig tunes the core.
type CoreConfig struct {
	// NodeTTL is how long a node stays in the map without a heartbeat or a load report.
	NodeTTL time.Duration
	// SnapshotEvery is how many log entries accumulate before the map is snapshotted.
	SnapshotEvery uint64
	// Algorithm and Params are used when nothing is stored yet.
	Algorithm string
	Params    map[string]string
	// Estimator tunes the folding of load reports.
	Estimator load.EstimatorConfig
	// MaxLoadRate caps what a node may report: per second of its report's window and per
	// unit of its capacity (0 counts as 1), in the application's load unit. A report above
	// it is refused whole. Default load.DefaultRate (1e9); at most load.MaxRate.
	MaxLoadRate float64
}

// Validate reports whether the configuration is usable (zero values take defaults).
func (cfg CoreConfig) Validate() error { return cfg.fill() }

// fill sets defaults and refuses nonsense.
func (cfg *CoreConfig) fill() error {
	if cfg.NodeTTL <= 0 {
		cfg.NodeTTL = 10 * time.Second
	}
	if cfg.SnapshotEvery == 0 {
		cfg.SnapshotEvery = 64
	}
	if cfg.MaxLoadRate == 0 {
		cfg.MaxLoadRate = load.DefaultRate
	}
	if !(cfg.MaxLoadRate > 0 && cfg.MaxLoadRate <= load.MaxRate) {
		return fmt.Errorf("assigner: max load rate %v: want > 0 and at most %g", cfg.MaxLoadRate, load.MaxRate)
	}
	return nil
}

// Bounds on what a node registers with: every node's capacity is within a factor of 1e12 of
// every other's, so the load over capacity that passes weigh stays finite; the rest bounds
// what the assigner stores and echoes.
const (
	MinCapacity      = 1e-6
	MaxCapacity      = 1e6
	MaxAddressBytes  = 256
	MaxLabels        = 64
	MaxLabelKeyBytes = 63
	MaxLabelBytes    = 256
)

type nodeState struct {
	store.Node
	lastSeen time.Time
}

// Core is the assigner's state as the leader of one term sees it. It is not safe for
// concurrent use: the driver owns it from one goroutine.
type Core struct {
	cfg       CoreConfig
	term, seq uint64
	clock     uint64 // the highest source clock seen
	published uint64 // the clock of the last quantum
	a         *assignment.Assignment
	meta      store.Meta
	alg       balance.Algorithm
	nodes     map[assignment.NodeID]*nodeState
	history   []balance.Move
	snapshot  uint64 // the log entry of the last snapshot asked for
	est       *load.Estimator
	estimate  load.Estimate          // of the last pass, on estimated
	estimated *assignment.Assignment // the map estimate is indexed by
	current   struct {               // estimate carried over to the map of, from estimated
		of, from *assignment.Assignment
		est      load.Estimate
	}
	explain  *balance.Explanation
	lastPass time.Time
	dists    quantum.Distributors
	failed   passFailure
}

// passFailure records the balancing passes that failed: how many in a row, and the last.
type passFailure struct {
	count uint64 // in a row; 0 once a pass succeeds
	err   string
	at    time.Time
}

// Proposal is one change of the state: what to persist, in order, and what to publish once
// persisted. Nothing changes until the driver commits it.
type Proposal struct {
	PutNode     *store.Node
	DeleteNodes []assignment.NodeID
	// Init stores After as the first map; Entry logs a change of the map.
	Init  bool
	Entry *store.Entry
	// Snapshot asks for After to be snapshotted, as the map of Entry, once Entry is stored.
	// It is compaction: the driver may do it in the background, and a failure loses nothing.
	Snapshot bool
	// SaveMeta stores Meta alone (Entry and Init store it with them).
	SaveMeta bool
	Meta     store.Meta
	// Quantum, if set, is published with After, the map it leads to.
	Quantum *quantum.Quantum
	After   *assignment.Assignment
	// Summary says what the change does, for the operator and the log.
	Summary string

	commit func(c *Core)
}

// Persists reports whether the proposal writes anything.
func (p *Proposal) Persists() bool {
	return p.PutNode != nil || len(p.DeleteNodes) > 0 || p.Init || p.Entry != nil || p.SaveMeta
}

// Commit makes a persisted proposal the core's state.
func (c *Core) Commit(p *Proposal) {
	c.meta = p.Meta
	if q := p.Quantum; q != nil {
		c.seq, c.published = q.Seq, q.Clock
		c.a = p.After
	}
	if p.Snapshot {
		c.snapshot = p.Meta.LastIndex
	}
	if p.commit != nil {
		p.commit(c)
	}
}

// NewCore returns the core of a new leadership of term, from the stored state (found is
// false if there is none) and the source's clock. The proposal it returns records the new
// term; commit it before anything else.
func NewCore(cfg CoreConfig, term uint64, st store.State, found bool, clock uint64, now time.Time) (*Core, *Proposal, error) {
	if err := cfg.fill(); err != nil {
		return nil, nil, err
	}
	c := &Core{cfg: cfg, term: term, nodes: map[assignment.NodeID]*nodeState{}, est: load.NewEstimator(cfg.Estimator),
		dists: quantum.Distributors{}}
	m := store.Meta{Algorithm: cfg.Algorithm, Params: cfg.Params}
	if found {
		c.a, m, c.history, c.snapshot = st.Assignment, st.Meta, st.History, st.SnapshotIndex
		for _, n := range st.Nodes {
			// Every node gets a full lease to find the new leader.
			c.nodes[n.ID] = &nodeState{Node: n, lastSeen: now}
		}
	}
	alg, err := newAlgorithm(m.Algorithm, m.Params)
	if err != nil {
		return nil, nil, fmt.Errorf("assigner: the stored algorithm: %w", err)
	}
	c.alg, c.clock, c.published = alg, max(clock, m.Clock), m.Clock
	m.Term = term
	return c, &Proposal{SaveMeta: true, Meta: m, Summary: fmt.Sprintf("term %d begins", term)}, nil
}

// newAlgorithm builds a balancing algorithm, refusing constants that the store cannot honour
// across a failover.
func newAlgorithm(name string, params map[string]string) (balance.Algorithm, error) {
	alg, err := balance.New(name, params)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if wm, ok := alg.(*balance.WeightedMove); ok && wm.Config().HoldPasses > store.Keep {
		return nil, fmt.Errorf("%w: hold_passes=%d: at most %d, the moves a new leader remembers",
			ErrInvalid, wm.Config().HoldPasses, store.Keep)
	}
	return alg, nil
}

// Assignment returns the current map (nil before the first node registers), the position of
// the last quantum and the clock.
func (c *Core) Assignment() (*assignment.Assignment, quantum.Position, uint64) {
	return c.a, quantum.Position{Term: c.term, Seq: c.seq}, c.published
}

// ObserveClock records a clock the source has reached.
func (c *Core) ObserveClock(clock uint64) { c.clock = max(c.clock, clock) }

// ClockQuantum proposes a clock-only quantum when the source moved since the last quantum,
// so that distributors need not wait for the next change of the map.
func (c *Core) ClockQuantum(now time.Time) *Proposal {
	if c.a == nil || c.clock <= c.published {
		return nil
	}
	q := &quantum.Quantum{Position: c.next(), Clock: c.clock, Generation: c.a.Generation(), Cause: "clock", Time: now}
	return &Proposal{Meta: c.meta, Quantum: q, After: c.a}
}

// SetDistributors proposes the set of live distributors, as a reinitializing quantum that
// carries it with the map, or returns nil if the set did not change. Before the first map
// there is nothing to publish: the first map's quantum carries the set.
func (c *Core) SetDistributors(d quantum.Distributors, now time.Time) *Proposal {
	if d == nil {
		d = quantum.Distributors{} // none live, which a quantum must say, not leave out
	}
	if c.dists.Equal(d) {
		return nil
	}
	commit := func(c *Core) { c.dists = d }
	if c.a == nil {
		return &Proposal{Meta: c.meta, commit: commit}
	}
	q := &quantum.Quantum{Position: c.next(), Clock: c.clock, Generation: c.a.Generation(), Snapshot: c.a,
		Distributors: d, Cause: "distributors", Time: now}
	return &Proposal{Meta: c.meta, Quantum: q, After: c.a, commit: commit,
		Summary: fmt.Sprintf("distributors: %d live", len(d))}
}

// Audit marks p as made by the call of by, so that the history of quanta says who changed
// what: p's quantum and log entry get by, and a change that alters no map op (a freeze, a
// pin, a node registered) gets a clock-only quantum of cause and by, which carries no
// operation and so changes nothing for watchers. A proposal that changes nothing gets
// nothing.
func (c *Core) Audit(p *Proposal, cause, by string, now time.Time) {
	if q := p.Quantum; q != nil {
		q.By = by
		if p.Entry != nil {
			p.Entry.By = by
		}
		return
	}
	if !p.Persists() {
		return
	}
	var gen uint64
	if c.a != nil {
		gen = c.a.Generation()
	}
	p.Quantum = &quantum.Quantum{Position: c.next(), Clock: c.clock, Generation: gen, Cause: cause, By: by, Time: now}
	p.After = c.a
}

// Distributors returns the live distributors, as last committed.
func (c *Core) Distributors() quantum.Distributors { return c.dists }

func (c *Core) next() quantum.Position { return quantum.Position{Term: c.term, Seq: c.seq + 1} }

// placement returns the nodes slices may be placed on: registered and not draining.
func (c *Core) placement() *assignment.NodeSet {
	var ns []assignment.Node
	for _, n := range c.nodes {
		if !slices.Contains(c.meta.Draining, n.ID) {
			ns = append(ns, n.Node.Node)
		}
	}
	return assignment.MustNodeSet(ns...)
}

// registered returns every registered node.
func (c *Core) registered() *assignment.NodeSet {
	ns := make([]assignment.Node, 0, len(c.nodes))
	for _, n := range c.nodes {
		ns = append(ns, n.Node.Node)
	}
	return assignment.MustNodeSet(ns...)
}

// change proposes a change of the map by ops, as one quantum and one log entry.
func (c *Core) change(ops []assignment.Op, moves []balance.Move, cause string, now time.Time) (*Proposal, error) {
	next, err := c.a.Apply(ops)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPrecondition, err)
	}
	if err := next.Validate(c.registered()); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPrecondition, err)
	}
	pos := c.next()
	m := c.meta
	m.Term, m.Seq, m.Clock, m.Generation = pos.Term, pos.Seq, c.clock, next.Generation()
	m.LastIndex++
	p := &Proposal{
		Entry: &store.Entry{Index: m.LastIndex, Term: pos.Term, Seq: pos.Seq, Clock: c.clock,
			Generation: next.Generation(), Cause: cause, Time: now, Ops: ops, Moves: moves},
		Quantum: &quantum.Quantum{Position: pos, Clock: c.clock, Generation: next.Generation(), Ops: ops, Cause: cause, Time: now},
		After:   next,
	}
	p.Meta = m
	p.Snapshot = m.LastIndex-c.snapshot >= c.cfg.SnapshotEvery
	return p, nil
}

// Pass proposes a balancing pass, or returns nil when there is nothing to do: balancing is
// frozen, or no node can hold slices. The first map is made even when balancing is frozen:
// without it nothing can be served.
func (c *Core) Pass(now time.Time) (*Proposal, error) {
	live := c.placement()
	switch {
	case live.Len() == 0:
		return nil, nil
	case c.a == nil:
		return c.initial(live, now)
	case c.meta.Frozen:
		return nil, nil
	}
	est := c.est.Fold(c.a, now)
	in := balance.Input{
		Assignment: c.a, Nodes: live, Load: loadOrKeySpace(c.a, est.Loads), Keys: est.Keys, HotKeys: est.HotKeys,
		Pass: c.meta.Pass, History: c.history, Pinned: c.meta.Pins,
	}
	res, err := c.alg.Rebalance(in)
	if err != nil {
		return nil, fmt.Errorf("assigner: pass %d: %w", c.meta.Pass, err)
	}
	record := func(c *Core) {
		c.history, c.explain, c.lastPass = res.History, &res.Explanation, now
		c.failed.count = 0
		c.estimate, c.estimated = est, in.Assignment
	}
	if len(res.Ops) == 0 {
		m := c.meta
		m.Pass++ // not stored by itself: after a failover, holds only last longer
		return &Proposal{Meta: m, Summary: "pass: no change", commit: record}, nil
	}
	var moves []balance.Move
	for _, mv := range res.History {
		if mv.Pass == c.meta.Pass {
			moves = append(moves, mv)
		}
	}
	p, err := c.change(res.Ops, moves, "pass", now)
	if err != nil {
		// The algorithm's output must always apply and keep I1; if not, it is a bug.
		return nil, fmt.Errorf("assigner: pass %d produced a bad map: %w", c.meta.Pass, err)
	}
	p.Meta.Pass++
	p.Summary = fmt.Sprintf("pass %d: %d ops, imbalance %.3f -> %.3f", c.meta.Pass, len(res.Ops),
		res.Explanation.ImbalanceBefore, res.Explanation.ImbalanceAfter)
	p.commit = record
	return p, nil
}

// maxErrorBytes bounds the reason of a failed pass that Status and Explain show.
const maxErrorBytes = 512

// PassFailed records that a pass failed (Pass returned err, or its proposal could not be
// stored), for Status and Explain.
func (c *Core) PassFailed(err error, now time.Time) {
	msg := err.Error()
	if len(msg) > maxErrorBytes {
		msg = msg[:maxErrorBytes] + "..."
	}
	c.failed = passFailure{count: c.failed.count + 1, err: msg, at: now}
}

// Cleanup proposes taking the slices of departed nodes off them without the algorithm, or
// returns nil when no slice is held by a departed node. It is the fallback for a pass that
// failed: whatever made the algorithm fail, I1 must hold once clean-up has run. A slice
// keeps its live replicas; one left with none goes to the live node holding the fewest
// slices.
func (c *Core) Cleanup(now time.Time) (*Proposal, error) {
	live, reg := c.placement(), c.registered()
	if c.a == nil || live.Len() == 0 {
		return nil, nil
	}
	held := make(map[assignment.NodeID]int, live.Len())
	for _, n := range live.Nodes() {
		held[n.ID] = 0
	}
	for _, s := range c.a.All() {
		for _, id := range s.Replicas {
			if _, ok := held[id]; ok {
				held[id]++
			}
		}
	}
	var ops []assignment.Op
	var moves []balance.Move
	for _, s := range c.a.All() {
		keep := slices.DeleteFunc(slices.Clone(s.Replicas), func(id assignment.NodeID) bool { return !reg.Has(id) })
		if len(keep) == len(s.Replicas) {
			continue
		}
		for _, id := range s.Replicas {
			if !reg.Has(id) {
				moves = append(moves, balance.Move{Range: s.Range, From: id, Pass: c.meta.Pass})
			}
		}
		if len(keep) == 0 {
			to := leastHeld(live, held)
			held[to]++
			keep = []assignment.NodeID{to}
			moves = append(moves, balance.Move{Range: s.Range, To: to, Pass: c.meta.Pass})
		}
		ops = append(ops, assignment.Assign{Slice: s.Range.Start, Replicas: keep})
	}
	if len(ops) == 0 {
		return nil, nil
	}
	p, err := c.change(ops, moves, "cleanup", now)
	if err != nil {
		return nil, fmt.Errorf("assigner: clean-up: %w", err)
	}
	p.Summary = fmt.Sprintf("clean-up without the algorithm: %d slices off departed nodes", len(ops))
	p.commit = func(c *Core) { c.history = append(c.history, moves...) }
	return p, nil
}

// leastHeld returns the node of live holding the fewest slices, the first by ID on a tie.
func leastHeld(live *assignment.NodeSet, held map[assignment.NodeID]int) assignment.NodeID {
	best := live.Nodes()[0].ID
	for _, n := range live.Nodes()[1:] {
		if held[n.ID] < held[best] {
			best = n.ID
		}
	}
	return best
}

// loadOrKeySpace returns loads, or, when no load at all is measured, each slice's share of
// the hash space: with nothing to weigh, a pass spreads the key space, so that nodes that
// join an idle cluster get slices instead of waiting for the first requests.
func loadOrKeySpace(a *assignment.Assignment, loads []float64) []float64 {
	for _, l := range loads {
		if l > 0 {
			return loads
		}
	}
	share := make([]float64, a.Len())
	for i := range share {
		share[i] = a.Slice(i).Range.Fraction()
	}
	return share
}

// initial proposes the first map, over the nodes registered so far.
func (c *Core) initial(live *assignment.NodeSet, now time.Time) (*Proposal, error) {
	a, err := c.alg.Initial(balance.Input{Nodes: live})
	if err != nil {
		return nil, fmt.Errorf("assigner: the initial assignment: %w", err)
	}
	pos := c.next()
	m := c.meta
	m.Term, m.Seq, m.Clock, m.Generation = pos.Term, pos.Seq, c.clock, a.Generation()
	return &Proposal{
		Init: true, Meta: m, After: a,
		Quantum: &quantum.Quantum{Position: pos, Clock: c.clock, Generation: a.Generation(), Snapshot: a, Distributors: c.dists, Cause: "initial", Time: now},
		Summary: fmt.Sprintf("initial assignment: %d slices over %d nodes", a.Len(), live.Len()),
	}, nil
}

// Register adds or updates a node and renews its lease.
func (c *Core) Register(n store.Node, now time.Time) (*Proposal, error) {
	if err := validateNode(n); err != nil {
		return nil, err
	}
	commit := func(c *Core) { c.nodes[n.ID] = &nodeState{Node: n, lastSeen: now} }
	if old, ok := c.nodes[n.ID]; ok && old.Node.Node == n.Node && old.Address == n.Address && maps.Equal(old.Labels, n.Labels) {
		return &Proposal{Meta: c.meta, commit: commit}, nil // a renewal: nothing to store
	}
	return &Proposal{PutNode: &n, Meta: c.meta, Summary: fmt.Sprintf("node %s registered at %q", n.ID, n.Address), commit: commit}, nil
}

// validateNode checks a registration: a node nobody can reach, or whose capacity makes its
// load over capacity overflow, must not get slices.
func validateNode(n store.Node) error {
	if err := n.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	switch {
	case n.Capacity != 0 && (n.Capacity < MinCapacity || n.Capacity > MaxCapacity):
		return fmt.Errorf("%w: node %s: capacity %g; want 0 (read as 1) or %g..%g", ErrInvalid, n.ID, n.Capacity, MinCapacity, MaxCapacity)
	case n.Address == "":
		return fmt.Errorf("%w: node %s: no address; routers could not reach it", ErrInvalid, n.ID)
	case len(n.Address) > MaxAddressBytes:
		return fmt.Errorf("%w: node %s: address of %d bytes; at most %d", ErrInvalid, n.ID, len(n.Address), MaxAddressBytes)
	case len(n.Labels) > MaxLabels:
		return fmt.Errorf("%w: node %s: %d labels; at most %d", ErrInvalid, n.ID, len(n.Labels), MaxLabels)
	}
	for k, v := range n.Labels {
		if k == "" || len(k) > MaxLabelKeyBytes || len(v) > MaxLabelBytes {
			return fmt.Errorf("%w: node %s: label %s=%s: want a key of 1..%d bytes and a value of at most %d",
				ErrInvalid, n.ID, wire.Quote(k), wire.Quote(v), MaxLabelKeyBytes, MaxLabelBytes)
		}
	}
	return nil
}

// Heartbeat renews a node's lease and says whether it is draining.
func (c *Core) Heartbeat(id assignment.NodeID, now time.Time) (draining bool, err error) {
	n, ok := c.nodes[id]
	if !ok {
		return false, fmt.Errorf("%w: %s is not registered (register again)", ErrUnknownNode, id)
	}
	n.lastSeen = now
	return slices.Contains(c.meta.Draining, id), nil
}

// Report records a node's load report; it renews the node's lease too.
func (c *Core) Report(r load.Report, now time.Time) error {
	n, ok := c.nodes[r.Node]
	if !ok {
		return fmt.Errorf("%w: %s is not registered, so its load cannot be counted", ErrUnknownNode, r.Node)
	}
	// Refused whole before the estimator sees it: one value out of bounds would make sums
	// infinite, and every pass after fail.
	if err := r.Check(load.Cap(c.cfg.MaxLoadRate, r.Window, n.Weight())); err != nil {
		return fmt.Errorf("%w: node %s: %w", ErrInvalid, r.Node, err)
	}
	if err := c.est.Add(r); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	n.lastSeen = now
	return nil
}

// Deregister proposes taking a node out at once.
func (c *Core) Deregister(id assignment.NodeID) (*Proposal, error) {
	if _, ok := c.nodes[id]; !ok {
		return nil, fmt.Errorf("%w: %s is not registered", ErrUnknownNode, id)
	}
	return c.removeNodes([]assignment.NodeID{id}, "deregistered"), nil
}

// Expire proposes taking out the nodes whose lease lapsed, or returns nil.
func (c *Core) Expire(now time.Time) *Proposal {
	var gone []assignment.NodeID
	for id, n := range c.nodes {
		if now.Sub(n.lastSeen) > c.cfg.NodeTTL {
			gone = append(gone, id)
		}
	}
	if len(gone) == 0 {
		return nil
	}
	slices.Sort(gone)
	return c.removeNodes(gone, "lease expired")
}

// RefreshNodes gives every node a full lease from now, as a new leader does: after the
// leader itself was away, their last heartbeats say nothing about them.
func (c *Core) RefreshNodes(now time.Time) {
	for _, n := range c.nodes {
		n.lastSeen = now
	}
}

// removeNodes proposes forgetting nodes; the next pass moves their slices.
func (c *Core) removeNodes(ids []assignment.NodeID, why string) *Proposal {
	m := c.meta
	m.Draining = slices.DeleteFunc(slices.Clone(m.Draining), func(d assignment.NodeID) bool { return slices.Contains(ids, d) })
	return &Proposal{
		DeleteNodes: ids, SaveMeta: len(m.Draining) != len(c.meta.Draining), Meta: m,
		Summary: fmt.Sprintf("nodes %v left: %s", ids, why),
		commit: func(c *Core) {
			for _, id := range ids {
				delete(c.nodes, id)
				c.est.Forget(id)
			}
		},
	}
}
