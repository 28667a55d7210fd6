package distributor

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/prometheus/client_golang/prometheus"
	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/grpcserver"
	"github.com/sliceplane/sliceplane/internal/membership"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/relay"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/target"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// lane is the distributor of one target: it registers among the target's distributors,
// follows the target's quanta and source, keeps the queues of the target's nodes it serves,
// and relays the target's map and node list. A Server runs one lane per target it serves.
type lane struct {
	cfg     Config // the process's, with this lane's Target and Source
	log     *slog.Logger
	metrics *metrics
	router  *Router
	app     *applier // applies the router's actions; route owns it, Pull reads its clock
	attach  chan attachRequest
	done    chan struct{}                          // closed when the route loop ends
	counted struct{ snapshots, overflows float64 } // of the router's stats, by the metrics
	// relay is this distributor's copy of the assigner's stream, which it serves to routers
	// and members; nodes its copy of the node list.
	relay   *relay.Relay
	nodes   *relay.Nodes
	service *relay.Service
	// sourceHeard is when the source last answered the route loop's watch (Unix ns; 0
	// before the first watch): Pull tells every node how long ago (see sourceFeed).
	sourceHeard atomic.Int64
}

// newLane returns the lane of cfg.Target, reading cfg.Source (default: the target's etcd
// data prefix), its metrics registered with reg.
func newLane(cfg Config, reg prometheus.Registerer, log *slog.Logger) *lane {
	if cfg.Source == nil {
		cfg.Source = source.NewEtcd(cfg.Client, target.DataPrefix(cfg.Prefix, cfg.Target))
	}
	s := &lane{
		cfg: cfg, log: log, metrics: newMetrics(reg),
		router: NewRouter(RouterConfig{ID: cfg.ID, MaxQueueBytes: cfg.MaxQueueBytes, ScanAheadBytes: cfg.MaxScanAheadBytes,
			NewEpoch: cfg.NewEpoch}),
		attach: make(chan attachRequest),
		done:   make(chan struct{}),
		relay:  relay.New(),
		nodes:  &relay.Nodes{},
	}
	s.app = newApplier(s.router)
	s.service = relay.NewService(s.relay, s.nodes, s.metrics.relayWatchers)
	if o, ok := cfg.Source.(source.Observed); ok {
		o.Observe(s.log, func(r source.RejectReason) { s.metrics.rejected.WithLabelValues(string(r)).Inc() })
	}
	return s
}

// tasks are the lane's goroutines, run by the Server's gRPC server; named after its target
// when the Server has several.
func (s *lane) tasks(named bool) []grpcserver.Task {
	suffix := ""
	if named {
		suffix = " of target " + target.Name(s.cfg.Target)
	}
	return []grpcserver.Task{{Name: "routing" + suffix, Run: s.route}, {Name: "registering" + suffix, Run: s.register},
		{Name: "relaying the node list" + suffix, Run: s.relayNodes}}
}

// relayNodes keeps the node list the relay serves, read from the leader, until ctx ends.
func (s *lane) relayNodes(ctx context.Context) error {
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
func (s *lane) relayQuantum(q quantum.Quantum) {
	if _, err := s.relay.Take(q); err != nil {
		s.metrics.relayRefused.Inc()
		s.log.Debug("the relay refused a quantum", "err", err)
	}
}

// register keeps the distributor in the set while ctx lasts, registering again whenever its
// lease is lost (etcd unreachable for longer than the lease).
func (s *lane) register(ctx context.Context) error {
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
func (s *lane) attachNode(ctx context.Context, id assignment.NodeID, epoch, index uint64) (Attached, error) {
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
func (s *lane) route(ctx context.Context) error {
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
func (s *lane) deliver(ctx context.Context, wg *sync.WaitGroup, seq *Sequencer, quanta *quantaFeed) {
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
func (s *lane) observe(latest uint64) {
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
	s      *lane
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
func (s *lane) followQuanta(ctx context.Context, from *quantum.Position, out chan<- quantum.Quantum) {
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
func (s *lane) watchQuanta(ctx context.Context, client pb.QuantaServiceClient, from **quantum.Position, out chan<- quantum.Quantum, backoff *time.Duration) error {
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
