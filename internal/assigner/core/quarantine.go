package core

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// The quarantine guard stops a key of death from walking round the cluster. A key whose
// holders crash shortly after acquiring it would, left alone, crash every node in turn: each
// crash hands its slice to the next node, which crashes too. The core remembers what each
// node acquired within the quarantine window; when a node's lease lapses (a crash or a lost
// session: a node that deregisters, with or without a grace, does not count), what it
// acquired within the window is its crash's suspect set. When two crashes within the window
// share a range, that intersection is quarantined: it is cut into its own slices, held by
// assignment.Nobody, which no node serves, and no pass, clean-up or admin move gives it to a
// node until an operator lifts the quarantine (Unquarantine). So a key of death crashes
// nodes twice at most (I12 in docs/DESIGN.md). The two crashes may be of one node that
// restarted and took the range again (a restart is a new session, whose acquisitions are
// counted afresh): a restart quicker than the clean-up gets the emptiest node, often the
// key again, and the loop would otherwise go on there.
//
// What each node acquired and the crashes lie in memory only: a new leader starts counting
// afresh. The quarantined ranges are part of the meta record, stored with every change.

// defaultQuarantineTTLs is the default quarantine window, in node TTLs: a crash is seen one
// TTL after it happens, and the next holder crashes at the earliest a pass later, so two
// crashes in a row on a key lie about one TTL and a pass apart.
const defaultQuarantineTTLs = 3

// quarantineWatch is what the guard remembers between events.
type quarantineWatch struct {
	acquired map[assignment.NodeID][]acquisition // within the window, oldest first
	crashes  []crash                             // within the window, oldest first
	probes   []*probe                            // under way, in the order they began (narrow.go)
	learnt   map[group]learnt                    // by quarantine, while it is narrowed
}

// acquisition says that a node was given a range at a time.
type acquisition struct {
	r  keyspace.Range
	at time.Time
}

// crash is a node whose lease lapsed at a time, with what it had acquired within the window,
// and when.
type crash struct {
	node   assignment.NodeID
	at     time.Time
	ranges []acquisition
}

// guarded reports whether the quarantine guard is on: a negative Config.QuarantineWindow
// turns it off (0 was filled in with the default).
func (c *Core) guarded() bool { return c.cfg.QuarantineWindow > 0 }

// noteAcquired records the ranges that ch gives nodes which did not hold them in before, the
// map until now (nil before the first).
func (c *Core) noteAcquired(before *assignment.Assignment, ch *change, now time.Time) {
	if !c.guarded() || ch.after == nil {
		return
	}
	pruned := map[assignment.NodeID]bool{} // once per node and change: a first map gives a node thousands
	add := func(id assignment.NodeID, r keyspace.Range) {
		if !pruned[id] {
			c.pruneAcquired(id, now)
			pruned[id] = true
		}
		c.noteAcquisition(id, r, now)
	}
	if before == nil || ch.write.Init {
		for _, s := range ch.after.All() {
			for _, id := range s.Replicas {
				add(id, s.Range)
			}
		}
		return
	}
	if ch.quantum == nil {
		return
	}
	for _, op := range ch.quantum.Ops {
		a, ok := op.(assignment.Assign)
		if !ok {
			continue
		}
		_, was := before.Lookup(a.Slice)
		_, is := ch.after.Lookup(a.Slice)
		for _, id := range a.Replicas {
			if !was.Holds(id) {
				add(id, is.Range)
			}
		}
	}
}

// noteRejoined records that node id, registering anew (a new session: it had left, or its
// lease had lapsed), acquires now whatever the map still gives it: a node that restarts
// before the clean-up of its old slices loads them again, and may crash on them again.
func (c *Core) noteRejoined(id assignment.NodeID, now time.Time) {
	if !c.guarded() || c.a == nil {
		return
	}
	c.pruneAcquired(id, now)
	for _, s := range c.a.All() {
		if s.Holds(id) {
			c.noteAcquisition(id, s.Range, now)
		}
	}
}

// noteAcquisition records that node id acquired r at now.
func (c *Core) noteAcquisition(id assignment.NodeID, r keyspace.Range, now time.Time) {
	if id == assignment.Nobody {
		return
	}
	if c.qw.acquired == nil {
		c.qw.acquired = map[assignment.NodeID][]acquisition{}
	}
	c.qw.acquired[id] = append(c.qw.acquired[id], acquisition{r: r, at: now})
}

// pruneAcquired forgets what node id acquired before the window.
func (c *Core) pruneAcquired(id assignment.NodeID, now time.Time) {
	if old, ok := c.qw.acquired[id]; ok {
		c.qw.acquired[id] = slices.DeleteFunc(old, func(a acquisition) bool { return now.Sub(a.at) > c.cfg.QuarantineWindow })
	}
}

// detectCrashes returns the crashes of the nodes gone, whose leases lapsed at now, and the
// ranges they put in quarantine: the overlaps of what two crashed sessions (of two nodes, or
// of one node before and after a restart) acquired within the window before crashing
// within it. A node that asked for a grace to restart is not
// counted: it announced its leave. Nor is a canary: its crash is its probe's verdict
// (narrow.go), and what else it acquired would otherwise be quarantined with a crash that
// acquired it before.
func (c *Core) detectCrashes(gone []assignment.NodeID, now time.Time) ([]crash, []Quarantine) {
	if !c.guarded() {
		return nil, nil
	}
	w := c.cfg.QuarantineWindow
	recent := slices.DeleteFunc(slices.Clone(c.qw.crashes), func(k crash) bool { return now.Sub(k.at) > w })
	var crashes []crash
	var found []Quarantine
	for _, id := range gone {
		if n := c.nodes[id]; n == nil || !n.awayUntil.IsZero() || c.canaryOf(id) != nil {
			continue
		}
		k := crash{node: id, at: now}
		for _, a := range c.qw.acquired[id] {
			if now.Sub(a.at) <= w {
				k.ranges = append(k.ranges, a)
			}
		}
		if len(k.ranges) == 0 {
			continue
		}
		for _, p := range recent {
			found = c.overlaps(p, k, found, now)
		}
		recent, crashes = append(recent, k), append(crashes, k)
	}
	return crashes, found
}

// overlaps appends to found the ranges both crashes suspect, but those quarantined already:
// what p, the earlier, acquired within the window and k acquired after p crashed. A key of
// death walks so: the first crash hands its range on, and the next holder crashes on it.
// Two members that crash together (a lost rack, a kill of several) had each acquired
// whatever they hold before either crashed, and quarantine nothing: without that rule, two
// members killed a few seconds after a cold start took a third of the key space off all.
func (c *Core) overlaps(p, k crash, found []Quarantine, now time.Time) []Quarantine {
	taken := func(r keyspace.Range) bool {
		in := func(q Quarantine) bool { return q.Range.Overlaps(r) }
		return slices.ContainsFunc(c.meta.Quarantined, in) || slices.ContainsFunc(found, in)
	}
	for _, a := range p.ranges {
		for _, b := range k.ranges {
			if b.at.Before(p.at) {
				continue
			}
			if o, ok := a.r.Intersect(b.r); ok && !taken(o) {
				found = append(found, Quarantine{Range: o, Since: now, Nodes: []assignment.NodeID{p.node, k.node}})
			}
		}
	}
	return found
}

// quarantine adds the ranges found to ch, the change that takes out the crashed nodes, to be
// stored with it and logged, and returns the cause to audit it by as the assigner's own call
// ("" if none was found).
func (c *Core) quarantine(ch *change, crashes []crash, found []Quarantine) string {
	ch.crashes = crashes
	if len(found) == 0 {
		return ""
	}
	ch.write.SaveMeta = true
	ch.write.Meta.Quarantined = append(slices.Clone(ch.write.Meta.Quarantined), found...)
	ch.quarantined = found
	parts := make([]string, len(found))
	for i, q := range found {
		parts[i] = fmt.Sprintf("%s (nodes %s crashed on it)", q.Range, assignment.FormatReplicas(q.Nodes))
	}
	ch.summary += "; quarantine " + strings.Join(parts, ", ")
	return "quarantine: " + strings.Join(parts, ", ")
}

// logQuarantined writes the audit records of the quarantines ch made, once stored.
func (c *Core) logQuarantined(ch *change, out *Output) {
	for _, q := range ch.quarantined {
		out.Quarantined++
		out.Log = append(out.Log, c.quarantineAudit(fmt.Sprintf("quarantine %s: nodes %s crashed shortly after acquiring it",
			q.Range, assignment.FormatReplicas(q.Nodes))))
	}
}

// quarantineAudit is the audit record of a change of the quarantine that the assigner made
// on its own, saying what, once stored.
func (c *Core) quarantineAudit(what string) Record {
	return Record{Level: slog.LevelWarn, Msg: "audit", Attrs: []any{"method", "quarantine", "by", "assigner",
		"what", what, "result", "ok", "seq", c.seq}}
}

// forgetCrashed updates the watch as ch commits: the nodes that left start afresh if they
// come back, and the crashes ch saw are remembered for the window.
func (c *Core) forgetCrashed(ch *change, now time.Time) {
	for _, id := range ch.forget {
		delete(c.qw.acquired, id)
	}
	if len(ch.crashes) > 0 || len(c.qw.crashes) > 0 {
		c.qw.crashes = slices.DeleteFunc(append(c.qw.crashes, ch.crashes...), func(k crash) bool {
			return now.Sub(k.at) > c.cfg.QuarantineWindow
		})
	}
}

// inQuarantine reports whether r lies inside a quarantined range.
func (c *Core) inQuarantine(r keyspace.Range) bool {
	return slices.ContainsFunc(c.meta.Quarantined, func(q Quarantine) bool {
		return q.Range.Start <= r.Start && r.End.Compare(q.Range.End) <= 0
	})
}

// touchesQuarantine reports whether r overlaps a quarantined range.
func (c *Core) touchesQuarantine(r keyspace.Range) bool {
	return slices.ContainsFunc(c.meta.Quarantined, func(q Quarantine) bool { return q.Range.Overlaps(r) })
}

// nobodyHolds reports whether s is held by no node.
func nobodyHolds(s assignment.Slice) bool {
	return len(s.Replicas) == 1 && s.Replicas[0] == assignment.Nobody
}

// isolate proposes cutting every quarantined range into slices of its own held by Nobody,
// but the parts the probes under way lend to their canaries, or returns nil when the map
// is so.
func (c *Core) isolate(now time.Time) (*change, error) {
	ch, ops, err := c.layout(c.qw.probes, "quarantine", now)
	if ch != nil {
		ch.summary, ch.kind = fmt.Sprintf("quarantined ranges taken off every node: %d ops", ops), kindQuarantine
	}
	return ch, err
}

// layout proposes the map that the quarantine and probes ask for, with cause, or returns
// nil when the map is so; it returns the number of operations too. Every quarantined range
// and every probe's part is cut into slices of its own; a part is held by its canary alone,
// the rest of the quarantine by Nobody.
func (c *Core) layout(probes []*probe, cause string, now time.Time) (*change, int, error) {
	if c.a == nil || len(c.meta.Quarantined) == 0 {
		return nil, 0, nil
	}
	a, ops := c.a, []assignment.Op(nil)
	do := func(op assignment.Op) error {
		next, err := a.Apply([]assignment.Op{op})
		if err != nil {
			return fmt.Errorf("assigner: isolating a quarantined range: %w", err)
		}
		a, ops = next, append(ops, op)
		return nil
	}
	var cuts []uint64
	for _, q := range c.meta.Quarantined {
		cuts = append(cuts, boundaries(q.Range)...)
	}
	for _, p := range probes {
		for _, r := range p.part.Ranges() {
			cuts = append(cuts, boundaries(r)...)
		}
	}
	for _, p := range cuts {
		if _, ok := a.Find(p); !ok {
			_, s := a.Lookup(p)
			if err := do(assignment.Split{Slice: s.Range.Start, At: p}); err != nil {
				return nil, 0, err
			}
		}
	}
	for _, q := range c.meta.Quarantined {
		for i, _ := a.Lookup(q.Range.Start); i < a.Len() && q.Range.Overlaps(a.Slice(i).Range); i++ {
			s := a.Slice(i)
			to := lentTo(probes, s.Range.Start)
			if holdsOnly(s, to) {
				continue
			}
			// A canary loads its part before routers send it reads, as any node gaining a slice.
			op := assignment.Op(assignment.Assign{Slice: s.Range.Start, Replicas: []assignment.NodeID{to}})
			if to != assignment.Nobody {
				op = c.asHandoffs([]assignment.Op{op})[0]
			}
			if err := do(op); err != nil {
				return nil, 0, err
			}
		}
	}
	if len(ops) == 0 {
		return nil, 0, nil
	}
	// The departed nodes the slices outside the quarantine still name are cleaned up by the
	// pass that follows: isolating must not wait for it, nor be refused for them.
	holders := slices.Clone(c.holders().Nodes())
	for _, s := range a.All() {
		for _, id := range s.Replicas {
			holders = append(holders, assignment.Node{ID: id})
		}
	}
	ch, err := c.changeMapOn(assignment.MustNodeSet(uniqNodes(holders)...), ops, nil, cause, now)
	if err != nil {
		return nil, 0, fmt.Errorf("assigner: isolating quarantined ranges: %w", err)
	}
	return ch, len(ops), nil
}

// uniqNodes returns ns without a second node of the same ID.
func uniqNodes(ns []assignment.Node) []assignment.Node {
	seen := make(map[assignment.NodeID]bool, len(ns))
	return slices.DeleteFunc(ns, func(n assignment.Node) bool {
		dup := seen[n.ID]
		seen[n.ID] = true
		return dup
	})
}

// boundaries returns the points where r begins and, unless it runs to the end, ends.
func boundaries(r keyspace.Range) []uint64 {
	if r.End.IsEnd() {
		return []uint64{r.Start}
	}
	return []uint64{r.Start, r.End.Point()}
}

// quarantineInput adapts a pass's input to the quarantine: each slice held by Nobody inside a
// quarantined range is shown held by a live stand-in (the first live node by ID) and
// pinned, so that the algorithm, which moves the slices of departed nodes, leaves it alone.
// The pass's operations then apply to the real map, where Nobody holds it: a pin is never
// moved, split or merged (checkQuarantine makes sure). Its load counts as none: nobody serves
// it, and the estimate it had, which no report renews, would weigh on the stand-in. A slice
// a probe lends to its canary is pinned where it is, until the probe ends.
func (c *Core) quarantineInput(in *balance.Input) error {
	if len(c.meta.Quarantined) == 0 || in.Nodes.Len() == 0 {
		return nil
	}
	stand := []assignment.NodeID{in.Nodes.Nodes()[0].ID}
	var ops []assignment.Op
	pins, loads := slices.Clone(in.Pinned), slices.Clone(in.Load)
	for i, s := range in.Assignment.All() {
		switch {
		case !c.inQuarantine(s.Range):
		case nobodyHolds(s):
			ops = append(ops, assignment.Assign{Slice: s.Range.Start, Replicas: stand})
			pins = append(pins, s.Range)
			if i < len(loads) {
				loads[i] = 0
			}
		default:
			pins = append(pins, s.Range)
		}
	}
	a, err := in.Assignment.Apply(ops)
	if err != nil {
		return fmt.Errorf("assigner: standing in for quarantined slices: %w", err)
	}
	in.Assignment, in.Pinned, in.Load = a, pins, loads
	return nil
}

// checkQuarantine refuses a pass's operations that touch a slice overlapping a quarantined
// range: the algorithm must leave pins alone, and isolate has cut those ranges out before
// the pass; if either failed, no node may get a key of death all the same.
func (c *Core) checkQuarantine(ops []assignment.Op) error {
	held := func(p uint64) (assignment.Slice, bool) {
		_, s := c.a.Lookup(p)
		return s, c.touchesQuarantine(s.Range)
	}
	for _, op := range ops {
		var points []uint64
		switch op := op.(type) {
		case assignment.Assign:
			points = []uint64{op.Slice}
		case assignment.Split:
			points = []uint64{op.At}
		case assignment.Merge:
			points = []uint64{op.Left}
			if i, ok := c.a.Find(op.Left); ok && i+1 < c.a.Len() {
				points = append(points, c.a.Slice(i+1).Range.Start)
			}
		}
		for _, p := range points {
			if s, bad := held(p); bad {
				return fmt.Errorf("assigner: the pass touched quarantined slice %s (%s)", s.Range, op)
			}
		}
	}
	return nil
}

// unquarantine proposes lifting the quarantines that overlap a slice: the next pass places
// its ranges on nodes, and the crashes remembered on them are forgotten, so that the guard
// counts two new crashes before it quarantines them again.
func (c *Core) unquarantine(ref SliceRef) (*change, keyspace.Range, error) {
	_, s, err := c.resolve(ref)
	if err != nil {
		return nil, keyspace.Range{}, err
	}
	m := c.meta
	var lifted []string
	m.Quarantined = slices.DeleteFunc(slices.Clone(m.Quarantined), func(q Quarantine) bool {
		if q.Range.Overlaps(s.Range) {
			lifted = append(lifted, q.Range.String())
			return true
		}
		return false
	})
	if len(lifted) == 0 {
		return &change{write: Write{Meta: c.meta}, summary: fmt.Sprintf("%s is not quarantined", s.Range)}, s.Range, nil
	}
	return &change{write: Write{SaveMeta: true, Meta: m}, summary: "lift the quarantine of " + strings.Join(lifted, ", "),
		lift: &s.Range}, s.Range, nil
}

// forgetLifted drops the crashes remembered on a range whose quarantine was lifted.
func (c *Core) forgetLifted(r keyspace.Range) {
	for i := range c.qw.crashes {
		c.qw.crashes[i].ranges = slices.DeleteFunc(slices.Clone(c.qw.crashes[i].ranges), func(a acquisition) bool { return r.Overlaps(a.r) })
	}
}
