package distributor

import (
	"slices"
	"sync"
	"time"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// op is one operation of a node's stream, encoded (see encode.go).
type op struct {
	data []byte
	// seen is when the router routed the change the operation carries; zero for others.
	seen time.Time
	// scanned marks operations of snapshots and scans: congestion control bounds the others.
	scanned bool
	// slices is the list of a set_slices operation (non-nil for one).
	slices []keyspace.Range
	// gen is a generation of the router's map whose every operation for the node is in the
	// stream at or before this one: once the node applied it, the node has seen every slice
	// that generation gives it, and a delta ending with it carries gen (the readiness rule of
	// make-before-break relies on it). It is the generation the operation was queued at,
	// except within a remap, whose operations but the last carry the generation before, and
	// within a snapshot, whose reset makes the node forget every slice: those carry 0 until
	// its last add_slice. A scan's items carry the generation of the operation before the
	// scan.
	gen uint64
}

// opOverhead approximates what an op costs beyond its bytes.
const opOverhead = 96

func (o op) size() int { return opOverhead + len(o.data) + 24*len(o.slices) }

// block holds what the router queued for a node behind a scan that is still running: the
// scan's items, once they arrive, then the operations routed after the scan began. A node
// must see a slice's items before the changes that follow them.
type block struct {
	scan  uint64 // the scan's ID
	done  bool
	items []op
	ops   []op
}

// queue is the stream of operations for one node within one epoch: the ones ready to send
// (numbered from base), then blocks waiting for scans. The router's actions append (see
// applier); the node's Pull handler takes deltas and trims what the node acknowledged. Both
// hold mu only to copy slice headers, so neither waits long for the other. Only the loop
// that applies the actions changes epoch, so it may read it without the lock.
type queue struct {
	mu     sync.Mutex
	epoch  uint64 // 0: none; the node needs a snapshot
	base   uint64 // the index of ready[0]
	ready  []op
	blocks []*block
	// baseSlices is the node's slice list in effect at base (for a stream that resumes there).
	baseSlices []keyspace.Range
	// baseGen is the generation of the operation before base (0 at the epoch's start).
	baseGen uint64
	bytes   int // of every op held
	// changes and blocked are the bytes of the ops that are not scanned, ready and behind a
	// scan: what congestion control bounds (see applier).
	changes, blocked int
	// ahead is the bytes of the scanned ops ready: what the scan-ahead bound counts (see
	// scanRoom). Scanned ops behind a scan (a later range's add_slice, a slice_loaded) are
	// not counted: they cannot leave before the scan ends, so counting them could keep it
	// from ever reading on.
	ahead int
	wake  chan struct{}
	// acked, if set, hears (without waiting) of every acknowledgement: a scan waiting for
	// the node to take what it read may read on.
	acked  chan<- struct{}
	gone   bool   // the node is no longer served here
	stream uint64 // the Pull stream attached last; older ones must end
}

func newQueue() *queue { return &queue{wake: make(chan struct{})} }

// signal wakes the readers; mu must be held.
func (q *queue) signal() {
	close(q.wake)
	q.wake = make(chan struct{})
}

// account counts op o in (sign 1) or out (-1) of the ready ops, or of the blocked ones.
func (q *queue) account(o op, sign int, blocked bool) {
	q.bytes += sign * o.size()
	switch {
	case o.scanned && !blocked:
		q.ahead += sign * o.size()
	case o.scanned:
	case blocked:
		q.blocked += sign * o.size()
	default:
		q.changes += sign * o.size()
	}
}

// push appends an operation after everything queued, and returns the bytes of changes held
// ready and behind scans.
func (q *queue) push(o op) (ready, blocked int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if n := len(q.blocks); n > 0 {
		q.account(o, 1, true)
		q.blocks[n-1].ops = append(q.blocks[n-1].ops, o)
	} else {
		q.account(o, 1, false)
		q.ready = append(q.ready, o)
		q.signal()
	}
	return q.changes, q.blocked
}

// pushScan makes what follows wait for scan id.
func (q *queue) pushScan(id uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.blocks = append(q.blocks, &block{scan: id})
}

// block returns the index of scan id's block, or -1; mu must be held.
func (q *queue) block(id uint64) int {
	for i, b := range q.blocks {
		if b.scan == id {
			return i
		}
	}
	return -1
}

// fill delivers items of scan id, the last ones if done, and releases what no longer waits.
// It reports false if the scan is not awaited (the epoch it was for is over).
func (q *queue) fill(id uint64, items []op, done bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := q.block(id)
	if i < 0 {
		return false
	}
	b := q.blocks[i]
	b.done = done
	b.items = append(b.items, items...)
	for _, o := range items {
		q.account(o, 1, true)
	}
	q.release()
	return true
}

// release makes ready what no longer waits: the items of the first scan, as they arrive, and
// once it is done, the operations held behind it; mu must be held. The items of a later scan
// wait with the operations before them.
func (q *queue) release() {
	released := false
	for len(q.blocks) > 0 {
		b := q.blocks[0]
		if len(b.items) > 0 {
			q.ready = append(q.ready, b.items...)
			for _, o := range b.items {
				q.account(o, -1, true)
				q.account(o, 1, false)
			}
			b.items, released = nil, true
		}
		if !b.done {
			break
		}
		q.ready = append(q.ready, b.ops...)
		for _, o := range b.ops {
			q.account(o, -1, true)
			q.account(o, 1, false)
		}
		q.blocks[0] = nil
		q.blocks, released = q.blocks[1:], true
	}
	if released {
		q.signal()
	}
}

// scanRoom reports whether scan id may deliver more items now: it is the first scan the
// queue waits for, so its items go straight to the node, and the queue holds less than limit
// bytes of scanned operations ready for the node (ahead). stale is true if the scan is not
// awaited.
func (q *queue) scanRoom(id uint64, limit int) (room, stale bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch q.block(id) {
	case -1:
		return false, true
	case 0:
		return q.ahead < limit, false
	}
	return false, false
}

// restart begins epoch (0 for none), dropping everything held.
func (q *queue) restart(epoch uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	clear(q.ready)
	q.epoch, q.base, q.ready, q.blocks, q.baseSlices, q.baseGen = epoch, 0, nil, nil, nil, 0
	q.bytes, q.changes, q.blocked, q.ahead = 0, 0, 0, 0
	q.signal()
}

// close ends the queue: the node is no longer served here.
func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	clear(q.ready)
	q.gone, q.epoch, q.ready, q.blocks = true, 0, nil, nil
	q.bytes, q.changes, q.blocked, q.ahead = 0, 0, 0, 0
	q.signal()
}

// tail returns the index after the last ready operation; mu must be held.
func (q *queue) tail() uint64 { return q.base + uint64(len(q.ready)) }

// attach starts a stream at index of epoch if the queue can continue from there, trimming
// what precedes it, and returns the stream's number and the slice list and generation in
// effect there.
func (q *queue) attach(epoch, index uint64) (stream uint64, slices []keyspace.Range, gen uint64, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.gone || epoch == 0 || epoch != q.epoch || index < q.base || index > q.tail() {
		return 0, nil, 0, false
	}
	q.trim(index, time.Time{}, nil)
	q.stream++
	q.signal() // an older stream of the node must notice it is replaced
	return q.stream, q.baseSlices, q.baseGen, true
}

// fresh reports whether the queue holds a whole epoch, from its reset on: any node, whatever
// it holds, can start there.
func (q *queue) fresh() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.gone && q.epoch != 0 && q.base == 0
}

// attachNew starts a stream at the beginning of the current epoch, which the caller just
// began.
func (q *queue) attachNew() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.stream++
	q.signal()
	return q.stream
}

// trim forgets the operations before index; mu must be held. The latency of each change
// acknowledged is observed at now.
func (q *queue) trim(index uint64, now time.Time, observe func(time.Duration)) {
	n := min(index, q.tail()) - q.base
	for i := range n {
		o := q.ready[i]
		if o.slices != nil {
			q.baseSlices = o.slices
		}
		q.baseGen = o.gen
		if observe != nil && !o.seen.IsZero() {
			observe(now.Sub(o.seen))
		}
		q.account(o, -1, false)
		q.ready[i] = op{}
	}
	q.ready = q.ready[n:]
	q.base += n
}

// ack records that the node applied everything before index of epoch.
func (q *queue) ack(epoch, index uint64, now time.Time, observe func(time.Duration)) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if epoch == q.epoch && index > q.base {
		q.trim(index, now, observe)
		if len(q.blocks) > 0 { // a scan may wait for room
			select {
			case q.acked <- struct{}{}:
			default:
			}
		}
	}
}

// takeState says what take found.
type takeState int

const (
	takeOK       takeState = iota
	takeReplaced           // a newer stream of the node took over
	takeGone               // the node is no longer served here
	takeRestart            // the epoch ended: the node needs a snapshot
)

// take returns up to maxOps operations (and at least one, if any) of at most maxBytes from
// index next of the stream's epoch, the clock the node's data reflects once they are
// applied (0 if it is no state of the source), and a channel closed when there may be more.
// routerClock is the router's clock, read before the call: when the delta reaches the end of
// what is queued, the node is up to date with it.
func (q *queue) take(stream, epoch, next uint64, maxOps, maxBytes int, routerClock uint64) (ops []op, clock uint64, wake <-chan struct{}, st takeState) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.gone:
		return nil, 0, nil, takeGone
	case stream != q.stream:
		return nil, 0, nil, takeReplaced
	case epoch != q.epoch || next < q.base || next > q.tail():
		// The epoch ended, or the stream is out of step with the queue: either way the
		// node starts over.
		return nil, 0, nil, takeRestart
	}
	avail := q.ready[next-q.base:]
	n, bytes := 0, 0
	for n < len(avail) && n < maxOps && (n == 0 || bytes+len(avail[n].data) <= maxBytes) {
		bytes += len(avail[n].data)
		n++
	}
	// A copy: once the lock is released, a newer stream of the node may acknowledge past
	// these operations, and trim zeroes the queue's entries in place while this stream
	// still encodes them.
	ops = slices.Clone(avail[:n])
	if n == len(avail) && len(q.blocks) == 0 {
		// Only at the end of what is queued is the node's data a state of the source: within
		// the queue, a slice may be added and its items still to come.
		clock = routerClock
	}
	return ops, clock, q.wake, takeOK
}

// depth returns the operations and bytes held.
func (q *queue) depth() (ops, bytes int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ops = len(q.ready)
	for _, b := range q.blocks {
		ops += len(b.items) + len(b.ops)
	}
	return ops, q.bytes
}
