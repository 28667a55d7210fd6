// Package assigner is the assigner service: it keeps the slice map, runs balancing passes on
// the load that nodes report, and streams each change as a quantum stamped with a Lamport
// clock.
//
// Core is the decision logic, a passive and deterministic state machine after etcd's raft
// RawNode: Core.Step takes one event of a closed set (a node registers, reports load, time
// passes, an operator moves a slice, a write is committed) with the time, and returns an
// Output of plain data: the write to persist, the quanta to publish once it is, the reply,
// and when it next wants a Tick. It does no I/O, reads no clock and starts no goroutine, so
// scripts (testdata/) and the simulator drive it as the server does. Server is the driver,
// active but simple: it holds leadership in etcd, steps events in from its channels and one
// timer, persists each write with the fence, steps its outcome, and publishes.
package core

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// Errors of the core, which the API maps to status codes.
var (
	ErrInvalid      = errors.New("assigner: invalid request")
	ErrUnknownNode  = errors.New("assigner: unknown node")
	ErrPrecondition = errors.New("assigner: not possible now")
	ErrNoMap        = fmt.Errorf("%w: there is no assignment yet, as no node has registered", ErrPrecondition)
	ErrNotLeader    = errors.New("assigner: not the leader")
)

// ErrWriteInFlight is the reply to an event stepped while a write is in flight: the driver
// must step WriteCommitted or WriteFailed first.
var ErrWriteInFlight = errors.New("assigner: a write is in flight; step its outcome first")

// Config tunes the core.
type Config struct {
	// NodeTTL is how long a node stays in the map without a heartbeat or a load report.
	NodeTTL time.Duration
	// PassInterval is the time between balancing passes; default 1 s.
	PassInterval time.Duration
	// ClockInterval is the shortest time between clock-only quanta; default 20 ms.
	// A Server sets both from its Config (the --pass-interval and --clock-interval flags).
	ClockInterval time.Duration
	// SnapshotEvery is how many log entries accumulate before the map is snapshotted.
	SnapshotEvery uint64
	// Algorithm and Params are the configured balancing: used when nothing is stored yet,
	// and over the stored ones when they differ from those the store says were configured
	// (Meta.Configured): a SetAlgorithm lasts until the config changes.
	Algorithm string
	Params    map[string]string
	// Estimator tunes the folding of load reports.
	Estimator load.EstimatorConfig
	// ZoneLabel is the key of the node label that names a node's zone (--zone-label):
	// passes spread each slice's replicas over distinct zones. Empty: zones are ignored.
	ZoneLabel string
	// MaxLoadRate caps what a node may report: per second of its report's window and per
	// unit of its capacity (0 counts as 1), in the application's load unit. A report above
	// it is refused whole. Default load.DefaultRate (1e9); at most load.MaxRate.
	MaxLoadRate float64
	// BreakBeforeMake switches readers to a slice's new holders the moment a move is made
	// (--make-before-break=false). By default a move is a handoff (make-before-break, I7):
	// the new holders load the slice while the old ones serve it, until the new holders
	// report it loaded (their heartbeats) or HandoffTimeout rolls it back.
	BreakBeforeMake bool
	// HandoffTimeout is how long a handoff may last before it is rolled back
	// (--handoff-timeout); default 30 s.
	HandoffTimeout time.Duration
	// HandoffLinger is how long the old holders of a slice keep serving it once its new
	// holders have loaded it (--handoff-linger), so that a router or node whose map does
	// not show the new holders serving yet still finds the data where it looks; default 2 s.
	HandoffLinger time.Duration
	// MaxGrace caps the grace a node may ask for when it deregisters to restart with its
	// store (maintenance): its slices stay and its lease lasts that long; default 5 min.
	MaxGrace time.Duration
	// Roles is the cluster's role model (--roles): RolesReplicas (the default: every replica
	// alike) or RolesPrimarySecondary (one primary per slice, which takes its writes; see
	// roles.go). Give every assigner the same: it is not stored with the map.
	Roles string
	// Exclusive gives primaries leases (--exclusive; see exclusive.go): a member holds a
	// primary role only while its lease, renewed by its heartbeats for NodeTTL, is valid, and
	// the role goes to another only once it gave it up or its lease ran out. It needs
	// RolesPrimarySecondary. Give every assigner the same.
	Exclusive bool
	// LoadWarmUp is how long, at most, a new leader waits for a load report from every node
	// holding a slice before its first balancing pass (until then its passes only clean
	// up): a pass on the reports of some nodes only would take the others for idle and move
	// load onto them, a reshuffle at every failover. 0: no wait (a simulator's core, whose
	// nodes all report each epoch). A Server's default is 2 s.
	LoadWarmUp time.Duration
	// FirstMapNodes is how many nodes the first map of a cluster waits for (--first-map-nodes):
	// made at the first pass with a node, it would give every slice to the few nodes
	// registered by then, and the passes after it would move most of the map as the rest of
	// a starting fleet arrives. 0: no wait.
	FirstMapNodes int
	// FirstMapWait caps that wait, counted from the start of the leader's term
	// (--first-map-wait): a fleet that never reaches FirstMapNodes still gets a map. 0: 1 min.
	FirstMapWait time.Duration
	// MinReplicas is how many replicas every slice keeps while that many nodes live
	// (--min-replicas; see replicas.go); 0 or 1: one. With 2, a primary that dies is replaced
	// by a secondary that already holds its range, without a load.
	MinReplicas int
	// QuarantineWindow is the quarantine guard's window (--quarantine-window; see
	// quarantine.go): two nodes whose leases lapse within it, each within it of acquiring a
	// range, put that range in quarantine. 0: three NodeTTLs; negative: no guard.
	QuarantineWindow time.Duration
	// QuarantineProbe is how long a canary must serve a probed part of a quarantine, once
	// it has loaded it, for the part to be found innocent (--quarantine-probe; see
	// narrow.go). 0: QuarantineWindow, the time after acquiring a range within which the
	// guard counts a crash as the range's; negative: no narrowing, a quarantine stays whole
	// until an operator lifts it.
	QuarantineProbe time.Duration
	// WrapAlgorithm, if set, wraps every balancing algorithm the core builds (at a term's
	// start and on an operator's change): a driver may instrument passes with it, and a test
	// make them fail as a broken algorithm would.
	WrapAlgorithm func(balance.Algorithm) balance.Algorithm
}

// Validate reports whether the configuration is usable (zero values take defaults).
func (cfg Config) Validate() error { return cfg.Fill() }

// Fill sets defaults and refuses nonsense.
func (cfg *Config) Fill() error {
	if cfg.NodeTTL <= 0 {
		cfg.NodeTTL = 10 * time.Second
	}
	if cfg.PassInterval <= 0 {
		cfg.PassInterval = time.Second
	}
	if cfg.ClockInterval <= 0 {
		cfg.ClockInterval = 20 * time.Millisecond
	}
	if cfg.SnapshotEvery == 0 {
		cfg.SnapshotEvery = 64
	}
	switch {
	case cfg.QuarantineWindow == 0:
		cfg.QuarantineWindow = defaultQuarantineTTLs * cfg.NodeTTL
	case cfg.QuarantineWindow > 0 && cfg.QuarantineWindow < cfg.NodeTTL:
		return fmt.Errorf("%w: quarantine window %s: want at least the node TTL %s, as a crash is seen a TTL late (or negative: no guard)",
			ErrInvalid, cfg.QuarantineWindow, cfg.NodeTTL)
	}
	if cfg.QuarantineProbe == 0 {
		cfg.QuarantineProbe = cfg.QuarantineWindow
	}
	if cfg.MaxGrace <= 0 {
		cfg.MaxGrace = 5 * time.Minute
	}
	if cfg.MinReplicas < 0 || cfg.MinReplicas > maxMinReplicas {
		return fmt.Errorf("%w: min replicas %d: want 1 to %d (0: one)", ErrInvalid, cfg.MinReplicas, maxMinReplicas)
	}
	roles, err := assignment.ParseRoleModel(cfg.Roles)
	if err == nil {
		err = roles.Check(cfg.BreakBeforeMake, cfg.Exclusive)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	cfg.Roles = roles.Name
	switch {
	case cfg.FirstMapNodes < 0:
		return fmt.Errorf("%w: first map nodes %d: want >= 0 (0: no wait)", ErrInvalid, cfg.FirstMapNodes)
	case cfg.FirstMapWait < 0:
		return fmt.Errorf("%w: first map wait %s: want >= 0 (0: the default, 1m)", ErrInvalid, cfg.FirstMapWait)
	case cfg.FirstMapWait == 0:
		cfg.FirstMapWait = time.Minute
	}
	switch {
	case cfg.LoadWarmUp < 0:
		return fmt.Errorf("assigner: negative load warm-up %s", cfg.LoadWarmUp)
	case cfg.HandoffTimeout < 0:
		return fmt.Errorf("assigner: handoff timeout %s: want > 0 (0: the default, 30s)", cfg.HandoffTimeout)
	case cfg.HandoffTimeout == 0:
		cfg.HandoffTimeout = 30 * time.Second
	}
	switch {
	case cfg.HandoffLinger < 0:
		return fmt.Errorf("assigner: handoff linger %s: want > 0 (0: the default, 2s)", cfg.HandoffLinger)
	case cfg.HandoffLinger == 0:
		cfg.HandoffLinger = 2 * time.Second
	}
	if cfg.MaxLoadRate == 0 {
		cfg.MaxLoadRate = load.DefaultRate
	}
	if !(cfg.MaxLoadRate > 0 && cfg.MaxLoadRate <= load.MaxRate) {
		return fmt.Errorf("assigner: max load rate %v: want > 0 and at most %g", cfg.MaxLoadRate, load.MaxRate)
	}
	if len(cfg.ZoneLabel) > MaxLabelKeyBytes {
		return fmt.Errorf("assigner: zone label %q: at most %d bytes, as node label keys are", cfg.ZoneLabel, MaxLabelKeyBytes)
	}
	if err := cfg.Estimator.Validate(); err != nil {
		return fmt.Errorf("assigner: %w", err)
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
	// MaxIncarnationBytes bounds the name a process registers under (RegisterRequest
	// incarnation).
	MaxIncarnationBytes = 64
)

type nodeState struct {
	Node
	lastSeen time.Time
	// awayUntil is when the grace of a node that restarts ends (zero: none); until then
	// its lease does not lapse. It lives in memory only: a new leader gives every node a
	// full lease instead.
	awayUntil time.Time
	// reported says the node reported its load in this term (see Config.LoadWarmUp).
	reported bool
}

// Core is the assigner's state as the leader of one term sees it. It is not safe for
// concurrent use: one goroutine steps it.
type Core struct {
	cfg       Config
	roles     assignment.RoleModel // cfg.Roles'
	leading   bool
	term, seq uint64
	clock     uint64 // the highest source clock seen
	published uint64 // the clock of the last quantum
	a         *assignment.Assignment
	meta      Meta
	alg       balance.Algorithm
	nodes     map[assignment.NodeID]*nodeState
	history   []balance.Move
	snapshot  uint64 // the log entry of the last snapshot asked for
	est       *load.Estimator
	estimate  load.Estimate          // of the last pass, on estimated
	estimated *assignment.Assignment // the map estimate is indexed by
	current   load.Estimate          // estimate carried over to a, redone when either changes
	explain   *balance.Explanation
	lastPass  time.Time
	dists     quantum.Distributors
	failed    passFailure
	src       sourceState
	// firstMapBy ends a new leader's wait for FirstMapNodes.
	firstMapBy time.Time
	// warmUntil ends a new leader's wait for load reports; warm says it ended.
	warmUntil time.Time
	warm      bool

	ho     handoffs                      // the handoffs under way, as of a
	claims map[assignment.NodeID][]claim // the primary roles members claimed last (roles.go)
	leases leases                        // of an exclusive cluster's primaries
	qw     quarantineWatch               // what the quarantine guard remembers

	inflight *change // whose write is in flight
	todo     agenda  // what a Tick left to do once the write in flight is committed
	nextPass time.Time
	// expiryAt is no later than when the first lease of a node lapses (zero: no node): the
	// core wakes then to take it out, rather than at the next pass, so that its slices are
	// placed anew within the lease. A renewal leaves it early, never late: the scan at that
	// time finds the next.
	expiryAt  time.Time
	nextClock time.Time // the earliest time for the next clock-only quantum
}

// passFailure records the balancing passes that failed: how many in a row, and the last.
type passFailure struct {
	count uint64 // in a row; 0 once a pass succeeds
	err   string
	at    time.Time
}

// change is a proposed change of the state: the write that persists it, the quantum that
// announces it, and what else the state becomes once the write is committed. It is plain
// data, kept by the core while its write is in flight.
type change struct {
	write    Write // Meta is the meta after the change, stored or not
	quantum  *quantum.Quantum
	after    *assignment.Assignment // the map quantum leads to
	snapshot bool                   // snapshot after, as the map of write.Meta.LastIndex
	summary  string
	kind     string // what made it: a kind* constant, or a request

	node   *nodeState           // registered or renewed
	forget []assignment.NodeID  // nodes that left
	dists  quantum.Distributors // the new set of distributors, if not nil
	alg    balance.Algorithm    // the new algorithm, if not nil
	moves  []balance.Move       // appended to the history
	pass   *passRecord          // a pass ran
	req    requestEvent         // the request that asked for the change, if any
	reply  Reply                // its reply once done (Err and Change are set then)
	setMap bool                 // after replaces the map (a quantum may carry the same)
	ended  handoffEnd           // the handoffs the change ends

	crashes     []crash         // nodes whose leases lapsed (quarantine guard)
	quarantined []Quarantine    // ranges the change puts in quarantine
	lift        *keyspace.Range // a lifted quarantine's range
	probe       *probe          // a probe the change lends to its canary (narrow.go)
	verdicts    []verdict       // probes the change ends
}

// passRecord is what a pass leaves besides its change of the map.
type passRecord struct {
	history   []balance.Move
	explain   balance.Explanation
	estimate  load.Estimate
	estimated *assignment.Assignment
}

// Kinds of changes the core makes on its own.
const (
	kindTerm         = "term"
	kindExpiry       = "expiry"
	kindPass         = "pass"
	kindCleanup      = "cleanup"
	kindClock        = "clock"
	kindDistributors = "distributors"
	kindRequest      = "request"
	kindLoaded       = "loaded"
	kindRollback     = "rollback"
	kindQuarantine   = "quarantine"
)

// New returns a core that leads nothing yet: step LeadershipGained to start a term.
func New(cfg Config) (*Core, error) {
	if err := cfg.Fill(); err != nil {
		return nil, err
	}
	roles, _ := assignment.ParseRoleModel(cfg.Roles) // Fill checked it
	return &Core{cfg: cfg, roles: roles, nodes: map[assignment.NodeID]*nodeState{}, est: load.NewEstimator(cfg.Estimator), leases: leases{until: map[assignment.NodeID]time.Time{}},
		dists: quantum.Distributors{}}, nil
}

// Config returns the core's configuration, defaults filled in.
func (c *Core) Config() Config { return c.cfg }

// gain starts term ev.Term from the stored state: the change it proposes records the term.
func (c *Core) gain(now time.Time, ev LeadershipGained, out *Output) {
	fresh, _ := New(c.cfg) // the configuration was checked by New
	*c = *fresh
	c.term = ev.Term
	m := Meta{Algorithm: c.cfg.Algorithm, Params: c.cfg.Params, Configured: configured(c.cfg)}
	summary := fmt.Sprintf("term %d begins", ev.Term)
	if ev.Found {
		st := ev.State
		c.a, m, c.history, c.snapshot = st.Assignment, st.Meta, st.History, st.SnapshotIndex
		for _, n := range st.Nodes {
			// Every node gets a full lease to find the new leader.
			c.nodes[n.ID] = &nodeState{Node: n, lastSeen: now}
		}
		if c.configChanged(&m) {
			summary += fmt.Sprintf("; the config changed: algorithm %s %v", m.Algorithm, m.Params)
		}
	}
	alg, err := c.newAlgorithm(m.Algorithm, m.Params)
	if err != nil {
		out.Reply = &Reply{Err: fmt.Errorf("assigner: the stored algorithm: %w", err)}
		return
	}
	c.alg, c.clock, c.published = alg, max(ev.Clock, m.Clock), m.Clock
	c.carry()
	c.trackHandoffs(now)
	c.takeOfficeLeases(now)
	c.leading = true
	c.nextPass, c.nextClock = now.Add(c.cfg.PassInterval), now.Add(c.cfg.ClockInterval)
	c.expiryAt = c.nextExpiry()
	c.warmUntil = now.Add(c.cfg.LoadWarmUp)
	c.firstMapBy = now.Add(c.cfg.FirstMapWait)
	m.Term = ev.Term
	c.propose(now, &change{write: Write{SaveMeta: true, Meta: m}, kind: kindTerm, summary: summary}, out)
}

// NewAlgorithm builds a balancing algorithm, refusing constants that the store cannot honour
// across a failover.
func NewAlgorithm(name string, params map[string]string) (balance.Algorithm, error) {
	alg, err := balance.New(name, params)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if wm, ok := alg.(*balance.WeightedMove); ok && wm.Config().HoldPasses > Keep {
		return nil, fmt.Errorf("%w: hold_passes=%d: at most %d, the moves a new leader remembers",
			ErrInvalid, wm.Config().HoldPasses, Keep)
	}
	return alg, nil
}

// newAlgorithm builds the algorithm the core runs, wrapped as configured.
func (c *Core) newAlgorithm(name string, params map[string]string) (balance.Algorithm, error) {
	alg, err := NewAlgorithm(name, params)
	if err != nil || c.cfg.WrapAlgorithm == nil {
		return alg, err
	}
	return c.cfg.WrapAlgorithm(alg), nil
}

// Assignment returns the current map (nil before the first node registers), the position of
// the last quantum and the clock.
func (c *Core) Assignment() (*assignment.Assignment, quantum.Position, uint64) {
	return c.a, quantum.Position{Term: c.term, Seq: c.seq}, c.published
}

// Meta returns the state the core stores besides the map and the nodes.
func (c *Core) Meta() Meta { return c.meta }

// Leading reports whether the core leads a term, and which.
func (c *Core) Leading() (uint64, bool) { return c.term, c.leading }

// clockQuantum proposes a clock-only quantum when the source moved since the last quantum,
// so that distributors need not wait for the next change of the map.
func (c *Core) clockQuantum(now time.Time) *change {
	if c.a == nil || c.clock <= c.published {
		return nil
	}
	q := &quantum.Quantum{Position: c.next(), Clock: c.clock, Generation: c.a.Generation(), Cause: "clock", Time: now}
	return &change{write: Write{Meta: c.meta}, quantum: q, after: c.a, kind: kindClock}
}

// setDistributors proposes the set of live distributors, as a reinitializing quantum that
// carries it with the map, or returns nil if the set did not change. Before the first map
// there is nothing to publish: the first map's quantum carries the set.
func (c *Core) setDistributors(d quantum.Distributors, now time.Time) *change {
	if d == nil {
		d = quantum.Distributors{} // none live, which a quantum must say, not leave out
	}
	if c.dists.Equal(d) {
		return nil
	}
	ch := &change{write: Write{Meta: c.meta}, dists: d, kind: kindDistributors}
	if c.a == nil {
		return ch
	}
	ch.quantum = &quantum.Quantum{Position: c.next(), Clock: c.clock, Generation: c.a.Generation(), Snapshot: c.a,
		Distributors: d, Cause: "distributors", Time: now}
	ch.after, ch.summary = c.a, fmt.Sprintf("distributors: %d live", len(d))
	return ch
}

// audit marks ch as made by the call of by, so that the history of quanta says who changed
// what: ch's quantum and log entry get by, and a change that alters no map op (a freeze, a
// pin, a node registered) gets a clock-only quantum of cause and by, which carries no
// operation and so changes nothing for watchers. A change that stores nothing gets nothing.
func (c *Core) audit(ch *change, cause, by string, now time.Time) {
	if q := ch.quantum; q != nil {
		q.By = by
		if ch.write.Entry != nil {
			ch.write.Entry.By = by
		}
		return
	}
	if !ch.write.persists() {
		return
	}
	var gen uint64
	if c.a != nil {
		gen = c.a.Generation()
	}
	ch.quantum = &quantum.Quantum{Position: c.next(), Clock: c.clock, Generation: gen, Cause: cause, By: by, Time: now}
	ch.after = c.a
}

// auditCause is the cause of the quantum of a call's change: the admin calls' causes start
// with "admin: " and the nodes' with "node: ", and both go on with what changed.
func auditCause(call, summary string) string {
	if IsAdmin(call) {
		return "admin: " + summary
	}
	return "node: " + summary
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
func (c *Core) registered() *assignment.NodeSet { return c.registeredAnd() }

// holders returns the nodes a slice may be held by: the registered ones, and Nobody, which
// holds the quarantined ranges.
func (c *Core) holders() *assignment.NodeSet {
	return c.registeredAnd(assignment.Node{ID: assignment.Nobody})
}

// registeredAnd returns every registered node and extra.
func (c *Core) registeredAnd(extra ...assignment.Node) *assignment.NodeSet {
	ns := make([]assignment.Node, 0, len(c.nodes)+len(extra))
	for _, n := range c.nodes {
		ns = append(ns, n.Node.Node)
	}
	return assignment.MustNodeSet(append(ns, extra...)...)
}

// changeMap proposes a change of the map by ops, as one quantum and one log entry.
func (c *Core) changeMap(ops []assignment.Op, moves []balance.Move, cause string, now time.Time) (*change, error) {
	return c.changeMapOn(c.holders(), ops, moves, cause, now)
}

// changeMapOn is changeMap with the map after ops checked against the holders given.
func (c *Core) changeMapOn(holders *assignment.NodeSet, ops []assignment.Op, moves []balance.Move, cause string, now time.Time) (*change, error) {
	ops, err := c.withRoles(ops, now)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPrecondition, err)
	}
	next, ops, err := c.a.Resolve(ops) // a Handoff goes on the wire and into the log as its Assign
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPrecondition, err)
	}
	if err := next.Validate(holders); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPrecondition, err)
	}
	pos := c.next()
	m := c.meta
	m.Term, m.Seq, m.Clock, m.Generation = pos.Term, pos.Seq, c.clock, next.Generation()
	m.LastIndex++
	return &change{
		write: Write{Meta: m, Entry: &Entry{Index: m.LastIndex, Term: pos.Term, Seq: pos.Seq, Clock: c.clock,
			Generation: next.Generation(), Cause: cause, Time: now, Ops: ops, Moves: moves}},
		quantum:  &quantum.Quantum{Position: pos, Clock: c.clock, Generation: next.Generation(), Ops: ops, Cause: cause, Time: now},
		after:    next,
		setMap:   true,
		snapshot: m.LastIndex-c.snapshot >= c.cfg.SnapshotEvery,
	}, nil
}

// pass proposes a balancing pass, or returns nil when there is nothing to do: balancing is
// frozen, no node can hold slices, or the first map waits for FirstMapNodes. The first map
// is made even when balancing is frozen: without it nothing can be served. While the source is lost, a pass is only the clean-up
// of departed nodes (see sourceLost).
func (c *Core) pass(now time.Time) (*change, error) {
	live := c.placement()
	switch {
	case live.Len() == 0:
		return nil, nil
	case c.a == nil && live.Len() < c.cfg.FirstMapNodes && now.Before(c.firstMapBy):
		return nil, nil
	case c.a == nil:
		return c.initial(live, now)
	case c.meta.Frozen:
		return nil, nil
	case c.src.lost, !c.warmedUp(now), c.short(live):
		// A slice short of replicas is topped up before the algorithm weighs the map.
		return c.cleanup(now)
	}
	est := c.est.Fold(c.a, now)
	in := balance.Input{
		Assignment: c.a, Nodes: live, Load: loadOrKeySpace(c.a, est.Loads), Spread: est.Spread, Uncertainty: est.Uncertainty, Keys: est.Keys,
		HotKeys: est.HotKeys, MinReplicas: c.replicasWanted(live),
		Pass: c.meta.Pass, History: c.history, Pinned: c.meta.Pins, Zones: c.zones(live),
	}
	fix, err := c.handoffInput(&in)
	if err != nil {
		return nil, err
	}
	if err := c.quarantineInput(&in); err != nil {
		return nil, err
	}
	res, err := c.alg.Rebalance(in)
	if err != nil {
		return nil, fmt.Errorf("assigner: pass %d: %w", c.meta.Pass, err)
	}
	if err := c.checkQuarantine(res.Ops); err != nil {
		return nil, err
	}
	record := &passRecord{history: res.History, explain: res.Explanation, estimate: est, estimated: in.Assignment}
	algOps, deferred := res.Ops, 0
	if !c.cfg.BreakBeforeMake {
		algOps, deferred = deferMerges(in.Assignment, algOps)
	}
	ops := append(fix, c.asHandoffs(algOps)...)
	if len(ops) == 0 {
		m := c.meta
		m.Pass++ // not stored by itself: after a failover, holds only last longer
		return &change{write: Write{Meta: m}, summary: "pass: no change", pass: record, kind: kindPass}, nil
	}
	var moves []balance.Move
	for _, mv := range res.History {
		if mv.Pass == c.meta.Pass {
			moves = append(moves, mv)
		}
	}
	ch, err := c.changeMap(ops, moves, "pass", now)
	if err != nil {
		// The algorithm's output must always apply and keep I1; if not, it is a bug.
		return nil, fmt.Errorf("assigner: pass %d produced a bad map: %w", c.meta.Pass, err)
	}
	ch.write.Meta.Pass++
	ch.summary = fmt.Sprintf("pass %d: %d ops, imbalance %.3f -> %.3f", c.meta.Pass, len(ops),
		res.Explanation.ImbalanceBefore, res.Explanation.ImbalanceAfter)
	if deferred > 0 {
		ch.summary += fmt.Sprintf(", %d ops deferred until handoffs end", deferred)
	}
	ch.pass, ch.kind = record, kindPass
	return ch, nil
}

// maxErrorBytes bounds the reason of a failed pass that Status and Explain show.
const maxErrorBytes = 512

// passFailed records that a pass failed (it returned err, or its write did), for Status and
// Explain, and asks for the clean-up of departed nodes without the algorithm: whatever made
// the pass fail, no slice may stay on a node that left (I1).
func (c *Core) passFailed(err error, now time.Time, out *Output) {
	msg := err.Error()
	if len(msg) > maxErrorBytes {
		msg = msg[:maxErrorBytes] + "..."
	}
	c.failed = passFailure{count: c.failed.count + 1, err: msg, at: now}
	out.PassFailed = true
	out.Log = append(out.Log, Record{Level: slog.LevelError,
		Msg: "balancing pass failed; cleaning up departed nodes without the algorithm", Attrs: []any{"err", err}})
	c.todo.cleanup = true
}

// cleanup proposes taking the slices of departed nodes off them without the algorithm, or
// returns nil when no slice is held by a departed node. It runs as soon as nodes leave, so
// that their keys are served again without waiting for a pass (and their new holders'
// reports tell that pass what they weigh), and as the fallback for a pass that failed:
// whatever made the algorithm fail, I1 must hold once clean-up has run. A slice keeps its
// live replicas; one left with fewer than the floor (MinReplicas; one by default) gets new
// ones on the live nodes holding the fewest slices, in zones it lacks first.
func (c *Core) cleanup(now time.Time) (*change, error) {
	live, reg := c.placement(), c.registered()
	if c.a == nil || live.Len() == 0 {
		return nil, nil
	}
	held := heldCounts(c.a, live)
	var fix, ops []assignment.Op
	var moves []balance.Move
	want, zones := c.replicasWanted(live), c.zones(live)
	for _, s := range c.a.All() {
		if op, ok := dropDeparted(s, reg); ok && s.InHandoff() {
			fix = append(fix, op)
			continue
		}
		// Nobody stays on a quarantined slice; on a lifted one it is a departed holder.
		gone := func(id assignment.NodeID) bool {
			return !reg.Has(id) && (id != assignment.Nobody || !c.inQuarantine(s.Range))
		}
		keep := slices.DeleteFunc(slices.Clone(s.Replicas), gone)
		short := shortOf(s, live, want)
		if len(keep) == len(s.Replicas) && !short {
			continue
		}
		for _, id := range s.Replicas {
			if gone(id) {
				moves = append(moves, balance.Move{Range: s.Range, From: id, Pass: c.meta.Pass})
			}
		}
		if len(keep) == 0 && c.touchesQuarantine(s.Range) {
			keep = []assignment.NodeID{assignment.Nobody} // no node gets a key of death; isolate cuts it out
		} else if countLive(keep, live) < want {
			added := len(keep)
			keep = topUp(keep, want, live, held, zones)
			for _, to := range keep[added:] {
				moves = append(moves, balance.Move{Range: s.Range, To: to, Pass: c.meta.Pass})
			}
		}
		ops = append(ops, assignment.Assign{Slice: s.Range.Start, Replicas: keep})
	}
	// An orphan's new holder loads it before it serves, as after a pass.
	ops = append(fix, c.asHandoffs(ops)...)
	if len(ops) == 0 {
		return nil, nil
	}
	ch, err := c.changeMap(ops, moves, "cleanup", now)
	if err != nil {
		return nil, fmt.Errorf("assigner: clean-up: %w", err)
	}
	ch.summary = fmt.Sprintf("clean-up without the algorithm: %d slices off departed nodes or short of replicas", len(ops))
	ch.moves, ch.kind = moves, kindCleanup
	return ch, nil
}

// heldCounts returns how many slices of a each node of live holds.
func heldCounts(a *assignment.Assignment, live *assignment.NodeSet) map[assignment.NodeID]int {
	held := make(map[assignment.NodeID]int, live.Len())
	for _, n := range live.Nodes() {
		held[n.ID] = 0
	}
	for _, s := range a.All() {
		for _, id := range s.Replicas {
			if _, ok := held[id]; ok {
				held[id]++
			}
		}
	}
	return held
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
func (c *Core) initial(live *assignment.NodeSet, now time.Time) (*change, error) {
	a, err := c.alg.Initial(balance.Input{Nodes: live})
	if err != nil {
		return nil, fmt.Errorf("assigner: the initial assignment: %w", err)
	}
	if a, err = c.withMinReplicas(a, live); err != nil {
		return nil, fmt.Errorf("assigner: the initial replicas: %w", err)
	}
	if a, err = c.withPrimaries(a, now); err != nil {
		return nil, err
	}
	pos := c.next()
	m := c.meta
	m.Term, m.Seq, m.Clock, m.Generation = pos.Term, pos.Seq, c.clock, a.Generation()
	return &change{
		write:   Write{Init: true, Map: a, Meta: m},
		after:   a,
		setMap:  true,
		quantum: &quantum.Quantum{Position: pos, Clock: c.clock, Generation: a.Generation(), Snapshot: a, Distributors: c.dists, Cause: "initial", Time: now},
		summary: fmt.Sprintf("initial assignment: %d slices over %d nodes", a.Len(), live.Len()),
		kind:    kindPass,
	}, nil
}

// register proposes adding or updating a node, renewing its lease.
func (c *Core) register(n Node, now time.Time) (*change, error) {
	if err := validateNode(n); err != nil {
		return nil, err
	}
	ch := &change{write: Write{Meta: c.meta}, node: &nodeState{Node: n, lastSeen: now}}
	if n.Roles != "" && n.Roles != c.cfg.Roles {
		return nil, fmt.Errorf("%w: node %s expects roles %q; this cluster's are %q (--roles)", ErrPrecondition, n.ID, n.Roles, c.cfg.Roles)
	}
	old, known := c.nodes[n.ID]
	if known && old.Node.Node == n.Node && old.Address == n.Address && maps.Equal(old.Labels, n.Labels) &&
		old.Roles == n.Roles && old.Incarnation == n.Incarnation {
		return ch, nil // a renewal: nothing to store
	}
	ch.write.PutNode, ch.summary = &n, fmt.Sprintf("node %s registered at %q", n.ID, n.Address)
	if known && old.Incarnation != "" && old.Incarnation != n.Incarnation && slices.Contains(c.meta.Draining, n.ID) {
		// A restart: the drain its last process asked for is over, whether it finished or
		// was given up; left on, the new process would be given nothing.
		m := c.meta
		m.Draining = slices.DeleteFunc(slices.Clone(m.Draining), func(d assignment.NodeID) bool { return d == n.ID })
		ch.write.Meta, ch.write.SaveMeta = m, true
		ch.summary += "; it restarted, so its drain ends"
	}
	return ch, nil
}

// validateNode checks a registration: a node nobody can reach, or whose capacity makes its
// load over capacity overflow, must not get slices.
func validateNode(n Node) error {
	if err := n.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	switch {
	case n.ID == assignment.Nobody:
		return fmt.Errorf("%w: node ID %q is reserved: it holds the quarantined ranges", ErrInvalid, n.ID)
	case n.Capacity != 0 && (n.Capacity < MinCapacity || n.Capacity > MaxCapacity):
		return fmt.Errorf("%w: node %s: capacity %g; want 0 (read as 1) or %g..%g", ErrInvalid, n.ID, n.Capacity, MinCapacity, MaxCapacity)
	case n.Address == "":
		return fmt.Errorf("%w: node %s: no address; routers could not reach it", ErrInvalid, n.ID)
	case len(n.Address) > MaxAddressBytes:
		return fmt.Errorf("%w: node %s: address of %d bytes; at most %d", ErrInvalid, n.ID, len(n.Address), MaxAddressBytes)
	case len(n.Incarnation) > MaxIncarnationBytes:
		return fmt.Errorf("%w: node %s: incarnation of %d bytes; at most %d", ErrInvalid, n.ID, len(n.Incarnation), MaxIncarnationBytes)
	case len(n.Labels) > MaxLabels:
		return fmt.Errorf("%w: node %s: %d labels; at most %d", ErrInvalid, n.ID, len(n.Labels), MaxLabels)
	}
	for k, v := range n.Labels {
		if k == "" || len(k) > MaxLabelKeyBytes || len(v) > MaxLabelBytes {
			return fmt.Errorf("%w: node %s: label %s=%s: want a key of 1..%d bytes and a value of at most %d",
				ErrInvalid, n.ID, keyspace.Quote(k), keyspace.Quote(v), MaxLabelKeyBytes, MaxLabelBytes)
		}
	}
	return nil
}

// heartbeat renews a node's lease and says whether it is draining.
func (c *Core) heartbeat(id assignment.NodeID, now time.Time) (draining bool, err error) {
	n, ok := c.nodes[id]
	if !ok {
		return false, fmt.Errorf("%w: %s is not registered (register again)", ErrUnknownNode, id)
	}
	n.lastSeen = now
	return slices.Contains(c.meta.Draining, id), nil
}

// report records a node's load report; it renews the node's lease too.
func (c *Core) report(r load.Report, now time.Time) error {
	if err := c.checkReport(r); err != nil {
		return err
	}
	return c.record(r, now)
}

// record adds a report checkReport took to the estimator.
func (c *Core) record(r load.Report, now time.Time) error {
	if err := c.est.Add(r); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	n := c.nodes[r.Node]
	n.lastSeen, n.reported = now, true
	return nil
}

// checkReport says why report would refuse r, or nil.
func (c *Core) checkReport(r load.Report) error {
	n, ok := c.nodes[r.Node]
	if !ok {
		return fmt.Errorf("%w: %s is not registered, so its load cannot be counted", ErrUnknownNode, r.Node)
	}
	// Refused whole before the estimator sees it: one value out of bounds would make sums
	// infinite, and every pass after fail.
	if err := r.Check(load.Cap(c.cfg.MaxLoadRate, r.Window, n.Weight())); err != nil {
		return fmt.Errorf("%w: node %s: %w", ErrInvalid, r.Node, err)
	}
	if err := r.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// warmedUp reports whether a new leader has the load to balance on: every node holding a
// slice has reported since the term began, or LoadWarmUp has passed (see Config).
func (c *Core) warmedUp(now time.Time) bool {
	if c.warm || !now.Before(c.warmUntil) {
		c.warm = true
		return true
	}
	for _, s := range c.a.All() {
		for _, id := range s.Replicas {
			if n := c.nodes[id]; n != nil && !n.reported {
				return false
			}
		}
	}
	c.warm = true
	return true
}

// deregister proposes taking a node out at once or, with a grace, keeps it and its slices
// for that long (at most MaxGrace): the node restarts with its store and resumes from its
// cursor, so moving its slices away and back would cost two loads for nothing.
func (c *Core) deregister(id assignment.NodeID, grace time.Duration, now time.Time) (*change, error) {
	n, ok := c.nodes[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s is not registered", ErrUnknownNode, id)
	}
	if grace > 0 {
		n.awayUntil = now.Add(min(grace, c.cfg.MaxGrace))
		return nil, nil
	}
	return c.removeNodes([]assignment.NodeID{id}, "deregistered"), nil
}

// lapses returns when node n's lease lapses: NodeTTL after it was last seen, or when the
// grace of a restart it announced ends, whichever is later.
func (c *Core) lapses(n *nodeState) time.Time {
	return later(n.lastSeen.Add(c.cfg.NodeTTL), n.awayUntil)
}

// nextExpiry returns when the first lease of a node lapses; zero for no node.
func (c *Core) nextExpiry() time.Time {
	var first time.Time
	for _, n := range c.nodes {
		if t := c.lapses(n); first.IsZero() || t.Before(first) {
			first = t
		}
	}
	return first
}

// expire proposes taking out the nodes whose lease lapsed, or returns nil.
func (c *Core) expire(now time.Time) *change {
	var gone []assignment.NodeID
	c.expiryAt = time.Time{}
	for id, n := range c.nodes {
		switch t := c.lapses(n); {
		case !now.Before(t):
			gone = append(gone, id)
		case c.expiryAt.IsZero() || t.Before(c.expiryAt):
			c.expiryAt = t
		}
	}
	if len(gone) == 0 {
		return nil
	}
	slices.Sort(gone)
	ch := c.removeNodes(gone, "lease expired")
	ch.kind = kindExpiry
	crashes, found := c.detectCrashes(gone, now)
	causes := c.judgeCrashed(ch, gone, now)
	if cause := c.quarantine(ch, crashes, found); cause != "" {
		causes = append(causes, cause)
	}
	if len(causes) > 0 {
		c.audit(ch, strings.Join(causes, "; "), "", now)
	}
	return ch
}

// refreshNodes gives every node a full lease from now, as a new leader does: after the
// leader itself was away, their last heartbeats say nothing about them.
func (c *Core) refreshNodes(now time.Time) {
	for _, n := range c.nodes {
		n.lastSeen = now
	}
	c.expiryAt = c.nextExpiry()
}

// removeNodes proposes forgetting nodes; the clean-up that follows moves their slices.
func (c *Core) removeNodes(ids []assignment.NodeID, why string) *change {
	m := c.meta
	m.Draining = slices.DeleteFunc(slices.Clone(m.Draining), func(d assignment.NodeID) bool { return slices.Contains(ids, d) })
	return &change{
		write:   Write{DeleteNodes: ids, SaveMeta: len(m.Draining) != len(c.meta.Draining), Meta: m},
		summary: fmt.Sprintf("nodes %v left: %s", ids, why),
		forget:  ids,
	}
}

// Loads returns the current map and its slices' estimated loads, for the web view's history.
// Both are the core's: read them in the leader's loop, and do not modify them.
func (c *Core) Loads() (*assignment.Assignment, []float64) { return c.a, c.current.Loads }
