package distributor

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/source/memsource"
	"github.com/sliceplane/sliceplane/internal/target"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// staleAssigner serves quanta as leaders that come and go would: the first stream is term
// 2's and breaks; the second is a deposed leader's (term 1), which the distributor must
// refuse; later ones are term 3's.
type staleAssigner struct {
	pb.UnimplementedQuantaServiceServer
	a     *assignment.Assignment
	dists quantum.Distributors

	mu    sync.Mutex
	froms []*pb.Position // of each stream
}

func (f *staleAssigner) WatchQuanta(req *pb.WatchQuantaRequest, stream pb.QuantaService_WatchQuantaServer) error {
	f.mu.Lock()
	n := len(f.froms)
	f.froms = append(f.froms, req.GetFrom())
	f.mu.Unlock()
	term := map[int]uint64{0: 2, 1: 1}[n]
	if term == 0 {
		term = 3
	}
	q := quantum.Quantum{Position: quantum.Position{Term: term, Seq: 1}, Generation: f.a.Generation(), Snapshot: f.a,
		Distributors: f.dists, Cause: "reinit", Time: time.Now()}
	if err := stream.Send(&pb.WatchQuantaResponse{Quantum: wire.QuantumToProto(q)}); err != nil {
		return err
	}
	if n == 0 {
		return status.Error(codes.Unavailable, "leader stepped down")
	}
	<-stream.Context().Done()
	return nil
}

func (f *staleAssigner) streams() []*pb.Position {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*pb.Position(nil), f.froms...)
}

// A distributor that hears a quantum from an older term than one it applied (a deposed
// leader's) refuses it, counts it, applies nothing of it and starts over from whoever leads.
func TestDistributorRefusesQuantaOfAnOlderTerm(t *testing.T) {
	a, err := assignment.Uniform(4, func(int) []assignment.NodeID { return []assignment.NodeID{"n1"} })
	require.NoError(t, err)
	fake := &staleAssigner{a: a, dists: quantum.Distributors{"d1": "127.0.0.1:1"}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	pb.RegisterQuantaServiceServer(gs, fake)
	hs := health.NewServer()
	hs.SetServingStatus(dial.LeaderHealthService, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()

	s, err := New(Config{ID: "d1", Client: etcdtest.New(t), Assigners: []string{lis.Addr().String()}, Source: memsource.New(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	require.Eventually(t, func() bool { return len(fake.streams()) >= 3 }, 15*time.Second, 10*time.Millisecond,
		"the distributor starts over after the refusal")
	froms := fake.streams()
	assert.Equal(t, uint64(2), froms[1].GetTerm(), "the second stream resumes term 2")
	assert.Nil(t, froms[2], "after the refusal, the distributor starts over from a whole map")
	require.Eventually(t, func() bool { return testutil.ToFloat64(s.lanes[target.Default].metrics.quanta) == 2 }, 15*time.Second, 10*time.Millisecond,
		"term 2's and term 3's quanta are applied")
	assert.Equal(t, 1.0, testutil.ToFloat64(s.lanes[target.Default].metrics.quantaRefused.WithLabelValues("stale_term")))
}
