package core

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// Make-before-break (I7 in docs/DESIGN.md), the assigner's side. With
// Config.BreakBeforeMake (false by default), every move a pass or an operator makes is an
// assignment.Handoff: the nodes that gain the slice load it while the nodes that lose it
// keep serving it. The map carries the handoff, so that a new leader finds it; what the
// core keeps beside it in memory is when it saw each one begin, for the timeout. A handoff
// ends in one of three ways: every loading node reports the slice loaded in its heartbeat
// (the new nodes serve; the leaving nodes linger, serving too, for HandoffLinger, then drop
// it), it times out (the loading nodes drop it, the leaving ones stay), or the nodes it
// moves to leave the cluster (the same as a timeout). The linger is for readers: a router
// or node that has not applied the quantum that made the new nodes serving still sends
// reads to the old ones, and they must not have dropped the data yet. Handoffs found
// in the map are finished and timed out whether or not the switch is on, so that turning it
// off never strands one.

// handoffs is what the core tracks of the handoffs under way in its map.
type handoffs struct {
	slices []int                // the indices in the map of the slices in handoff, in order
	begun  map[uint64]time.Time // a handoff's start generation -> when this core saw it begin
	served map[uint64]time.Time // a lingering handoff's start generation -> when its new nodes served
	// demoting holds the start generations of lingering handoffs whose primary hands its
	// role over: they linger until it has (or HandoffTimeout after they served).
	demoting map[uint64]bool
	// named holds, by slice start, the map generation at which this core first saw the
	// slice name a Next: its primary's heartbeat promotes Next only from that generation on,
	// so that a heartbeat from before the member saw the handover (it may not have become
	// primary yet) is not taken for its demotion.
	named map[uint64]naming
	// unclaimed holds, by slice start, the start generations of lingering slices whose
	// primary, a member acting on roles, has not claimed the role in a heartbeat since it
	// was promoted: their leaving replicas wait for the claim (or HandoffTimeout after they
	// served), so that the old primary lets go only once the new one has become primary.
	unclaimed map[uint64]uint64
	retry     time.Time // no rollback before then: the last one's write failed
}

// naming is when a slice's Next was named: the map generation at which this core first saw
// it.
type naming struct {
	next assignment.NodeID
	gen  uint64
}

// handoffEnd counts the handoffs a change ends, with how long each of the completed ones
// took.
type handoffEnd struct {
	completed, rolledBack int
	durations             []time.Duration
	// promoted and forced count the primaries handed over after a demotion and without
	// one (roles.go).
	promoted, forced int
}

// HandoffStats is what one step did to handoffs, for metrics: how many began, completed
// and were rolled back, and how long each completed one took.
type HandoffStats struct {
	Started, Completed, RolledBack int
	Durations                      []time.Duration
	// Promoted and Forced count the successors promoted after their primary demoted
	// itself, and after --handoff-timeout without it.
	Promoted, Forced int
}

// trackHandoffs finds the handoffs of the map after it changed, starting the clock of each
// new one at now (the time the core committed it, or took over a map that had it), and
// returns how many slices the map's last change put in handoff.
func (c *Core) trackHandoffs(now time.Time) int {
	ho := &c.ho
	ho.slices = ho.slices[:0]
	if c.a == nil {
		ho.begun = nil
		return 0
	}
	started, gen := 0, c.a.Generation()
	loading, lingering := map[uint64]bool{}, map[uint64]bool{}
	ho.demoting, ho.unclaimed = map[uint64]bool{}, map[uint64]uint64{}
	named := map[uint64]naming{}
	for i, s := range c.a.All() {
		if !s.InHandoff() {
			continue
		}
		ho.slices = append(ho.slices, i)
		if s.Lingering() {
			lingering[s.Since] = true
			ho.served = startClock(ho.served, s.Since, now)
			ho.demoting[s.Since] = ho.demoting[s.Since] || demoting(s)
			if c.awaitsClaim(s) {
				ho.unclaimed[s.Range.Start] = s.Since
			}
			if n, ok := ho.named[s.Range.Start]; ok && n.next == s.Next {
				named[s.Range.Start] = n
			} else if s.Next != "" {
				named[s.Range.Start] = naming{next: s.Next, gen: gen}
			}
			continue
		}
		loading[s.Since] = true
		ho.begun = startClock(ho.begun, s.Since, now)
		if s.Since == gen {
			started++
		}
	}
	ho.named = named
	maps.DeleteFunc(ho.begun, func(since uint64, _ time.Time) bool { return !loading[since] })
	maps.DeleteFunc(ho.served, func(since uint64, _ time.Time) bool { return !lingering[since] })
	return started
}

// startClock records now as the time of key in m, unless it has one.
func startClock(m map[uint64]time.Time, key uint64, now time.Time) map[uint64]time.Time {
	if m == nil {
		m = map[uint64]time.Time{}
	}
	if _, ok := m[key]; !ok {
		m[key] = now
	}
	return m
}

// creditHandoffs gives the handoffs under way back the time gap the driver was away, up to
// now: the heartbeats that would have ended them may have waited unread meanwhile, as
// refreshNodes assumes of leases.
func (c *Core) creditHandoffs(now time.Time, gap time.Duration) {
	for _, m := range []map[uint64]time.Time{c.ho.begun, c.ho.served} {
		for since, t := range m {
			if t = t.Add(gap); t.After(now) {
				t = now
			}
			m[since] = t
		}
	}
}

// Handoffs returns how many slices are in handoff.
func (c *Core) Handoffs() int { return len(c.ho.slices) }

// asHandoffs turns the Assigns of ops into Handoffs, when moves are make-before-break:
// every registered node may stay as a leaving replica, departed ones may not.
func (c *Core) asHandoffs(ops []assignment.Op) []assignment.Op {
	if c.cfg.BreakBeforeMake {
		return ops
	}
	live := c.registered()
	out := make([]assignment.Op, len(ops))
	for i, op := range ops {
		out[i] = op
		if a, ok := op.(assignment.Assign); ok {
			out[i] = assignment.Handoff{Slice: a.Slice, Replicas: a.Replicas, Live: live}
		}
	}
	return out
}

// handoffInput adapts a pass's input to the handoffs under way, if any (the map is not
// copied otherwise, so that passes without handoffs cost what they did). It returns the
// operations that take departed nodes out of handoffs, which go before the pass's own; the
// input's map is the map after them, with each slice in handoff at its Target replica set
// (the load of a move under way counts at its destination at once, as PD's operator
// influence does) and pinned, so that the pass neither moves, splits nor merges it again
// until the handoff is done, clean-up off departed nodes aside.
func (c *Core) handoffInput(in *balance.Input) ([]assignment.Op, error) {
	if len(c.ho.slices) == 0 {
		return nil, nil
	}
	reg := c.registered()
	var fix []assignment.Op
	for _, i := range c.ho.slices {
		if op, ok := dropDeparted(c.a.Slice(i), reg); ok {
			fix = append(fix, op)
		}
	}
	a, err := c.a.Apply(fix)
	if err != nil {
		return nil, fmt.Errorf("assigner: taking departed nodes out of handoffs: %w", err)
	}
	pins := slices.Clone(in.Pinned)
	for _, i := range c.ho.slices { // fix changes no range
		if s := a.Slice(i); s.InHandoff() {
			pins = append(pins, s.Range)
		}
	}
	in.Assignment, in.Pinned = a.AtTarget(), pins
	return fix, nil
}

// dropDeparted returns the Assign that takes the departed nodes out of slice s, in handoff,
// or false if none of its replicas departed or none is left (clean-up places it anew). A
// handoff whose every loading node departed is rolled back: its leaving nodes stay.
func dropDeparted(s assignment.Slice, reg *assignment.NodeSet) (assignment.Assign, bool) {
	gone := func(id assignment.NodeID) bool { return !reg.Has(id) }
	if !slices.ContainsFunc(s.Replicas, gone) {
		return assignment.Assign{}, false
	}
	keep := slices.DeleteFunc(slices.Clone(s.Replicas), gone)
	loading := slices.DeleteFunc(slices.Clone(s.Loading), gone)
	leaving := slices.DeleteFunc(slices.Clone(s.Leaving), gone)
	switch {
	case len(loading) > 0:
		return assignment.Assign{Slice: s.Range.Start, Replicas: keep, Loading: loading, Leaving: leaving, Since: s.Since}, true
	case len(keep) > 0:
		return assignment.Assign{Slice: s.Range.Start, Replicas: keep}, true
	}
	return assignment.Assign{}, false
}

// loaded proposes the change a node's heartbeat makes to the handoffs it takes part in, or
// returns nil: each slice the node loads that the readiness rule finds loaded (the node
// applied the generation the handoff began at, and lists no part of it as loading) stops
// loading, and a slice with no loading node left ends its handoff, its leaving nodes
// dropping it. One change at most, whatever the number of slices.
func (c *Core) loaded(hb Heartbeat, now time.Time) (*change, error) {
	var ops []assignment.Op
	var end handoffEnd
	for _, i := range c.ho.slices {
		s := c.a.Slice(i)
		if !s.IsLoading(hb.Node) || hb.Generation < s.Since || overlapsAny(hb.Loading, s.Range) {
			continue
		}
		if rest := slices.DeleteFunc(slices.Clone(s.Loading), func(id assignment.NodeID) bool { return id == hb.Node }); len(rest) > 0 {
			ops = append(ops, assignment.Assign{Slice: s.Range.Start, Replicas: s.Replicas, Loading: rest, Leaving: s.Leaving, Since: s.Since})
			continue
		}
		if len(s.Leaving) == 0 {
			ops = append(ops, assignment.Assign{Slice: s.Range.Start, Replicas: s.Replicas})
		} else { // the new nodes serve; the old ones linger, serving too, then drop it (expire)
			ops = append(ops, assignment.Assign{Slice: s.Range.Start, Replicas: s.Replicas, Leaving: s.Leaving, Since: s.Since})
		}
		end.completed++
		end.durations = append(end.durations, now.Sub(c.ho.begun[s.Since]))
	}
	loaded := len(ops)
	promoted := c.promote(hb)
	claimed := c.claimed(hb.Node, now)
	ops = append(append(ops, promoted...), claimed...)
	if len(ops) == 0 {
		return nil, nil
	}
	var parts []string
	if loaded > 0 {
		parts = append(parts, fmt.Sprintf("loaded %d slices (%d handoffs done)", loaded, end.completed))
	}
	if len(promoted) > 0 {
		parts = append(parts, fmt.Sprintf("handed over the primary role of %d slices", len(promoted)))
	}
	if len(claimed) > 0 {
		parts = append(parts, fmt.Sprintf("took the primary role of %d slices, which their old primaries leave", len(claimed)))
	}
	summary := fmt.Sprintf("node %s %s", hb.Node, strings.Join(parts, " and "))
	ch, err := c.changeMap(ops, nil, "node: "+summary, now)
	if err != nil {
		return nil, fmt.Errorf("assigner: ending handoffs: %w", err)
	}
	end.promoted = len(promoted)
	ch.summary, ch.kind, ch.ended = summary, kindLoaded, end
	return ch, nil
}

// loadedOrLog is loaded for a heartbeat, which succeeds whether or not the handoffs it ends
// can be: a map still holding a departed node until the next pass takes it out refuses
// every change, and the node's next heartbeat ends them.
func (c *Core) loadedOrLog(hb Heartbeat, now time.Time, out *Output) *change {
	ch, err := c.loaded(hb, now)
	if err != nil {
		out.Log = append(out.Log, Record{Level: slog.LevelWarn, Msg: "handoffs not ended", Attrs: []any{"node", hb.Node, "err", err}})
	}
	return ch
}

func overlapsAny(rs []keyspace.Range, r keyspace.Range) bool {
	return slices.ContainsFunc(rs, r.Overlaps)
}

// handoffDeadline returns when the next handoff times out or stops lingering, if any is
// under way.
func (c *Core) handoffDeadline() (time.Time, bool) {
	var first time.Time
	earliest := func(t time.Time) {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	for _, t := range c.ho.begun {
		earliest(t.Add(c.cfg.HandoffTimeout))
	}
	unclaimed := map[uint64]bool{}
	for _, since := range c.ho.unclaimed {
		unclaimed[since] = true
	}
	for since, t := range c.ho.served {
		if c.ho.demoting[since] || unclaimed[since] { // it waits for a heartbeat, or the timeout
			earliest(t.Add(c.cfg.HandoffTimeout))
			continue
		}
		earliest(t.Add(c.cfg.HandoffLinger))
	}
	if first.IsZero() {
		return first, false
	}
	return later(first, c.ho.retry), true
}

// rollback proposes ending the handoffs that are due, or returns nil: those that lingered
// for HandoffLinger end, their leaving nodes dropping the slice; those older than the
// timeout are rolled back, their loading nodes dropping the slice and their leaving nodes
// keeping it as plain replicas. A slice whose every replica is loading (its holders left)
// keeps them: nobody holds it better; but a quarantined one (a canary that did not load its
// probe's part) goes back to Nobody.
func (c *Core) rollback(now time.Time) (*change, error) {
	var ops []assignment.Op
	var n endings
	for _, i := range c.ho.slices {
		s := c.a.Slice(i)
		switch {
		case s.Lingering() && demoting(s):
			// Its primary hands the role over first (roles.go).
			if op, ok := c.forcePromotion(s, now); ok {
				ops = append(ops, op)
				n.forced++
			}
			continue
		case s.Lingering():
			wait := c.cfg.HandoffLinger
			if _, ok := c.ho.unclaimed[s.Range.Start]; ok {
				wait = c.cfg.HandoffTimeout // the new primary is hung: let the old one go
			}
			if !now.Before(c.ho.served[s.Since].Add(wait)) {
				ops = append(ops, assignment.Assign{Slice: s.Range.Start, Replicas: s.Target()})
				n.released++
			}
			continue
		}
		if now.Before(c.ho.begun[s.Since].Add(c.cfg.HandoffTimeout)) {
			continue
		}
		keep := slices.DeleteFunc(slices.Clone(s.Replicas), s.IsLoading)
		switch {
		case len(keep) == 0 && c.touchesQuarantine(s.Range):
			keep = []assignment.NodeID{assignment.Nobody}
		case len(keep) == 0:
			keep = s.Replicas
		}
		ops = append(ops, assignment.Assign{Slice: s.Range.Start, Replicas: keep})
		n.rolled++
	}
	if len(ops) == 0 {
		return nil, nil
	}
	summary, cause := n.describe(c.cfg)
	ch, err := c.changeMap(ops, nil, cause, now)
	if err != nil {
		c.ho.retry = now.Add(c.cfg.PassInterval) // not at every tick: the map must change first
		return nil, fmt.Errorf("assigner: ending handoffs: %w", err)
	}
	ch.summary, ch.kind, ch.ended = summary, kindRollback, handoffEnd{rolledBack: n.rolled, forced: n.forced}
	return ch, nil
}

// endings counts what a rollback ends: lingering handoffs released, handoffs rolled back,
// and promotions forced past a primary that did not demote.
type endings struct{ released, rolled, forced int }

// describe returns the summary and the cause of a rollback's change.
func (n endings) describe(cfg Config) (summary, cause string) {
	var parts, causes []string
	if n.released > 0 {
		parts = append(parts, fmt.Sprintf("%d handoffs done: the old holders drop their slices after %s", n.released, cfg.HandoffLinger))
		causes = append(causes, "handoff done")
	}
	if n.rolled > 0 {
		parts = append(parts, fmt.Sprintf("%d handoffs timed out after %s: rolled back", n.rolled, cfg.HandoffTimeout))
		causes = append(causes, "handoff timeout")
	}
	if n.forced > 0 {
		parts = append(parts, fmt.Sprintf("%d primaries did not demote within %s: their successors promoted", n.forced, cfg.HandoffTimeout))
		causes = append(causes, "primary handover timeout")
	}
	return strings.Join(parts, "; "), strings.Join(causes, ", ")
}

// deferMerges returns the operations of a pass over view without the merges that join a
// slice of another primary, or one handing its primary role over, and without those that join a
// slice the pass moves: with make-before-break the moved slice is in handoff, and the
// merge, which needs both sides held alike, waits for a later pass, free once the handoff
// is done. An operation that relied on a merge left out is left out too (the algorithm's
// operations are checked against the map they make), and so is the rest of a chain of
// merges. It also returns how many operations it left out.
func deferMerges(view *assignment.Assignment, ops []assignment.Op) ([]assignment.Op, int) {
	sim := opSim{view: view, pieces: map[uint64]*piece{}, dead: map[uint64]bool{}}
	out := ops[:0:0]
	for _, op := range ops {
		if sim.apply(op) {
			out = append(out, op)
		}
	}
	return out, len(ops) - len(out)
}

// piece is what deferMerges knows of a slice as the pass's operations go.
type piece struct {
	end   keyspace.Bound
	reps  []assignment.NodeID
	moved bool // an operation gave it a node that did not hold it: a handoff
	// primary is its primary, and handing says its primary hands the role over: a merge
	// would give one of two primaries the other's range at once (roles.go).
	primary assignment.NodeID
	handing bool
}

// opSim follows the slices a pass's operations touch, the others read from the view.
type opSim struct {
	view   *assignment.Assignment
	pieces map[uint64]*piece
	dead   map[uint64]bool // starts merged away
}

func (s *opSim) get(start uint64) (*piece, bool) {
	if p, ok := s.pieces[start]; ok {
		return p, true
	}
	if s.dead[start] {
		return nil, false
	}
	i, ok := s.view.Find(start)
	if !ok {
		return nil, false
	}
	v := s.view.Slice(i)
	p := &piece{end: v.Range.End, reps: v.Replicas, primary: v.Primary, handing: v.Next != ""}
	s.pieces[start] = p
	return p, true
}

// apply follows op and reports whether it is kept.
func (s *opSim) apply(op assignment.Op) bool {
	switch o := op.(type) {
	case assignment.Split:
		p, ok := s.get(o.Slice)
		if !ok || o.At <= o.Slice || !p.end.After(o.At) {
			return false
		}
		s.pieces[o.At] = &piece{end: p.end, reps: p.reps, moved: p.moved, primary: p.primary, handing: p.handing}
		delete(s.dead, o.At)
		p.end = keyspace.At(o.At)
	case assignment.Assign:
		p, ok := s.get(o.Slice)
		if !ok {
			return false
		}
		for _, id := range o.Replicas {
			p.moved = p.moved || !slices.Contains(p.reps, id)
		}
		p.reps = o.Replicas
	case assignment.Merge:
		p, ok := s.get(o.Left)
		if !ok || p.end.IsEnd() {
			return false
		}
		next := p.end.Point()
		r, ok := s.get(next)
		if !ok || p.moved || r.moved || p.primary != r.primary || p.handing || r.handing {
			return false
		}
		p.end = r.end
		delete(s.pieces, next)
		s.dead[next] = true
	}
	return true
}
