package client

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

func TestARouterWatchesItsBestRelayThatDidNotFailLately(t *testing.T) {
	var dialled []string
	rs := newRelays("router-1", func(addr string) (*grpc.ClientConn, error) {
		dialled = append(dialled, addr)
		return dial.Peer(addr)
	})
	defer rs.close()
	now := time.Now()
	assert.Empty(t, rs.preferred(now), "no relay known: the assigner")

	set := quantum.Distributors{"d1": "127.0.0.1:1", "d2": "127.0.0.1:2", "d3": "127.0.0.1:3"}
	rs.update(set)
	ranked := set.Rank("router-1")
	require.Equal(t, ranked[0], rs.preferred(now))
	_, err := rs.conn(ranked[0])
	require.NoError(t, err)
	rs.jitter = func(d time.Duration) time.Duration { return d / 2 }
	rs.watching(ranked[0], now)
	rs.tick(now.Add(warmSpread/2 - time.Millisecond))
	assert.Equal(t, []string{set[ranked[0]]}, dialled, "the next relay is connected at a random point of warmSpread, not at once")
	rs.tick(now.Add(warmSpread / 2))
	assert.Equal(t, []string{set[ranked[0]], set[ranked[1]]}, dialled, "the next relay is connected ahead of need")
	rs.tick(now.Add(warmSpread))
	assert.Len(t, dialled, 2, "and once")

	rs.fail(ranked[0], now)
	assert.Equal(t, ranked[1], rs.preferred(now), "a failed relay is left alone")
	rs.fail(ranked[1], now)
	rs.fail(ranked[2], now)
	assert.Empty(t, rs.preferred(now), "every relay failed lately: the assigner")
	assert.Equal(t, ranked[0], rs.preferred(now.Add(relayRetry+time.Second)), "and the best one again once its time is out")

	// A relay that moved is dialled again at its new address; one that left is forgotten.
	// A new set is news: the relays that failed are tried again.
	moved := quantum.Distributors{ranked[0]: "127.0.0.1:9", ranked[1]: set[ranked[1]]}
	rs.update(moved)
	assert.Equal(t, ranked[0], rs.preferred(now), "the set changed: its best relay is tried again")
	_, ok := rs.conns[ranked[0]]
	assert.False(t, ok, "the moved relay's connection is closed")
	assert.Contains(t, rs.conns, ranked[1])
	_, err = rs.conn(ranked[0])
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:9", dialled[len(dialled)-1])
}

// The connection a router keeps to its next relay, ahead of need, is made again when it went
// idle: after the relay restarted, gRPC leaves it idle until something asks for it.
func TestTheNextRelayIsConnectedAgainOnceIdle(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	srv := grpc.NewServer()
	go srv.Serve(lis)
	defer func() { srv.Stop() }()

	rs := newRelays("router-1", func(a string) (*grpc.ClientConn, error) { return dial.Peer(a) })
	defer rs.close()
	rs.jitter = func(d time.Duration) time.Duration { return d / 2 }
	set := quantum.Distributors{"d1": "127.0.0.1:1", "d2": "127.0.0.1:2"}
	ranked := set.Rank("router-1")
	set[ranked[1]] = addr // the next relay is the one that runs here
	rs.update(set)
	now := time.Now()
	rs.watching(ranked[0], now)
	rs.tick(now.Add(warmSpread))
	next := rs.conns[ranked[1]]
	require.NotNil(t, next, "the next relay is connected ahead of need")
	awaitState(t, next, connectivity.Ready)

	srv.Stop() // the next relay restarts
	awaitState(t, next, connectivity.Idle)
	lis, err = net.Listen("tcp", addr)
	require.NoError(t, err)
	srv = grpc.NewServer()
	go srv.Serve(lis)
	now = now.Add(time.Minute)
	rs.tick(now)
	assert.Equal(t, connectivity.Idle, next.GetState(), "not at once: at a random point within warmSpread")
	rs.tick(now.Add(warmSpread / 2))
	awaitState(t, next, connectivity.Ready)
	assert.Same(t, next, rs.conns[ranked[1]], "the same connection, connected again")
}

// awaitState waits, 10 s at most, for conn to reach state.
func awaitState(t *testing.T, conn *grpc.ClientConn, state connectivity.State) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for s := conn.GetState(); s != state; s = conn.GetState() {
		require.True(t, conn.WaitForStateChange(ctx, s), "the connection stayed %s, never %s", s, state)
	}
}
