// Package distributor is the distributor service: it follows the assigner's quanta and the
// data source's changes, puts them in causal order, and keeps for each node it serves the
// stream of operations that brings the node's data in line with its slices. Nodes pull
// their streams over gRPC.
//
// Sequencer and Router are the deterministic core; Server is the driver: it holds the
// goroutines, the network and the clocks.
package distributor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/grpcserver"
	"github.com/sliceplane/sliceplane/internal/membership"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/relay"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/target"
)

// Config configures a Server.
type Config struct {
	// ID names the distributor among the others; nodes are spread over distributors by it.
	// A restarted distributor should keep its ID, so that its nodes come back to it.
	ID string
	// Listen is the gRPC address, "127.0.0.1:0" for a free port; Advertise the address nodes
	// dial, default the bound one.
	Listen, Advertise string
	// MetricsListen serves Prometheus metrics at /metrics; "" serves none.
	MetricsListen string
	// Assigners are the addresses of the assigners (leader and standbys).
	Assigners []string
	// Client reaches the etcd cluster where distributors register. Required.
	Client *clientv3.Client
	// Prefix roots Sliceplane's keys in etcd; default "/sliceplane/".
	Prefix string
	// Target is the target the distributor serves ("" the default one): it registers among
	// that target's distributors, follows that target's quanta, and its source's default
	// prefix is the target's; calls naming another target are refused.
	Target string
	// Source is the data source; default the etcd source under Prefix+"data/". The keys an
	// etcd source skips are counted in sliceplane_distributor_source_rejected_total.
	Source source.Source
	// Lanes are the targets of a distributor that serves several (--target a,b), each with
	// its source (nil: the target's etcd data prefix): each has its registration, quanta,
	// nodes, queues and relay, and its metrics carry the label target. Empty: the one
	// target of Target and Source. Set Lanes or those, not both.
	Lanes []Lane
	// SessionTTL is the registration's lease: how long nodes wait for a dead distributor
	// before they move. Default 5 s.
	SessionTTL time.Duration

	// MaxDeltaOps and MaxDeltaBytes bound one delta; defaults 1024 and 1 MiB.
	MaxDeltaOps   int
	MaxDeltaBytes int
	// MaxInFlightBytes bounds what a node has been sent but not acknowledged; default 4 MiB.
	MaxInFlightBytes int
	// MaxQueueBytes bounds the changes queued for one node (see RouterConfig).
	MaxQueueBytes int
	// ScanWorkers is how many scans read the source at once; default 4.
	ScanWorkers int
	// MaxScanAheadBytes bounds what a node's snapshot holds in memory: scanned items the node
	// has not acknowledged. A scan reads on only as the node takes what it read. Default 8 MiB.
	MaxScanAheadBytes int
	// ClockInterval is the shortest time between the deltas that only advance a node's clock;
	// default 50 ms.
	ClockInterval time.Duration
	// PullHeartbeat is the longest a Pull stream stays silent: an idle node gets a delta
	// that only carries the clock this often, and so tells idle from stalled. Default
	// dial.StreamHeartbeat.
	PullHeartbeat time.Duration
	// QuantaIdleTimeout is how long the quanta stream may stay silent before the
	// distributor drops it and reconnects to whoever leads; default dial.StreamIdleTimeout.
	QuantaIdleTimeout time.Duration
	// NewEpoch is for tests; see RouterConfig.
	NewEpoch func() uint64

	// TLS is the distributor's mutual TLS, for its gRPC and metrics servers and its
	// connections to the assigners; nil means plaintext, which New refuses on a
	// non-loopback address unless Insecure.
	TLS *mtls.Source
	// Policy grants identities roles beyond their kind's (package authz); nil grants none.
	Policy *authz.Policy
	// Insecure allows plaintext on a non-loopback address (--insecure).
	Insecure bool

	Logger   *slog.Logger
	Registry *prometheus.Registry
}

// Lane is one target a distributor serves, and where its items are.
type Lane struct {
	Target string
	Source source.Source
}

// lanes returns the targets c serves: Lanes, or the one of Target and Source.
func (c *Config) lanes() []Lane {
	if len(c.Lanes) > 0 {
		return c.Lanes
	}
	return []Lane{{Target: c.Target, Source: c.Source}}
}

// checkLanes refuses lanes given beside Target or Source, and a target named twice or
// badly.
func (c *Config) checkLanes() error {
	if len(c.Lanes) > 0 && (c.Target != "" || c.Source != nil) {
		return errors.New("distributor: give the targets as Lanes, or one as Target and Source, not both")
	}
	seen := map[string]bool{}
	for _, l := range c.lanes() {
		if err := target.CheckRef(l.Target); err != nil {
			return fmt.Errorf("distributor: --target: %w", err)
		}
		if seen[target.Name(l.Target)] {
			return fmt.Errorf("distributor: --target: target %q given twice", target.Name(l.Target))
		}
		seen[target.Name(l.Target)] = true
	}
	return nil
}

// Validate fills in the defaults of c and rejects a configuration no distributor can run
// with, plaintext off loopback included (closed by default); New calls it. It leaves Client
// and the Source that defaults to it to New, so that the command can check its flags, which
// the errors name, before it reaches etcd.
func (c *Config) Validate() error {
	if len(c.Assigners) == 0 {
		return errors.New("distributor: --assigners: want at least one address")
	}
	for _, a := range c.Assigners {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("distributor: --assigners: %w", err)
		}
	}
	if err := membership.ValidateID(c.ID); err != nil {
		return fmt.Errorf("distributor: --id: %w", err)
	}
	if c.Advertise != "" {
		if _, _, err := net.SplitHostPort(c.Advertise); err != nil {
			return fmt.Errorf("distributor: --advertise: %w", err)
		}
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.Prefix == "" {
		c.Prefix = "/sliceplane/"
	}
	if err := c.checkLanes(); err != nil {
		return err
	}
	if err := grpcserver.FillDefaults("distributor",
		grpcserver.Default("--session-ttl", &c.SessionTTL, 5*time.Second),
		grpcserver.Default("--clock-interval", &c.ClockInterval, 50*time.Millisecond),
		grpcserver.Default("PullHeartbeat", &c.PullHeartbeat, dial.StreamHeartbeat),
		grpcserver.Default("QuantaIdleTimeout", &c.QuantaIdleTimeout, dial.StreamIdleTimeout),
	); err != nil {
		return err
	}
	if err := grpcserver.FillDefaults("distributor",
		grpcserver.Default("--max-delta-ops", &c.MaxDeltaOps, 1024),
		grpcserver.Default("--max-delta-bytes", &c.MaxDeltaBytes, 1<<20),
		grpcserver.Default("--max-in-flight-bytes", &c.MaxInFlightBytes, 4<<20),
		grpcserver.Default("--max-queue-bytes", &c.MaxQueueBytes, 64<<20),
		grpcserver.Default("--scan-workers", &c.ScanWorkers, 4),
		grpcserver.Default("--max-scan-ahead-bytes", &c.MaxScanAheadBytes, 8<<20),
	); err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.SessionTTL < time.Second || c.SessionTTL%time.Second != 0 {
		// etcd leases last whole seconds: a shorter one would fail to register, over and over,
		// and a fraction of a second would be dropped without a word.
		return fmt.Errorf("distributor: --session-ttl %s: want whole seconds, at least 1s", c.SessionTTL)
	}
	return grpcserver.CheckListen("distributor", c.TLS, c.Insecure, c.Listen, c.MetricsListen)
}

// Server is a distributor process: one gRPC server, and a lane for each target it serves
// (Config.Lanes), to which each call goes by the target it names.
type Server struct {
	cfg   Config
	log   *slog.Logger
	grpc  *grpcserver.Server
	lanes map[string]*lane // by target.Name
}

// New returns a distributor listening on cfg.Listen (and cfg.MetricsListen); Run serves.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Client == nil {
		return nil, errors.New("distributor: no etcd client")
	}
	log := cfg.Logger.With("distributor", cfg.ID)
	lanes := cfg.lanes()
	// Stopped without grace: Pull streams end only when their nodes go.
	srv, err := grpcserver.New(grpcserver.Config{
		Name: "distributor", Listen: cfg.Listen, Advertise: cfg.Advertise, MetricsListen: cfg.MetricsListen,
		Rules: authz.DistributorRules(), Policy: cfg.Policy, TLS: cfg.TLS, Registry: cfg.Registry, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	cfg.Advertise = srv.Advertise()
	s := &Server{cfg: cfg, log: log, grpc: srv, lanes: map[string]*lane{}}
	for _, l := range lanes {
		lc := cfg
		lc.Target, lc.Source, lc.Lanes = l.Target, l.Source, nil
		reg, llog := prometheus.Registerer(cfg.Registry), log
		if len(lanes) > 1 { // one target keeps the metrics and logs of a distributor from before targets
			reg = prometheus.WrapRegistererWith(prometheus.Labels{"target": target.Name(l.Target)}, cfg.Registry)
			llog = log.With("target", target.Name(l.Target))
		}
		s.lanes[target.Name(l.Target)] = newLane(lc, reg, llog)
	}
	pb.RegisterDistributorServiceServer(srv, pullDispatch{s: s})
	pb.RegisterAssignmentServiceServer(srv, relayDispatch{s: s})
	pb.RegisterAdminServiceServer(srv, relayDispatch{s: s})
	return s, nil
}

// Addr returns the address the gRPC server listens on.
func (s *Server) Addr() string { return s.grpc.Addr() }

// MetricsAddr returns the address of the metrics endpoint, or "".
func (s *Server) MetricsAddr() string { return s.grpc.MetricsAddr() }

// Run serves until ctx ends: each lane registers the distributor among its target's,
// follows its quanta and source, and serves Pull. On return it has left every distributor
// set and stopped every goroutine.
func (s *Server) Run(ctx context.Context) error {
	var tasks []grpcserver.Task
	for _, l := range s.lanes {
		defer l.relay.Close()
		tasks = append(tasks, l.tasks(len(s.lanes) > 1)...)
	}
	return s.grpc.Run(ctx, tasks...)
}

// lane returns the lane of the target a call names, or NotFound for a target this
// distributor does not serve. Only the services of a target go through it: health and
// reflection are the process's, and answer a probe that names no target.
func (s *Server) lane(ctx context.Context) (*lane, error) {
	in := authz.CallTarget(ctx)
	if l, ok := s.lanes[in]; ok {
		return l, nil
	}
	served := make([]string, 0, len(s.lanes))
	for _, name := range slices.Sorted(maps.Keys(s.lanes)) {
		served = append(served, strconv.Quote(name))
	}
	which := "targets "
	if len(served) == 1 {
		which = "target "
	}
	return nil, status.Errorf(codes.NotFound, "distributor: this distributor serves %s%s, not target %q", which, strings.Join(served, ", "), in)
}

// pullDispatch serves Pull on the lane of the call's target.
type pullDispatch struct {
	pb.UnimplementedDistributorServiceServer
	s *Server
}

func (d pullDispatch) Pull(stream pb.DistributorService_PullServer) error {
	l, err := d.s.lane(stream.Context())
	if err != nil {
		return err
	}
	return (&puller{s: l}).Pull(stream)
}

// relayDispatch serves the relay's map and node list of the call's target.
type relayDispatch struct {
	pb.UnimplementedAssignmentServiceServer
	pb.UnimplementedAdminServiceServer
	s *Server
}

func (d relayDispatch) WatchAssignment(req *pb.WatchAssignmentRequest, stream pb.AssignmentService_WatchAssignmentServer) error {
	l, err := d.s.lane(stream.Context())
	if err != nil {
		return err
	}
	return l.service.WatchAssignment(req, stream)
}

func (d relayDispatch) GetAssignment(ctx context.Context, req *pb.GetAssignmentRequest) (*pb.GetAssignmentResponse, error) {
	return onRelay(d.s, ctx, req, (*relay.Service).GetAssignment)
}

func (d relayDispatch) Lookup(ctx context.Context, req *pb.LookupRequest) (*pb.LookupResponse, error) {
	return onRelay(d.s, ctx, req, (*relay.Service).Lookup)
}

func (d relayDispatch) ListNodes(ctx context.Context, req *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	return onRelay(d.s, ctx, req, (*relay.Service).ListNodes)
}

// onRelay calls m on the relay of the lane of ctx's target.
func onRelay[Req, Resp any](s *Server, ctx context.Context, req Req, m func(*relay.Service, context.Context, Req) (Resp, error)) (Resp, error) {
	l, err := s.lane(ctx)
	if err != nil {
		var zero Resp
		return zero, err
	}
	return m(l.service, ctx, req)
}
