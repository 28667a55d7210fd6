package dial_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/faultproxy"
)

func proxyT(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// A leader that hangs keeps its health SERVING; a connection renewed after a call timed out
// reaches the new leader, and never the hung one.
func TestARenewedConnectionLeavesAHungLeader(t *testing.T) {
	a := startAssigner(t, "a", true)
	b := startAssigner(t, "b", false)
	pa := proxyT(t, a.addr)
	f, err := dial.Follow([]string{pa.Addr(), b.addr})
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	call := func() (string, error) {
		conn := f.Conn()
		got, err := reached(ctxT(t, time.Second), pb.NewNodeServiceClient(conn), grpc.WaitForReady(true))
		if err != nil {
			f.Renew(conn) // as users do when the leader stops answering
		}
		return got, err
	}
	require.Eventually(t, func() bool { got, err := call(); return err == nil && got == "a" }, 5*time.Second, 10*time.Millisecond)

	pa.Stall() // a hangs, and its last word was SERVING
	b.lead(true)
	// Round robin sends calls to a and b in turn: one to a soon times out, and its caller
	// renews the connection.
	require.Eventually(t, func() bool { _, err := call(); return err != nil }, 10*time.Second, time.Millisecond,
		"no call reached the hung leader: the test tests nothing")
	for i := range 20 {
		start := time.Now()
		got, err := call()
		require.NoError(t, err, "call %d after %s", i, time.Since(start))
		assert.Equal(t, "b", got, "a hung leader must get no calls")
	}
}

// Renewing a connection that was already replaced does nothing: users that notice the same
// hang together make one new connection.
func TestRenewIsOncePerConnection(t *testing.T) {
	a := startAssigner(t, "a", true)
	f, err := dial.Follow([]string{a.addr})
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	old := f.Conn()
	awaitReady(t, old)
	f.Renew(old)
	renewed := f.Conn()
	assert.NotSame(t, old, renewed)
	f.Renew(old)
	assert.Same(t, renewed, f.Conn())
	assert.Equal(t, connectivity.Shutdown, old.GetState(), "the replaced connection is closed")
}

// A connection still connecting is not renewed: it is not held by a hung peer, and a new one
// would only start its handshakes over. A call that timed out waiting for it leaves it be.
func TestAConnectionNotReadyIsNotRenewed(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close()) // nothing listens there
	f, err := dial.Follow([]string{addr})
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	conn := f.Conn()
	_, err = reached(ctxT(t, 100*time.Millisecond), pb.NewNodeServiceClient(conn), grpc.WaitForReady(true))
	require.Error(t, err)
	require.NotEqual(t, connectivity.Ready, conn.GetState())
	f.Renew(conn)
	assert.Same(t, conn, f.Conn(), "a connection that is not ready was renewed")
	assert.NotEqual(t, connectivity.Shutdown, conn.GetState())
}

// awaitReady connects conn and waits until it is ready.
func awaitReady(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	conn.Connect()
	ctx := ctxT(t, 10*time.Second)
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		require.True(t, conn.WaitForStateChange(ctx, s), "the connection never became ready")
	}
}

// A peer that accepts TCP and never speaks (a frozen process: the kernel accepts for it) is
// given up after ConnectTimeout, not gRPC's default 20 s.
func TestAConnectionToAFrozenPeerGivesUp(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var held []net.Conn
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		lis.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	conn, err := dial.Peer(lis.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	conn.Connect()
	start := time.Now()
	require.Eventually(t, func() bool { return conn.GetState() == connectivity.TransientFailure },
		dial.ConnectTimeout+3*time.Second, 10*time.Millisecond, "the attempt was not given up")
	assert.GreaterOrEqual(t, time.Since(start), dial.ConnectTimeout/2)
}

// A server frees the stream of a client whose link went silent (keepalive from the server):
// with the server's pings shortened to a second (grpc-go's least), its wait too, so that the
// test does not wait out the 40 s of the real ones.
func TestAServerClosesTheStreamsOfASilentClient(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ended := make(chan struct{})
	const ping, wait = time.Second, time.Second
	s := grpc.NewServer(dial.ServerOptionsPinging(ping, wait)...)
	healthpb.RegisterHealthServer(s, &endNotifier{Server: health.NewServer(), ended: ended})
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.Serve(lis) })
	t.Cleanup(func() { s.Stop(); wg.Wait() })

	p := proxyT(t, lis.Addr().String())
	conn, err := dial.Peer(p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err)

	p.Stall()
	select {
	case <-ended:
	case <-time.After(ping + wait + 10*time.Second):
		t.Fatal("the server kept the stream of a silent client")
	}
}

// endNotifier is a health server whose Watch says when its stream ends.
type endNotifier struct {
	*health.Server
	ended chan struct{}
}

func (e *endNotifier) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	defer close(e.ended)
	return e.Server.Watch(req, stream)
}

func TestAWatchdogCancelsASilentStream(t *testing.T) {
	ctx, w := dial.NewWatchdog(context.Background(), 50*time.Millisecond)
	defer w.Stop()
	w.Waiting()
	time.Sleep(10 * time.Millisecond)
	w.Heard() // heard in time: the clock stops
	select {
	case <-ctx.Done():
		t.Fatal("canceled while no one waited")
	case <-time.After(200 * time.Millisecond):
	}
	w.Waiting()
	select {
	case <-ctx.Done():
		assert.True(t, dial.Silent(ctx))
	case <-time.After(5 * time.Second):
		t.Fatal("a silent stream was not canceled")
	}
}

func TestAStoppedWatchdogIsNotSilent(t *testing.T) {
	ctx, w := dial.NewWatchdog(context.Background(), time.Hour)
	w.Stop()
	<-ctx.Done()
	assert.False(t, dial.Silent(ctx))
}

func TestReceiveSaysASilentStreamIsSilent(t *testing.T) {
	ctx, w := dial.NewWatchdog(context.Background(), 20*time.Millisecond)
	defer w.Stop()
	heard := func() (int, error) { return 1, nil }
	m, err := dial.Receive(w, heard)
	require.NoError(t, err)
	assert.Equal(t, 1, m)
	hung := func() (int, error) { <-ctx.Done(); return 0, ctx.Err() }
	_, err = dial.Receive(w, hung)
	assert.ErrorIs(t, err, dial.ErrSilent, "a stream the watchdog ended is silent")

	ctx2, w2 := dial.NewWatchdog(context.Background(), time.Hour)
	defer w2.Stop()
	failed := func() (int, error) { return 0, errors.New("reset") }
	_, err = dial.Receive(w2, failed)
	assert.EqualError(t, err, "reset", "other failures pass through")
	assert.NoError(t, ctx2.Err())
}
