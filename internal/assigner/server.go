package assigner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/frame"
	"github.com/sliceplane/sliceplane/internal/membership"
	"github.com/sliceplane/sliceplane/internal/metricsserver"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/store"
)

// LeaderHealthService is the gRPC health service name that reports SERVING only on the
// leader, for load balancers and readiness checks that must reach it (and for dial.Leader).
const LeaderHealthService = dial.LeaderHealthService

// Config configures a Server.
type Config struct {
	// Listen is the gRPC address, "127.0.0.1:0" for a free port. Advertise is the address
	// others should dial, told to clients by standbys; default the bound address.
	Listen, Advertise string
	// MetricsListen serves Prometheus metrics at /metrics; "" serves none.
	MetricsListen string
	// Client reaches the etcd cluster that holds the state and the data source. Required.
	Client *clientv3.Client
	// Prefix roots the assigner's keys in etcd: state under Prefix+"assigner/", the
	// election under Prefix+"election/". Default "/sliceplane/".
	Prefix string
	// SourcePrefix is where the data source keeps its items; default Prefix+"data/".
	SourcePrefix string
	// PassInterval is the time between balancing passes; default 1 s.
	PassInterval time.Duration
	// ClockInterval is the shortest time between clock-only quanta; default 20 ms.
	ClockInterval time.Duration
	// SessionTTL is the leader's etcd lease: how long a standby waits for a dead leader.
	// Default 5 s.
	SessionTTL time.Duration
	// MaxRequestBytes caps a request; default 16 MiB.
	MaxRequestBytes int
	// Core configures the balancing state.
	Core CoreConfig
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
	// Registry receives the metrics; default a new registry.
	Registry *prometheus.Registry
	// TLS secures the gRPC and metrics endpoints with mutual TLS; nil serves plaintext, which
	// only loopback addresses accept unless Insecure is set (closed by default).
	TLS *mtls.Source
	// Policy grants identities roles beyond their kind's; nil grants none.
	Policy *authz.Policy
	// Insecure lets the server listen without TLS on a non-loopback address.
	Insecure bool
}

// Validate fills in the defaults of c and rejects a configuration no assigner can run with,
// plaintext off loopback included (closed by default); New calls it.
func (c *Config) Validate() error {
	if c.Client == nil {
		return errors.New("assigner: no etcd client")
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.Prefix == "" {
		c.Prefix = "/sliceplane/"
	}
	if c.SourcePrefix == "" {
		c.SourcePrefix = c.Prefix + "data/"
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&c.PassInterval, time.Second}, {&c.ClockInterval, 20 * time.Millisecond}, {&c.SessionTTL, 5 * time.Second}} {
		if *d.v < 0 {
			return fmt.Errorf("assigner: negative interval %s", *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if c.SessionTTL < time.Second {
		return fmt.Errorf("assigner: session TTL %s: etcd leases last whole seconds, at least 1 s", c.SessionTTL)
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = 16 << 20
	}
	if c.Core.Algorithm == "" {
		c.Core.Algorithm = "weighted-move"
	}
	if err := c.Core.fill(); err != nil {
		return err
	}
	if _, err := newAlgorithm(c.Core.Algorithm, c.Core.Params); err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if err := mtls.CheckListen(c.TLS, c.Insecure, "the assigner's gRPC API", c.Listen); err != nil {
		return fmt.Errorf("assigner: %w", err)
	}
	if c.MetricsListen != "" {
		if err := mtls.CheckListen(c.TLS, c.Insecure, "the assigner's metrics", c.MetricsListen); err != nil {
			return fmt.Errorf("assigner: %w", err)
		}
	}
	return nil
}

// Server is the assigner: it serves the API, campaigns for leadership and, while it leads,
// runs the core.
type Server struct {
	cfg     Config
	log     *slog.Logger
	store   *store.Store
	source  *source.Etcd
	metrics *metrics
	grpc    *grpc.Server
	health  *health.Server
	lis     net.Listener
	scrape  *metricsserver.Server // nil without MetricsListen

	leading    atomic.Pointer[leadership] // nil unless this server leads
	leaderAddr atomic.Value               // string: the leader's advertised address, if known

	// now is the leader's clock (monotonic), and keepAlive makes one keep-alive round trip of
	// a lease: tests replace them to suspend the process or cut it from etcd.
	now       func() time.Time
	keepAlive func(c *clientv3.Client, id clientv3.LeaseID) func(context.Context) (time.Duration, error)
}

// New returns a server listening on cfg.Listen (and cfg.MetricsListen); Run serves.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("assigner: listening on %s: %w", cfg.Listen, err)
	}
	if cfg.Advertise == "" {
		cfg.Advertise = lis.Addr().String()
	}
	s := &Server{
		cfg: cfg, log: cfg.Logger, lis: lis,
		store:   store.New(cfg.Client, cfg.Prefix+"assigner/"),
		source:  source.NewEtcd(cfg.Client, cfg.SourcePrefix),
		metrics: newMetrics(cfg.Registry),
		health:  health.NewServer(),
		now:     time.Now, keepAlive: etcdKeepAlive,
	}
	s.leaderAddr.Store("")
	s.store.Observe = func(op string, d time.Duration) { s.metrics.etcdWrite.WithLabelValues(op).Observe(d.Seconds()) }
	opts := append(dial.ServerOptions(), grpc.MaxRecvMsgSize(cfg.MaxRequestBytes), frame.ServerOption())
	opts = append(opts, authz.New("assigner", cfg.TLS, cfg.Policy, authz.AssignerRules(), cfg.Registry, cfg.Logger).ServerOptions()...)
	s.grpc = grpc.NewServer(opts...)
	api := &api{s: s, fresh: newFreshness(cfg.Registry)}
	pb.RegisterAssignmentServiceServer(s.grpc, api)
	pb.RegisterQuantaServiceServer(s.grpc, api)
	pb.RegisterNodeServiceServer(s.grpc, api)
	pb.RegisterAdminServiceServer(s.grpc, api)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	s.health.SetServingStatus(LeaderHealthService, healthpb.HealthCheckResponse_NOT_SERVING)
	if s.scrape, err = metricsserver.Listen(cfg.MetricsListen, cfg.Registry, cfg.TLS.ServerTLS()); err != nil {
		lis.Close()
		return nil, fmt.Errorf("assigner: %w", err)
	}
	return s, nil
}

// Addr returns the address the gRPC server listens on.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// MetricsAddr returns the address of the metrics endpoint, or "".
func (s *Server) MetricsAddr() string { return s.scrape.Addr() }

// Run serves until ctx ends, then stops gracefully: it gives up leadership at once (so a
// standby takes over without waiting for the lease), ends the streams and lets calls in
// flight finish.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := s.grpc.Serve(s.lis); err != nil {
			errs <- fmt.Errorf("assigner: serving gRPC: %w", err)
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := s.scrape.Serve(ctx); err != nil {
			errs <- fmt.Errorf("assigner: %w", err)
		}
	}()
	s.log.Info("assigner serving", "grpc", s.Addr(), "metrics", s.MetricsAddr(), "advertise", s.cfg.Advertise, "tls", s.cfg.TLS.Mode())
	for _, ep := range []struct{ what, addr string }{{"grpc", s.Addr()}, {"metrics", s.MetricsAddr()}} {
		if ep.addr == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			mtls.WarnPlaintext(ctx, s.log, s.cfg.TLS, ep.what, ep.addr)
		}()
	}

	campaignCtx, stopCampaign := context.WithCancel(ctx)
	campaignDone := make(chan struct{})
	go func() {
		defer close(campaignDone)
		s.campaign(campaignCtx)
	}()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	cancel() // the metrics endpoint stops too
	stopCampaign()
	<-campaignDone // leadership is given up and the hub closed: the streams end
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		s.grpc.Stop()
	}
	wg.Wait()
	s.log.Info("assigner stopped")
	return err
}

// campaign runs for leadership again and again until ctx ends, and leads when elected.
func (s *Server) campaign(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := s.electAndLead(ctx)
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("leadership ended; campaigning again", "err", err, "retry_in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (s *Server) electAndLead(ctx context.Context) error {
	// The lease is granted here, not by the session, to know when it was asked for: that is
	// where the leader's own count of its validity starts.
	asked := s.now()
	grant, err := s.cfg.Client.Grant(ctx, int64(s.cfg.SessionTTL/time.Second))
	if err != nil {
		return fmt.Errorf("granting the leader lease: %w", err)
	}
	session, err := concurrency.NewSession(s.cfg.Client, concurrency.WithLease(grant.ID), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("opening an etcd session: %w", err)
	}
	lease := newLeaderLease(s.now, asked, time.Duration(grant.TTL)*time.Second, s.keepAlive(s.cfg.Client, grant.ID))
	keepCtx, stopKeeping := context.WithCancel(ctx)
	keeping := make(chan struct{})
	go func() {
		defer close(keeping)
		lease.keep(keepCtx)
	}()
	defer func() {
		stopKeeping()
		<-keeping
	}()
	defer func() {
		// Revoke the lease ourselves: Close would use the session's context, which is already
		// cancelled on shutdown, and a standby would then wait out the whole TTL.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if _, err := s.cfg.Client.Revoke(rctx, session.Lease()); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			s.log.Warn("could not revoke the leader lease; standbys wait for it to expire", "err", err)
		}
		session.Orphan()
	}()
	election := concurrency.NewElection(session, s.cfg.Prefix+"election/")

	observeCtx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	go s.observe(observeCtx, election)

	campaignCtx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-session.Done():
		case <-campaignCtx.Done():
		}
		cancel()
	}()
	err = election.Campaign(campaignCtx, s.cfg.Advertise)
	cancel()
	if err != nil {
		return fmt.Errorf("campaigning: %w", err)
	}
	select {
	case <-session.Done():
		return errors.New("the etcd session expired while campaigning")
	default:
	}
	return s.lead(ctx, session, election, lease)
}

// observe follows who leads, so that standbys can say where to go.
func (s *Server) observe(ctx context.Context, e *concurrency.Election) {
	for resp := range e.Observe(ctx) {
		if len(resp.Kvs) > 0 {
			s.leaderAddr.Store(string(resp.Kvs[0].Value))
		}
	}
}

// leadership is the state of this server while it leads.
type leadership struct {
	term  uint64
	lease *leaderLease
	hub   *quantum.Hub
	reqs  chan request
	done  chan struct{} // closed when the leadership ends
	fence store.Fence

	snapshotting atomic.Bool
	background   sync.WaitGroup // snapshots being written
}

// request runs fn on the core in the leader's loop. fn returns a proposal to persist and
// commit (or nil) and a result for the caller.
type request struct {
	caller
	fn    func(c *Core, now time.Time) (*Proposal, any, error)
	reply chan reply
}

// caller says what a request is and who made it, for the audit trail.
type caller struct {
	call string // the API call, as named in the logs and metrics ("drain"); "" for none
	// who is the authenticated caller (authz.Caller); claims is who the client says it acts
	// for (UserMetadata), unverified.
	who, claims string
}

type reply struct {
	result   any
	proposal *Proposal
	err      error
}

// do runs fn in the leader's loop and returns its result once its proposal is persisted.
func (l *leadership) do(ctx context.Context, by caller, fn func(c *Core, now time.Time) (*Proposal, any, error)) (any, *Proposal, error) {
	r := request{caller: by, fn: fn, reply: make(chan reply, 1)}
	select {
	case l.reqs <- r:
	case <-l.done:
		return nil, nil, ErrNotLeader
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	select {
	case rep := <-r.reply:
		return rep.result, rep.proposal, rep.err
	case <-l.done:
		return nil, nil, ErrNotLeader
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// lead runs the leader's loop until the session ends, ctx ends or a write is fenced off.
func (s *Server) lead(ctx context.Context, session *concurrency.Session, e *concurrency.Election, lease *leaderLease) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-session.Done():
			cancel() // the lease is gone: stop at once, never emit under a stale term
		case <-lease.done():
			cancel()
		case <-ctx.Done():
		}
	}()
	fence := store.Fence{Key: e.Key(), Rev: e.Rev()}
	term := uint64(e.Rev())
	log := s.log.With("term", term)

	var st store.State
	var found bool
	var clock uint64
	err := s.retry(ctx, lease, "load", func(ctx context.Context) (err error) {
		if st, found, err = s.store.Load(ctx); err != nil {
			return fmt.Errorf("loading the state: %w", err)
		}
		clock, err = s.source.Clock(ctx)
		return err
	})
	if err != nil {
		return err
	}
	core, first, err := NewCore(s.cfg.Core, term, st, found, clock, s.now())
	if err != nil {
		return err
	}
	if !lease.confirm(ctx) {
		return errLeaseLapsed
	}
	if err := s.persist(ctx, lease, fence, first); err != nil {
		return fmt.Errorf("claiming term %d: %w", term, err)
	}
	core.Commit(first)
	a, _, published := core.Assignment()
	l := &leadership{term: term, fence: fence, lease: lease, hub: quantum.NewHub(quantum.HubConfig{}, term, a, published),
		reqs: make(chan request), done: make(chan struct{})}
	// The distributors are known before anything is served: a reinitializing quantum without
	// them would tell every distributor that it serves no node.
	var dists quantum.Distributors
	var distRev int64
	err = s.retry(ctx, lease, "load_distributors", func(ctx context.Context) (err error) {
		dists, distRev, err = membership.Load(ctx, s.cfg.Client, s.cfg.Prefix)
		return err
	})
	if err != nil {
		return err
	}
	if p := core.SetDistributors(dists, s.now()); p != nil {
		if err := s.apply(ctx, l, core, p); err != nil {
			return err
		}
	}
	s.leading.Store(l)
	s.metrics.leader.Set(1)
	s.metrics.term.Set(float64(term))
	s.health.SetServingStatus(LeaderHealthService, healthpb.HealthCheckResponse_SERVING)
	switch {
	case found && st.Assignment != nil:
		log.Info("leading", "generation", st.Assignment.Generation(), "slices", st.Assignment.Len(), "nodes", len(st.Nodes), "clock", clock)
	case found:
		log.Info("leading, before the first map", "nodes", len(st.Nodes), "clock", clock)
	default:
		log.Info("leading a new cluster", "clock", clock)
	}
	defer func() {
		cancel()
		l.background.Wait()
		s.leading.Store(nil)
		close(l.done)
		l.hub.Close()
		s.metrics.leader.Set(0)
		s.health.SetServingStatus(LeaderHealthService, healthpb.HealthCheckResponse_NOT_SERVING)
		log.Info("no longer leading")
	}()

	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	clocks := s.source.Watch(watchCtx, clock)
	distributors := membership.Watch(watchCtx, s.cfg.Client, s.cfg.Prefix, dists, distRev)
	pass := time.NewTicker(s.cfg.PassInterval)
	defer pass.Stop()
	tick := time.NewTicker(s.cfg.ClockInterval)
	defer tick.Stop()
	s.observeCore(core)
	lease.step(s.now()) // the loop starts: campaigning is no gap

	for {
		var p *Proposal
		var cause string
		var computed time.Duration // of a pass, before persistence
		var start time.Time
		select {
		case <-ctx.Done():
			if isDone(session) {
				return errors.New("the etcd session expired")
			}
			if !lease.valid() {
				return errLeaseLapsed
			}
			return nil
		case r := <-l.reqs:
			if err := s.handle(ctx, l, core, r, log); err != nil {
				return err
			}
			continue
		case <-pass.C:
			if start, err = s.steady(ctx, l, core, log); err != nil {
				return err
			}
			if p = core.Expire(start); p != nil {
				log.Info("nodes expired", "what", p.Summary)
				if err := s.apply(ctx, l, core, p); err != nil {
					return err
				}
			}
			if p, err = core.Pass(start); err != nil {
				if err := s.passFailed(ctx, l, core, err, start); err != nil {
					return err
				}
				continue
			}
			cause, computed = "pass", s.now().Sub(start)
		case <-tick.C:
			// Clock quanta are not written to etcd, so no fence guards them: steady checks
			// the lease on this process's clock, and apply again right before publishing.
			if start, err = s.steady(ctx, l, core, log); err != nil {
				return err
			}
			p, cause = core.ClockQuantum(start), "clock"
		case d, ok := <-distributors:
			if !ok {
				return errors.New("the watch of the distributors ended")
			}
			if start, err = s.steady(ctx, l, core, log); err != nil {
				return err
			}
			if p = core.SetDistributors(d, start); p != nil {
				log.Info("distributors changed", "distributors", d)
			}
			cause = "distributors"
		case b, ok := <-clocks:
			switch {
			case !ok:
				return errors.New("the source watch ended")
			case b.Err != nil:
				log.Warn("the source watch failed; restarting it", "err", b.Err)
				var now uint64
				err := s.retry(ctx, lease, "clock", func(ctx context.Context) (err error) {
					now, err = s.source.Clock(ctx)
					return err
				})
				if err != nil {
					return err
				}
				core.ObserveClock(now)
				clocks = s.source.Watch(watchCtx, now)
			case len(b.Changes) > 0:
				// Progress marks (asked for by a distributor sharing this etcd client) would
				// do too, but a clock quantum for them would invite the next request.
				core.ObserveClock(b.Clock)
			}
			continue
		}
		if p == nil {
			continue
		}
		if err := s.apply(ctx, l, core, p); err != nil {
			return err
		}
		if cause == "pass" {
			took := s.now().Sub(start)
			s.metrics.passDuration.Observe(took.Seconds())
			log.Debug("pass", "took", took, "computed", computed, "summary", p.Summary)
			if x, ok := core.Explain(); ok && p.Quantum != nil {
				s.metrics.passChurn.Observe(x.Churn.Total())
			}
			s.observeCore(core)
		}
	}
}

// handle runs a request in the leader's loop and replies to it. It returns an error only when
// leadership is lost.
func (s *Server) handle(ctx context.Context, l *leadership, core *Core, r request, log *slog.Logger) error {
	start, err := s.steady(ctx, l, core, log)
	if err != nil {
		r.reply <- reply{err: ErrNotLeader}
		return err
	}
	prop, result, err := r.fn(core, start)
	if err == nil && prop != nil {
		if audited(r.call) {
			core.Audit(prop, auditCause(r.call, prop.Summary), r.who, start)
		}
		err = s.apply(ctx, l, core, prop)
	}
	switch {
	case audited(r.call):
		s.audit(log, r.caller, prop, core, err)
	case prop != nil && prop.Summary != "" && err == nil:
		log.Info("change", "call", r.call, "what", prop.Summary, "seq", core.seq)
	}
	r.reply <- reply{result: result, proposal: prop, err: err}
	if errors.Is(err, store.ErrFenced) {
		return err
	}
	return nil
}

// auditCause is the cause of the quantum of a call's change: the admin calls' causes start
// with "admin: " and the nodes' with "node: ", and both go on with what changed.
func auditCause(call, summary string) string {
	if isAdmin(call) {
		return "admin: " + summary
	}
	return "node: " + summary
}

// audit logs the outcome of an audited call: who (the authenticated identity, and what the
// client claims), what, and whether it was done. A registration that renews one, changing
// nothing, is left out: nodes re-register as often as they like.
func (s *Server) audit(log *slog.Logger, by caller, p *Proposal, core *Core, err error) {
	changed := p != nil && (p.Persists() || p.Quantum != nil)
	if err == nil && !changed && by.call == "register" {
		return
	}
	attrs := []any{"method", by.call, "by", by.who}
	if by.claims != "" {
		attrs = append(attrs, "claims", by.claims)
	}
	var what string
	if p != nil {
		what = p.Summary
	}
	switch {
	case err != nil:
		attrs = append(attrs, "what", what, "result", "refused", "err", err)
	case changed:
		attrs = append(attrs, "what", what, "result", "ok", "seq", core.seq)
	default:
		attrs = append(attrs, "what", what, "result", "unchanged")
	}
	log.Info("audit", attrs...)
}

// passFailed counts a failed pass and runs the clean-up of departed nodes without the
// algorithm, so that no slice stays on a node that left (I1) whatever made the pass fail. It
// returns an error only when leadership is lost.
func (s *Server) passFailed(ctx context.Context, l *leadership, core *Core, err error, now time.Time) error {
	s.metrics.passFailures.Inc()
	core.PassFailed(err, now)
	s.log.Error("balancing pass failed; cleaning up departed nodes without the algorithm", "term", l.term, "err", err)
	p, err := core.Cleanup(now)
	if err != nil {
		s.log.Error("clean-up failed", "term", l.term, "err", err)
		return nil
	}
	if p == nil {
		return nil
	}
	if err := s.apply(ctx, l, core, p); err != nil {
		return err
	}
	s.log.Info("change", "call", "cleanup", "what", p.Summary, "seq", core.seq, "term", l.term)
	s.observeCore(core)
	return nil
}

// steady is called before the leader loop acts on anything: it returns the time to act at if
// the lease is certainly still valid. After a long gap since the last iteration (the process
// was suspended or starved) it renews the lease first, and gives every node a fresh lease, as
// a new leader does: their heartbeats may have been waiting unread, and expiring them for
// this process's absence would move every slice.
func (s *Server) steady(ctx context.Context, l *leadership, core *Core, log *slog.Logger) (time.Time, error) {
	now := s.now()
	gap, long := l.lease.step(now)
	if long {
		_ = l.lease.renew(ctx) // whatever the lease's count says now, renew it before acting
	}
	if !l.lease.confirm(ctx) {
		log.Warn("the leader lease lapsed; stepping down", "gap", gap)
		return now, errLeaseLapsed
	}
	if long {
		core.RefreshNodes(now)
		log.Warn("the leader loop stalled; every node gets a fresh lease", "gap", gap)
	}
	return now, nil
}

func isDone(s *concurrency.Session) bool {
	select {
	case <-s.Done():
		return true
	default:
		return false
	}
}

// apply persists a proposal, commits it and publishes its quantum. A proposal that cannot be
// persisted changes nothing; a fenced write means leadership is lost.
func (s *Server) apply(ctx context.Context, l *leadership, core *Core, p *Proposal) error {
	if !l.lease.confirm(ctx) {
		return errLeaseLapsed
	}
	if err := s.persist(ctx, l.lease, l.fence, p); err != nil {
		return err
	}
	core.Commit(p)
	if q := p.Quantum; q != nil {
		if !l.lease.confirm(ctx) {
			return errLeaseLapsed // persisting took the rest of the lease
		}
		q.Time = time.Now() // when it is emitted, which watchers can measure their lag from
		data, err := encodeQuantum(*q)
		if err != nil {
			return fmt.Errorf("assigner: encoding %s: %w", q.Position, err)
		}
		q.Payload = data
		if err := l.hub.Publish(*q, p.After); err != nil {
			return fmt.Errorf("assigner: publishing %s: %w", q.Position, err)
		}
		s.metrics.quanta.WithLabelValues(quantumCause(q.Cause)).Inc()
		s.metrics.clock.Set(float64(q.Clock))
	}
	if p.Snapshot {
		l.snapshot(ctx, s, p.Meta.LastIndex, p.After)
	}
	return nil
}

// snapshot writes a snapshot in the background, one at a time: it is compaction, not needed
// for correctness (the log has it all), and writing a large map takes longer than a pass.
// One asked for while another is being written is skipped; the next will cover it.
func (l *leadership) snapshot(ctx context.Context, s *Server, index uint64, a *assignment.Assignment) {
	if !l.snapshotting.CompareAndSwap(false, true) {
		return
	}
	l.background.Add(1)
	go func() {
		defer l.background.Done()
		defer l.snapshotting.Store(false)
		start := time.Now()
		if err := s.store.Snapshot(ctx, l.fence, index, a); err != nil {
			if ctx.Err() == nil {
				s.log.Warn("snapshot failed; the log keeps everything", "index", index, "err", err)
			}
			return
		}
		s.log.Debug("snapshot", "index", index, "slices", a.Len(), "took", time.Since(start))
	}()
}

// quantumCause folds the causes of admin and node calls into one label value each, keeping
// the label bounded.
func quantumCause(cause string) string {
	for _, prefix := range []string{"admin", "node"} {
		if strings.HasPrefix(cause, prefix+":") {
			return prefix
		}
	}
	return cause
}

// persist writes what a proposal asks, in order, each write retried through an etcd
// election while the lease lasts (the store's writes may run again: see the store package).
func (s *Server) persist(ctx context.Context, lease *leaderLease, f store.Fence, p *Proposal) error {
	if p.PutNode != nil {
		if err := s.retry(ctx, lease, "put_node", func(ctx context.Context) error { return s.store.PutNode(ctx, f, *p.PutNode) }); err != nil {
			return err
		}
	}
	for _, id := range p.DeleteNodes {
		if err := s.retry(ctx, lease, "delete_node", func(ctx context.Context) error { return s.store.DeleteNode(ctx, f, id) }); err != nil {
			return err
		}
	}
	var what string
	var write func(context.Context) error
	switch {
	case p.Init:
		what, write = "init", func(ctx context.Context) error { return s.store.Init(ctx, f, p.Meta, p.After) }
	case p.Entry != nil:
		what, write = "append", func(ctx context.Context) error { return s.store.Append(ctx, f, p.Meta, *p.Entry) }
	case p.SaveMeta:
		what, write = "meta", func(ctx context.Context) error { return s.store.SaveMeta(ctx, f, p.Meta) }
	default:
		return nil
	}
	return s.retry(ctx, lease, what, write)
}

// observeCore updates the gauges that describe the core.
func (s *Server) observeCore(c *Core) {
	st := c.Status()
	s.metrics.nodes.Set(float64(st.Nodes))
	s.metrics.slices.Set(float64(st.Slices))
	s.metrics.imbalance.Set(st.Imbalance)
	s.metrics.nodeLoad.Reset()
	for _, n := range c.Nodes() {
		s.metrics.nodeLoad.WithLabelValues(string(n.ID)).Set(n.Load)
	}
}
