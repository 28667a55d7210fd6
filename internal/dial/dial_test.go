package dial_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/dial"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeAssigner is a stand-in for an assigner: its Heartbeat answers with its own name, so that a
// call says which assigner it reached, and its health service says whether it leads.
type fakeAssigner struct {
	pb.UnimplementedNodeServiceServer
	name   string
	addr   string
	health *health.Server
}

func (a *fakeAssigner) Heartbeat(context.Context, *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	return &pb.HeartbeatResponse{Distributor: &pb.Distributor{Id: a.name}}, nil
}

// lead sets whether a reports the leader's health service as serving.
func (a *fakeAssigner) lead(leads bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if leads {
		st = healthpb.HealthCheckResponse_SERVING
	}
	a.health.SetServingStatus(dial.LeaderHealthService, st)
}

func startAssigner(t *testing.T, name string, leads bool) *fakeAssigner {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	a := &fakeAssigner{name: name, addr: lis.Addr().String(), health: health.NewServer()}
	a.lead(leads)
	s := grpc.NewServer()
	pb.RegisterNodeServiceServer(s, a)
	healthpb.RegisterHealthServer(s, a.health)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(lis)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return a
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// reached makes one call and returns the name of the assigner that answered it, or the error.
func reached(ctx context.Context, c pb.NodeServiceClient, opts ...grpc.CallOption) (string, error) {
	resp, err := c.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "n"}, opts...)
	return resp.GetDistributor().GetId(), err
}

// waitFor calls until a call reaches the assigner named want, or the deadline passes.
func waitFor(t *testing.T, c pb.NodeServiceClient, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var got string
	var err error
	for time.Now().Before(deadline) {
		if got, err = reached(ctxT(t, time.Second), c); err == nil && got == want {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("calls did not reach %s within %s: the last reached %q, err %v", want, within, got, err)
}

func dialT(t *testing.T, addrs ...string) pb.NodeServiceClient {
	t.Helper()
	conn, err := dial.Leader(addrs)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return pb.NewNodeServiceClient(conn)
}

func TestCallsReachTheLeader(t *testing.T) {
	a := startAssigner(t, "a", true)
	b := startAssigner(t, "b", false)
	c := dialT(t, a.addr, " "+b.addr+" ", "") // blanks and padding are ignored

	waitFor(t, c, "a", 5*time.Second)
	for range 20 {
		got, err := reached(ctxT(t, 5*time.Second), c)
		require.NoError(t, err)
		assert.Equal(t, "a", got, "round robin must not pick the standby")
	}
}

func TestCallsFollowTheLeader(t *testing.T) {
	a := startAssigner(t, "a", true)
	b := startAssigner(t, "b", false)
	c := dialT(t, a.addr, b.addr)
	waitFor(t, c, "a", 5*time.Second)

	// Failover: a steps down, b takes over.
	a.lead(false)
	b.lead(true)
	waitFor(t, c, "b", 5*time.Second)
	for range 20 {
		got, err := reached(ctxT(t, 5*time.Second), c)
		require.NoError(t, err)
		assert.Equal(t, "b", got, "once b leads, a is not called")
	}

	// And back.
	b.lead(false)
	a.lead(true)
	waitFor(t, c, "a", 5*time.Second)
}

func TestWithoutALeaderCallsFailOrWait(t *testing.T) {
	a := startAssigner(t, "a", true)
	b := startAssigner(t, "b", false)
	c := dialT(t, a.addr, b.addr)
	waitFor(t, c, "a", 5*time.Second)

	a.lead(false)
	deadline := time.Now().Add(5 * time.Second)
	var err error
	for {
		_, err = reached(ctxT(t, time.Second), c)
		if status.Code(err) == codes.Unavailable || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.Equal(t, codes.Unavailable, status.Code(err), "no assigner leads: calls fail fast, err %v", err)

	// A call that waits for a leader gets one.
	type result struct {
		name string
		err  error
	}
	done := make(chan result, 1)
	ctx := ctxT(t, 10*time.Second)
	go func() {
		name, err := reached(ctx, c, grpc.WaitForReady(true))
		done <- result{name, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("a call waiting for a leader returned while none leads: %q, %v", r.name, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	b.lead(true)
	select {
	case r := <-done:
		require.NoError(t, r.err)
		assert.Equal(t, "b", r.name)
	case <-time.After(5 * time.Second):
		t.Fatal("a call waiting for a leader did not reach the new one")
	}
}

func TestLeaderNeedsAnAddress(t *testing.T) {
	for _, addrs := range [][]string{nil, {}, {"", "  "}} {
		conn, err := dial.Leader(addrs)
		assert.Error(t, err, "%q", addrs)
		assert.Nil(t, conn)
	}
}

// The assigner reports leadership under the name that dial watches.
func TestTheAssignerServesTheNameDialWatches(t *testing.T) {
	assert.Equal(t, assigner.LeaderHealthService, dial.LeaderHealthService)
}
