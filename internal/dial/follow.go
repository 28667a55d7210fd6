package dial

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// Follower is a connection to the leading assigner that its users replace when the leader
// stops answering. A hung leader (SIGSTOP, a frozen host) keeps its transport open and its
// last health status, SERVING, so a connection keeps sending calls to it even after a
// standby took over; a new connection only becomes ready with peers that complete the
// HTTP/2 handshake, which a hung process never does, and so finds the new leader.
type Follower struct {
	target string
	addrs  []string
	opts   []grpc.DialOption

	mu     sync.Mutex
	conn   *grpc.ClientConn
	closed bool
}

// Follow returns a Follower of the assigners at addrs, leading the default target.
func Follow(addrs []string, opts ...grpc.DialOption) (*Follower, error) {
	return FollowTarget("", addrs, opts...)
}

// FollowTarget returns a Follower of the assigner that leads target name among addrs.
func FollowTarget(name string, addrs []string, opts ...grpc.DialOption) (*Follower, error) {
	conn, err := TargetLeader(name, addrs, opts...)
	if err != nil {
		return nil, err
	}
	return &Follower{target: name, addrs: addrs, opts: opts, conn: conn}, nil
}

// Conn returns the current connection. Calls on it fail with CANCELED once it is replaced.
func (f *Follower) Conn() *grpc.ClientConn {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conn
}

// Renew replaces conn, if it is still the current connection and ready, with a new one; a
// Renew of a connection already replaced does nothing, so that users that notice the same
// hang at once make one new connection. A connection that is not ready is not renewed: it
// is not held by a hung peer but still connecting, and a new one would only start its
// handshakes over. Under load, renewing those turned slow handshakes into a storm of them.
func (f *Follower) Renew(conn *grpc.ClientConn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || conn != f.conn || conn.GetState() != connectivity.Ready {
		return
	}
	next, err := TargetLeader(f.target, f.addrs, f.opts...)
	if err != nil {
		return // the addresses were good once: this cannot happen
	}
	f.conn = next
	_ = conn.Close()
}

// Close closes the connection.
func (f *Follower) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return f.conn.Close()
}

// ErrSilent is the cause of a Watchdog's cancellation.
var ErrSilent = errors.New("dial: the peer sent nothing for too long")

// Watchdog cancels a stream's context when the stream stays silent while its reader waits:
// a hung peer, or a link that holds bytes without resetting, is then noticed in a bounded
// time. Only time spent waiting counts, not time spent on what was received.
type Watchdog struct {
	ctx     context.Context // the stream's, which the watchdog cancels
	timeout time.Duration
	timer   *time.Timer
	cancel  context.CancelCauseFunc
}

// NewWatchdog returns a context to run the stream with, which is canceled with cause
// ErrSilent when Waiting was called and Heard not within timeout, and the Watchdog. Stop it
// when the stream ends.
func NewWatchdog(ctx context.Context, timeout time.Duration) (context.Context, *Watchdog) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &Watchdog{ctx: ctx, timeout: timeout, cancel: cancel}
	w.timer = time.AfterFunc(timeout, func() { cancel(ErrSilent) })
	w.timer.Stop()
	return ctx, w
}

// Waiting starts the clock: call it right before receiving.
func (w *Watchdog) Waiting() { w.timer.Reset(w.timeout) }

// Heard stops the clock: call it right after a message arrived.
func (w *Watchdog) Heard() { w.timer.Stop() }

// Receive waits for the next message of a stream run with the watchdog's context, with the
// clock running only meanwhile; a stream the watchdog ended returns ErrSilent.
func Receive[T any](w *Watchdog, recv func() (T, error)) (T, error) {
	w.Waiting()
	m, err := recv()
	w.Heard()
	if err != nil && Silent(w.ctx) {
		return m, ErrSilent
	}
	return m, err
}

// Stop releases the timer and the context: check Silent first.
func (w *Watchdog) Stop() {
	w.timer.Stop()
	w.cancel(context.Canceled)
}

// Silent reports whether ctx, one a Watchdog returned, ended because the peer was silent.
func Silent(ctx context.Context) bool { return errors.Is(context.Cause(ctx), ErrSilent) }
