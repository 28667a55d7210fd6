package distributor

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/source"
)

// blockedFactor is how much more than MaxQueueBytes of changes may wait behind scans.
const blockedFactor = 4

// applier drives a Router: it steps events into it, applies the actions it returns to the
// queue of every node it serves, which the Pull handlers and the scan readers read, and
// steps back into it what only the queues know. It belongs to one goroutine, as the router
// does (the distributor's loop).
//
// Congestion control is applied here: an Enqueue that makes a node's queue hold more changes
// than its bound is the router's Overflowed event, and until the router's Restart for the
// node, nothing more is applied to its queue. A node's changes count only until the node
// acknowledges them, which it does to its queue, not to the router. Changes queued behind a
// scan are not the node's fault, and counting them would keep a snapshot from ever
// finishing while changes flow faster than the bound allows for the scan's time; they get a
// wider bound, which only a scan that never ends can reach.
type applier struct {
	r      *Router
	queues map[assignment.NodeID]*queue
	slots  []*queue // the same queues, by Action.slot
	// maxQueueBytes and scanAhead are the bounds of RouterConfig.
	maxQueueBytes, scanAhead int
	// acked hears (without waiting) of acknowledgements that may let a scan read on.
	acked chan struct{}
	// clock is the router's clock, published to the Pull handlers: every change up to it
	// is in the queues. It is published only once the actions of an event, and those of the
	// overflows they caused, are applied: a node never sees a clock its queue is behind.
	clock atomic.Uint64
	scans []ScanRequest       // asked for and not taken yet (takeScans)
	over  []assignment.NodeID // queues that overflowed, in order, and await their Restart
	// trace, if set, sees every list of actions before it is applied; overflowed names the
	// node whose overflow the list answers, if it does.
	trace func(overflowed assignment.NodeID, acts []Action)
}

func newApplier(r *Router) *applier {
	return &applier{r: r, queues: map[assignment.NodeID]*queue{}, maxQueueBytes: r.cfg.MaxQueueBytes,
		scanAhead: r.cfg.ScanAheadBytes, acked: make(chan struct{}, 1)}
}

// Acked receives after nodes acknowledged operations: scans waiting for room (see
// scanReady) may read on.
func (a *applier) Acked() <-chan struct{} { return a.acked }

// quantum steps a quantum into the router; see Router.Quantum.
func (a *applier) quantum(q quantum.Quantum) error {
	acts, err := a.r.Quantum(q)
	if err != nil {
		return err
	}
	a.apply(acts)
	return nil
}

// changes steps a batch of changes into the router; see Router.Changes.
func (a *applier) changes(b source.Batch, now time.Time) { a.apply(a.r.Changes(b, now)) }

// progress steps the source's progress into the router; see Router.Progress.
func (a *applier) progress(clock uint64) { a.apply(a.r.Progress(clock)) }

// rebase steps a rebase into the router; see Router.Rebase.
func (a *applier) rebase(clock uint64) { a.apply(a.r.Rebase(clock)) }

// scanItems steps items a scan read into the router; see Router.ScanItems.
func (a *applier) scanItems(id uint64, items []op) { a.apply(a.r.ScanItems(id, items)) }

// scanDone steps the end of a scan into the router; see Router.ScanDone.
func (a *applier) scanDone(id uint64, items []op, at uint64, err error) {
	a.apply(a.r.ScanDone(id, items, at, err))
}

// takeScans returns the scans the router asked for since the last call.
func (a *applier) takeScans() []ScanRequest {
	out := a.scans
	a.scans = nil
	return out
}

// attach starts a Pull stream for node id, which applied everything before cursor (epoch,
// index): it continues from there if the node's queue can, else the router starts the node
// over (see Router.Attach).
func (a *applier) attach(id assignment.NodeID, epoch, index uint64) (Attached, error) {
	// A queue is there only for a node the router serves.
	q := a.queues[id]
	if q != nil {
		if stream, list, gen, ok := q.attach(epoch, index); ok {
			return Attached{q: q, Stream: stream, Epoch: epoch, Index: index, Resumed: true, Slices: list, Gen: gen}, nil
		}
	}
	acts, err := a.r.Attach(id, q != nil && q.fresh())
	if err != nil {
		return Attached{}, err
	}
	a.apply(acts)
	q = a.queues[id]
	return Attached{q: q, Stream: q.attachNew(), Epoch: q.epoch}, nil
}

// scanReady reports whether scan req should read on now: it is the first scan its node's
// queue waits for, and the node took enough of what was read before. A snapshot thus waits
// for its node instead of piling up in memory (I5); the node's later changes wait behind it,
// bounded as ever by congestion control. stale is true for a scan no queue awaits (the
// node's epoch ended): drop it.
func (a *applier) scanReady(req ScanRequest) (ready, stale bool) {
	q := a.queues[req.Node]
	if q == nil {
		return false, true
	}
	return q.scanRoom(req.ID, a.scanAhead)
}

// apply applies acts in order, then the Restarts the router answers the overflows they
// caused with, then publishes the router's clock.
func (a *applier) apply(acts []Action) {
	clock, publish := a.applyList("", acts)
	for len(a.over) > 0 {
		id := a.over[0]
		acts := a.r.Overflowed(id)
		a.unmark(id) // in case the router had dropped the node already
		a.applyList(id, acts)
	}
	if publish {
		a.clock.Store(clock)
	}
}

// applyList applies acts but Publish, whose clock it returns; they answer the overflow of
// node overflowed's queue, if not "".
func (a *applier) applyList(overflowed assignment.NodeID, acts []Action) (clock uint64, publish bool) {
	if a.trace != nil && (len(acts) > 0 || overflowed != "") {
		a.trace(overflowed, acts)
	}
	for i := range acts {
		act := &acts[i]
		switch {
		case act.Kind == Publish:
			clock, publish = act.Clock, true
		case len(a.over) > 0 && slices.Contains(a.over, act.Node) && act.Kind != Restart && act.Kind != Close:
			// The queue is to be dropped.
		case act.Kind == Enqueue:
			a.enqueue(act)
		default:
			a.applyOne(act)
		}
	}
	if len(acts) > maxHeldActions {
		clear(acts)
	}
	return clock, publish
}

// maxHeldActions is the longest action list the applier leaves as it is once applied, until
// the router's next call: the ops of a longer one, a remap's, are let go at once, to be
// freed as soon as the nodes took them.
const maxHeldActions = 64

// enqueue applies an Enqueue, and tells of an overflow.
func (a *applier) enqueue(act *Action) {
	ready, blocked := a.slots[act.slot].push(act.Op)
	if !act.Op.scanned && (ready > a.maxQueueBytes || blocked > blockedFactor*a.maxQueueBytes) {
		a.over = append(a.over, act.Node)
	}
}

// applyOne applies one action other than Publish and Enqueue.
func (a *applier) applyOne(act *Action) {
	switch act.Kind {
	case Open:
		q := newQueue()
		q.acked = a.acked
		a.queues[act.Node] = q
		if int(act.slot) >= len(a.slots) {
			a.slots = append(a.slots, make([]*queue, int(act.slot)+1-len(a.slots))...)
		}
		a.slots[act.slot] = q
	case Scan:
		a.slots[act.slot].pushScan(act.Scan.ID)
		a.scans = append(a.scans, *act.Scan)
	case Fill:
		a.slots[act.slot].fill(act.ScanID, act.Items, act.Done)
		act.Items = nil // the queue holds them now: a snapshot's must not outlive their trim
	case Restart:
		a.unmark(act.Node)
		a.slots[act.slot].restart(act.Epoch)
	case Close:
		a.unmark(act.Node)
		a.slots[act.slot].close()
		a.slots[act.slot] = nil
		delete(a.queues, act.Node)
	}
}

// unmark forgets that node id's queue overflowed.
func (a *applier) unmark(id assignment.NodeID) {
	a.over = slices.DeleteFunc(a.over, func(o assignment.NodeID) bool { return o == id })
}

// Attached is the start of a Pull stream.
type Attached struct {
	q       *queue
	Stream  uint64
	Epoch   uint64
	Index   uint64
	Resumed bool
	// Slices is the node's slice list at Index of a resumed stream.
	Slices []keyspace.Range
	// Gen is the generation of the operation before Index (see op.gen).
	Gen uint64
}
