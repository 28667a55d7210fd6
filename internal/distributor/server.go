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
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/grpcserver"
	"github.com/sliceplane/sliceplane/internal/membership"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/relay"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/target"
	"github.com/sliceplane/sliceplane/internal/wire"
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
	if err := target.CheckRef(c.Target); err != nil {
		return fmt.Errorf("distributor: --target: %w", err)
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

// Server is a distributor.
type Server struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	router  *Router
	app     *applier // applies the router's actions; route owns it, Pull reads its clock
	grpc    *grpcserver.Server
	attach  chan attachRequest
	done    chan struct{}                          // closed when Run's loop ends
	counted struct{ snapshots, overflows float64 } // of the router's stats, by the metrics
	// relay is this distributor's copy of the assigner's stream, which it serves to routers
	// and members; nodes its copy of the node list.
	relay *relay.Relay
	nodes *relay.Nodes
	// sourceHeard is when the source last answered the route loop's watch (Unix ns; 0
	// before the first watch): Pull tells every node how long ago (see sourceFeed).
	sourceHeard atomic.Int64
}

// New returns a distributor listening on cfg.Listen (and cfg.MetricsListen); Run serves.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Client == nil {
		return nil, errors.New("distributor: no etcd client")
	}
	root := target.Root(cfg.Prefix, cfg.Target)
	if cfg.Source == nil {
		cfg.Source = source.NewEtcd(cfg.Client, root+"data/")
	}
	log := cfg.Logger.With("distributor", cfg.ID)
	// Stopped without grace: Pull streams end only when their nodes go.
	srv, err := grpcserver.New(grpcserver.Config{
		Name: "distributor", Listen: cfg.Listen, Advertise: cfg.Advertise, MetricsListen: cfg.MetricsListen,
		Target: target.Name(cfg.Target), Rules: authz.DistributorRules(), Policy: cfg.Policy, TLS: cfg.TLS, Registry: cfg.Registry, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	cfg.Advertise = srv.Advertise()
	s := &Server{
		cfg: cfg, log: log, grpc: srv,
		metrics: newMetrics(cfg.Registry),
		router: NewRouter(RouterConfig{ID: cfg.ID, MaxQueueBytes: cfg.MaxQueueBytes, ScanAheadBytes: cfg.MaxScanAheadBytes,
			NewEpoch: cfg.NewEpoch}),
		attach: make(chan attachRequest),
		done:   make(chan struct{}),
		relay:  relay.New(),
		nodes:  &relay.Nodes{},
	}
	s.app = newApplier(s.router)
	if o, ok := cfg.Source.(source.Observed); ok {
		o.Observe(s.log, func(r source.RejectReason) { s.metrics.rejected.WithLabelValues(string(r)).Inc() })
	}
	pb.RegisterDistributorServiceServer(srv, &puller{s: s})
	relay.NewService(s.relay, s.nodes, s.metrics.relayWatchers).Register(srv)
	return s, nil
}

// Addr returns the address the gRPC server listens on.
func (s *Server) Addr() string { return s.grpc.Addr() }

// MetricsAddr returns the address of the metrics endpoint, or "".
func (s *Server) MetricsAddr() string { return s.grpc.MetricsAddr() }

// Run serves until ctx ends: it registers the distributor, follows quanta and the source,
// and serves Pull. On return it has left the distributor set and stopped every goroutine.
func (s *Server) Run(ctx context.Context) error {
	defer s.relay.Close()
	return s.grpc.Run(ctx, grpcserver.Task{Name: "routing", Run: s.route}, grpcserver.Task{Name: "registering", Run: s.register},
		grpcserver.Task{Name: "relaying the node list", Run: s.relayNodes})
}

// relayNodes keeps the node list the relay serves, read from the leader, until ctx ends.
func (s *Server) relayNodes(ctx context.Context) error {
	leader, err := dial.FollowTarget(s.cfg.Target, s.cfg.Assigners, s.cfg.TLS.DialOption("assigner"))
	if err != nil {
		return err
	}
	defer leader.Close()
	s.nodes.Run(ctx, leader, relay.NodesInterval, s.log)
	return nil
}

// relayQuantum hands a quantum received from the assigner to the relay, as it arrives. One
// it refuses goes on to the router all the same, which refuses it too (an older term's, or
// one of a broken stream) and starts the stream over from a whole map, which resets the
// relay; until then the relay, if its map is behind, stops vouching for it.
func (s *Server) relayQuantum(q quantum.Quantum) {
	if _, err := s.relay.Take(q); err != nil {
		s.metrics.relayRefused.Inc()
		s.log.Debug("the relay refused a quantum", "err", err)
	}
}

// register keeps the distributor in the set while ctx lasts, registering again whenever its
// lease is lost (etcd unreachable for longer than the lease).
func (s *Server) register(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		reg, err := membership.Register(ctx, s.cfg.Client, target.Root(s.cfg.Prefix, s.cfg.Target), s.cfg.ID, s.cfg.Advertise, s.cfg.SessionTTL)
		if err == nil {
			backoff = 100 * time.Millisecond
			select {
			case <-ctx.Done():
				if err := reg.Close(); err != nil {
					s.log.Warn("could not leave the distributor set; nodes wait for the lease to lapse", "err", err)
				}
				return nil
			case <-reg.Done():
				s.log.Warn("the registration's lease was lost; registering again")
				continue
			}
		}
		s.log.Warn("registration failed", "err", err, "retry_in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	return nil
}

// randomEpoch returns a random nonzero epoch. Epochs only need to differ from every other
// this distributor, and its earlier runs, gave out; 64 random bits do that without storage.
func randomEpoch() uint64 {
	var b [8]byte
	for {
		rand.Read(b[:])
		if e := binary.BigEndian.Uint64(b[:]); e != 0 {
			return e
		}
	}
}

// attachRequest asks the loop to start a Pull stream.
type attachRequest struct {
	node         assignment.NodeID
	epoch, index uint64
	reply        chan attachReply
}

type attachReply struct {
	att Attached
	err error
}

// attachNode starts a Pull stream through the loop.
func (s *Server) attachNode(ctx context.Context, id assignment.NodeID, epoch, index uint64) (Attached, error) {
	req := attachRequest{node: id, epoch: epoch, index: index, reply: make(chan attachReply, 1)}
	select {
	case s.attach <- req:
	case <-s.done:
		return Attached{}, errStopped
	case <-ctx.Done():
		return Attached{}, ctx.Err()
	}
	select {
	case rep := <-req.reply:
		return rep.att, rep.err
	case <-s.done:
		return Attached{}, errStopped
	case <-ctx.Done():
		return Attached{}, ctx.Err()
	}
}

var errStopped = errors.New("distributor: stopping")

// route is the loop that owns the sequencer and the router.
func (s *Server) route(ctx context.Context) error {
	defer close(s.done)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	scans := newScanner(s.cfg.Source, s.app, s.cfg.ScanWorkers, s.log, s.metrics)
	quanta := &quantaFeed{s: s}
	quanta.start(ctx, &wg, nil, 0)
	defer quanta.stop()

	var (
		seq      *Sequencer
		feed     sourceFeed
		progress <-chan time.Time
		latest   uint64 // the latest clock known, for the lag metric
	)
	feed.s = s
	defer feed.stop()
	stats := time.NewTicker(time.Second)
	defer stats.Stop()
	liveness := time.NewTicker(livenessAsk)
	defer liveness.Stop()

	for {
		select {
		case <-ctx.Done():
			return nil
		case q := <-quanta.out:
			s.relayQuantum(q)
			latest = max(latest, q.Clock)
			if seq == nil {
				// The first quantum is reinitializing, as every fresh stream begins: the source
				// is followed from its clock, and the map in it was made at that clock.
				seq = NewSequencer(q.Clock)
				feed.start(ctx, q.Clock)
			}
			seq.AddQuantum(q)
		case b, ok := <-feed.out:
			if !feed.take(b, ok, seq) {
				continue
			}
			latest = max(latest, b.Clock)
		case <-feed.retry:
			feed.restart(ctx, seq)
			continue
		case now := <-liveness.C:
			feed.live(now)
			continue
		case p := <-scans.pieces:
			scans.finish(p)
		case <-s.app.Acked():
			// A node took what a scan read: the scan may read on.
			scans.dispatch(ctx, &wg)
			continue
		case req := <-s.attach:
			att, err := s.app.attach(req.node, req.epoch, req.index)
			req.reply <- attachReply{att: att, err: err}
		case now := <-progress:
			// A quantum waits for the source to say it has delivered everything up to the
			// quantum's clock; ask it to say how far it got.
			progress = nil
			feed.ask(now)
		case <-stats.C:
			s.observe(latest)
			continue
		}
		scans.add(s.app.takeScans())
		scans.dispatch(ctx, &wg)
		if seq == nil {
			continue
		}
		s.deliver(ctx, &wg, seq, quanta)
		scans.add(s.app.takeScans())
		scans.dispatch(ctx, &wg)
		progress = progressTimer(seq, s.router, progress)
	}
}

// deliver hands the router, in order, what the sequencer has released: quanta and batches of
// changes, then how far the source has delivered. A refused quantum ends it: the quanta are
// resubscribed to, from a reinit.
func (s *Server) deliver(ctx context.Context, wg *sync.WaitGroup, seq *Sequencer, quanta *quantaFeed) {
	for {
		ev, ok := seq.Next()
		if !ok {
			if clock, settled := seq.Settled(); settled {
				s.app.progress(clock)
			}
			return
		}
		if ev.Quantum != nil {
			if err := s.app.quantum(*ev.Quantum); err != nil {
				// The stream is broken (a quantum was lost) or comes from a deposed
				// leader: start over from a reinit, from whoever leads now.
				reason, wait := "does_not_apply", time.Duration(0)
				if refused, ok := errors.AsType[*quantum.RefusedError](err); ok {
					reason = refused.Reason
					wait = 100 * time.Millisecond // a deposed leader may still answer at first
				}
				s.metrics.quantaRefused.WithLabelValues(reason).Inc()
				s.log.Warn("quantum refused; resubscribing", "reason", reason, "err", err)
				seq.DropQuanta()
				quanta.restart(ctx, wg, wait)
				return
			}
			s.metrics.quanta.Inc()
		} else {
			s.app.changes(*ev.Batch, time.Now())
			s.metrics.changes.Add(float64(len(ev.Batch.Changes)))
		}
	}
}

// progressTimer returns when route asks the source for progress: soon while the sequencer
// waits for the source to reach a quantum's clock, or the router for it to reach a scan's
// (a timer already running is kept), never otherwise.
func progressTimer(seq *Sequencer, r *Router, progress <-chan time.Time) <-chan time.Time {
	_, quantum := seq.Waiting()
	_, scan := r.Waiting()
	if !quantum && !scan {
		return nil
	}
	if progress == nil {
		return time.After(5 * time.Millisecond)
	}
	return progress
}

// observe updates the gauges.
func (s *Server) observe(latest uint64) {
	clock := s.router.Clock()
	s.metrics.clock.Set(float64(clock))
	if latest > clock {
		s.metrics.lag.Set(float64(latest - clock))
	} else {
		s.metrics.lag.Set(0)
	}
	st := s.router.Stats()
	s.metrics.snapshots.Add(float64(st.Snapshots) - s.counted.snapshots)
	s.metrics.overflows.Add(float64(st.Overflows) - s.counted.overflows)
	s.counted.snapshots, s.counted.overflows = float64(st.Snapshots), float64(st.Overflows)
	s.metrics.queueOps.Reset()
	s.metrics.queueBytes.Reset()
	served := 0
	for id, q := range s.app.queues {
		ops, bytes := q.depth()
		s.metrics.queueOps.WithLabelValues(string(id)).Set(float64(ops))
		s.metrics.queueBytes.WithLabelValues(string(id)).Set(float64(bytes))
		served++
	}
	s.metrics.served.Set(float64(served))
}

// quantaFeed follows the assigner's quanta, reconnecting as needed.
type quantaFeed struct {
	s      *Server
	cancel context.CancelFunc
	out    chan quantum.Quantum
}

// start follows quanta after position from (nil: from a reinitializing quantum), after
// waiting for wait.
func (f *quantaFeed) start(ctx context.Context, wg *sync.WaitGroup, from *quantum.Position, wait time.Duration) {
	ctx, f.cancel = context.WithCancel(ctx)
	out := make(chan quantum.Quantum)
	f.out = out
	wg.Add(1)
	go func() {
		defer wg.Done()
		if wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return
			}
		}
		f.s.followQuanta(ctx, from, out)
	}()
}

func (f *quantaFeed) stop() {
	if f.cancel != nil {
		f.cancel()
	}
}

// restart starts over from a reinitializing quantum, after wait.
func (f *quantaFeed) restart(ctx context.Context, wg *sync.WaitGroup, wait time.Duration) {
	f.stop()
	f.start(ctx, wg, nil, wait)
}

// followQuanta streams quanta into out until ctx ends, reconnecting after failures from the
// last position received. A stream silent for longer than dial.StreamIdleTimeout (the leader
// sends heartbeats when idle) means a hung leader: the connection, which would keep choosing
// it, is replaced, and the new one finds whoever leads now.
func (s *Server) followQuanta(ctx context.Context, from *quantum.Position, out chan<- quantum.Quantum) {
	leader, err := dial.FollowTarget(s.cfg.Target, s.cfg.Assigners, s.cfg.TLS.DialOption("assigner"))
	if err != nil {
		s.log.Error("cannot follow quanta", "err", err)
		return
	}
	defer leader.Close()
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		conn := leader.Conn()
		err := s.watchQuanta(ctx, pb.NewQuantaServiceClient(conn), &from, out, &backoff)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, dial.ErrSilent) {
			s.metrics.quantaSilent.Inc()
			s.log.Warn("the quanta stream went silent; reconnecting to whoever leads now", "timeout", s.cfg.QuantaIdleTimeout)
			leader.Renew(conn)
		}
		s.log.Info("the quanta stream ended; reconnecting", "err", err, "retry_in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// watchQuanta runs one quanta stream until it fails; it keeps *from at the last position
// received, and resets *backoff whenever a quantum arrives.
func (s *Server) watchQuanta(ctx context.Context, client pb.QuantaServiceClient, from **quantum.Position, out chan<- quantum.Quantum, backoff *time.Duration) error {
	ctx, watchdog := dial.NewWatchdog(ctx, s.cfg.QuantaIdleTimeout)
	defer watchdog.Stop()
	// A whole map of 150k slices is ~4.5 MB, over gRPC's default 4 MB receive limit.
	stream, err := client.WatchQuanta(ctx, &pb.WatchQuantaRequest{From: positionOrNil(*from)}, grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(256<<20))
	if err != nil {
		return err
	}
	for {
		resp, err := dial.Receive(watchdog, stream.Recv)
		if err != nil {
			return err
		}
		s.relay.Heard(time.Now())
		if resp.GetHeartbeat() {
			continue
		}
		q, err := wire.QuantumFromProto(resp.GetQuantum())
		if err != nil {
			*from = nil // start over from the whole map
			return err
		}
		select {
		case out <- q:
		case <-ctx.Done():
			return ctx.Err()
		}
		*from, *backoff = &q.Position, 50*time.Millisecond
	}
}

func positionOrNil(p *quantum.Position) *pb.Position {
	if p == nil {
		return nil
	}
	return wire.PositionToProto(*p)
}
