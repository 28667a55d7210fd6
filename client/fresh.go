package client

import (
	"fmt"
	"sync"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
)

// maxSightings bounds the source clocks a freshness remembers; past it, neighbours merge
// (see sighted), which can only make the node look older than it is, never fresher.
const maxSightings = 32

// sighting is a source clock the node was told of, and when it first was.
type sighting struct {
	clock uint64
	at    time.Time
}

// freshness is what a node knows of how far behind its source its data is: when it last
// heard from its distributor, the clock its data reflects, and the source clocks the
// distributor told it of that its data does not reflect yet, each with the time it first
// heard of it. It is passive: the node tells it what happens, with the time, and asks it.
//
// The node's data is within the bound at time now if it heard from its distributor within
// the bound, its distributor heard from the source within the bound, it is not loading a
// snapshot, and it reflects every source clock it heard of before now-bound: a write older
// than the bound that its distributor had read, it has applied.
type freshness struct {
	bound   time.Duration
	started time.Time
	heard   time.Time // zero: never
	// sourceHeard is when the distributor last heard from its source, as its last message
	// said: zero if it never said.
	sourceHeard time.Time
	applied     uint64
	loading     bool
	// behind lists, oldest first, source clocks the data does not reflect, rising.
	behind []sighting
}

func newFreshness(bound time.Duration, started time.Time) *freshness {
	return &freshness{bound: bound, started: started}
}

// heardFrom records a message of the distributor at now: source is the distributor's source
// clock (0: not said), silence how long the distributor had not heard from its source,
// applied the clock the node's data reflects after it, and loading whether a snapshot is
// under way.
func (f *freshness) heardFrom(now time.Time, source uint64, silence time.Duration, applied uint64, loading bool) {
	f.heard, f.loading, f.sourceHeard = now, loading, now.Add(-silence)
	if applied < f.applied {
		// A snapshot completed at an older clock than the node had: it lacks changes its
		// distributor read no one knows how long ago, so as long ago as can be.
		f.behind = append([]sighting{{clock: f.applied, at: f.started}}, f.behind...)
		if len(f.behind) > maxSightings {
			f.behind = append(f.behind[:maxSightings-1], sighting{clock: f.behind[len(f.behind)-1].clock, at: f.behind[maxSightings-1].at})
		}
	}
	f.applied = applied
	i := 0
	for i < len(f.behind) && f.behind[i].clock <= f.applied {
		i++
	}
	f.behind = f.behind[i:]
	if source > f.applied && (len(f.behind) == 0 || source > f.behind[len(f.behind)-1].clock) {
		f.sighted(sighting{clock: source, at: now})
	}
}

func (f *freshness) sighted(s sighting) {
	if len(f.behind) == maxSightings {
		// The newest sighting takes the clock of the one after it: older than it is, the
		// node stops answering early rather than late.
		last := len(f.behind) - 1
		f.behind[last].clock = s.clock
		return
	}
	f.behind = append(f.behind, s)
}

// fresh reports whether the node's data is within the bound at now and, if not, why.
func (f *freshness) fresh(now time.Time) (bool, string) {
	switch {
	case f.heard.IsZero() && now.Sub(f.started) > f.bound:
		return false, fmt.Sprintf("no word from a distributor in the %s since the node started", now.Sub(f.started).Round(time.Millisecond))
	case f.heard.IsZero():
		return false, "no word from a distributor yet"
	case now.Sub(f.sourceHeard) > f.bound && now.Sub(f.heard) < f.heard.Sub(f.sourceHeard):
		// Most of the silence is the source's, as the distributor last said.
		return false, fmt.Sprintf("the distributor has not heard from its source for %s (bound %s)",
			now.Sub(f.sourceHeard).Round(time.Millisecond), f.bound)
	case now.Sub(f.sourceHeard) > f.bound:
		why := fmt.Sprintf("distributor silent for %s", now.Sub(f.heard).Round(time.Millisecond))
		if before := f.heard.Sub(f.sourceHeard); before > 0 {
			why += fmt.Sprintf(", and its source for %s before", before.Round(time.Millisecond))
		}
		return false, why + fmt.Sprintf(" (bound %s)", f.bound)
	case f.loading:
		return false, "loading a snapshot"
	case len(f.behind) > 0 && now.Sub(f.behind[0].at) > f.bound:
		b := f.behind[0]
		return false, fmt.Sprintf("behind: at clock %d, the source at %d for %s (bound %s)", f.applied, b.clock, now.Sub(b.at).Round(time.Millisecond), f.bound)
	}
	return true, ""
}

// lockedFreshness is a freshness shared by the pull loop, which drives it, and readers.
type lockedFreshness struct {
	mu sync.Mutex
	f  *freshness
}

func (l *lockedFreshness) heardFrom(now time.Time, source uint64, silence time.Duration, applied uint64, loading bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.f.heardFrom(now, source, silence, applied, loading)
}

func (l *lockedFreshness) fresh(now time.Time) (bool, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.fresh(now)
}

// Fresh reports whether the node may answer reads from its data: whether the data is within
// FreshnessBound of its source. If not, reason says why: its distributor has been silent for
// longer than the bound, a snapshot is under way, or the data lacks changes that its
// distributor had read more than the bound ago. A node that is not fresh says so to the
// assigner (its heartbeats' stale), and routers send reads to its slices' fresh replicas.
func (n *Node) Fresh() (ok bool, reason string) {
	return n.fresh.fresh(time.Now())
}

// freshOf returns the replicas of ids that are not known to be stale, if any is; else all
// of them. ids is returned as is when none is stale, the common case. r.mu must be held.
func (r *Router) freshOf(ids []assignment.NodeID) []assignment.NodeID {
	stale := 0
	for _, id := range ids {
		if r.nodes[id].stale {
			stale++
		}
	}
	if stale == 0 || stale == len(ids) {
		return ids
	}
	fresh := make([]assignment.NodeID, 0, len(ids)-stale)
	for _, id := range ids {
		if !r.nodes[id].stale {
			fresh = append(fresh, id)
		}
	}
	return fresh
}

// staleRefreshInterval is how often a router reads the node list while some node is stale,
// if its RefreshInterval is longer.
const staleRefreshInterval = time.Second

// anyStale reports whether the last node list said some node is stale.
func (r *Router) anyStale() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.nodes {
		if n.stale {
			return true
		}
	}
	return false
}
