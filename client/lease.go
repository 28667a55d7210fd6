package client

import (
	"sync"
	"time"
)

// lease is a member's own count of its lease on the primary roles the map gives it, in an
// exclusive cluster (the assigner's --exclusive): the assigner renews it with a registration
// or heartbeat it accepts, for a length counted from when the member sent the request. The
// member counts it on its monotonic clock, so a jump of the wall clock changes nothing, and
// ends it early by its margin, so that under bounded clock-rate drift it stops before the
// assigner's count, which runs from when the request arrived, ends. While it is not valid
// the member holds its primary ranges as secondary: it demotes its application itself.
//
// A lease that begins (the first, or one after the last ended) covers the primary roles of
// the assigner's map as it answered, and later ones, only: while the member's lease had
// ended the assigner may have given its roles to others, which its own older map does not
// say yet (it re-registered after a partition, say).
//
// It is plain data with a lock: the session goroutine grants, the member's loop reads.
type lease struct {
	margin time.Duration // 0: a tenth of each grant

	mu        sync.Mutex
	exclusive bool      // the cluster gives leases: its registration said so
	until     time.Time // monotonic; valid before it
	gen       uint64    // the least map generation whose primary roles the lease covers
	changed   chan struct{}
}

func newLease(margin time.Duration) *lease {
	return &lease{margin: margin, changed: make(chan struct{}, 1)}
}

// registered takes what a registration sent at sent answered: a lease of length d, or none
// (0: the cluster is not exclusive), as of the map of generation gen. It begins a lease.
func (l *lease) registered(sent time.Time, d time.Duration, gen uint64) {
	l.mu.Lock()
	l.exclusive, l.until = d > 0, time.Time{}
	l.mu.Unlock()
	l.renewed(sent, d, gen)
}

// renewed takes a renewal of length d, as of the map of generation gen, of a request sent at
// sent; 0 renews nothing.
func (l *lease) renewed(sent time.Time, d time.Duration, gen uint64) {
	if d <= 0 {
		return
	}
	margin := l.margin
	if margin == 0 {
		margin = d / 10
	}
	l.mu.Lock()
	if !sent.Before(l.until) { // the lease had ended when the request left: a new one begins
		l.gen = gen
	}
	if until := sent.Add(d - margin); until.After(l.until) {
		l.until = until
	}
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// valid reports whether the member may act as primary at now, until when, and the least
// map generation whose primary roles it covers; always in a cluster that is not exclusive.
func (l *lease) valid(now time.Time) (ok bool, until time.Time, gen uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.exclusive {
		return true, time.Time{}, 0
	}
	return now.Before(l.until), l.until, l.gen
}

// covers reports whether the lease lets the member act as primary at now on the roles of the
// map of generation gen, and until when: it is valid, and began no later than that map (one
// that began after may cover roles the assigner gave to others meanwhile, which an older map
// does not say). Always, with a zero until, in a cluster that is not exclusive.
func (l *lease) covers(now time.Time, gen uint64) (bool, time.Time) {
	ok, until, since := l.valid(now)
	return ok && gen >= since, until
}
