package client_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sliceplane/sliceplane/client"
)

// memberServer is a member's gRPC service for routing tests: the health service, whose
// answers carry the member's ID in the header "member", and which answers NotOwner to as
// many calls as refuse says.
type memberServer struct {
	id     string
	addr   string
	refuse atomic.Int32
}

func startMemberServer(t *testing.T, id string) *memberServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ms := &memberServer{id: id, addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := grpc.SetHeader(ctx, metadata.Pairs("member", id)); err != nil {
			return nil, err
		}
		if ms.refuse.Add(-1) >= 0 {
			return nil, client.NotOwner([]byte("k"))
		}
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis) //nolint:errcheck // it returns when stopped
	t.Cleanup(srv.Stop)
	return ms
}

// TestGRPCRoutesByKey runs two members with primary and secondary roles, each serving gRPC,
// and a grpc-go client made with GRPCDialOptions: a write goes to the key's primary, a read
// to a replica of its slice, a NotOwner answer is tried again, and a call without a key is
// refused.
func TestGRPCRoutesByKey(t *testing.T) {
	servers := map[string]*memberServer{"m1": startMemberServer(t, "m1"), "m2": startMemberServer(t, "m2")}
	_, r := roleCluster(t, map[string]string{"m1": servers["m1"].addr, "m2": servers["m2"].addr}, client.LeastOutstanding)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	conn, err := grpc.NewClient("sliceplane:///test", append(client.GRPCDialOptions(r), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	hc := healthpb.NewHealthClient(conn)

	call := func(ctx context.Context) (string, error) {
		var md metadata.MD
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
		if v := md.Get("member"); len(v) == 1 {
			return v[0], err
		}
		return "", err
	}
	for i := range 40 {
		key := []byte{byte(i), 'k'}
		got, err := call(client.WithWriteKey(ctx, key))
		require.NoError(t, err)
		p, err := r.Primary(key)
		require.NoError(t, err)
		assert.Equal(t, p.ID, got, "a write goes to the key's primary")
		got, err = call(client.WithKey(ctx, key))
		require.NoError(t, err)
		rt, err := r.Lookup(key)
		require.NoError(t, err)
		assert.Contains(t, []string{rt.Replicas[0].ID, rt.Replicas[len(rt.Replicas)-1].ID}, got, "a read goes to a replica")
	}

	// The member answers NotOwner twice (its range moved): the call is tried again.
	key := []byte("moved")
	p, err := r.Primary(key)
	require.NoError(t, err)
	servers[p.ID].refuse.Store(2)
	got, err := call(client.WithWriteKey(ctx, key))
	require.NoError(t, err)
	assert.Equal(t, p.ID, got)
	assert.Less(t, servers[p.ID].refuse.Load(), int32(0), "both refusals were answered")

	_, err = call(ctx)
	assert.Equal(t, codes.Internal, status.Code(err), "a call without a key: %v", err)
	assert.Contains(t, status.Convert(err).Message(), "needs a key")
	// Long enough for a refusal to come back on a busy machine, short for a test.
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	defer cancelShort()
	servers[p.ID].refuse.Store(1 << 20)
	_, err = call(client.WithWriteKey(short, key))
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "refused until the deadline: %v", err)
	assert.Contains(t, status.Convert(err).Message(), "answered NotOwner until the deadline: sliceplane: this member does not serve", "the last answer is in the message")
}
