package assigner

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sliceplane/sliceplane/internal/assigner/core"
	"github.com/sliceplane/sliceplane/internal/assigner/etcdstate"
	"github.com/sliceplane/sliceplane/internal/mapserve"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/target"
	"github.com/sliceplane/sliceplane/internal/webview"
)

// target is one target in this assigner: its state in etcd, its source, metrics and web
// view, and its leadership while this assigner holds it. Every target campaigns on its own
// election, so targets fail over independently; Server decides which targets this assigner
// campaigns for (target.Of), and supervise carries that out.
type served struct {
	name string
	// sizeKey is where the leader publishes the target's size for placement (target.Place).
	sizeKey string
	cfg     Config // the process's, with the target's prefix, source and core config
	log     *slog.Logger
	store   *etcdstate.Store
	source  source.Source
	// clockOnly says the source's watch is a source.ClockWatcher's: every batch is a clock.
	clockOnly bool
	metrics   *metrics
	view      *webview.View
	page      http.Handler
	api       *api
	health    *health.Server // grpc's, shared by the targets
	// healthName is the health service SERVING while this assigner leads the target.
	healthName string
	// collectors are the target's metrics, unregistered when the target goes.
	collectors *collectors

	leading    atomic.Pointer[leadership] // nil unless this assigner leads the target
	leaderAddr atomic.Value               // string: the leader's advertised address, if known

	// coreCfg is the target's core config, the latest its target.yaml gave (cfg.Core at
	// first); configGen counts its changes, and reconfigured tells the leader's loop of one.
	coreCfg      atomic.Pointer[core.Config]
	configGen    atomic.Uint64
	reconfigured chan struct{}

	// now is the leader's clock (monotonic), and keepAlive makes one keep-alive round trip of
	// a lease: tests replace them to suspend the process or cut it from etcd.
	now       func() time.Time
	keepAlive func(c *clientv3.Client, id clientv3.LeaseID) func(context.Context) (time.Duration, error)
}

// newTarget returns target name, configured by cfg (the process's config with the target's
// core config), its metrics labelled with its name.
func newTarget(name string, cfg Config, reg prometheus.Registerer, h *health.Server) (*served, error) {
	root, sizeKey := target.Root(cfg.Prefix, name), target.SizeKey(cfg.Prefix, name)
	if name != target.Default {
		cfg.Prefix, cfg.SourcePrefix = root, target.DataPrefix(cfg.Prefix, name)
	}
	if cfg.Source == nil {
		cfg.Source = source.NewEtcd(cfg.Client, cfg.SourcePrefix)
	}
	col := &collectors{reg: prometheus.WrapRegistererWith(prometheus.Labels{"target": name}, reg)}
	a := &api{fresh: newFreshness(col), gate: newReportGate(cfg.MaxReportsPerSecond)}
	view, err := webview.New(cfg.History, a, cfg.Core.ZoneLabel)
	if err != nil {
		return nil, fmt.Errorf("assigner: the web view's history of target %s: %w", name, err)
	}
	log := cfg.Logger.With("target", name)
	t := &served{
		name: name, sizeKey: sizeKey, cfg: cfg, log: log, store: etcdstate.New(cfg.Client, cfg.Prefix+"assigner/"), source: cfg.Source,
		metrics: newMetrics(col), view: view, page: view.Handler(log), api: a, health: h,
		healthName: target.LeaderHealthService(name), collectors: col, now: time.Now, keepAlive: etcdKeepAlive,
		reconfigured: make(chan struct{}, 1),
	}
	t.coreCfg.Store(&cfg.Core)
	_, t.clockOnly = cfg.Source.(source.ClockWatcher)
	t.leaderAddr.Store("")
	t.store.Observe = func(op string, d time.Duration) { t.metrics.etcdWrite.WithLabelValues(op).Observe(d.Seconds()) }
	a.s = t
	a.maps = &mapserve.Server{Name: "assigner", Feed: a.feed, Watchers: t.metrics.watchers,
		Closed: "assigner: this assigner stopped leading target " + name + "; reconnect to its leader", NoMap: a.toStatus(core.ErrNoMap)}
	h.SetServingStatus(t.healthName, healthpb.HealthCheckResponse_NOT_SERVING)
	return t, nil
}

// coreConfig returns the target's core config, with the process's intervals, and its count
// of changes: read in that order, so that a change in between is applied again, not missed.
func (s *served) coreConfig() (core.Config, uint64) {
	gen := s.configGen.Load()
	cfg := *s.coreCfg.Load()
	cfg.PassInterval, cfg.ClockInterval = s.cfg.PassInterval, s.cfg.ClockInterval
	return cfg, gen
}

// reconfigure makes cfg the target's core config: a term begins with it, and the leader's
// loop, if this assigner leads, steps it (core.Reconfigure) so that its next pass uses it.
func (s *served) reconfigure(cfg core.Config) {
	s.coreCfg.Store(&cfg)
	s.configGen.Add(1)
	select {
	case s.reconfigured <- struct{}{}:
	default: // one is pending: the loop reads the latest
	}
}

// leader returns the advertised address of the target's leader, "" if none is known.
func (s *served) leader() string {
	addr, _ := s.leaderAddr.Load().(string)
	return addr
}

// placement is what this assigner is to a target (target.Of), and the target's owner.
type placement struct {
	role  target.Role
	owner string
}

// supervise runs the target until ctx ends: it follows who leads it, campaigns while this
// assigner is its owner or backup, and hands it back to its owner once the owner is queued
// in its election (a backup leads only while the owner cannot).
func (s *served) supervise(ctx context.Context, observer *concurrency.Session, places <-chan placement) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.observe(ctx, concurrency.NewElection(observer, s.cfg.Prefix+"election/")) })
	c := campaigner{t: s}
	defer c.stop()
	handBack := time.NewTicker(time.Second)
	defer handBack.Stop()
	var p placement
	for {
		select {
		case <-ctx.Done():
			return
		case p = <-places:
			if p.role == target.Neither {
				c.stop()
			} else {
				c.start(ctx)
			}
		case <-handBack.C:
			if p.role == target.Backup && s.leading.Load() != nil && s.queued(ctx, p.owner) {
				s.log.Info("handing the target back to its owner", "owner", p.owner)
				c.stop()
				c.start(ctx)
			}
		}
	}
}

// queued reports whether the assigner advertised at addr campaigns for the target.
func (s *served) queued(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := s.cfg.Client.Get(ctx, s.cfg.Prefix+"election/", clientv3.WithPrefix())
	if err != nil {
		return false
	}
	for _, kv := range resp.Kvs {
		if string(kv.Value) == addr {
			return true
		}
	}
	return false
}

// campaigner runs a target's campaign on a goroutine it can stop: stopping ends the term,
// if it leads, and revokes its lease, so that the next candidate leads at once.
type campaigner struct {
	t      *served
	cancel context.CancelFunc
	done   chan struct{}
}

func (c *campaigner) start(ctx context.Context) {
	if c.done != nil {
		return
	}
	ctx, c.cancel = context.WithCancel(ctx)
	c.done = make(chan struct{})
	go func() {
		defer close(c.done)
		c.t.campaign(ctx)
	}()
}

func (c *campaigner) stop() {
	if c.done == nil {
		return
	}
	c.cancel()
	<-c.done
	c.done = nil
}

// collectors registers a target's metrics, labelled with its name, and unregisters them all
// when the target goes.
type collectors struct {
	reg prometheus.Registerer
	mu  sync.Mutex
	all []prometheus.Collector
}

func (c *collectors) Register(col prometheus.Collector) error {
	if err := c.reg.Register(col); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all = append(c.all, col)
	return nil
}

func (c *collectors) MustRegister(cols ...prometheus.Collector) {
	for _, col := range cols {
		if err := c.Register(col); err != nil {
			panic(err)
		}
	}
}

func (c *collectors) Unregister(col prometheus.Collector) bool { return c.reg.Unregister(col) }

func (c *collectors) unregisterAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, col := range c.all {
		c.reg.Unregister(col)
	}
	c.all = nil
}
