package core

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// SliceRef names a slice: the one starting exactly at Start, or the one holding Key or Hash.
// Exactly one must be set.
type SliceRef struct {
	Start *uint64
	Key   []byte
	Hash  *uint64
}

func (r SliceRef) String() string {
	switch {
	case r.Start != nil:
		return "the slice starting at " + keyspace.FormatPoint(*r.Start)
	case r.Key != nil:
		return "the slice holding key " + keyspace.Quote(string(r.Key))
	case r.Hash != nil:
		return "the slice holding hash " + keyspace.FormatPoint(*r.Hash)
	}
	return "no slice"
}

func (c *Core) resolve(ref SliceRef) (int, assignment.Slice, error) {
	if c.a == nil {
		return 0, assignment.Slice{}, ErrNoMap
	}
	switch {
	case ref.Start != nil:
		i, ok := c.a.Find(*ref.Start)
		if !ok {
			j, s := c.a.Lookup(*ref.Start)
			return 0, assignment.Slice{}, fmt.Errorf("%w: no slice starts at %s (it lies inside slice %d, %s)",
				ErrInvalid, keyspace.FormatPoint(*ref.Start), j, s.Range)
		}
		return i, c.a.Slice(i), nil
	case ref.Key != nil:
		i, s := c.a.Lookup(keyspace.Hash(ref.Key))
		return i, s, nil
	case ref.Hash != nil:
		i, s := c.a.Lookup(*ref.Hash)
		return i, s, nil
	}
	return 0, assignment.Slice{}, fmt.Errorf("%w: no slice given (give its start, a key or a hash)", ErrInvalid)
}

// move proposes giving a slice a new replica set. Moving a slice to where it is changes
// nothing and succeeds.
func (c *Core) move(ref SliceRef, to []assignment.NodeID, now time.Time) (*change, error) {
	_, s, err := c.resolve(ref)
	if err != nil {
		return nil, err
	}
	reps := slices.Sorted(slices.Values(to))
	if len(reps) == 0 {
		return nil, fmt.Errorf("%w: moving %s to no node", ErrInvalid, s.Range)
	}
	if c.touchesQuarantine(s.Range) {
		return nil, fmt.Errorf("%w: %s is quarantined (its holders crashed on it); lift it first (unquarantine)", ErrPrecondition, s.Range)
	}
	for i, id := range reps {
		if err := id.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if i > 0 && reps[i-1] == id {
			return nil, fmt.Errorf("%w: node %s is listed twice", ErrInvalid, id)
		}
		if _, ok := c.nodes[id]; !ok {
			return nil, fmt.Errorf("%w: %s is not registered", ErrUnknownNode, id)
		}
		if slices.Contains(c.meta.Draining, id) {
			return nil, fmt.Errorf("%w: %s is draining; it takes no slices", ErrPrecondition, id)
		}
	}
	if !c.cfg.BreakBeforeMake {
		s.Replicas = s.Target() // where a handoff under way takes it, which a move redirects
	}
	if slices.Equal(reps, s.Replicas) {
		return &change{write: Write{Meta: c.meta}, summary: fmt.Sprintf("%s is already held by %s", s.Range, assignment.FormatReplicas(reps))}, nil
	}
	moves := replicaMoves(s, reps, c.meta.Pass)
	summary := fmt.Sprintf("move %s from %s to %s", s.Range, assignment.FormatReplicas(s.Replicas), assignment.FormatReplicas(reps))
	ops := c.asHandoffs([]assignment.Op{assignment.Assign{Slice: s.Range.Start, Replicas: reps}})
	ch, err := c.changeMap(ops, moves, "admin: "+summary, now)
	if err != nil {
		return nil, err
	}
	ch.summary, ch.moves = summary, moves
	return ch, nil
}

// replicaMoves records giving slice s the replicas reps as the algorithm's moves would be,
// so that passes do not undo it at once: a replica that leaves for another is one move from
// the first to the second (a pass checks that pair), a replica dropped or added alone is a
// move from or to no node.
func replicaMoves(s assignment.Slice, reps []assignment.NodeID, pass uint64) []balance.Move {
	var gone, added []assignment.NodeID
	for _, id := range s.Replicas {
		if !slices.Contains(reps, id) {
			gone = append(gone, id)
		}
	}
	for _, id := range reps {
		if !slices.Contains(s.Replicas, id) {
			added = append(added, id)
		}
	}
	var moves []balance.Move
	for i := range max(len(gone), len(added)) {
		m := balance.Move{Range: s.Range, Pass: pass}
		if i < len(gone) {
			m.From = gone[i]
		}
		if i < len(added) {
			m.To = added[i]
		}
		moves = append(moves, m)
	}
	return moves
}

// split proposes cutting a slice at a point, by default its middle.
func (c *Core) split(ref SliceRef, at *uint64, now time.Time) (*change, error) {
	_, s, err := c.resolve(ref)
	if err != nil {
		return nil, err
	}
	point, ok := s.Range.Midpoint()
	if at != nil {
		point = *at
	} else if !ok {
		return nil, fmt.Errorf("%w: %s holds one point and cannot be split", ErrPrecondition, s.Range)
	}
	if _, _, err := s.Range.Split(point); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	summary := fmt.Sprintf("split %s at %s", s.Range, keyspace.FormatPoint(point))
	ch, err := c.changeMap([]assignment.Op{assignment.Split{Slice: s.Range.Start, At: point}}, nil, "admin: "+summary, now)
	if err != nil {
		return nil, err
	}
	ch.summary = summary
	return ch, nil
}

// merge proposes joining two adjacent slices; the right one takes the left one's replicas.
func (c *Core) merge(left, right SliceRef, now time.Time) (*change, error) {
	i, l, err := c.resolve(left)
	if err != nil {
		return nil, err
	}
	j, r, err := c.resolve(right)
	if err != nil {
		return nil, err
	}
	if j != i+1 {
		return nil, fmt.Errorf("%w: %s and %s are not adjacent, left then right", ErrPrecondition, l.Range, r.Range)
	}
	if c.touchesQuarantine(l.Range) || c.touchesQuarantine(r.Range) {
		// The merged slice would be held by one replica set: a node would get the
		// quarantined range, or no node the other.
		return nil, fmt.Errorf("%w: %s or %s is quarantined; lift it first (unquarantine)", ErrPrecondition, l.Range, r.Range)
	}
	if l.InHandoff() || r.InHandoff() {
		// A loading node of one would be taken as loaded for the other by its heartbeats.
		return nil, fmt.Errorf("%w: %s or %s is in handoff; merge once it ends", ErrPrecondition, l.Range, r.Range)
	}
	var ops []assignment.Op
	if !slices.Equal(l.Replicas, r.Replicas) {
		ops = append(ops, assignment.Assign{Slice: r.Range.Start, Replicas: l.Replicas})
	}
	ops = append(ops, assignment.Merge{Left: l.Range.Start})
	summary := fmt.Sprintf("merge %s and %s on %s", l.Range, r.Range, assignment.FormatReplicas(l.Replicas))
	ch, err := c.changeMap(ops, nil, "admin: "+summary, now)
	if err != nil {
		return nil, err
	}
	ch.summary = summary
	return ch, nil
}

// pin proposes keeping a slice's range where it is; balancing passes will not touch it.
func (c *Core) pin(ref SliceRef) (*change, keyspace.Range, error) {
	_, s, err := c.resolve(ref)
	if err != nil {
		return nil, keyspace.Range{}, err
	}
	if slices.Contains(c.meta.Pins, s.Range) {
		// Idempotent, as etcd's and PD's label and placement writes are: asking for what
		// holds already succeeds and changes nothing.
		return &change{write: Write{Meta: c.meta}, summary: fmt.Sprintf("%s is already pinned", s.Range)}, s.Range, nil
	}
	m := c.meta
	m.Pins = append(slices.Clone(m.Pins), s.Range)
	return &change{write: Write{SaveMeta: true, Meta: m}, summary: fmt.Sprintf("pin %s", s.Range)}, s.Range, nil
}

// unpin proposes removing the pins that overlap a slice. Unpinning a slice that is not
// pinned succeeds and changes nothing, as pinning a pinned one does.
func (c *Core) unpin(ref SliceRef) (*change, keyspace.Range, error) {
	_, s, err := c.resolve(ref)
	if err != nil {
		return nil, keyspace.Range{}, err
	}
	m := c.meta
	m.Pins = slices.DeleteFunc(slices.Clone(m.Pins), func(p keyspace.Range) bool { return p.Overlaps(s.Range) })
	if len(m.Pins) == len(c.meta.Pins) {
		return &change{write: Write{Meta: c.meta}, summary: fmt.Sprintf("%s is not pinned", s.Range)}, s.Range, nil
	}
	return &change{write: Write{SaveMeta: true, Meta: m}, summary: fmt.Sprintf("unpin %s", s.Range)}, s.Range, nil
}

// drain proposes emptying a node (or, with cancel, stopping that). It returns how many
// slices the node holds now.
func (c *Core) drain(id assignment.NodeID, cancel bool) (*change, int, error) {
	if _, ok := c.nodes[id]; !ok {
		return nil, 0, fmt.Errorf("%w: %s is not registered", ErrUnknownNode, id)
	}
	held := c.holds(id)
	m := c.meta
	draining := slices.Contains(m.Draining, id)
	switch {
	case cancel && !draining:
		return nil, 0, fmt.Errorf("%w: %s is not draining", ErrPrecondition, id)
	case cancel:
		m.Draining = slices.DeleteFunc(slices.Clone(m.Draining), func(d assignment.NodeID) bool { return d == id })
		return &change{write: Write{SaveMeta: true, Meta: m}, summary: fmt.Sprintf("stop draining %s", id)}, held, nil
	case draining && len(m.Draining) >= len(c.nodes):
		// A whole cluster stopping: each drain would wait for a node to hand to, in vain.
		return nil, 0, fmt.Errorf("%w: every node is draining: %s has no node to hand its slices to", ErrPrecondition, id)
	case draining:
		return &change{write: Write{Meta: m}, summary: fmt.Sprintf("%s is already draining", id)}, held, nil
	case len(m.Draining)+1 >= len(c.nodes):
		return nil, 0, fmt.Errorf("%w: draining %s would leave no node to hold its slices", ErrPrecondition, id)
	}
	m.Draining = append(slices.Clone(m.Draining), id)
	slices.Sort(m.Draining)
	return &change{write: Write{SaveMeta: true, Meta: m}, summary: fmt.Sprintf("drain %s (%d slices)", id, held)}, held, nil
}

func (c *Core) holds(id assignment.NodeID) int {
	if c.a == nil {
		return 0
	}
	n := 0
	for _, s := range c.a.All() {
		if s.Holds(id) {
			n++
		}
	}
	return n
}

// freeze proposes stopping balancing passes.
func (c *Core) freeze(reason string) *change {
	m := c.meta
	m.Frozen, m.FreezeReason = true, reason
	return &change{write: Write{SaveMeta: true, Meta: m}, summary: fmt.Sprintf("freeze balancing: %q", reason)}
}

// unfreeze proposes resuming balancing passes.
func (c *Core) unfreeze() *change {
	m := c.meta
	m.Frozen, m.FreezeReason = false, ""
	return &change{write: Write{SaveMeta: true, Meta: m}, summary: "unfreeze balancing"}
}

// setAlgorithm proposes another balancing algorithm or other constants.
func (c *Core) setAlgorithm(name string, params map[string]string) (*change, error) {
	alg, err := c.newAlgorithm(name, params)
	if err != nil {
		return nil, err
	}
	m := c.meta
	m.Algorithm, m.Params = name, maps.Clone(params)
	return &change{write: Write{SaveMeta: true, Meta: m}, summary: fmt.Sprintf("algorithm %s %v", name, params), alg: alg}, nil
}

// Status is what Core knows about itself.
type Status struct {
	Position   quantum.Position
	Clock      uint64
	Generation uint64
	Imbalance  float64
	Slices     int
	Nodes      int
	Frozen     bool
	Reason     string
	Algorithm  string
	Params     map[string]string
	LastPass   time.Time
	Pinned     []keyspace.Range
	// PassFailures counts the passes that failed in a row; PassError says why the last
	// failed one did, at PassErrorTime (zero if none has failed in this term).
	PassFailures  uint64
	PassError     string
	PassErrorTime time.Time
	// Handoffs counts the slices in handoff.
	Handoffs int
	// SourceError, when not empty, says why the source cannot be followed, since
	// SourceLostSince (SourceMisconfigured: no retry mends it); balancing passes are held.
	SourceError         string
	SourceLostSince     time.Time
	SourceMisconfigured bool
	// Quarantined lists the ranges no node holds (see quarantine.go).
	Quarantined []Quarantine
	// Roles, Exclusive and NodeTTL are the core's Config.Roles, Exclusive and NodeTTL.
	Roles     string
	Exclusive bool
	NodeTTL   time.Duration
	// MinReplicas is how many replicas every slice keeps (Config.MinReplicas, 1 at least).
	MinReplicas int
}

// Status returns the core's status.
func (c *Core) Status() Status {
	st := Status{
		Position: quantum.Position{Term: c.term, Seq: c.seq}, Clock: c.published, Nodes: len(c.nodes),
		Frozen: c.meta.Frozen, Reason: c.meta.FreezeReason, Algorithm: c.meta.Algorithm, Params: c.meta.Params,
		LastPass: c.lastPass, Pinned: c.meta.Pins, Imbalance: 1,
		PassFailures: c.failed.count, PassError: c.failed.err, PassErrorTime: c.failed.at, Handoffs: c.Handoffs(),
		SourceError: c.src.err, SourceLostSince: c.src.since, SourceMisconfigured: c.src.misconfigured,
		Quarantined: c.meta.Quarantined, Roles: c.cfg.Roles, Exclusive: c.cfg.Exclusive, NodeTTL: c.cfg.NodeTTL,
		MinReplicas: max(1, c.cfg.MinReplicas),
	}
	if c.a != nil {
		st.Generation, st.Slices = c.a.Generation(), c.a.Len()
		st.Imbalance = load.Imbalance(load.NodeLoads(c.a, c.current.Loads, c.placement()))
	}
	return st
}

// carry carries the last pass's estimates over to the current map. The commit of a change
// of either calls it, so that reads, which status queries and metrics make often, only read.
func (c *Core) carry() {
	n := 0
	if c.a != nil {
		n = c.a.Len()
	}
	est := load.Estimate{Loads: make([]float64, n), Keys: make([]float64, n)}
	if c.estimated != nil && c.a != nil {
		loads, err1 := load.Reproject(c.estimated, c.estimate.Loads, c.a)
		keys, err2 := load.Reproject(c.estimated, c.estimate.Keys, c.a)
		if err1 != nil || err2 != nil {
			panic(fmt.Sprintf("assigner: estimates of a validated map are invalid: %v %v", err1, err2))
		}
		est = load.Estimate{Loads: loads, Keys: keys}
	}
	c.current = est
}

// NodeInfo describes a registered node.
type NodeInfo struct {
	Node
	Draining bool
	Slices   int
	// Loading counts the slices it is loading (make-before-break); Primaries, those it is
	// the primary of (with roles).
	Loading, Primaries int
	// Load is the node's estimated load over its capacity.
	Load     float64
	LastSeen time.Time
	// Idle says why the node holds no slice, when it holds none.
	Idle string
}

// Nodes lists the registered nodes by ID.
func (c *Core) Nodes() []NodeInfo {
	reg := c.registered()
	out := make([]NodeInfo, reg.Len())
	for i, n := range reg.Nodes() {
		st := c.nodes[n.ID]
		out[i] = NodeInfo{Node: st.Node, Draining: slices.Contains(c.meta.Draining, n.ID), LastSeen: st.lastSeen}
	}
	if c.a == nil {
		return out
	}
	for i, l := range load.NodeLoads(c.a, c.current.Loads, reg) {
		out[i].Load = l
	}
	for _, s := range c.a.All() { // one pass over the map, not one per node
		for _, id := range s.Replicas {
			if i, ok := reg.Index(id); ok {
				out[i].Slices++
				if s.IsLoading(id) {
					out[i].Loading++
				}
			}
		}
		if i, ok := reg.Index(s.Primary); ok && s.Primary != "" {
			out[i].Primaries++
		}
	}
	for i := range out {
		if out[i].Slices == 0 {
			out[i].Idle = c.idle(out[i].Draining)
		}
	}
	return out
}

// idle says why a node holds no slice: what holds the passes that would give it some.
func (c *Core) idle(draining bool) string {
	switch {
	case draining:
		return "draining: it takes no slice until the drain is cancelled (slicectl drain ID --cancel) or it restarts"
	case c.a == nil:
		return "no map yet: the first waits for --first-map-nodes nodes, or --first-map-wait"
	case c.meta.Frozen:
		return "balancing is frozen (slicectl unfreeze): no pass moves a slice to it"
	case c.src.lost:
		return "balancing passes are held until the data source answers"
	case !c.warm:
		return "a new leader waits for the nodes' load reports before it balances"
	}
	return "balanced without it: a pass moves slices to it once the imbalance is past the algorithm's dead band"
}

// SliceInfo describes a slice.
type SliceInfo struct {
	assignment.Slice
	Load, Keys float64
	Pinned     bool
}

// Slices lists the slices, of one node if node is set, hottest first if byLoad, at most
// limit of them; it also returns how many matched.
func (c *Core) Slices(node assignment.NodeID, byLoad bool, limit int) ([]SliceInfo, int, error) {
	if c.a == nil {
		return nil, 0, nil
	}
	if node != "" {
		if _, ok := c.nodes[node]; !ok {
			return nil, 0, fmt.Errorf("%w: %s is not registered", ErrUnknownNode, node)
		}
	}
	est := c.current
	var out []SliceInfo
	for i, s := range c.a.All() {
		if node != "" && !s.Holds(node) {
			continue
		}
		pinned := slices.ContainsFunc(c.meta.Pins, func(p keyspace.Range) bool { return p.Overlaps(s.Range) })
		out = append(out, SliceInfo{Slice: s, Load: est.Loads[i], Keys: est.Keys[i], Pinned: pinned})
	}
	if byLoad {
		slices.SortStableFunc(out, func(a, b SliceInfo) int { return cmp.Compare(b.Load, a.Load) })
	}
	total := len(out)
	return out[:min(len(out), limit)], total, nil
}

// Explain returns the explanation of the last pass of this term, if any ran, and of the
// passes that failed.
func (c *Core) Explain() Explanation {
	x := Explanation{Position: quantum.Position{Term: c.term, Seq: c.seq},
		Failures: c.failed.count, Error: c.failed.err, ErrorTime: c.failed.at, Quarantined: c.meta.Quarantined}
	if c.explain != nil {
		x.Explanation, x.Passed = *c.explain, true
	}
	return x
}
