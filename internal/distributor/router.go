package distributor

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/source"
)

// ErrNotServed is returned for a node that another distributor serves.
var ErrNotServed = errors.New("distributor: node not served here")

// RouterConfig configures a Router.
type RouterConfig struct {
	// ID is this distributor's ID: it serves the nodes that the distributor set gives it.
	ID string
	// MaxQueueBytes bounds what a node's queue holds of changes the node has not
	// acknowledged; beyond it the node's queue is dropped and the node catches up by a
	// snapshot. Default 64 MiB. The queues apply it (see applier), since only they see
	// what nodes acknowledge.
	MaxQueueBytes int
	// ScanAheadBytes bounds the scanned items a node's queue holds that the node has not
	// acknowledged: a snapshot is read only as fast as the node takes it, so it never has to
	// fit in memory. Default 8 MiB. The scanner applies it (see applier.scanReady).
	ScanAheadBytes int
	// NewEpoch returns a new epoch: nonzero, and unlike any other this distributor or any
	// earlier run of it gave out. Default: random.
	NewEpoch func() uint64
}

// ScanRequest asks for the items of a range as of a clock, for a node. The node's queue
// waits for them from the point of the Scan action that carries the request.
type ScanRequest struct {
	ID    uint64
	Node  assignment.NodeID
	Range keyspace.Range
	Clock uint64
}

// ActionKind says what an Action does.
type ActionKind uint8

const (
	// Open: the router serves Node from now on. Its queue is empty and has no epoch: the
	// node needs a snapshot.
	Open ActionKind = iota + 1
	// Enqueue appends Op to Node's queue, after everything queued before, scans included.
	Enqueue
	// Scan asks for the items of Scan.Range at Scan.Clock: what Node's queue gets after it
	// waits for them. Scan.ID is higher than any before.
	Scan
	// Fill delivers Items, the next items scan ScanID read for Node, in order; Done says
	// they are the scan's last.
	Fill
	// Restart drops everything Node's queue holds and begins Epoch: a new one, whose stream
	// the following Enqueues make, or 0 for none (the node must start over with a snapshot).
	Restart
	// Close: Node is no longer served here; its queue ends, and so do its streams.
	Close
	// Publish makes Clock the router's clock for the Pull handlers: every change up to it is
	// in the queues.
	Publish
)

var actionNames = [...]string{Open: "open", Enqueue: "enqueue", Scan: "scan", Fill: "fill",
	Restart: "restart", Close: "close", Publish: "publish"}

func (k ActionKind) String() string {
	if int(k) < len(actionNames) && actionNames[k] != "" {
		return actionNames[k]
	}
	return fmt.Sprintf("ActionKind(%d)", uint8(k))
}

// Action is what the router asks of whoever holds the nodes' queues. It is a plain value,
// one struct for every kind (the fields a kind does not use are zero) so that a list of
// them is one allocation: a batch of changes makes one Enqueue per replica. It is kept
// small for the same reason: what only Scan uses is behind a pointer.
type Action struct {
	Kind ActionKind
	Done bool // Fill: the scan's last items
	// slot is Node's number among the nodes served, which no two of them share at once:
	// the applier finds a node's queue by it without a map lookup per operation.
	slot   int32
	Node   assignment.NodeID // every kind but Publish
	Epoch  uint64            // Restart
	Clock  uint64            // Publish
	ScanID uint64            // Fill
	Scan   *ScanRequest      // Scan
	Op     op                // Enqueue
	Items  []op              // Fill
}

// node is what the router knows of a node it serves.
type node struct {
	id   assignment.NodeID
	slot int32 // see Action.slot
	// epoch is the epoch of the node's queue, as the router's actions set it: 0 while the
	// node waits for a snapshot, when nothing is queued for it.
	epoch uint64
	cover keyspace.Set     // the points the node holds, by the map
	list  []keyspace.Range // the map's slices the node holds, in order
	// scans are the scans running for the node's current epoch.
	scans map[uint64]scanned
	// gen is the generation of the last operation queued for the node: see op.gen.
	gen uint64
}

// pendingLoad is a scan of rg for node n, done in n's epoch epoch, whose items are as of
// clock at: n has loaded rg once the changes up to at follow them.
type pendingLoad struct {
	n     *node
	epoch uint64
	rg    keyspace.Range
	at    uint64
}

// scanned is what the router keeps of a running scan.
type scanned struct {
	rg  keyspace.Range
	gen uint64 // of the operation queued before the scan: its items follow it
}

// Stats counts what the router did. Ops counts the operations routed (snapshots' aside),
// those a queue did not take because it had just overflowed included.
type Stats struct {
	Quanta, Changes, Ops uint64
	Snapshots, Overflows uint64
}

// Router turns quanta and changes, in causal order (see Sequencer), into each served node's
// stream of operations: for a slice a node gains, "add slice" and the slice's items as of the
// cut, the router's clock when it applies the quantum (scanned by the caller; I2); for a
// slice it loses, "drop slice"; for every change, the change, to every replica that holds
// it.
//
// The router is passive and deterministic: events in, actions out. Every method that
// changes what nodes are sent returns the actions that do it, which the caller applies in
// order (see applier); the same events give the same actions. The router does no I/O and
// holds no queue: scans are Scan actions the caller runs and answers with ScanItems and
// ScanDone, and what only the queues can know, since nodes acknowledge to them directly, comes
// back as events: a queue that outgrew its bound (Overflowed), and whether a queue still
// holds its whole epoch (Attach).
//
// Order: the actions of one call are to be applied in the order given, and the same events
// give the same list. A node's Enqueue, Scan and Fill actions follow its stream, after the
// Restart that begins its epoch. A quantum gives the Closes of the nodes no longer served,
// then the Opens of new ones, then each node's operations, every group in the sorted order
// of node IDs; a batch of changes gives, change after change, an Enqueue per replica in the
// order of the slice's replicas; a scan's end gives its last Fill, then the Enqueue of
// slice_loaded for what of its range the node still holds; a rebase gives its Restarts in
// node order. Scan IDs rise in the order of the Scan actions. A Publish, where there is one,
// is last.
//
// The list a method returns is the caller's to apply, and to clear if it likes, until the
// router's next call, which reuses it. The router is not safe for concurrent use.
type Router struct {
	cfg      RouterConfig
	a        *assignment.Assignment
	dists    quantum.Distributors
	clock    uint64
	pos      quantum.Position // of the last quantum applied
	started  bool             // a quantum was applied: pos means something
	nodes    map[assignment.NodeID]*node
	scanning map[uint64]*node
	nextScan uint64
	acts     []Action // of the current call
	// loads are the ends of scans positioned past the router's clock: their slice_loaded
	// waits until the changes up to that clock are routed (see ScanDone).
	loads []pendingLoad
	slots int32   // the slots given out
	free  []int32 // the slots of nodes no longer served, to give out again
	stats Stats
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
	return &Router{cfg: cfg, nodes: map[assignment.NodeID]*node{}, scanning: map[uint64]*node{}}
}

// Clock returns the router's clock: every change up to it has been routed.
func (r *Router) Clock() uint64 { return r.clock }

// Stats returns what the router did so far.
func (r *Router) Stats() Stats { return r.stats }

// begin starts the action list of a call. A long list is let go, so that its memory is
// not held for good; a short one is reused as it is.
func (r *Router) begin() {
	if cap(r.acts) > maxKeptActions {
		r.acts = nil
	}
	r.acts = r.acts[:0]
}

// maxKeptActions is the longest action list the router keeps for its next call.
const maxKeptActions = 4096

// publish emits the router's clock, last.
func (r *Router) publish() { r.acts = append(r.acts, Action{Kind: Publish, Clock: r.clock}) }

// act emits an action for node n.
func (r *Router) act(n *node, a Action) {
	a.Node, a.slot = n.id, n.slot
	r.acts = append(r.acts, a)
}

// serves reports whether this distributor serves node id.
func (r *Router) serves(id assignment.NodeID) bool {
	if id == assignment.Nobody { // the holder of quarantined ranges: no node pulls for it
		return false
	}
	d, _, ok := r.dists.For(id)
	return ok && d == r.cfg.ID
}

// Quantum applies a quantum: the map changes, and with it what each served node holds.
//
// Like the routers of the client library, it refuses, without applying it, a quantum from a
// term older than one it applied (a deposed leader's, which may undo the new leader's
// changes) and operations that do not follow its position within a term.
func (r *Router) Quantum(q quantum.Quantum) ([]Action, error) {
	r.begin()
	next, err := (quantum.Follower{Pos: r.pos, Started: r.started, Holder: "the router"}).Follow(r.a, q)
	if err != nil {
		return nil, fmt.Errorf("distributor: %w", err)
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
	r.releaseLoads()
	r.publish()
	return r.acts, nil
}

// Position returns the position of the last quantum applied (zero before the first).
func (r *Router) Position() quantum.Position { return r.pos }

// remap works out what every served node holds under the current map and distributors, and
// emits the difference.
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
	// Maps are walked in sorted order: the order of the actions, and so the scans' IDs,
	// must not depend on Go's map order.
	for _, id := range sortedIDs(r.nodes) {
		if n := r.nodes[id]; !r.serves(id) {
			r.act(n, Action{Kind: Close})
			r.free = append(r.free, n.slot)
			delete(r.nodes, id)
			r.forgetScans(n)
		}
	}
	for _, id := range sortedIDs(lists) {
		if r.nodes[id] == nil {
			r.open(id)
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

// open starts serving node id, whose queue has no epoch yet.
func (r *Router) open(id assignment.NodeID) *node {
	n := &node{id: id, scans: map[uint64]scanned{}}
	if k := len(r.free); k > 0 {
		n.slot, r.free = r.free[k-1], r.free[:k-1]
	} else {
		n.slot = r.slots
		r.slots++
	}
	r.nodes[id] = n
	r.act(n, Action{Kind: Open})
	return n
}

// update makes node n hold the slices of list, emitting the operations that get it there.
//
// Only the last of these operations carries the map's generation (see op.gen): a node that
// applied the first add_slice of a remap and not the second has not seen all that the
// generation gave it, and must not say it has.
func (r *Router) update(n *node, list []keyspace.Range) {
	cover := keyspace.NewSet(list...)
	lost, gained := n.cover.Minus(cover).Ranges(), cover.Minus(n.cover).Ranges()
	relisted := !slices.Equal(n.list, list)
	n.cover, n.list = cover, list
	if n.epoch == 0 {
		return // the node's snapshot will hold all of it
	}
	gen, left := r.generation(), len(lost)+len(gained)
	if relisted {
		left++
	}
	next := func() {
		if left--; left == 0 {
			n.gen = gen
		}
	}
	for _, rg := range lost {
		next()
		r.push(n, op{data: encodeRangeOp(opDropSlice, rg)})
	}
	if relisted {
		next()
		r.push(n, setSlices(list))
	}
	for _, rg := range gained {
		next()
		r.push(n, op{data: encodeRangeOp(opAddSlice, rg)})
		r.scan(n, rg)
	}
	n.gen = gen
}

// generation returns the generation of the router's map, 0 before it has one.
func (r *Router) generation() uint64 {
	if r.a == nil {
		return 0
	}
	return r.a.Generation()
}

func setSlices(list []keyspace.Range) op {
	if list == nil {
		list = []keyspace.Range{} // non-nil marks the op as set_slices
	}
	return op{data: encodeSetSlices(list), slices: list}
}

// push queues an operation for a node. Congestion control bounds what the node's queue
// holds of such operations; the queue, which sees what the node acknowledges, tells of an
// overflow (see Overflowed).
func (r *Router) push(n *node, o op) {
	r.stats.Ops++
	o.gen = n.gen
	// Built in place, not through act: a change costs little else.
	r.acts = append(r.acts, Action{Kind: Enqueue, Node: n.id, slot: n.slot, Op: o})
}

// scan asks for the items of rg at the router's clock, to follow what is queued for n: the
// cut of I2, which every change routed so far precedes, whether or not the quantum's own
// clock does.
func (r *Router) scan(n *node, rg keyspace.Range) {
	r.nextScan++
	id := r.nextScan
	n.scans[id] = scanned{rg: rg, gen: n.gen}
	r.scanning[id] = n
	r.act(n, Action{Kind: Scan, Scan: &ScanRequest{ID: id, Node: n.id, Range: rg, Clock: r.clock}})
}

func (r *Router) forgetScans(n *node) {
	for _, id := range slices.Sorted(maps.Keys(n.scans)) {
		delete(r.scanning, id)
	}
	clear(n.scans)
}

// Changes routes a batch of changes, all with one clock, to the nodes that hold them. The
// router's clock reaches the batch's with the last batch of its clock (source.Batch.More).
func (r *Router) Changes(b source.Batch, now time.Time) []Action {
	r.begin()
	if !b.More {
		r.clock = max(r.clock, b.Clock)
	}
	if r.a == nil {
		return nil // cannot happen after a Sequencer, which releases no change before a quantum
	}
	for _, c := range b.Changes {
		r.stats.Changes++
		_, s := r.a.Lookup(c.Hash)
		var data []byte
		for _, id := range s.Replicas {
			n := r.nodes[id]
			if n == nil || n.epoch == 0 {
				continue
			}
			if data == nil {
				data = encodeChange(c) // once, for every replica
			}
			r.push(n, op{data: data, seen: now})
		}
	}
	r.releaseLoads()
	r.publish()
	return r.acts
}

// Progress is the event of the source having delivered, and the router routed, every change
// up to clock, with no quantum at or before it left to apply (Sequencer.Settled): the
// router's clock reaches it, so that nodes learn how far they are when no change comes,
// and the scans waiting for it are loaded. Later quanta are applied at later cuts.
func (r *Router) Progress(clock uint64) []Action {
	r.begin()
	if clock <= r.clock {
		return nil
	}
	r.clock = clock
	r.releaseLoads()
	r.publish()
	return r.acts
}

// Overflowed is the event of node id's queue outgrowing its bound: a node whose queue of
// changes outgrows it is dropped to a snapshot, which costs it a rescan but keeps the
// distributor's memory bounded whatever the node does. Nothing more is applied to the
// node's queue until the Restart this returns.
//
// The queue sees the overflow, not the router: what counts is what the node has not
// acknowledged, and nodes acknowledge to their queues directly, so that acknowledgements
// never wait for the router's loop. A count of the router's own would need every
// acknowledgement stepped in as an event. What the queue holds is the router's doing all
// the same: given the same acknowledgements, the event comes at the same point.
func (r *Router) Overflowed(id assignment.NodeID) []Action {
	r.begin()
	n := r.nodes[id]
	if n == nil || n.epoch == 0 {
		return nil // dropped already
	}
	r.stats.Overflows++
	r.drop(n)
	return r.acts
}

// drop ends n's epoch: it waits for a snapshot.
func (r *Router) drop(n *node) {
	n.epoch = 0
	r.forgetScans(n)
	r.act(n, Action{Kind: Restart})
}

// ScanItems delivers a part of the items scan id read, in order; more parts and then
// ScanDone follow. Items of the first scan a node waits for go to the node at once.
func (r *Router) ScanItems(id uint64, items []op) []Action {
	r.begin()
	if n := r.scanning[id]; n != nil {
		stamp(items, n.scans[id].gen)
		r.act(n, Action{Kind: Fill, ScanID: id, Items: items})
	}
	return r.acts
}

// stamp gives items the generation of the operation queued before their scan, which they
// follow in the node's stream.
func stamp(items []op, gen uint64) {
	for i := range items {
		items[i].gen = gen
	}
}

// ScanDone delivers the last items a scan read, or its error, and the clock the scan is
// positioned at (source.Source.Scan; 0 for the clock asked). A scan whose clock the source
// no longer holds is not an error the node can see: it starts over with a snapshot at a
// later clock.
//
// Once a scan is done, the node is told that it holds all of the scan's range that it still
// holds (slice_loaded), at the end of its queue: after the scan's items and after the changes
// routed since the scan began, which wait behind them. A scan positioned past the router's
// clock (a source that reads only the present) may hold items newer than changes not yet
// routed, which the node applies over them: slice_loaded then waits until the router's
// clock reaches the scan's, when those changes are behind the items too.
func (r *Router) ScanDone(id uint64, items []op, at uint64, err error) []Action {
	r.begin()
	n := r.scanning[id]
	if n == nil {
		return nil // the node's epoch ended while the scan ran
	}
	sc := n.scans[id]
	delete(r.scanning, id)
	delete(n.scans, id)
	if err != nil {
		r.snapshot(n)
		return r.acts
	}
	stamp(items, sc.gen)
	r.act(n, Action{Kind: Fill, ScanID: id, Items: items, Done: true})
	if at > r.clock {
		r.loads = append(r.loads, pendingLoad{n: n, epoch: n.epoch, rg: sc.rg, at: at})
		return r.acts
	}
	r.loaded(n, sc.rg)
	return r.acts
}

// loaded tells n that it holds all of rg that it still holds.
func (r *Router) loaded(n *node, rg keyspace.Range) {
	for _, part := range keyspace.NewSet(rg).Intersect(n.cover).Ranges() {
		r.act(n, Action{Kind: Enqueue, Op: op{data: encodeRangeOp(opSliceLoaded, part), scanned: true, gen: n.gen}})
	}
}

// releaseLoads emits the slice_loaded of the scans the router's clock has reached, in the
// order the scans ended; a node no longer served, or in another epoch, is not told.
func (r *Router) releaseLoads() {
	kept := r.loads[:0]
	for _, p := range r.loads {
		switch {
		case p.at > r.clock:
			kept = append(kept, p)
		case r.nodes[p.n.id] == p.n && p.n.epoch == p.epoch:
			r.loaded(p.n, p.rg)
		}
	}
	clear(r.loads[len(kept):])
	r.loads = kept
}

// Waiting returns the clock the router waits for the source to reach, if a scan's
// slice_loaded waits for it: the caller asks the source for progress meanwhile.
func (r *Router) Waiting() (uint64, bool) {
	if len(r.loads) == 0 {
		return 0, false
	}
	least := r.loads[0].at
	for _, p := range r.loads[1:] {
		least = min(least, p.at)
	}
	return least, true
}

// Attach is the start of a Pull stream for node id that could not resume where the node
// is in its queue. fresh says whether the queue holds its whole current epoch, from its
// reset on (nothing of it was acknowledged): any node, whatever it holds, can start there.
// Otherwise the node starts over with a new snapshot.
func (r *Router) Attach(id assignment.NodeID, fresh bool) ([]Action, error) {
	r.begin()
	if !r.serves(id) {
		return nil, fmt.Errorf("%w: %s", ErrNotServed, id)
	}
	n := r.nodes[id]
	if n == nil {
		n = r.open(id) // a node that holds nothing yet
	}
	// A snapshot the router started by itself (after a failed scan) and that no stream took
	// yet serves as well as a new one, and its scans may be done already.
	if !fresh || n.epoch == 0 {
		r.snapshot(n)
	}
	return r.acts, nil
}

// snapshot starts a new epoch for n: reset, then every slice it holds, scanned at the
// router's clock.
//
// The reset makes the node forget every slice: its operations carry generation 0 (the node
// holds no generation's slices) but the last, which carries the map's (see op.gen).
func (r *Router) snapshot(n *node) {
	r.stats.Snapshots++
	r.forgetScans(n)
	n.epoch, n.gen = r.cfg.NewEpoch(), 0
	r.act(n, Action{Kind: Restart, Epoch: n.epoch})
	r.act(n, Action{Kind: Enqueue, Op: op{data: encodeReset(), scanned: true}})
	ranges := n.cover.Ranges()
	gen := r.generation()
	s := setSlices(n.list)
	s.scanned = true
	if len(ranges) == 0 {
		n.gen = gen
	}
	s.gen = n.gen
	r.act(n, Action{Kind: Enqueue, Op: s})
	for i, rg := range ranges {
		if i == len(ranges)-1 {
			n.gen = gen
		}
		r.act(n, Action{Kind: Enqueue, Op: op{data: encodeRangeOp(opAddSlice, rg), scanned: true, gen: n.gen}})
		r.scan(n, rg)
	}
}

// Rebase restarts every node's stream with a snapshot at clock or later: the source lost
// changes the router never saw (its watch had to restart at clock).
func (r *Router) Rebase(clock uint64) []Action {
	r.begin()
	r.clock = max(r.clock, clock)
	for _, id := range sortedIDs(r.nodes) {
		if n := r.nodes[id]; n.epoch != 0 {
			r.drop(n)
		}
	}
	r.releaseLoads() // every node's epoch ended: this forgets them
	r.publish()
	return r.acts
}

// Served returns the nodes this distributor serves that hold slices or have pulled.
func (r *Router) Served() []assignment.NodeID {
	return sortedIDs(r.nodes)
}
