package distributor

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/source"
)

// ErrNotServed is returned for a node that another distributor serves.
var ErrNotServed = errors.New("distributor: node not served here")

// RefusedError is returned for a quantum the router will not apply: one from before its
// position, which only a deposed leader sends (fencing), or one that does not follow it.
type RefusedError struct {
	// Reason is "stale_term" (from a term older than one applied), "stale" (going back
	// within a term) or "out_of_sequence" (operations not following the map held).
	Reason   string
	Quantum  quantum.Position
	Position quantum.Position
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("distributor: quantum %s refused (%s): the router is at %s", e.Quantum, e.Reason, e.Position)
}

// RouterConfig configures a Router.
type RouterConfig struct {
	// ID is this distributor's ID: it serves the nodes that the distributor set gives it.
	ID string
	// MaxQueueBytes bounds what a node's queue holds of changes the node has not
	// acknowledged; beyond it the node's queue is dropped and the node catches up by a
	// snapshot. Default 64 MiB.
	MaxQueueBytes int
	// ScanAheadBytes bounds the scanned items a node's queue holds that the node has not
	// acknowledged: a snapshot is read only as fast as the node takes it, so it never has to
	// fit in memory. Default 8 MiB.
	ScanAheadBytes int
	// NewEpoch returns a new epoch: nonzero, and unlike any other this distributor or any
	// earlier run of it gave out. Default: random.
	NewEpoch func() uint64
}

// blockedFactor is how much more than MaxQueueBytes of changes may wait behind scans.
const blockedFactor = 4

// ScanRequest asks for the items of a range as of a clock, for a node.
type ScanRequest struct {
	ID    uint64
	Node  assignment.NodeID
	Range keyspace.Range
	Clock uint64
	// q is the node's queue, which a scan reading on asks for room (see queue.scanRoom), and
	// ahead the room it has.
	q     *queue
	ahead int
}

// node is what the router knows of a node it serves.
type node struct {
	id    assignment.NodeID
	q     *queue
	cover keyspace.Set     // the points the node holds, by the map
	list  []keyspace.Range // the map's slices the node holds, in order
	scans map[uint64]bool  // the scans running for the node's current epoch
}

// Stats counts what the router did.
type Stats struct {
	Quanta, Changes, Ops uint64
	Snapshots, Overflows uint64
}

// Router turns quanta and changes, in causal order (see Sequencer), into each served node's
// stream of operations: for a slice a node gains, "add slice" and the slice's items as of the
// quantum's clock (scanned by the caller); for a slice it loses, "drop slice"; for every
// change, the change, to every replica that holds it.
//
// The router is deterministic and does no I/O: scans are requests the caller runs and
// answers with ScanDone. It is not safe for concurrent use, except that the queues it fills
// are read by Pull handlers.
type Router struct {
	cfg      RouterConfig
	a        *assignment.Assignment
	dists    quantum.Distributors
	clock    uint64
	pos      quantum.Position // of the last quantum applied
	started  bool             // a quantum was applied: pos means something
	pub      atomic.Uint64    // clock, published to the Pull handlers
	nodes    map[assignment.NodeID]*node
	scanning map[uint64]*node
	nextScan uint64
	requests []ScanRequest
	stats    Stats
	acked    chan struct{}
}

// NewRouter returns a router with no map yet.
func NewRouter(cfg RouterConfig) *Router {
	if cfg.MaxQueueBytes <= 0 {
		cfg.MaxQueueBytes = 64 << 20
	}
	if cfg.ScanAheadBytes <= 0 {
		cfg.ScanAheadBytes = 8 << 20
	}
	if cfg.NewEpoch == nil {
		cfg.NewEpoch = randomEpoch
	}
	return &Router{cfg: cfg, nodes: map[assignment.NodeID]*node{}, scanning: map[uint64]*node{},
		acked: make(chan struct{}, 1)}
}

// Acked receives after nodes acknowledged operations: scans waiting for room (see
// ScanReady) may read on.
func (r *Router) Acked() <-chan struct{} { return r.acked }

// Clock returns the router's clock: every change up to it has been routed.
func (r *Router) Clock() uint64 { return r.clock }

// Stats returns what the router did so far.
func (r *Router) Stats() Stats { return r.stats }

// TakeScans returns the scans asked for since the last call.
func (r *Router) TakeScans() []ScanRequest {
	out := r.requests
	r.requests = nil
	return out
}

// serves reports whether this distributor serves node id.
func (r *Router) serves(id assignment.NodeID) bool {
	d, _, ok := r.dists.For(id)
	return ok && d == r.cfg.ID
}

// Quantum applies a quantum: the map changes, and with it what each served node holds.
//
// Like the routers of the client library, it refuses, without applying it, a quantum from a
// term older than one it applied (a deposed leader's, which may undo the new leader's
// changes) and operations that do not follow its position within a term.
func (r *Router) Quantum(q quantum.Quantum) error {
	if err := r.admit(q); err != nil {
		return err
	}
	next := r.a
	switch {
	case q.Snapshot != nil:
		next = q.Snapshot
	case len(q.Ops) > 0 && r.a == nil:
		return fmt.Errorf("distributor: quantum %s changes a map this distributor never had", q.Position)
	case len(q.Ops) > 0:
		var err error
		if next, err = r.a.Apply(q.Ops); err != nil {
			return fmt.Errorf("distributor: quantum %s does not apply to generation %d: %w", q.Position, r.a.Generation(), err)
		}
	}
	r.stats.Quanta++
	r.pos, r.started = q.Position, true
	r.clock = max(r.clock, q.Clock)
	distsChanged := q.Distributors != nil && !q.Distributors.Equal(r.dists)
	if distsChanged {
		r.dists = q.Distributors
	}
	if next != r.a || distsChanged {
		r.a = next
		r.remap()
	}
	r.pub.Store(r.clock)
	return nil
}

// admit checks that q may follow the quanta applied so far.
func (r *Router) admit(q quantum.Quantum) error {
	if !r.started {
		return nil
	}
	reason := ""
	switch {
	case q.Term < r.pos.Term:
		reason = "stale_term"
	case q.Snapshot != nil && q.Position.Less(r.pos):
		reason = "stale"
	case q.Snapshot == nil && (q.Term != r.pos.Term || !r.pos.Less(q.Position)):
		reason = "out_of_sequence"
	default:
		return nil
	}
	return &RefusedError{Reason: reason, Quantum: q.Position, Position: r.pos}
}

// Position returns the position of the last quantum applied (zero before the first).
func (r *Router) Position() quantum.Position { return r.pos }

// remap works out what every served node holds under the current map and distributors, and
// queues the difference.
func (r *Router) remap() {
	lists := map[assignment.NodeID][]keyspace.Range{}
	served := map[assignment.NodeID]bool{}
	for _, s := range r.a.All() {
		for _, id := range s.Replicas {
			ok, known := served[id]
			if !known {
				ok = r.serves(id)
				served[id] = ok
			}
			if ok {
				lists[id] = append(lists[id], s.Range)
			}
		}
	}
	// Maps are walked in sorted order: the order of the scans asked for, and so their IDs,
	// must not depend on Go's map order.
	for _, id := range sortedIDs(r.nodes) {
		if n := r.nodes[id]; !r.serves(id) {
			n.q.close()
			delete(r.nodes, id)
			r.forgetScans(n)
		}
	}
	for _, id := range sortedIDs(lists) {
		if r.nodes[id] == nil {
			r.nodes[id] = r.newNode(id)
		}
	}
	for _, id := range sortedIDs(r.nodes) {
		r.update(r.nodes[id], lists[id])
	}
}

// sortedIDs returns the keys of m in order.
func sortedIDs[V any](m map[assignment.NodeID]V) []assignment.NodeID {
	return slices.Sorted(maps.Keys(m))
}

func (r *Router) newNode(id assignment.NodeID) *node {
	q := newQueue()
	q.acked = r.acked
	return &node{id: id, q: q, scans: map[uint64]bool{}}
}

// update makes node n hold the slices of list, queueing the operations that get it there.
func (r *Router) update(n *node, list []keyspace.Range) {
	cover := keyspace.NewSet(list...)
	lost, gained := n.cover.Minus(cover), cover.Minus(n.cover)
	relisted := !slices.Equal(n.list, list)
	n.cover, n.list = cover, list
	if !n.q.active() {
		return // the node's snapshot will hold all of it
	}
	for _, rg := range lost.Ranges() {
		r.push(n, op{data: encodeRangeOp(opDropSlice, rg)})
	}
	if relisted {
		r.push(n, setSlices(list))
	}
	for _, rg := range gained.Ranges() {
		r.push(n, op{data: encodeRangeOp(opAddSlice, rg)})
		r.scan(n, rg)
	}
}

func setSlices(list []keyspace.Range) op {
	if list == nil {
		list = []keyspace.Range{} // non-nil marks the op as set_slices
	}
	return op{data: encodeSetSlices(list), slices: list}
}

// push queues an operation for a node and applies congestion control: a node whose queue of
// changes outgrows its bound is dropped to a snapshot, which costs it a rescan but keeps the
// distributor's memory bounded whatever the node does. Changes queued behind a scan are not
// the node's fault, and counting them would keep a snapshot from ever finishing while changes
// flow faster than the bound allows for the scan's time; they get a wider bound, which only a
// scan that never ends can reach.
func (r *Router) push(n *node, o op) {
	r.stats.Ops++
	if ready, blocked := n.q.push(o); ready > r.cfg.MaxQueueBytes || blocked > blockedFactor*r.cfg.MaxQueueBytes {
		r.stats.Overflows++
		n.q.restart(0)
		r.forgetScans(n)
	}
}

// scan asks for the items of rg at the router's clock, to follow what is queued for n.
func (r *Router) scan(n *node, rg keyspace.Range) {
	r.nextScan++
	id := r.nextScan
	n.q.pushScan(id)
	n.scans[id] = true
	r.scanning[id] = n
	r.requests = append(r.requests, ScanRequest{ID: id, Node: n.id, Range: rg, Clock: r.clock, q: n.q, ahead: r.cfg.ScanAheadBytes})
}

func (r *Router) forgetScans(n *node) {
	for _, id := range slices.Sorted(maps.Keys(n.scans)) {
		delete(r.scanning, id)
	}
	clear(n.scans)
}

// Changes routes a batch of changes, all with one clock, to the nodes that hold them.
func (r *Router) Changes(b source.Batch, now time.Time) {
	r.clock = max(r.clock, b.Clock)
	if r.a == nil {
		return // cannot happen after a Sequencer, which releases no change before a quantum
	}
	for _, c := range b.Changes {
		r.stats.Changes++
		_, s := r.a.Lookup(c.Hash)
		var data []byte
		for _, id := range s.Replicas {
			n := r.nodes[id]
			if n == nil || !n.q.active() {
				continue
			}
			if data == nil {
				data = encodeChange(c) // once, for every replica
			}
			r.push(n, op{data: data, seen: now})
		}
	}
	r.pub.Store(r.clock)
}

// ScanReady reports whether scan id should read on now: it is the first scan its node's
// queue waits for, and the node took enough of what was read before. A snapshot thus waits
// for its node instead of piling up in memory (I5); the node's later changes wait behind it,
// bounded as ever by congestion control. stale is true for a scan the router no longer
// awaits (the node's epoch ended): drop it.
func (r *Router) ScanReady(id uint64) (ready, stale bool) {
	n := r.scanning[id]
	if n == nil {
		return false, true
	}
	return n.q.scanRoom(id, r.cfg.ScanAheadBytes)
}

// ScanItems delivers a part of the items scan id read, in order; more parts and then
// ScanDone follow. Items of the first scan a node waits for go to the node at once.
func (r *Router) ScanItems(id uint64, items []op) {
	if n := r.scanning[id]; n != nil {
		n.q.fill(id, items, false)
	}
}

// ScanDone delivers the last items a scan read, or its error. A scan whose clock the source
// no longer holds is not an error the node can see: it starts over with a snapshot at a
// later clock.
func (r *Router) ScanDone(id uint64, items []op, err error) {
	n := r.scanning[id]
	if n == nil {
		return // the node's epoch ended while the scan ran
	}
	delete(r.scanning, id)
	delete(n.scans, id)
	if err != nil {
		r.snapshot(n)
		return
	}
	n.q.fill(id, items, true)
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
}

// Attach starts a Pull stream for node id, which applied everything before cursor (epoch,
// index): it continues from there if it can, else it starts a snapshot.
func (r *Router) Attach(id assignment.NodeID, epoch, index uint64) (Attached, error) {
	if !r.serves(id) {
		return Attached{}, fmt.Errorf("%w: %s", ErrNotServed, id)
	}
	n := r.nodes[id]
	if n == nil {
		n = r.newNode(id) // a node that holds nothing yet
		r.nodes[id] = n
	}
	if stream, list, ok := n.q.attach(epoch, index); ok {
		return Attached{q: n.q, Stream: stream, Epoch: epoch, Index: index, Resumed: true, Slices: list}, nil
	}
	if !n.q.fresh() {
		// A snapshot the router started by itself (after a failed scan) and that no stream
		// took yet serves as well as a new one, and its scans may be done already.
		r.snapshot(n)
	}
	return Attached{q: n.q, Stream: n.q.attachNew(), Epoch: n.q.epoch}, nil
}

// snapshot starts a new epoch for n: reset, then every slice it holds, scanned at the
// router's clock.
func (r *Router) snapshot(n *node) {
	r.stats.Snapshots++
	r.forgetScans(n)
	n.q.restart(r.cfg.NewEpoch())
	n.q.push(op{data: encodeReset(), scanned: true})
	s := setSlices(n.list)
	s.scanned = true
	n.q.push(s)
	for _, rg := range n.cover.Ranges() {
		n.q.push(op{data: encodeRangeOp(opAddSlice, rg), scanned: true})
		r.scan(n, rg)
	}
}

// Rebase restarts every node's stream with a snapshot at clock or later: the source lost
// changes the router never saw (its watch had to restart at clock).
func (r *Router) Rebase(clock uint64) {
	r.clock = max(r.clock, clock)
	for _, id := range sortedIDs(r.nodes) {
		if n := r.nodes[id]; n.q.active() {
			n.q.restart(0)
			r.forgetScans(n)
		}
	}
	r.pub.Store(r.clock)
}

// Served returns the nodes this distributor serves that hold slices or have pulled.
func (r *Router) Served() []assignment.NodeID {
	return sortedIDs(r.nodes)
}
