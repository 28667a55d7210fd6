package assigner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sliceplane/sliceplane/internal/assigner/etcdstate"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestLeaderLeaseCountsFromTheRequestNotTheResponse(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	var suspend time.Duration // how long the process is stopped while a keep-alive is in flight
	var fail error
	keepAlive := func(context.Context) (time.Duration, error) {
		clock.Advance(suspend)
		return 5 * time.Second, fail
	}
	l := newLeaderLease(clock.Now, clock.Now(), 5*time.Second, keepAlive)
	assert.True(t, l.valid())
	clock.Advance(4400 * time.Millisecond)
	assert.True(t, l.valid(), "within TTL minus the margin")
	clock.Advance(200 * time.Millisecond)
	assert.False(t, l.valid(), "past TTL minus the margin, with no keep-alive")

	require.NoError(t, l.renew(t.Context()))
	assert.True(t, l.valid(), "renewed")

	// A keep-alive whose response is read after a long suspension: the lease was renewed at
	// the request, so it is not valid now, although a response has just arrived.
	suspend = 6 * time.Second
	require.NoError(t, l.renew(t.Context()))
	assert.False(t, l.valid())

	// Failures (an etcd election) leave the deadline where it was.
	suspend = 0
	require.NoError(t, l.renew(t.Context()))
	fail = errors.New("etcdserver: request timed out")
	clock.Advance(time.Second)
	assert.Error(t, l.renew(t.Context()))
	assert.True(t, l.valid(), "the lease counts from the last success")
	select {
	case <-l.done():
		t.Fatal("a timed-out request does not lose the lease")
	default:
	}

	fail = rpctypes.ErrLeaseNotFound
	assert.ErrorIs(t, l.renew(t.Context()), errLeaseLapsed)
	assert.False(t, l.valid())
	<-l.done()
}

func TestLeaderLoopGapsAreMeasuredAgainstTheTTL(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	l := newLeaderLease(clock.Now, clock.Now(), 4*time.Second, nil)
	clock.Advance(time.Second)
	_, long := l.step(clock.Now())
	assert.False(t, long)
	clock.Advance(2100 * time.Millisecond)
	gap, long := l.step(clock.Now())
	assert.True(t, long)
	assert.Equal(t, 2100*time.Millisecond, gap)
}

// offsetClock is the real clock plus an offset the test moves: the leader's tickers keep
// running, and a jump of the offset is a suspension of the process as the process sees it.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) Now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *offsetClock) Advance(d time.Duration) { c.off.Add(int64(d)) }

// startSuspendable starts an assigner whose clock and keep-alives the test controls, with two
// registered nodes, and waits until it leads.
func startSuspendable(t *testing.T, cut *atomic.Bool) (*Server, *offsetClock, *leadership) {
	cli := etcdtest.New(t)
	srv, err := New(Config{Client: cli, PassInterval: 20 * time.Millisecond, ClockInterval: 10 * time.Millisecond,
		SessionTTL: 2 * time.Second, Core: core.Config{NodeTTL: 3 * time.Second},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	clock := &offsetClock{}
	srv.def().now = clock.Now
	srv.def().keepAlive = func(c *clientv3.Client, id clientv3.LeaseID) func(context.Context) (time.Duration, error) {
		real := etcdKeepAlive(c, id)
		return func(ctx context.Context) (time.Duration, error) {
			if cut.Load() {
				return 0, errors.New("etcd unreachable")
			}
			return real(ctx)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	var l *leadership
	require.Eventually(t, func() bool { l = srv.def().leading.Load(); return l != nil }, 15*time.Second, 10*time.Millisecond)
	for _, id := range []assignment.NodeID{"a", "b"} {
		rep, err := l.do(t.Context(), core.Register{Caller: core.Caller{Who: "test"}, Node: core.Node{Node: assignment.Node{ID: id, Capacity: 1}, Address: "127.0.0.1:1"}})
		require.NoError(t, err)
		require.NoError(t, rep.Err)
	}
	return srv, clock, l
}

// storedNodes returns the nodes in etcd.
func storedNodes(t *testing.T, srv *Server) int {
	st, _, err := srv.def().store.Load(t.Context())
	require.NoError(t, err)
	return len(st.Nodes)
}

// A leader suspended for longer than the nodes' TTL (but not its own lease's) resumes,
// renews its lease and keeps the nodes: their heartbeats were waiting, unread.
func TestALeaderResumingWithinItsLeaseKeepsTheNodes(t *testing.T) {
	var cut atomic.Bool
	srv, clock, l := startSuspendable(t, &cut)
	// The suspension happens inside the loop, so nothing is in flight across it.
	err := inLoop(t.Context(), l, func(*core.Core) { clock.Advance(10 * time.Second) })
	require.NoError(t, err)
	resumed := clock.Now()
	var st core.Status
	require.Eventually(t, func() bool {
		rep, err := l.do(t.Context(), core.GetStatus{})
		require.NoError(t, err)
		st = *rep.Status
		return st.Nodes < 2 || st.LastPass.After(resumed.Add(5*20*time.Millisecond))
	}, 10*time.Second, 10*time.Millisecond, "passes run after the suspension")
	assert.Equal(t, 2, st.Nodes, "no node expired")
	assert.Same(t, l, srv.def().leading.Load(), "the same term goes on")
	assert.Equal(t, 2, storedNodes(t, srv), "no node expired")
}

// A leader suspended past its lease, cut from etcd, emits nothing and writes nothing when it
// resumes: it steps down on its own clock before acting.
func TestALeaderResumingAfterItsLeaseEmitsAndWritesNothing(t *testing.T) {
	var cut atomic.Bool
	srv, clock, l := startSuspendable(t, &cut)
	var at uint64
	suspend := func(*core.Core) {
		cut.Store(true)
		clock.Advance(10 * time.Second)
		_, p, _ := l.feed.Hub().Current()
		at = p.Seq
	}
	// On a very busy machine the first leadership may lapse (its 2 s lease unrenewed) before
	// the test suspends it: suspend the next one then.
	for err := inLoop(t.Context(), l, suspend); err != nil; err = inLoop(t.Context(), l, suspend) {
		require.ErrorIs(t, err, core.ErrNotLeader)
		require.Eventually(t, func() bool {
			if n := srv.def().leading.Load(); n != nil && n != l {
				l = n
				return true
			}
			return false
		}, 15*time.Second, 10*time.Millisecond, "a new leadership after the first lapsed")
	}
	select {
	case <-l.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the leader did not step down")
	}
	_, p, _ := l.feed.Hub().Current()
	assert.Equal(t, at, p.Seq, "no quantum after the suspension")
	cut.Store(false)
	assert.Equal(t, 2, storedNodes(t, srv), "no node expired")
}

func TestTransientEtcdErrors(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("etcdstate: append: %w", err) }
	for _, err := range []error{rpctypes.ErrTimeout, rpctypes.ErrLeaderChanged, rpctypes.ErrNoLeader, rpctypes.ErrTimeoutDueToLeaderFail,
		rpctypes.ErrStopped, status.Error(codes.Unavailable, "transport is closing"), status.Error(codes.Unknown, "raft: stopped"),
		context.DeadlineExceeded} {
		assert.True(t, transient(wrap(err)), "%v", err)
	}
	for _, err := range []error{nil, etcdstate.ErrFenced, fmt.Errorf("%w: log entry 3 is missing", etcdstate.ErrCorrupt), errLeaseLapsed,
		context.Canceled, errors.New("etcdstate: encoding meta"), status.Error(codes.InvalidArgument, "too large")} {
		assert.False(t, transient(err), "%v", err)
	}
}
