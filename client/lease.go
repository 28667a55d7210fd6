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
// It is plain data with a lock: the session goroutine grants, the member's loop reads.
type lease struct {
	margin time.Duration // 0: a tenth of each grant

	mu        sync.Mutex
	exclusive bool      // the cluster gives leases: its registration said so
	until     time.Time // monotonic; valid before it
	changed   chan struct{}
}

func newLease(margin time.Duration) *lease {
	return &lease{margin: margin, changed: make(chan struct{}, 1)}
}

// registered takes what a registration sent at sent answered: a lease of length d, or none
// (0: the cluster is not exclusive).
func (l *lease) registered(sent time.Time, d time.Duration) {
	l.mu.Lock()
	l.exclusive = d > 0
	l.mu.Unlock()
	l.renewed(sent, d)
}

// renewed takes a renewal of length d of a request sent at sent; 0 renews nothing.
func (l *lease) renewed(sent time.Time, d time.Duration) {
	if d <= 0 {
		return
	}
	margin := l.margin
	if margin == 0 {
		margin = d / 10
	}
	l.mu.Lock()
	if until := sent.Add(d - margin); until.After(l.until) {
		l.until = until
	}
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// valid reports whether the member may act as primary at now, and until when; always in a
// cluster that is not exclusive.
func (l *lease) valid(now time.Time) (bool, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.exclusive {
		return true, time.Time{}
	}
	return now.Before(l.until), l.until
}
