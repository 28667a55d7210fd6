package relay

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	s.maps = &mapserve.Server{Name: "relay", Feed: s.feed, Live: s.live, Watchers: watchers,
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
	return s.maps.Watch(stream, req.GetFrom(), false, req.GetHeartbeat())
}

func (s *Service) GetAssignment(context.Context, *pb.GetAssignmentRequest) (*pb.GetAssignmentResponse, error) {
	return s.maps.GetAssignment()
}

func (s *Service) Lookup(_ context.Context, req *pb.LookupRequest) (*pb.LookupResponse, error) {
	return s.maps.Lookup(req)
}

func (s *Service) ListNodes(context.Context, *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	if l := s.nodes.latest.Load(); l != nil {
		return l, nil
	}
	return nil, status.Error(codes.Unavailable, "relay: the node list was not read from the assigner yet; ask another relay or the assigner")
}

// Nodes is the node list a relay serves in the assigner's place. Routers read it every few
// seconds, and the leader answers a node list in its loop: ten thousand routers asking it
// would cost the leader in their number, a relay asking once a second does not.
type Nodes struct {
	latest atomic.Pointer[pb.ListNodesResponse]
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
			n.latest.Store(resp)
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
