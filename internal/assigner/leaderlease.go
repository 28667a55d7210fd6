package assigner

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// errLeaseLapsed ends a term whose lease may have expired.
var errLeaseLapsed = errors.New("assigner: the leader lease is not certainly valid")

// leaderLease tracks, on this process's monotonic clock, until when the leader's etcd lease is
// certainly still valid: the time a keep-alive was sent (or the grant asked for), plus the TTL
// etcd answered, minus a margin for clock rate differences. etcd starts the TTL when it
// handles the request, after it was sent, so the lease cannot expire before that deadline.
//
// Timing from the request, not the response, matters: a response read after the process was
// suspended (SIGSTOP, starvation) says nothing about now. The session's own expiry signal
// arrives only after a keep-alive round trip, too late for a leader that just resumed.
type leaderLease struct {
	ttl    time.Duration // asked for at grant; a long gap in the loop is measured against it
	margin time.Duration
	now    func() time.Time
	// keepAlive makes one keep-alive round trip and returns the TTL etcd granted.
	keepAlive func(ctx context.Context) (time.Duration, error)

	mu       sync.Mutex
	deadline time.Time
	lost     bool
	lostCh   chan struct{} // closed once etcd says the lease is gone

	lastStep time.Time // of the leader loop; only the loop reads and writes it
}

// newLeaderLease returns the lease granted with ttl by a request sent at asked.
func newLeaderLease(now func() time.Time, asked time.Time, ttl time.Duration, keepAlive func(context.Context) (time.Duration, error)) *leaderLease {
	// The margin covers a difference in clock rates between this process and etcd's leader,
	// which is tiny: etcd never expires a lease before its TTL has passed on its clock.
	l := &leaderLease{ttl: ttl, margin: max(ttl/10, 50*time.Millisecond), now: now, keepAlive: keepAlive,
		lostCh: make(chan struct{}), lastStep: now()}
	l.deadline = asked.Add(ttl - l.margin)
	return l
}

// etcdKeepAlive makes keep-alive round trips of lease id.
func etcdKeepAlive(c *clientv3.Client, id clientv3.LeaseID) func(context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		resp, err := c.KeepAliveOnce(ctx, id)
		if err != nil {
			return 0, err
		}
		return time.Duration(resp.TTL) * time.Second, nil
	}
}

// valid reports whether the lease is certainly still valid now.
func (l *leaderLease) valid() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.lost && l.now().Before(l.deadline)
}

// confirm reports whether the lease is certainly valid, asking etcd once if this process's
// count has run out: a starved process may not have renewed in time although etcd still
// holds the lease, and a renewal proves it from the time it was sent.
func (l *leaderLease) confirm(ctx context.Context) bool {
	if l.valid() {
		return true
	}
	return l.renew(ctx) == nil && l.valid()
}

// done is closed once etcd has said the lease is gone.
func (l *leaderLease) done() <-chan struct{} { return l.lostCh }

// renew makes one keep-alive round trip, bounded by what is left of the lease (a reply after
// the deadline would be of no use), and moves the deadline on.
func (l *leaderLease) renew(ctx context.Context) error {
	sent := l.now()
	l.mu.Lock()
	left := l.deadline.Sub(sent)
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, max(left, l.ttl/4))
	defer cancel()
	ttl, err := l.keepAlive(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil && ttl <= 0:
		if !l.lost {
			l.lost = true
			close(l.lostCh)
		}
		return errLeaseLapsed
	case err != nil:
		return err
	}
	if d := sent.Add(ttl - l.margin); d.After(l.deadline) {
		l.deadline = d
	}
	return nil
}

// keep renews the lease every sixth of its TTL (a slow round trip or a busy process must
// not let the count lapse while etcd still holds the lease), and more often after a
// failure, until ctx ends or the lease is gone. Failures are left to valid to judge: an etcd election makes a
// few round trips fail while the lease stays valid.
func (l *leaderLease) keep(ctx context.Context) {
	for {
		wait := l.ttl / 6
		if err := l.renew(ctx); err != nil {
			if errors.Is(err, errLeaseLapsed) {
				return
			}
			wait = min(wait, 200*time.Millisecond)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
	}
}

// step records an iteration of the leader loop at now and reports the time since the last
// one if it was long: the process was suspended or starved, so what it knows of time-based
// state (the lease, nodes' last heartbeats) must be checked again before acting on it.
func (l *leaderLease) step(now time.Time) (gap time.Duration, long bool) {
	gap, l.lastStep = now.Sub(l.lastStep), now
	return gap, gap > l.ttl/2
}
