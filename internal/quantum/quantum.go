// Package quantum holds quanta, the atomic steps of the assignment, and the hub that streams
// them to watchers.
//
// A quantum is the batch of operations of one balancing pass or admin change (or a
// clock-only step), stamped with a position (term, seq) and a Lamport clock. Positions are
// totally ordered, term first: a new leader's term is higher than any before it, and seq
// counts the quanta of one term from 1. Operations only make sense within a term; a watcher
// that comes from another term, or from too far back, first gets a reinitializing quantum
// carrying the whole map.
package quantum

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// Position is a place in the stream of quanta.
type Position struct {
	Term, Seq uint64
}

// Less reports whether p comes before q.
func (p Position) Less(q Position) bool {
	return p.Term < q.Term || p.Term == q.Term && p.Seq < q.Seq
}

func (p Position) String() string { return fmt.Sprintf("%d.%d", p.Term, p.Seq) }

// Quantum is one step of the assignment.
type Quantum struct {
	Position
	// Clock is the Lamport clock: every source change with a clock <= Clock precedes the
	// quantum, and none after it.
	Clock uint64
	// Generation is the assignment's generation once the quantum is applied.
	Generation uint64
	// Ops transform the map of the previous quantum; empty for a clock-only quantum.
	Ops []assignment.Op
	// Snapshot is the whole map of a reinitializing quantum (which has no Ops).
	Snapshot *assignment.Assignment
	// Distributors is the set of live distributors, on every reinitializing quantum (a
	// change of the set is sent as one); nil on others.
	Distributors Distributors
	// Cause says where the quantum came from: "pass", "clock", "reinit", or the admin call.
	Cause string
	// By is the identity whose call made the quantum, for the audit trail; "" for the
	// assigner's own.
	By   string
	Time time.Time
}

// ClockOnly reports whether the quantum only advances the clock.
func (q Quantum) ClockOnly() bool { return len(q.Ops) == 0 && q.Snapshot == nil }

// Reinitializing reports whether the quantum carries the whole map.
func (q Quantum) Reinitializing() bool { return q.Snapshot != nil }

// Next returns the map q leads to from cur, the map of the quantum before it: q's own for a
// reinitializing quantum, cur for a clock-only one, else cur with q's operations applied,
// which must reach q's generation (a watcher that missed a change finds out here). Only a
// reinitializing quantum may come first (cur nil). holder names cur's holder in the errors:
// "the router".
func (q Quantum) Next(cur *assignment.Assignment, holder string) (*assignment.Assignment, error) {
	switch {
	case q.Snapshot != nil:
		return q.Snapshot, nil
	case cur == nil:
		return nil, fmt.Errorf("quantum %s changes a map %s never had", q.Position, holder)
	case len(q.Ops) == 0:
		return cur, nil
	}
	next, err := cur.Apply(q.Ops)
	if err != nil {
		return nil, fmt.Errorf("quantum %s does not apply to generation %d: %w", q.Position, cur.Generation(), err)
	}
	if next.Generation() != q.Generation {
		return nil, fmt.Errorf("quantum %s leads to generation %d, but applied to %s's map it gives %d",
			q.Position, q.Generation, holder, next.Generation())
	}
	return next, nil
}

// size approximates the memory a quantum holds, to bound the hub's ring.
func (q Quantum) size() int { return 128 + 48*len(q.Ops) }

// ErrClosed is returned by Next once the hub is closed (its leader stepped down).
var ErrClosed = errors.New("quantum: hub closed")

// HubConfig bounds what a hub keeps for watchers that resume.
type HubConfig struct {
	// MaxQuanta and MaxBytes bound the recent quanta kept; defaults 4096 and 64 MiB.
	MaxQuanta int
	MaxBytes  int
	// Follows says the hub follows another's stream (a relay's copy of the assigner's) and
	// may lag its watchers: a watcher resuming from a position ahead of the hub waits for
	// the hub to reach it, instead of starting over from an older map. The assigner's own
	// hub is the stream's origin: a position ahead of it was never given out.
	Follows bool
}

// Hub holds the current map and the recent quanta of one term, and streams them to
// subscribers. Publishing never waits for subscribers: each keeps a cursor into the recent
// quanta, and one that falls behind what the hub keeps gets a reinitializing quantum instead
// of an unbounded queue.
type Hub struct {
	cfg HubConfig

	mu      sync.Mutex
	current *assignment.Assignment
	dists   Distributors
	pos     Position // of the last quantum; Seq 0 before the first of the term
	clock   uint64
	recent  []Quantum // seqs first..pos.Seq
	first   uint64    // seq of recent[0]
	last    time.Time // when the last quantum was emitted
	bytes   int
	wake    chan struct{} // closed and replaced at every publish and at Close
	// wakeMap is wake for the subscribers that skip clock-only quanta (routers, members):
	// closed and replaced only when a quantum changes the map, at Reset and at Close. While a
	// source changes, the assigner ticks the clock every 20 ms; a relay's ten thousand
	// routers woke to each tick only to skip it.
	wakeMap chan struct{}
	// trimmedMap is the seq of the last quantum that changed the map and has left recent: a
	// subscriber that skips clock-only quanta and whose cursor is after it, but before first,
	// missed only clock ticks and is not behind.
	trimmedMap uint64
	closed     bool
	// epoch counts Resets, and base is the position of the last: a subscription made
	// before it starts over, unless it stands at or after base in base's term.
	epoch uint64
	base  Position
}

// NewHub returns a hub for term, starting from map a at clock. a may be nil while there is no
// map yet: subscribers then wait for the first quantum.
func NewHub(cfg HubConfig, term uint64, a *assignment.Assignment, clock uint64) *Hub {
	if cfg.MaxQuanta <= 0 {
		cfg.MaxQuanta = 4096
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 64 << 20
	}
	return &Hub{cfg: cfg, current: a, dists: Distributors{}, pos: Position{Term: term}, clock: clock, first: 1,
		wake: make(chan struct{}), wakeMap: make(chan struct{})}
}

// Distributors returns the current set of distributors.
func (h *Hub) Distributors() Distributors {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dists
}

// Current returns the current map, the position of the last quantum and the clock.
func (h *Hub) Current() (*assignment.Assignment, Position, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.current, h.pos, h.clock
}

// Publish appends the next quantum of the term and the map it leads to. The quantum's
// position must follow the last one, and its clock must not go back.
func (h *Hub) Publish(q Quantum, after *assignment.Assignment) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closed:
		return ErrClosed
	case !h.pos.Precedes(q.Position):
		return fmt.Errorf("quantum: publishing %s after %s", q.Position, h.pos)
	case q.Clock < h.clock:
		return fmt.Errorf("quantum: clock %d goes back from %d", q.Clock, h.clock)
	}
	h.current, h.pos, h.clock, h.last = after, q.Position, q.Clock, q.Time
	if q.Distributors != nil {
		h.dists = q.Distributors
	}
	h.recent = append(h.recent, q)
	h.bytes += q.size()
	for len(h.recent) > 1 && (len(h.recent) > h.cfg.MaxQuanta || h.bytes > h.cfg.MaxBytes) {
		if !h.recent[0].ClockOnly() {
			h.trimmedMap = h.recent[0].Seq
		}
		h.bytes -= h.recent[0].size()
		h.recent[0] = Quantum{} // let the ops go
		h.recent = h.recent[1:]
		h.first++
	}
	h.wakeUp(!q.ClockOnly())
	return nil
}

// wakeUp wakes the subscribers waiting for a quantum: all of them, or, for a clock tick
// (mapChanged false), those that take clock-only quanta.
func (h *Hub) wakeUp(mapChanged bool) {
	close(h.wake)
	h.wake = make(chan struct{})
	if mapChanged {
		close(h.wakeMap)
		h.wakeMap = make(chan struct{})
	}
}

// Reset makes q, a reinitializing quantum, the hub's new start: the map and position it
// carries replace the hub's, the recent quanta go, and every subscription starts over from q's
// map (or resumes, if it stands at q's position). A relay resets its hub when the stream it
// follows starts over: a new term, or a reconnection that found its position gone. A
// quantum of an older term, or one that goes back in the same term, is refused.
func (h *Hub) Reset(q Quantum) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closed:
		return ErrClosed
	case q.Snapshot == nil:
		return fmt.Errorf("quantum: resetting to %s, which carries no map", q.Position)
	}
	if err := (Follower{Pos: h.pos, Started: true, Holder: "the hub"}).Admit(q); err != nil {
		return fmt.Errorf("quantum: resetting: %w", err)
	}
	h.current, h.pos, h.clock, h.last = q.Snapshot, q.Position, q.Clock, q.Time
	if q.Distributors != nil {
		h.dists = q.Distributors
	}
	clear(h.recent)
	h.recent, h.first, h.bytes = h.recent[:0], q.Seq+1, 0
	h.epoch++
	h.base = q.Position
	h.trimmedMap = q.Seq // what came before the base was never here
	h.wakeUp(true)
	return nil
}

// Recent returns up to limit of the most recent quanta, oldest first.
func (h *Hub) Recent(limit int, clockOnly bool) []Quantum {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Quantum
	for i := len(h.recent) - 1; i >= 0 && len(out) < limit; i-- {
		// A clock-only quantum made by someone's call records that call (a freeze, a
		// registration): it is history, not a tick of the clock.
		if q := h.recent[i]; clockOnly || !q.ClockOnly() || q.By != "" {
			out = append(out, q)
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// Close ends every subscription with ErrClosed.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		close(h.wake)
		close(h.wakeMap)
	}
}

// onlyTicksLeft reports whether a subscriber whose next quantum is at seq next, and which
// takes clock ticks or not, lost nothing it takes when the quanta before first left the
// hub: it skips ticks, and every quantum that changed the map and left was before next.
func (h *Hub) onlyTicksLeft(next uint64, clockQuanta bool) bool {
	return !clockQuanta && next > h.trimmedMap
}

// Subscription is one watcher's cursor.
type Subscription struct {
	h           *Hub
	next        uint64 // seq of the next quantum to deliver
	reinit      bool
	clockQuanta bool
	epoch       uint64   // the hub's when the cursor was set
	at          Position // the last position delivered, or the one subscribed from
}

// Subscribe starts a subscription after position from, or with a reinitializing quantum if
// from is nil, of another term, or older than the quanta the hub keeps. With clockQuanta
// false, clock-only quanta are skipped.
func (h *Hub) Subscribe(from *Position, clockQuanta bool) *Subscription {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := &Subscription{h: h, clockQuanta: clockQuanta, reinit: true, epoch: h.epoch}
	if from == nil {
		return s
	}
	s.at = *from
	ahead := h.pos.Less(*from) && h.cfg.Follows
	if from.Term == h.pos.Term && (from.Seq+1 >= h.first || h.onlyTicksLeft(from.Seq+1, clockQuanta)) && (from.Seq <= h.pos.Seq || ahead) {
		s.next, s.reinit = from.Seq+1, false
	}
	return s
}

// Next returns the next quantum, waiting for it until ctx ends.
func (s *Subscription) Next(ctx context.Context) (Quantum, error) {
	h := s.h
	for {
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return Quantum{}, ErrClosed
		}
		if s.epoch != h.epoch {
			// The hub started over: from its map, unless the subscriber stands at or after its
			// position in its term.
			s.epoch = h.epoch
			s.reinit = s.at.Term != h.base.Term || s.at.Seq < h.base.Seq
			s.next = s.at.Seq + 1
		}
		if !s.reinit && s.next < h.first && h.onlyTicksLeft(s.next, s.clockQuanta) {
			s.next, s.at = h.first, Position{Term: h.pos.Term, Seq: h.first - 1}
		}
		// A following hub sends no map older than the subscriber has: it waits to catch up.
		if (s.reinit || s.next < h.first) && h.current != nil && (!h.cfg.Follows || !h.pos.Less(s.at)) {
			// Too far behind, or never in step: start over from the whole map.
			// Every subscriber starting over at a position gets the same quantum, so that a
			// transport can encode it once for all of them.
			q := Quantum{Position: h.pos, Clock: h.clock, Generation: h.current.Generation(),
				Snapshot: h.current, Distributors: h.dists, Cause: "reinit", Time: h.last}
			s.next, s.reinit, s.at = h.pos.Seq+1, false, h.pos
			h.mu.Unlock()
			return q, nil
		}
		if !s.reinit && s.next <= h.pos.Seq {
			q := h.recent[s.next-h.first]
			s.next++
			s.at = q.Position
			h.mu.Unlock()
			if q.ClockOnly() && !s.clockQuanta {
				continue
			}
			return q, nil
		}
		wake := h.wake
		if !s.clockQuanta {
			wake = h.wakeMap
		}
		h.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return Quantum{}, ctx.Err()
		}
	}
}
