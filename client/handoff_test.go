package client_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/distributor"
	"github.com/sliceplane/sliceplane/internal/source/sourcetest"
)

// beatRecorder passes a node's calls to the leading assigner and keeps its last heartbeat.
type beatRecorder struct {
	pb.UnimplementedNodeServiceServer
	leader pb.NodeServiceClient
	mu     sync.Mutex
	last   map[string]*pb.HeartbeatRequest
}

func (b *beatRecorder) Register(ctx context.Context, req *pb.RegisterRequest) (*pb.RegisterResponse, error) {
	return b.leader.Register(ctx, req)
}

func (b *beatRecorder) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	b.mu.Lock()
	b.last[req.GetNodeId()] = proto.Clone(req).(*pb.HeartbeatRequest)
	b.mu.Unlock()
	return b.leader.Heartbeat(ctx, req)
}

func (b *beatRecorder) ReportLoad(ctx context.Context, req *pb.ReportLoadRequest) (*pb.ReportLoadResponse, error) {
	return b.leader.ReportLoad(ctx, req)
}

func (b *beatRecorder) lastBeat(id string) *pb.HeartbeatRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last[id]
}

// startBeatRecorder serves a beatRecorder in front of c's assigners, as a leader would.
func startBeatRecorder(t *testing.T, c *clustertest.Cluster) (*beatRecorder, string) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	rec := &beatRecorder{leader: pb.NewNodeServiceClient(c.Conn()), last: map[string]*pb.HeartbeatRequest{}}
	srv := grpc.NewServer()
	pb.RegisterNodeServiceServer(srv, rec)
	hs := health.NewServer()
	hs.SetServingStatus(dial.LeaderHealthService, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	return rec, lis.Addr().String()
}

// TestHeartbeatsSayWhatANodeLoads gives a node a slice whose scan the source holds: its
// heartbeats list the slice as loading, at the generation of the map that gave it, until the
// scan is done; then they list nothing.
func TestHeartbeatsSayWhatANodeLoads(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	gs := &sourcetest.Gated{}
	var recAddr string
	c := clustertest.New(t, clustertest.Options{
		Distributor: func(cfg *distributor.Config) { cfg.Source = gs },
		Node:        func(cfg *client.NodeConfig) { cfg.Assigners = []string{recAddr} },
	})
	gs.Source = c.Source
	c.StartDistributor("d1")
	rec, addr := startBeatRecorder(t, c)
	recAddr = addr
	adm := newAdmin(c)
	n1 := c.StartNode("n1", nil)
	key := []byte("item-loading")
	clock, err := c.Source.Put(ctx, key, []byte("v"))
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "n1 serves the key", func() bool { return n1.Serving(key) && n1.Clock() >= clock })
	_, err = adm.Freeze(ctx, &pb.FreezeRequest{Reason: "client test"}, grpc.WaitForReady(true))
	require.NoError(t, err)

	gs.Shut()
	n2 := c.StartNode("n2", nil)
	var gen uint64
	waitFor(t, 30*time.Second, "n2 a replica of the key's slice", func() bool {
		if _, err := adm.Move(ctx, &pb.MoveRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: key}}, To: []string{"n1", "n2"}}); err != nil {
			return false
		}
		gen = adm.assignment(t, ctx).Generation()
		return true
	})
	h := client.Hash(key)
	loading := func(b *pb.HeartbeatRequest) bool {
		for _, r := range b.GetLoading() {
			if (r.GetStart() <= h) && (r.GetEndOfSpace() || h < r.GetEnd()) {
				return true
			}
		}
		return false
	}
	waitFor(t, 30*time.Second, "n2's heartbeat says it loads the key's slice", func() bool {
		b := rec.lastBeat("n2")
		return b != nil && b.GetGeneration() >= gen && loading(b)
	})
	require.True(t, n2.Loading(h))
	require.False(t, n2.Serving(key))

	gs.Open()
	waitFor(t, 30*time.Second, "n2's heartbeat says it loaded the slice", func() bool {
		b := rec.lastBeat("n2")
		return b.GetGeneration() >= gen && !loading(b)
	})
	require.True(t, n2.Serving(key))
}
