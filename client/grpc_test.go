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

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/keyspace"
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
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) {
		cfg.Core.Roles = assigner.RolesPrimarySecondary
	}})
	check := &primaries{by: map[string]keyspace.Set{}, taken: map[string]time.Time{}}
	servers := map[string]*memberServer{}
	for _, id := range []string{"m1", "m2"} {
		servers[id] = startMemberServer(t, id)
		m, err := client.NewMember(client.MemberConfig{ID: id, Address: servers[id].addr, Assigners: c.Assigners(),
			App: &roleApp{id: id, check: check}, Roles: client.RolesPrimarySecondary, ReportInterval: 100 * time.Millisecond, Logger: quiet()})
		require.NoError(t, err)
		runMember(t, m)
	}
	waitFor(t, 30*time.Second, "every point has a primary", check.covered)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err := newAdmin(c).Freeze(ctx, &pb.FreezeRequest{Reason: "routing test"}, grpc.WaitForReady(true))
	require.NoError(t, err, "no pass moves a primary while the test compares")

	r, err := client.NewRouter(client.RouterConfig{Assigners: c.Assigners(), Policy: client.LeastOutstanding, Logger: quiet()})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(rctx) }() //nolint:errcheck // nil when rctx ends
	t.Cleanup(func() { stop(); <-done })
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
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	servers[p.ID].refuse.Store(1 << 20)
	_, err = call(client.WithWriteKey(short, key))
	assert.Equal(t, codes.FailedPrecondition, status.Code(err), "refused until the deadline, the last answer is returned: %v", err)
}
