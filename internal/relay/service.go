package relay

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/mapserve"
)

// Service serves a relay's map and node list over gRPC: the assignment service, and the
// admin service's ListNodes, which routers read the nodes' addresses from.
type Service struct {
	pb.UnimplementedAssignmentServiceServer
	pb.UnimplementedAdminServiceServer
	relay *Relay
	nodes *Nodes
	maps  *mapserve.Server
	now   func() time.Time
}

// NewService returns the service of r and n; watchers counts the open watches (nil: none).
func NewService(r *Relay, n *Nodes, watchers prometheus.Gauge) *Service {
	s := &Service{relay: r, nodes: n, now: time.Now}
	s.maps = &mapserve.Server{Name: "relay", Feed: s.feed, Live: s.live, Watchers: watchers, Nodes: n.watched,
		Closed: "relay: this relay stopped; watch another relay or the assigner",
		NoMap:  status.Error(codes.Unavailable, "relay: no map followed yet; watch another relay or the assigner")}
	return s
}

// Register registers the services on reg.
func (s *Service) Register(reg grpc.ServiceRegistrar) {
	pb.RegisterAssignmentServiceServer(reg, s)
	pb.RegisterAdminServiceServer(reg, s)
}

// silenceLimit is how long a relay's stream from the assigner may say nothing before the
// relay gives up its watchers: twice the silence after which its driver reconnects, so
// that one reconnection does not move every watcher away.
const silenceLimit = 2 * dial.StreamIdleTimeout

// errLost is the status of a relay whose stream from the assigner went silent.
var errLost = status.Error(codes.Unavailable, "relay: lost the assigner's stream; watch another relay or the assigner")

func (s *Service) live() error {
	if !s.relay.Live(s.now(), silenceLimit) {
		return errLost
	}
	return nil
}

func (s *Service) feed() (*mapserve.Feed, error) {
	if m, _, _ := s.relay.feed.Hub().Current(); m == nil {
		return nil, s.maps.NoMap
	}
	if err := s.live(); err != nil {
		return nil, err
	}
	return s.relay.feed, nil
}

func (s *Service) WatchAssignment(req *pb.WatchAssignmentRequest, stream pb.AssignmentService_WatchAssignmentServer) error {
	return s.maps.Watch(stream, mapserve.Want{From: req.GetFrom(), Heartbeat: req.GetHeartbeat(), Nodes: req.GetNodes()})
}

func (s *Service) GetAssignment(context.Context, *pb.GetAssignmentRequest) (*pb.GetAssignmentResponse, error) {
	return s.maps.GetAssignment()
}

func (s *Service) Lookup(_ context.Context, req *pb.LookupRequest) (*pb.LookupResponse, error) {
	return s.maps.Lookup(req)
}

func (s *Service) ListNodes(context.Context, *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	if l := s.nodes.latest.Load(); l != nil {
		return l.resp, nil
	}
	return nil, status.Error(codes.Unavailable, "relay: the node list was not read from the assigner yet; ask another relay or the assigner")
}

// Nodes is the node list a relay serves in the assigner's place: on its watches, to the
// watchers that ask for it, and to ListNodes. The leader answers a node list in its loop:
// ten thousand routers asking it would cost the leader in their number, a relay asking once
// a second does not.
type Nodes struct {
	latest atomic.Pointer[nodeList]
}

// nodeList is a node list read from the leader, its routing part, and that part's encoding
// for watchers.
type nodeList struct {
	resp    *pb.ListNodesResponse
	routing *pb.ListNodesResponse
	watched mapserve.NodeList
}

// store keeps resp, and for watchers its routing part (routing), encoded once for all of
// them under a new version if that part changed.
func (n *Nodes) store(resp *pb.ListNodesResponse) error {
	prev := n.latest.Load()
	l := &nodeList{resp: resp, routing: routing(resp)}
	if prev != nil && proto.Equal(prev.routing, l.routing) {
		l.watched = prev.watched
		n.latest.Store(l)
		return nil
	}
	data, err := mapserve.EncodeNodes(l.routing)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	l.watched = mapserve.NodeList{Version: 1, Data: data}
	if prev != nil {
		l.watched.Version = prev.watched.Version + 1
	}
	n.latest.Store(l)
	return nil
}

// routing returns the part of a node list that routers use: each node, its address, labels,
// roles, and whether it drains or is stale. The counters that change with every report
// (load, last seen, silence, slices, loading, primaries) are left out: with them, every
// watcher would be sent the list every second.
func routing(resp *pb.ListNodesResponse) *pb.ListNodesResponse {
	out := &pb.ListNodesResponse{Nodes: make([]*pb.NodeInfo, len(resp.GetNodes()))}
	for i, info := range resp.GetNodes() {
		out.Nodes[i] = &pb.NodeInfo{Node: info.GetNode(), Address: info.GetAddress(), Labels: info.GetLabels(),
			Draining: info.GetDraining(), Stale: info.GetStale(), Roles: info.GetRoles()}
	}
	return out
}

// watched returns the node list as watchers are sent it.
func (n *Nodes) watched() mapserve.NodeList {
	if l := n.latest.Load(); l != nil {
		return l.watched
	}
	return mapserve.NodeList{}
}

// NodesInterval is how often a relay reads the node list.
const NodesInterval = time.Second

// Run reads the node list from the leader every interval until ctx ends.
func (n *Nodes) Run(ctx context.Context, leader *dial.Follower, interval time.Duration, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		conn := leader.Conn()
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := pb.NewAdminServiceClient(conn).ListNodes(callCtx, &pb.ListNodesRequest{}, grpc.WaitForReady(true))
		cancel()
		switch {
		case err == nil:
			if err := n.store(resp); err != nil {
				log.Warn("relay: keeping the node list", "err", err)
			}
		case ctx.Err() == nil:
			if status.Code(err) == codes.DeadlineExceeded {
				leader.Renew(conn)
			}
			log.Debug("relay: reading the node list", "err", err)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}
