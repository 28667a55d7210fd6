package core

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// errNothingInFlight answers WriteCommitted or WriteFailed when no write is in flight.
var errNothingInFlight = errors.New("assigner: no write is in flight")

// agenda is what a Tick found due and has not done yet: it waits while a write is in flight,
// and is empty whenever none is.
type agenda struct{ expire, pass, cleanup, rollback, roles, clock bool }

// Step applies one event at now and returns what the driver must do. See Output for the
// protocol: one write in flight at most, quanta published only once persisted.
func (c *Core) Step(now time.Time, ev Event) Output {
	var out Output
	switch ev := ev.(type) {
	case LeadershipGained:
		c.gain(now, ev, &out)
	case LeadershipLost:
		c.leading, c.inflight, c.todo = false, nil, agenda{}
	case ClockObserved:
		c.clock = max(c.clock, ev.Clock)
		c.sourceBack(now, &out)
	case SourceLost:
		c.sourceLost(now, ev, &out)
	case WriteCommitted:
		c.committed(now, &out)
	case WriteFailed:
		c.writeFailed(now, ev.Err, &out)
	case Reconfigure:
		c.reconfigure(now, ev.Config, &out)
	default:
		switch {
		case c.inflight != nil:
			out.Reply = &Reply{Err: ErrWriteInFlight}
		case !c.leading:
			out.Reply = &Reply{Err: ErrNotLeader}
		default:
			c.step(now, ev, &out)
		}
	}
	out.Wake = c.wake(now)
	return out
}

// step applies an event other than the write protocol's and leadership's.
func (c *Core) step(now time.Time, ev Event, out *Output) {
	switch ev := ev.(type) {
	case Tick:
		if !now.Before(c.nextPass) {
			c.todo.expire, c.todo.pass = true, true
			c.nextPass = c.nextPass.Add(c.cfg.PassInterval)
			if !c.nextPass.After(now) { // ticks were missed: like a ticker, drop them
				c.nextPass = now.Add(c.cfg.PassInterval)
			}
		}
		if !c.expiryAt.IsZero() && !now.Before(c.expiryAt) {
			c.todo.expire = true
		}
		if d, ok := c.handoffDeadline(); ok && !now.Before(d) {
			c.todo.rollback = true
		}
		c.todo.roles = c.todo.roles || c.exclusive()
		c.todo.clock = c.todo.clock || c.clockDue(now)
		c.run(now, out)
	case LoopStalled:
		c.refreshNodes(now)
		c.creditHandoffs(now, ev.Gap)
	case DistributorsChanged:
		if ch := c.setDistributors(ev.Distributors, now); ch != nil {
			out.Log = append(out.Log, Record{Level: slog.LevelInfo, Msg: "distributors changed", Attrs: []any{"distributors", ev.Distributors}})
			c.propose(now, ch, out)
		}
	case requestEvent:
		c.request(now, ev, out)
	default:
		out.Reply = &Reply{Err: fmt.Errorf("%w: unknown event %T", ErrInvalid, ev)}
	}
}

// clockDue reports whether a clock-only quantum is due: the source moved past the last
// quantum and the last clock-only quantum is ClockInterval old.
func (c *Core) clockDue(now time.Time) bool {
	return c.a != nil && c.clock > c.published && !now.Before(c.nextClock)
}

// wake returns when the core next wants a Tick: the next pass, the next clock-only quantum
// if the source has moved (at once if the last one is ClockInterval old), or the timeout of
// the oldest handoff.
func (c *Core) wake(now time.Time) time.Time {
	if !c.leading {
		return time.Time{}
	}
	w := c.nextPass
	if c.a != nil && c.clock > c.published && c.nextClock.Before(w) {
		w = later(c.nextClock, now)
	}
	if d, ok := c.handoffDeadline(); ok && d.Before(w) {
		w = later(d, now)
	}
	if !c.expiryAt.IsZero() && c.expiryAt.Before(w) {
		w = later(c.expiryAt, now)
	}
	if d, ok := c.leaseDeadline(now); ok && d.Before(w) {
		w = d
	}
	return w
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// run does what the agenda holds, in order, until a write is in flight or nothing is left.
func (c *Core) run(now time.Time, out *Output) {
	for c.inflight == nil {
		switch t := &c.todo; {
		case t.expire:
			t.expire = false
			if ch := c.expire(now); ch != nil {
				out.Log = append(out.Log, Record{Level: slog.LevelInfo, Msg: "nodes expired", Attrs: []any{"what", ch.summary}})
				c.propose(now, ch, out)
			}
		case t.pass:
			if c.quarantineStep(now, out) {
				continue // the pass runs once it is stored
			}
			t.pass = false
			ch, err := c.pass(now)
			if err != nil {
				c.passFailed(err, now, out)
			} else if ch != nil {
				c.propose(now, ch, out)
			}
		case t.cleanup:
			t.cleanup = false
			c.proposeOrLog(now, "clean-up failed", c.cleanup, out)
		case t.rollback:
			t.rollback = false
			c.proposeOrLog(now, "handoff rollback failed", c.rollback, out)
		case t.roles:
			t.roles = false
			c.proposeOrLog(now, "placing primaries failed", c.leaseRoles, out)
		case t.clock:
			t.clock = false
			if ch := c.clockQuantum(now); ch != nil {
				c.nextClock = now.Add(c.cfg.ClockInterval)
				c.propose(now, ch, out)
			}
		default:
			return
		}
	}
}

// proposeOrLog proposes the change that build returns, if any, or logs why it failed.
func (c *Core) proposeOrLog(now time.Time, msg string, build func(time.Time) (*change, error), out *Output) {
	ch, err := build(now)
	if err != nil {
		out.Log = append(out.Log, Record{Level: slog.LevelError, Msg: msg, Attrs: []any{"err", err}})
	} else if ch != nil {
		c.propose(now, ch, out)
	}
}

// request decides a request: a refusal, an answer, or a change to propose.
func (c *Core) request(now time.Time, ev requestEvent, out *Output) {
	call, by := Call(ev), ev.caller()
	ch, reply, err := c.decide(now, ev, out)
	if err != nil {
		c.finish(&change{req: ev}, err, out)
		return
	}
	if ch == nil {
		out.Reply = &reply
		return
	}
	ch.req, ch.reply = ev, reply
	if ch.kind == "" {
		ch.kind = kindRequest
	}
	if audited(call) {
		c.audit(ch, auditCause(call, ch.summary), by.Who, now)
	}
	c.propose(now, ch, out)
}

// heartbeatStep renews a node's lease, counts the load report it carries, and ends the
// loads it finished. A heartbeat whose claims or report are refused changes nothing.
func (c *Core) heartbeatStep(ev Heartbeat, now time.Time, r *Reply, out *Output) (*change, error) {
	err := c.checkClaims(ev)
	switch {
	case err != nil || ev.Report == nil:
	case ev.Report.Node != ev.Node:
		err = fmt.Errorf("%w: the heartbeat of %s carries the load of %s", ErrInvalid, ev.Node, ev.Report.Node)
	default:
		err = c.checkReport(*ev.Report)
	}
	if err == nil {
		r.Draining, err = c.heartbeat(ev.Node, now)
	}
	r.TTL, r.Distributor = c.cfg.NodeTTL, c.distributorFor(ev.Node)
	if err != nil {
		return nil, err
	}
	if ev.Report != nil {
		rep := *ev.Report
		rep.At = now
		if err := c.record(rep, now); err != nil {
			return nil, err // checked above: cannot happen
		}
	}
	r.Lease, r.Generation = c.renew(ev.Node, now), c.generation()
	c.noteClaims(ev)
	c.observeCanary(ev, now)
	return c.loadedOrLog(ev, now, out), nil
}

// decide returns what a request changes (nil for nothing) and what to reply.
func (c *Core) decide(now time.Time, ev requestEvent, out *Output) (*change, Reply, error) {
	var ch *change
	var err error
	r := Reply{}
	switch ev := ev.(type) {
	case Register:
		ch, err = c.register(ev.Node, now)
		r.TTL, r.Distributor = c.cfg.NodeTTL, c.distributorFor(ev.Node.ID)
		if err == nil {
			r.Lease, r.Generation = c.renew(ev.Node.ID, now), c.generation()
		}
	case Heartbeat:
		ch, err = c.heartbeatStep(ev, now, &r, out)
	case ReportLoad:
		ev.Report.At = now
		err = c.report(ev.Report, now)
	case Deregister:
		ch, err = c.deregister(ev.Node, ev.Grace, now)
		if err == nil && ev.Grace > 0 {
			out.Log = append(out.Log, Record{Level: slog.LevelInfo, Msg: "node restarting: its slices stay",
				Attrs: []any{"node", ev.Node, "until", c.nodes[ev.Node].awayUntil}})
		}
	case Move:
		ch, err = c.move(ev.Slice, ev.To, now)
	case Split:
		ch, err = c.split(ev.Slice, ev.At, now)
	case Merge:
		ch, err = c.merge(ev.Left, ev.Right, now)
	case Pin:
		ch, r.Range, err = c.pin(ev.Slice)
	case Unpin:
		ch, r.Range, err = c.unpin(ev.Slice)
	case Unquarantine:
		ch, r.Range, err = c.unquarantine(ev.Slice)
	case Drain:
		ch, r.Held, err = c.drain(ev.Node, ev.Cancel)
	case Freeze:
		ch = c.freeze(ev.Reason)
	case Unfreeze:
		ch = c.unfreeze()
	case SetAlgorithm:
		ch, err = c.setAlgorithm(ev.Name, ev.Params)
	default:
		return nil, c.query(ev), nil
	}
	return ch, r, err
}

// query answers a read; it changes nothing.
func (c *Core) query(ev requestEvent) Reply {
	switch ev := ev.(type) {
	case GetStatus:
		st := c.Status()
		return Reply{Status: &st}
	case ListNodes:
		return Reply{Nodes: c.Nodes()}
	case ListSlices:
		s, total, err := c.Slices(ev.Node, ev.ByLoad, ev.Limit)
		return Reply{Slices: s, Total: total, Err: err}
	case GetExplain:
		x := c.Explain()
		return Reply{Explain: &x}
	}
	return Reply{Err: fmt.Errorf("%w: unknown request %T", ErrInvalid, ev)}
}

// distributorFor says which distributor serves node id, or nil while there is none. It reads
// the core's set, which is current even before the first map carries it to the hub.
func (c *Core) distributorFor(id assignment.NodeID) *Distributor {
	d, addr, ok := c.dists.For(id)
	if !ok {
		return nil
	}
	return &Distributor{ID: d, Address: addr}
}

// propose makes ch the state at once if it stores nothing, or holds it while its write is in
// flight.
func (c *Core) propose(now time.Time, ch *change, out *Output) {
	if ch.write.persists() {
		c.inflight, out.Write = ch, &ch.write
		return
	}
	c.commit(now, ch, out)
}

// committed makes the change in flight the state, and goes on with the agenda.
func (c *Core) committed(now time.Time, out *Output) {
	ch := c.inflight
	if ch == nil {
		out.Reply = &Reply{Err: errNothingInFlight}
		return
	}
	c.inflight = nil
	c.commit(now, ch, out)
	c.run(now, out)
}

// writeFailed drops the change in flight: the state stays as it was.
func (c *Core) writeFailed(now time.Time, err error, out *Output) {
	ch := c.inflight
	if ch == nil {
		out.Reply = &Reply{Err: errNothingInFlight}
		return
	}
	c.inflight = nil
	switch ch.kind {
	case kindTerm:
		c.leading, c.todo = false, agenda{}
		return
	case kindPass:
		c.passFailed(fmt.Errorf("assigner: storing the pass: %w", err), now, out)
	case kindRollback:
		c.ho.retry = now.Add(c.cfg.PassInterval) // not at once: the store is failing
	case kindLoaded:
		// The heartbeat renewed the lease all the same; the node's next one ends the
		// handoffs.
		out.Log = append(out.Log, Record{Level: slog.LevelWarn, Msg: "storing the end of handoffs failed",
			Attrs: []any{"what", ch.summary, "err", err}})
		err = nil
	}
	c.finish(ch, err, out)
	c.run(now, out)
}

// commit makes ch the state and publishes its quantum.
func (c *Core) commit(now time.Time, ch *change, out *Output) {
	c.meta = ch.write.Meta
	if q := ch.quantum; q != nil {
		c.seq, c.published = q.Seq, q.Clock
		out.Publish = append(out.Publish, Publication{Quantum: *q, Map: ch.after})
	}
	remap := false
	if ch.setMap {
		c.noteAcquired(c.a, ch, now)
		c.a, remap = ch.after, true
	}
	c.forgetCrashed(ch, now)
	c.logQuarantined(ch, out)
	c.settleProbes(ch, now, out)
	if ch.lift != nil {
		c.forgetLifted(*ch.lift)
	}
	if ch.snapshot {
		c.snapshot = c.meta.LastIndex
		out.Snapshot = &Snapshot{Index: c.meta.LastIndex, Map: ch.after}
	}
	if ch.node != nil {
		if _, known := c.nodes[ch.node.ID]; !known {
			c.noteRejoined(ch.node.ID, now)
		}
		c.nodes[ch.node.ID] = ch.node
		if t := c.lapses(ch.node); c.expiryAt.IsZero() || t.Before(c.expiryAt) {
			c.expiryAt = t
		}
	}
	for _, id := range ch.forget {
		delete(c.nodes, id)
		delete(c.claims, id)
		c.est.Forget(id)
		// The departed node's slices are served by no one until they move: clean them up
		// now rather than at the next pass, so that their keys are served again at once and
		// their new holders' reports tell the pass what they weigh.
		c.todo.cleanup = true
	}
	if ch.dists != nil {
		c.dists = ch.dists
	}
	if ch.alg != nil {
		c.alg = ch.alg
	}
	c.history = append(c.history, ch.moves...)
	if ch.kind == kindPass {
		out.Pass = &PassDone{Summary: ch.summary, Changed: ch.quantum != nil}
	}
	if p := ch.pass; p != nil {
		c.history, c.explain, c.lastPass = p.history, &p.explain, now
		c.failed.count = 0
		c.estimate, c.estimated, remap = p.estimate, p.estimated, true
		out.Pass.Explanation = c.explain
	}
	if remap {
		c.carry()
	}
	if ch.setMap {
		out.Handoffs.Started += c.trackHandoffs(now)
	}
	out.Handoffs.Completed += ch.ended.completed
	out.Handoffs.RolledBack += ch.ended.rolledBack
	out.Handoffs.Promoted += ch.ended.promoted
	out.Handoffs.Forced += ch.ended.forced
	out.Handoffs.Durations = append(out.Handoffs.Durations, ch.ended.durations...)
	c.finish(ch, nil, out)
}

// finish replies to the request behind ch, if any, and logs how ch ended: err is nil if it
// is the state now.
func (c *Core) finish(ch *change, err error, out *Output) {
	if ch.kind == kindCleanup && err == nil {
		out.Log = append(out.Log, Record{Level: slog.LevelInfo, Msg: "change", Attrs: []any{"call", "cleanup", "what", ch.summary, "seq", c.seq}})
	}
	if ch.req == nil {
		return
	}
	reply := ch.reply
	reply.Err = err
	call := Call(ch.req)
	if err == nil && IsAdmin(call) {
		reply.Change = c.describe(ch)
	}
	out.Reply = &reply
	if audited(call) {
		c.auditRecord(call, ch.req.caller(), ch, err, out)
	}
}

// describe says what a committed admin change did.
func (c *Core) describe(ch *change) *Change {
	m := ch.write.Meta
	out := &Change{Summary: ch.summary, Position: quantum.Position{Term: m.Term, Seq: m.Seq}, Generation: m.Generation,
		Persisted: ch.write.persists()}
	if q := ch.quantum; q != nil {
		out.Position, out.Generation, out.Ops = q.Position, q.Generation, q.Ops
	}
	return out
}

// auditRecord logs the outcome of an audited call: who (the authenticated identity, and what
// the client claims), what, and whether it was done. A registration that renews one,
// changing nothing, is left out, and so is a drain asked again: nodes re-register as often
// as they like, and a draining node asks for its drain until it is over.
func (c *Core) auditRecord(call string, by Caller, ch *change, err error, out *Output) {
	changed := ch.write.persists() || ch.quantum != nil
	if err == nil && !changed && (call == "register" || call == "drain") {
		return
	}
	attrs := []any{"method", call, "by", by.Who}
	if by.Claims != "" {
		attrs = append(attrs, "claims", by.Claims)
	}
	switch {
	case err != nil:
		attrs = append(attrs, "what", ch.summary, "result", "refused", "err", err)
	case changed:
		attrs = append(attrs, "what", ch.summary, "result", "ok", "seq", c.seq)
	default:
		attrs = append(attrs, "what", ch.summary, "result", "unchanged")
	}
	out.Log = append(out.Log, Record{Level: slog.LevelInfo, Msg: "audit", Attrs: attrs})
}

// Settle steps ev at now, then commits every write it leads to at once, as a driver whose
// writes never fail does (a simulator's); it returns the output of every step, in order.
func (c *Core) Settle(now time.Time, ev Event) []Output {
	outs := []Output{c.Step(now, ev)}
	for outs[len(outs)-1].Write != nil {
		outs = append(outs, c.Step(now, WriteCommitted{}))
	}
	return outs
}
