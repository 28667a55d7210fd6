package client_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// laggingList is an assigner whose first node list lacks n2, as a relay's copy, read up to
// a second before a map naming a new node, does.
type laggingList struct {
	pb.UnimplementedAssignmentServiceServer
	pb.UnimplementedAdminServiceServer
	a     *assignment.Assignment
	reads atomic.Int32
}

func (f *laggingList) WatchAssignment(_ *pb.WatchAssignmentRequest, stream pb.AssignmentService_WatchAssignmentServer) error {
	q := quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 1}, Generation: f.a.Generation(), Snapshot: f.a, Cause: "reinit",
		Time: time.Now()}
	if err := stream.Send(&pb.WatchAssignmentResponse{Quantum: wire.QuantumToProto(q)}); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-time.After(dial.StreamHeartbeat):
			if err := stream.Send(&pb.WatchAssignmentResponse{Heartbeat: true}); err != nil {
				return err
			}
		}
	}
}

func (f *laggingList) ListNodes(context.Context, *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	resp := &pb.ListNodesResponse{Nodes: []*pb.NodeInfo{{Node: &pb.Node{Id: "n1"}, Address: "127.0.0.1:1"}}}
	if f.reads.Add(1) > 2 { // a read before the map, and the one the map triggers, lack n2
		resp.Nodes = append(resp.Nodes, &pb.NodeInfo{Node: &pb.Node{Id: "n2"}, Address: "127.0.0.1:2"})
	}
	return resp, nil
}

// A router whose node list lacks a node its map names reads the list again soon, not only
// after its refresh interval: the list of a relay may be a second older than its map.
func TestARouterReadsTheNodeListAgainUntilItNamesEveryReplica(t *testing.T) {
	a, err := assignment.Uniform(2, func(i int) []assignment.NodeID { return []assignment.NodeID{[]assignment.NodeID{"n1", "n2"}[i]} })
	require.NoError(t, err)
	fake := &laggingList{a: a}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	pb.RegisterAssignmentServiceServer(gs, fake)
	pb.RegisterAdminServiceServer(gs, fake)
	hs := health.NewServer()
	hs.SetServingStatus(dial.LeaderHealthService, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()

	r, err := client.NewRouter(client.RouterConfig{Assigners: []string{lis.Addr().String()}, RefreshInterval: time.Hour, Logger: quiet()})
	require.NoError(t, err)
	runRouter(t, r)
	require.Eventually(t, func() bool {
		rt, err := r.LookupHash(a.Slice(1).Range.Start)
		return err == nil && rt.Replicas[0].Address == "127.0.0.1:2"
	}, 10*time.Second, 10*time.Millisecond, "the router learns n2's address from a later read")
}
