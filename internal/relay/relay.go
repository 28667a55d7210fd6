// Package relay keeps a copy of the assigner's stream of quanta and serves it to routers and
// members, so that the leader is not the fan-out point of the whole fleet: the leader streams
// each quantum to the relays (the distributors), and each relay to its share of the
// watchers, with the protocol the leader itself serves (package mapserve).
//
// Relay is the passive core: Take applies the quanta its driver received, in order, to a hub
// that follows the assigner's (quantum.HubConfig.Follows). It never takes a quantum of an
// older term than the map it holds, so it never serves an older term's map after a newer
// one; a stream that starts over (a new term, or a position the assigner no longer holds)
// resets the hub, and its watchers start over from the new map, except those already at its
// position. Service is the gRPC side, and Nodes the node list the relay serves in the
// assigner's place.
package relay

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sliceplane/sliceplane/internal/mapserve"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

// ErrRefused wraps every quantum a relay does not take: its stream is to start over.
// ErrOlderTerm is the refusal of a quantum of an older term than the relay's map: a deposed
// leader's, which leaves the relay's map as good as it was.
var (
	ErrRefused   = errors.New("relay: quantum refused")
	ErrOlderTerm = fmt.Errorf("%w: of an older term", ErrRefused)
)

// Outcome says what Take did with a quantum.
type Outcome int

const (
	// Published: the quantum followed the relay's map and was appended to its hub.
	Published Outcome = iota
	// Reset: a reinitializing quantum replaced the relay's map (a new term, or its stream
	// started over); its watchers start over too.
	Reset
	// Kept: a reinitializing quantum at the position the relay holds, the same map.
	Kept
)

func (o Outcome) String() string {
	return [...]string{"published", "reset", "kept"}[o]
}

// Relay is a copy of the assigner's stream. Take is called by one goroutine, the driver
// that follows the stream; the feed serves watchers concurrently.
type Relay struct {
	feed *mapserve.Feed
	// heard is when the stream last said anything (a quantum or a heartbeat), Unix ns.
	heard atomic.Int64
	// behind is set when the relay refused a quantum of its map's term or a newer one: its
	// map is behind the stream until a reset.
	behind atomic.Bool
}

// New returns a relay that holds no map yet.
func New() *Relay {
	return &Relay{feed: mapserve.NewFeed(quantum.NewHub(quantum.HubConfig{Follows: true}, 0, nil, 0))}
}

// Feed returns the relay's feed.
func (r *Relay) Feed() *mapserve.Feed { return r.feed }

// Take applies q, the next quantum its driver received from the assigner.
func (r *Relay) Take(q quantum.Quantum) (Outcome, error) {
	out, err := r.take(q)
	switch {
	case out == Reset:
		r.behind.Store(false)
	case err != nil && !errors.Is(err, ErrOlderTerm):
		r.behind.Store(true)
	}
	return out, err
}

func (r *Relay) take(q quantum.Quantum) (Outcome, error) {
	hub := r.feed.Hub()
	cur, pos, _ := hub.Current()
	if err := (quantum.Follower{Pos: pos, Started: cur != nil, Every: true, Holder: "the relay"}).Admit(q); err != nil {
		if refused, ok := errors.AsType[*quantum.RefusedError](err); ok && refused.Reason == quantum.StaleTerm {
			return 0, fmt.Errorf("%w: %w", ErrOlderTerm, err)
		}
		return 0, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	switch {
	case q.Reinitializing() && cur != nil && q.Position == pos:
		return Kept, nil
	case q.Reinitializing() && (cur == nil || !pos.Precedes(q.Position)):
		// The stream starts over (a new term, or a reconnection that found its position
		// gone): so do the relay's watchers.
		if err := hub.Reset(q); err != nil {
			return 0, fmt.Errorf("%w: %w", ErrRefused, err)
		}
		return Reset, nil
	}
	after, err := q.Next(cur, "the relay")
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	if err := r.feed.Publish(q, after); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return Published, nil
}

// Heard records that the stream said something at now: a quantum or a heartbeat.
func (r *Relay) Heard(now time.Time) { r.heard.Store(now.UnixNano()) }

// Live reports whether the stream said something within limit of now, and the relay's map
// is not behind it. A relay that lost its stream, or fell behind it, must not tell its
// watchers all is well: they would keep its map, however old.
func (r *Relay) Live(now time.Time, limit time.Duration) bool {
	heard := r.heard.Load()
	return heard != 0 && now.Sub(time.Unix(0, heard)) < limit && !r.behind.Load()
}

// Close ends every watch of the relay.
func (r *Relay) Close() { r.feed.Hub().Close() }
