package assigner

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sliceplane/sliceplane/internal/assigner/etcdstate"
)

// transient reports whether an etcd request failed for a reason that passes: an etcd
// election (no leader, leader changed, a proposal timed out with it), or the loss of the
// member the client spoke to. The same request may then succeed, on this member or another.
func transient(err error) bool {
	switch {
	case err == nil, errors.Is(err, etcdstate.ErrFenced), errors.Is(err, etcdstate.ErrCorrupt), errors.Is(err, errLeaseLapsed),
		errors.Is(err, context.Canceled):
		return false
	case errors.Is(err, context.DeadlineExceeded):
		return true // an attempt's own deadline; the lease decides whether to try again
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable || ee.Code() == codes.DeadlineExceeded
	}
	c := status.Code(err)
	// A member that stops with a request in flight answers with its raft's error, unknown to
	// gRPC; another member serves the retry.
	stopping := c == codes.Unknown && strings.HasSuffix(status.Convert(err).Message(), "raft: stopped")
	return c == codes.Unavailable || c == codes.DeadlineExceeded || stopping
}

// minAttempt is the least time one etcd request of the leader is given. An attempt may take
// up to the lease's TTL (a large map is written in many parts); one that takes longer is
// given up and tried again, perhaps on another member, while the lease lasts.
const minAttempt = 2 * time.Second

// retry runs op until it succeeds, fails for good, or the lease is no longer certainly valid:
// a leader rides out an etcd election instead of giving up its term over it. op must be safe
// to run again after an attempt whose outcome is unknown (a timed-out request may have been
// applied); the store's writes are (see the store package).
func (s *served) retry(ctx context.Context, lease *leaderLease, what string, op func(context.Context) error) error {
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		if !lease.confirm(ctx) {
			return errLeaseLapsed
		}
		actx, cancel := context.WithTimeout(ctx, max(minAttempt, lease.ttl))
		err := op(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !transient(err) {
			return err
		}
		s.metrics.etcdRetries.WithLabelValues(what).Inc()
		s.log.Warn("etcd request failed; retrying while the lease lasts", "op", what, "attempt", attempt, "err", err, "retry_in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
		backoff = min(2*backoff, time.Second)
	}
}
