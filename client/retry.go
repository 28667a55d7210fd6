package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// When a call is tried again: the one rule of Transport and of the GRPCDialOptions
// interceptor. A call that was not sent (no map, no primary, no connection), or that a
// replica answered NotOwner (421), is tried again once the key's route changes so that the
// call would not go where it went (see moved), or after a backoff, whichever comes first. A
// failover changes the map many times a second, mostly for other keys: waiting for any change
// of the map would send the call again at once, again and again, to the replica that just
// refused it. The backoff bounds the tries while the key's route stands still; the route's
// change sends the call on as soon as the router knows where.

// ErrRouterNotRunning ends a call through a Router whose Run was not called, or returned:
// its map will not change, so waiting for it would only end at the call's deadline.
var ErrRouterNotRunning = errors.New("client: the router is not running (Router.Run not called, or returned)")

// The backoff of a call between tries: 5 ms doubling to 1 s, each wait drawn within a fifth
// of it either way so that the calls a failover turned away do not come back together.
const (
	firstRetryWait = 5 * time.Millisecond
	maxRetryWait   = time.Second
	retryJitter    = 0.2
)

// startGrace is how long a call whose router never ran waits for Run to start: the time for
// a "go r.Run(ctx)" just before the call to be scheduled.
const startGrace = 100 * time.Millisecond

// retryCause says why a try of a call is tried again; noRetry that it is not.
type retryCause uint8

const (
	noRetry retryCause = iota
	// retryNotSent: the call was not sent (no map, no primary, no connection to the replica).
	retryNotSent
	// retryNotOwner: the replica answered NotOwner (421): the key's range is not its now.
	retryNotOwner
	// retryBroken: an idempotent call whose connection broke before an answer came.
	retryBroken
	nRetryCauses
)

// causeText says what the tries of a call that ended with a cause met, for the error of a
// call that ends while it waits to try again.
var causeText = [nRetryCauses]string{
	retryNotSent:  "the call could not be sent",
	retryNotOwner: "the key's replicas answered NotOwner",
	retryBroken:   "the key's replicas' connections broke",
}

// RouterStats counts the calls of a router's Transports and GRPCDialOptions connections that
// were tried again, since the router was made. A harness reads it before and after a failover:
// the difference is what the failover cost the callers.
type RouterStats struct {
	// Retried is the number of calls tried more than once.
	Retried uint64
	// NotSent, NotOwner and Broken count the tries after a call's first, by what ended the
	// try before: it was not sent (no map, no primary while the role is handed over, no
	// connection to the replica, the connection refused); the replica answered NotOwner
	// (421); the connection of an idempotent call broke before an answer came.
	NotSent, NotOwner, Broken uint64
	// Expired is the number of calls whose context ended while they waited to be tried
	// again, or for the answer of a replica that did not give one (a member that hangs):
	// DeadlineExceeded or Canceled.
	Expired uint64
}

// retryStats are the atomic counters behind RouterStats.
type retryStats struct {
	retried, expired atomic.Uint64
	retries          [nRetryCauses]atomic.Uint64
}

// Stats returns the router's counts of calls tried again.
func (r *Router) Stats() RouterStats {
	s := &r.stats
	return RouterStats{
		Retried:  s.retried.Load(),
		NotSent:  s.retries[retryNotSent].Load(),
		NotOwner: s.retries[retryNotOwner].Load(),
		Broken:   s.retries[retryBroken].Load(),
		Expired:  s.expired.Load(),
	}
}

// try is one try of a call, as the retry rule sees it.
type try struct {
	route *replicaSet // the key's route the try was made by; nil: no map
	to    *Replica    // the replica it went to, in route; nil: none was chosen
	cause retryCause
	err   error // what ended the try, for the error the call ends with
}

// retrier tries a call again by the rule. A call makes one, and asks it after each try.
type retrier struct {
	r     *Router
	key   []byte
	write bool
	b     backoff.ExponentialBackOff
	tries int
	last  try // the last try that was to be tried again
}

// newRetrier returns the retrier of a call for key, its context ctx; or ErrRouterNotRunning,
// at once if the router's Run returned, after startGrace if it has not started.
func (r *Router) newRetrier(ctx context.Context, key []byte, write bool) (retrier, error) {
	select {
	case <-r.started:
	default:
		if !r.awaitStart(ctx) {
			return retrier{}, notRunning()
		}
	}
	select {
	case <-r.stopped:
		return retrier{}, notRunning()
	default:
	}
	return retrier{r: r, key: key, write: write, b: backoff.ExponentialBackOff{
		InitialInterval: firstRetryWait, RandomizationFactor: retryJitter, Multiplier: 2, MaxInterval: maxRetryWait,
	}}, nil
}

// awaitStart waits startGrace for the router's Run to start, or until ctx ends, and reports
// whether it started.
func (r *Router) awaitStart(ctx context.Context) bool {
	t := time.NewTimer(startGrace)
	defer t.Stop()
	select {
	case <-r.started:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

// after is asked after try t of the call, its context ctx: it reports whether to try again,
// having waited as the rule says; if not, the error the call ends with, or nil for the try's
// own outcome.
func (rt *retrier) after(ctx context.Context, t try) (bool, error) {
	if t.err != nil {
		settleDeadline(ctx)
	}
	if t.err != nil && ctx.Err() != nil {
		rt.r.stats.expired.Add(1)
		if t.cause == noRetry && t.to != nil {
			return false, unanswered(ctx, t) // it went out, and its replica did not answer
		}
		if rt.tries > 0 {
			// A try again that ran into the call's end failed for it, maybe before it could
			// meet anything: what kept the call from an answer is what the tries before met.
			return false, expired(ctx, rt.last)
		}
		return false, t.err
	}
	if t.cause == noRetry {
		return false, nil
	}
	rt.last = t
	end := ctxEnded
	if ctx.Err() == nil {
		end = rt.r.awaitRoute(ctx, t, rt.key, rt.write, rt.b.NextBackOff())
	}
	switch end {
	case ctxEnded:
		rt.r.stats.expired.Add(1)
		return false, expired(ctx, t)
	case routerStopped:
		return false, notRunning()
	}
	if rt.tries == 0 {
		rt.r.stats.retried.Add(1)
	}
	rt.tries++
	rt.r.stats.retries[t.cause].Add(1)
	return true, nil
}

// settleDeadline waits for ctx to end once its deadline has passed: a transport's own timer
// for the deadline (gRPC's) may end a try before the context's fires, and the rule tells a
// call that ran out of time by its context.
func settleDeadline(ctx context.Context) {
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		<-ctx.Done()
	}
}

// waitEnd says how a wait to try a call again ended.
type waitEnd uint8

const (
	tryAgain waitEnd = iota
	ctxEnded
	routerStopped
)

// awaitRoute waits until the key's route moved away from where try t went, or d passed, or
// ctx ended, or the router stopped.
func (r *Router) awaitRoute(ctx context.Context, t try, key []byte, write bool, d time.Duration) waitEnd {
	views, stop := r.watchViews()
	defer stop()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-views:
			if v := r.view.Load(); v != nil && moved(t, v.setOf(key), write) {
				return tryAgain
			}
		case <-timer.C:
			return tryAgain
		case <-ctx.Done():
			return ctxEnded
		case <-r.stopped:
			return routerStopped
		}
	}
}

// moved reports whether the key's route, now, differs from the one try t was made by so that
// the call would not go where t went: then it is tried again without waiting out the backoff.
// A try that reached no replica (no map, no primary) waits for any change of the route; one
// that went to replica X (which answered NotOwner, or could not be reached) waits until the
// route no longer offers the call X as it was: X left it, or lost the role the call needs, or
// holds it under another grant (token), or serves at another address. A change that still
// offers X as it was (another replica joined) waits for the backoff.
func moved(t try, now *replicaSet, write bool) bool {
	switch {
	case now == t.route:
		return false
	case t.route == nil:
		return true
	case sameRoute(t.route, now):
		return false // the set was rebuilt, for another node list, not changed
	case t.to == nil:
		return true
	}
	return !offers(now, write, *t.to)
}

// offers reports whether a call (a write or a read) by route set may go to replica rep.
func offers(set *replicaSet, write bool, rep Replica) bool {
	if write && set.hasRoles() {
		return set.primary >= 0 && sameReplica(set.replicas[set.primary], rep)
	}
	return slices.ContainsFunc(set.readers().replicas, func(c Replica) bool { return sameReplica(c, rep) })
}

// sameRoute reports whether two replica sets send calls alike: the same replicas, and the
// same of them take reads.
func sameRoute(a, b *replicaSet) bool {
	return slices.EqualFunc(a.replicas, b.replicas, sameReplica) && slices.EqualFunc(a.readers().replicas, b.readers().replicas, sameReplica)
}

// sameReplica reports whether a and b are one replica in one role, under one grant, at one
// address: its capacity or staleness may differ.
func sameReplica(a, b Replica) bool {
	return a.ID == b.ID && a.Address == b.Address && a.Role == b.Role && a.Token == b.Token
}

// callError is the error of a call that the retry rule ended: a status for gRPC callers, and
// errors.Is for the context's error, ErrRouterNotRunning and the last try's failure.
type callError struct {
	code codes.Code
	msg  string
	errs []error
}

func (e *callError) Error() string              { return e.msg }
func (e *callError) Unwrap() []error            { return e.errs }
func (e *callError) GRPCStatus() *status.Status { return status.New(e.code, e.msg) }

// notRunning returns ErrRouterNotRunning for a call: FailedPrecondition for gRPC callers (the
// router must run before calls can succeed).
func notRunning() error {
	return &callError{code: codes.FailedPrecondition, msg: ErrRouterNotRunning.Error(), errs: []error{ErrRouterNotRunning}}
}

// expired returns the error of a call whose context ended while it was tried again: the
// context's (DeadlineExceeded, Canceled), saying what its last try t met.
func expired(ctx context.Context, t try) error {
	until := " until the deadline: "
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		until = " until the call was canceled: "
	}
	msg := "client: " + causeText[t.cause] + until + unprefixed(t.err)
	return &callError{code: status.FromContextError(ctx.Err()).Code(), msg: msg, errs: []error{ctx.Err(), t.err}}
}

// unanswered returns the error of a call whose context ended before the replica its last try
// went to answered (a member that hangs: stopped, or its machine cut off), naming the replica.
func unanswered(ctx context.Context, t try) error {
	msg := fmt.Sprintf("client: %s at %s did not answer before the call ended: %s", t.to.ID, t.to.Address, unprefixed(t.err))
	return &callError{code: status.FromContextError(ctx.Err()).Code(), msg: msg, errs: []error{ctx.Err(), t.err}}
}

// unprefixed returns the message of err, of a gRPC status its description, without this
// package's prefix, for a message that has it already.
func unprefixed(err error) string {
	msg := err.Error()
	if st, ok := status.FromError(err); ok {
		msg = st.Message()
	}
	return strings.TrimPrefix(msg, "client: ")
}
