package core

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// Narrowing a quarantine by bisection on a canary (I12 in docs/DESIGN.md). What the guard
// quarantines is what two crashed sessions acquired within the window, which can be far wider
// than the key that crashed them: a slice in a steady cluster, a third of the space at a cold
// start. So the core lends one half of a quarantine (a probe) to one live node, the canary,
// and keeps the other half on Nobody. If the canary's lease lapses before it has served the
// half for QuarantineProbe, the key is in that half: the quarantine narrows to it and the
// other half is served again. If a heartbeat of the canary comes QuarantineProbe after the
// one that said it had loaded the half, the half is innocent: the canary keeps it and the
// quarantine narrows to the other half. A heartbeat proves the canary was alive when it sent
// it, so the verdict waits for no lease to lapse: a crash is seen a NodeTTL late, but no
// heartbeat follows it.
//
// Two crashes may be unrelated, a false positive: until a canary has crashed on a quarantine,
// an innocent half makes the core probe the other half whole, and lift it if it is innocent
// too. Once a canary has crashed on it, the key is known to lie in it, and an innocent half
// places the key in the other without a probe of its own. Narrowing stops at narrowBound or
// at a range that cannot be cut; what is left stays until an operator lifts it. So a key of
// death crashes nodes twice to be found, then at most once per halving.
//
// A quarantine is a group of stored records: those one detection made (same time, same
// nodes), which need not be adjacent; a probe's half is half of their points. Each quarantine
// has one probe at most and each canary one probe, so that a crash tells which probe it ends.
// The probes and what narrowing has learnt live in the leader's memory only: the stored
// quarantine is the narrowed one, and a new leader takes the lent halves back (isolate) and
// probes again from it.

// narrowBound is the size, in points of the hash space, at which narrowing stops: 1/1024 of
// the space.
const narrowBound = uint64(1) << 54

// group names a quarantine: the records that one detection stored.
type group struct {
	since int64 // Quarantine.Since in Unix nanoseconds: a time.Time compares its location too
	nodes string
}

func groupOf(q Quarantine) group {
	return group{since: q.Since.UnixNano(), nodes: assignment.FormatReplicas(q.Nodes)}
}

// probe is a part of a quarantine lent to one live node, the canary.
type probe struct {
	g       group
	part    keyspace.Set
	canary  assignment.NodeID
	gen     uint64 // of the map that lent it
	started time.Time
	loaded  time.Time // the canary's first heartbeat that had loaded part; zero: none yet
	served  bool      // a heartbeat of the canary came QuarantineProbe after loaded
}

// learnt is what narrowing knows of a quarantine besides its records.
type learnt struct {
	confirmed bool      // a canary crashed on it: the key lies in it
	cleared   bool      // a half was found innocent before any canary crashed: the rest is probed whole
	retry     time.Time // no probe before then: the last canary did not load its part in time
}

// verdict is how a probe ended: its canary crashed, or served its part.
type verdict struct {
	p             *probe
	crashed       bool
	before, after keyspace.Set // the quarantine's points
	took          time.Duration
}

// ProbeStats counts what one step did to the probes of quarantines: begun, ended by a crash
// of the canary, ended by the canary serving its part, and abandoned without a verdict.
type ProbeStats struct {
	Started, Crashed, Served, Abandoned int
}

// narrowing reports whether quarantines are narrowed (see Config.QuarantineProbe).
func (c *Core) narrowing() bool { return c.guarded() && c.cfg.QuarantineProbe > 0 }

// groupSet returns the points of quarantine g among the records qs.
func groupSet(qs []Quarantine, g group) keyspace.Set {
	var rs []keyspace.Range
	for _, q := range qs {
		if groupOf(q) == g {
			rs = append(rs, q.Range)
		}
	}
	return keyspace.NewSet(rs...)
}

// regroup returns qs with the records of quarantine g replaced by one for each range of
// keep, where its first record was.
func regroup(qs []Quarantine, g group, keep keyspace.Set) []Quarantine {
	i := slices.IndexFunc(qs, func(q Quarantine) bool { return groupOf(q) == g })
	if i < 0 {
		return qs
	}
	first := qs[i]
	out := slices.Clone(qs[:i])
	for _, r := range keep.Ranges() {
		out = append(out, Quarantine{Range: r, Since: first.Since, Nodes: first.Nodes})
	}
	for _, q := range qs[i:] {
		if groupOf(q) != g {
			out = append(out, q)
		}
	}
	return out
}

// within reports whether p's part is still in its quarantine, among the records qs: an
// operator may have lifted it.
func (p *probe) within(qs []Quarantine) bool {
	return p.part.Minus(groupSet(qs, p.g)).Empty()
}

// probeWhere returns the first probe under way that match accepts, or nil.
func (c *Core) probeWhere(match func(*probe) bool) *probe {
	if i := slices.IndexFunc(c.qw.probes, match); i >= 0 {
		return c.qw.probes[i]
	}
	return nil
}

// probeOf returns the probe of quarantine g, or nil.
func (c *Core) probeOf(g group) *probe { return c.probeWhere(func(p *probe) bool { return p.g == g }) }

// canaryOf returns the probe whose canary is node id, or nil.
func (c *Core) canaryOf(id assignment.NodeID) *probe {
	return c.probeWhere(func(p *probe) bool { return p.canary == id })
}

// lentTo returns the canary that one of probes lends the slice starting at p to, or Nobody.
func lentTo(probes []*probe, p uint64) assignment.NodeID {
	for _, pr := range probes {
		if pr.part.Contains(p) {
			return pr.canary
		}
	}
	return assignment.Nobody
}

// lends reports whether the map gives every slice of p's part to its canary alone.
func (c *Core) lends(p *probe) bool {
	for _, r := range p.part.Ranges() {
		for i, _ := c.a.Lookup(r.Start); i < c.a.Len() && r.Overlaps(c.a.Slice(i).Range); i++ {
			if !holdsOnly(c.a.Slice(i), p.canary) {
				return false
			}
		}
	}
	return true
}

// holdsOnly reports whether s is held by id alone, loading it or not.
func holdsOnly(s assignment.Slice, id assignment.NodeID) bool {
	return len(s.Replicas) == 1 && s.Replicas[0] == id
}

// size returns the number of points in s, or full when s is the whole space (2^64 points do
// not fit in a uint64).
func size(s keyspace.Set) (n uint64, full bool) {
	for _, r := range s.Ranges() {
		m, all := r.Size()
		if all {
			return 0, true
		}
		n += m
	}
	return n, false
}

// nextPart returns the part of quarantine s to probe next, or false when it needs none: it
// is narrow enough (or one point), or it is confirmed and narrow enough.
func nextPart(s keyspace.Set, l learnt) (keyspace.Set, bool) {
	n, full := size(s)
	switch {
	case l.cleared && !l.confirmed:
		return s, true
	case !full && (n <= narrowBound || n < 2):
		return keyspace.Set{}, false
	}
	return firstHalf(s, n, full), true
}

// firstHalf returns the lower half of the points of s, which holds n of them (or the whole
// space): its first ranges, and the one that straddles the middle cut there.
func firstHalf(s keyspace.Set, n uint64, full bool) keyspace.Set {
	want := n / 2
	if full {
		want = 1 << 63
	}
	var rs []keyspace.Range
	for _, r := range s.Ranges() {
		m, all := r.Size()
		switch {
		case m == want && !all:
			return keyspace.NewSet(append(rs, r)...)
		case m > want || all:
			return keyspace.NewSet(append(rs, keyspace.Range{Start: r.Start, End: keyspace.At(r.Start + want)})...)
		}
		rs, want = append(rs, r), want-m
	}
	return keyspace.NewSet(rs...)
}

// pickCanary returns the node a probe is lent to: the live node holding the fewest slices
// (the first by ID on a tie) that is the canary of no other probe, false if there is none.
// The fewest slices are the least to lose to a crash, and a crashed node that restarted
// holds none: a key of death's crashes fall on one node as far as they can.
func (c *Core) pickCanary() (assignment.NodeID, bool) {
	var free []assignment.Node
	for _, n := range c.placement().Nodes() {
		if c.canaryOf(n.ID) == nil && c.nodes[n.ID].awayUntil.IsZero() {
			free = append(free, n)
		}
	}
	if len(free) == 0 {
		return "", false
	}
	live := assignment.MustNodeSet(free...)
	return leastHeld(live, heldCounts(c.a, live)), true
}

// probeNext proposes lending part of a quarantine to a canary, or returns nil: narrowing is
// off, balancing is frozen or the source lost (a probe may cost a crash; not then), every
// quarantine is probed or narrow enough, or no node can be a canary.
func (c *Core) probeNext(now time.Time) (*change, error) {
	if !c.narrowing() || c.a == nil || c.meta.Frozen || c.src.lost {
		return nil, nil
	}
	for _, g := range c.groups() {
		if c.probeOf(g) != nil || now.Before(c.qw.learnt[g].retry) {
			continue
		}
		whole := groupSet(c.meta.Quarantined, g)
		part, ok := nextPart(whole, c.qw.learnt[g])
		if !ok {
			continue
		}
		canary, ok := c.pickCanary()
		if !ok {
			return nil, nil
		}
		p := &probe{g: g, part: part, canary: canary}
		ch, _, err := c.layout(append(slices.Clone(c.qw.probes), p), "quarantine probe", now)
		if err != nil || ch == nil {
			return nil, err
		}
		ch.probe, ch.kind = p, kindQuarantine
		ch.summary = fmt.Sprintf("probe %s of quarantine %s on canary %s", describe(part), describe(whole), canary)
		return ch, nil
	}
	return nil, nil
}

// groups returns the quarantines, in the order of their first records.
func (c *Core) groups() []group {
	var gs []group
	for _, q := range c.meta.Quarantined {
		if g := groupOf(q); !slices.Contains(gs, g) {
			gs = append(gs, g)
		}
	}
	return gs
}

// observeCanary takes what a heartbeat of a canary says of its probe: that it has loaded its
// part (it applied the map that lent it and loads no point of it), or, QuarantineProbe
// later, that it served it.
func (c *Core) observeCanary(hb Heartbeat, now time.Time) {
	p := c.canaryOf(hb.Node)
	if p == nil || p.served || !c.lends(p) {
		return
	}
	switch {
	case !p.loaded.IsZero():
		p.served = now.Sub(p.loaded) >= c.cfg.QuarantineProbe
	case hb.Generation >= p.gen && p.part.Intersect(keyspace.NewSet(hb.Loading...)).Empty():
		p.loaded = now
	}
}

// reviewProbes abandons the probes that can no longer end in a verdict; isolate then takes
// their parts back, if still quarantined. A canary that did not load its part in time holds
// the next probe of its quarantine back for a window: it may crash and restart faster than
// its lease, which the guard cannot see.
func (c *Core) reviewProbes(now time.Time, out *Output) {
	kept := c.qw.probes[:0]
	for _, p := range c.qw.probes {
		why, late := c.probeEnded(p, now)
		if why == "" {
			kept = append(kept, p)
			continue
		}
		if late {
			l := c.qw.learnt[p.g]
			l.retry = now.Add(c.cfg.QuarantineWindow)
			c.learn(p.g, l)
		}
		out.Probes.Abandoned++
		out.Log = append(out.Log, Record{Level: slog.LevelInfo, Msg: "quarantine probe abandoned",
			Attrs: []any{"canary", string(p.canary), "part", describe(p.part), "why", why}})
	}
	clear(c.qw.probes[len(kept):])
	c.qw.probes = kept
	gs := c.groups()
	maps.DeleteFunc(c.qw.learnt, func(g group, _ learnt) bool { return !slices.Contains(gs, g) })
}

// probeEnded says why probe p can no longer end in a verdict, or "", and whether it is
// because its canary did not load its part within HandoffTimeout, the time a handoff has to
// load (a handoff of the part is rolled back then). A canary that has served its part has
// given its verdict, whatever it does next.
func (c *Core) probeEnded(p *probe, now time.Time) (why string, late bool) {
	n := c.nodes[p.canary]
	switch {
	case !p.within(c.meta.Quarantined):
		return "its part is no longer quarantined", false
	case p.served:
		return "", false
	case n == nil:
		return "the canary left", false
	case !n.awayUntil.IsZero():
		return "the canary is restarting", false
	case slices.Contains(c.meta.Draining, p.canary):
		return "the canary drains", false
	case p.loaded.IsZero() && !now.Before(p.started.Add(c.cfg.HandoffTimeout)):
		return fmt.Sprintf("the canary did not load its part within %s", c.cfg.HandoffTimeout), true
	case !c.lends(p):
		return "the map no longer lends its part to the canary", false
	}
	return "", false
}

// learn records what narrowing knows of quarantine g.
func (c *Core) learn(g group, l learnt) {
	if c.qw.learnt == nil {
		c.qw.learnt = map[group]learnt{}
	}
	c.qw.learnt[g] = l
}

// judge returns the verdict on probe p, whose canary crashed or served its part, and the
// records qs narrowed by it.
func judge(qs []Quarantine, p *probe, crashed bool, now time.Time) (verdict, []Quarantine) {
	before := groupSet(qs, p.g)
	v := verdict{p: p, crashed: crashed, before: before, after: before.Minus(p.part), took: now.Sub(p.loaded)}
	if crashed {
		v.after, v.took = before.Intersect(p.part), now.Sub(p.started)
	}
	return v, regroup(qs, p.g, v.after)
}

// what says what a verdict did to its quarantine, naming it before and after.
func (v verdict) what() string {
	switch {
	case v.crashed && v.after.Equal(v.before):
		return fmt.Sprintf("%s confirmed: canary %s crashed within %s of its probe", describe(v.before), v.p.canary, v.took)
	case v.crashed:
		return fmt.Sprintf("%s narrowed to %s: canary %s crashed within %s of its probe; the rest is served again",
			describe(v.before), describe(v.after), v.p.canary, v.took)
	case v.after.Empty():
		return fmt.Sprintf("%s lifted: canary %s served it for %s and no canary crashed on it", describe(v.before), v.p.canary, v.took)
	}
	return fmt.Sprintf("%s narrowed to %s: canary %s served %s for %s", describe(v.before), describe(v.after),
		v.p.canary, describe(v.p.part), v.took)
}

// judgeServed proposes storing the verdict of a canary that served its part, or returns nil.
func (c *Core) judgeServed(now time.Time) *change {
	p := c.probeWhere(func(p *probe) bool { return p.served })
	if p == nil {
		return nil
	}
	v, qs := judge(c.meta.Quarantined, p, false, now)
	m := c.meta
	m.Quarantined = qs
	ch := &change{write: Write{SaveMeta: true, Meta: m}, kind: kindQuarantine, verdicts: []verdict{v}, summary: "quarantine " + v.what()}
	c.audit(ch, "quarantine: "+v.what(), "", now)
	return ch
}

// judgeCrashed adds to ch, the change that takes out the nodes gone, the verdicts of the
// probes whose canaries crashed (not those that announced a restart, nor those that had
// served their parts already: their verdict is due at the next pass), and returns their
// causes.
func (c *Core) judgeCrashed(ch *change, gone []assignment.NodeID, now time.Time) []string {
	var causes []string
	for _, id := range gone {
		p := c.canaryOf(id)
		if p == nil || p.served || !c.nodes[id].awayUntil.IsZero() || !p.within(ch.write.Meta.Quarantined) {
			continue
		}
		v, qs := judge(ch.write.Meta.Quarantined, p, true, now)
		ch.write.Meta.Quarantined, ch.write.SaveMeta = qs, true
		ch.verdicts = append(ch.verdicts, v)
		ch.summary += "; quarantine " + v.what()
		causes = append(causes, "quarantine: "+v.what())
	}
	return causes
}

// settleProbes updates the probes as ch commits: the probe it lends starts, and the probes
// it judged end, their canaries' crashes or service learnt; what is no longer quarantined
// forgets the crashes remembered on it, as a lift does.
func (c *Core) settleProbes(ch *change, now time.Time, out *Output) {
	for _, v := range ch.verdicts {
		c.qw.probes = slices.DeleteFunc(c.qw.probes, func(p *probe) bool { return p == v.p })
		l := c.qw.learnt[v.p.g]
		l.confirmed = l.confirmed || v.crashed
		l.cleared = l.cleared || !v.crashed
		c.learn(v.p.g, l)
		for _, r := range v.before.Minus(v.after).Ranges() {
			c.forgetLifted(r)
		}
		if v.crashed {
			out.Probes.Crashed++
		} else {
			out.Probes.Served++
		}
		out.Log = append(out.Log, c.quarantineAudit("quarantine "+v.what()))
	}
	if p := ch.probe; p != nil {
		p.gen, p.started = c.a.Generation(), now
		c.qw.probes = append(c.qw.probes, p)
		out.Probes.Started++
		out.Log = append(out.Log, c.quarantineAudit(ch.summary))
	}
}

// quarantineStep does what the quarantine asks before a pass, one change at a time: it
// abandons the probes that can no longer end, cuts the map to the quarantine's layout, stores
// the verdict of a canary that served its part, and lends the next probe. It reports whether
// it proposed a change.
func (c *Core) quarantineStep(now time.Time, out *Output) bool {
	c.reviewProbes(now, out)
	ch, err := c.isolate(now)
	if err != nil {
		out.Log = append(out.Log, Record{Level: slog.LevelError, Msg: "isolating quarantined ranges failed", Attrs: []any{"err", err}})
		return false
	}
	if ch == nil {
		ch = c.judgeServed(now)
	}
	if ch == nil {
		if ch, err = c.probeNext(now); err != nil {
			out.Log = append(out.Log, Record{Level: slog.LevelError, Msg: "probing a quarantine failed", Attrs: []any{"err", err}})
		}
	}
	if ch == nil {
		return false
	}
	c.propose(now, ch, out)
	return true
}

// describe names the ranges of s for a log line, and its share of the space: all of them, or
// the first and the last of many.
func describe(s keyspace.Set) string {
	rs := s.Ranges()
	var share float64
	for _, r := range rs {
		share += r.Fraction()
	}
	switch {
	case len(rs) == 0:
		return "nothing"
	case len(rs) == 1:
		return fmt.Sprintf("%s (%.3g%% of the key space)", rs[0], 100*share)
	case len(rs) <= 3:
		parts := make([]string, len(rs))
		for i, r := range rs {
			parts[i] = r.String()
		}
		return fmt.Sprintf("%s (%.3g%% of the key space)", strings.Join(parts, " "), 100*share)
	}
	return fmt.Sprintf("%d ranges from %s to %s (%.3g%% of the key space)", len(rs), rs[0], rs[len(rs)-1], 100*share)
}
