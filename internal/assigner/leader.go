package assigner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/v3/concurrency"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sliceplane/sliceplane/internal/assigner/etcdstate"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/mapserve"
	"github.com/sliceplane/sliceplane/internal/membership"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/source"
)

// LeaderHealthService is the gRPC health service name that reports SERVING only on the
// default target's leader, for load balancers and readiness checks that must reach it (and
// for dial.Leader); another target's is target.LeaderHealthService(name).
const LeaderHealthService = dial.LeaderHealthService

// campaign runs for leadership again and again until ctx ends, and leads when elected.
func (s *served) campaign(ctx context.Context) {
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

func (s *served) electAndLead(ctx context.Context) error {
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
func (s *served) observe(ctx context.Context, e *concurrency.Election) {
	for ctx.Err() == nil {
		for resp := range e.Observe(ctx) {
			if len(resp.Kvs) > 0 {
				s.leaderAddr.Store(string(resp.Kvs[0].Value))
			}
		}
		select { // the observation failed (etcd unreachable): start it again
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
}

// leadership is the state of this server while it leads.
type leadership struct {
	term  uint64
	lease *leaderLease
	feed  *mapserve.Feed // the hub of the term, with its quanta's encodings
	core  *core.Core     // owned by the leader loop
	log   *slog.Logger
	reqs  chan request
	done  chan struct{} // closed when the leadership ends
	fence etcdstate.Fence
	wake  time.Time // when the core wants its next Tick
	// configGen is the count of the target's config changes the core has (served.coreConfig).
	configGen uint64
	// sized is the size this leader last published for placement; -1 before the first.
	sized int64

	snapshotting atomic.Bool
	background   sync.WaitGroup // snapshots and history being written

	// historyFlushed is the last column of the web view's history persisted, historyAt when
	// its last flush began; flushing is set while one runs (see webview.go).
	historyFlushed uint64
	historyAt      time.Time
	flushing       atomic.Bool
}

// request is an event for the core, stepped in the leader's loop; or, for tests only, a
// function run there instead (a suspension of the process, a broken algorithm).
type request struct {
	ev    core.Event
	hook  func(c *core.Core)
	reply chan result
}

// result is the core's reply to a request, or err if the leader could not step it.
type result struct {
	core.Reply
	err error
}

// do steps ev in the leader's loop and returns the core's reply once whatever it changed is
// persisted. The error says the request could not be stepped (no leader, ctx ended); the
// core's verdict is the reply's Err.
func (l *leadership) do(ctx context.Context, ev core.Event) (core.Reply, error) {
	res := l.send(ctx, request{ev: ev, reply: make(chan result, 1)})
	return res.Reply, res.err
}

func (l *leadership) send(ctx context.Context, r request) result {
	select {
	case l.reqs <- r:
	case <-l.done:
		return result{err: core.ErrNotLeader}
	case <-ctx.Done():
		return result{err: ctx.Err()}
	}
	select {
	case res := <-r.reply:
		return res
	case <-l.done:
		return result{err: core.ErrNotLeader}
	case <-ctx.Done():
		return result{err: ctx.Err()}
	}
}

// boot is what a new leader reads before it serves: the stored state, the source's clock
// (0 if the source did not answer: sourceErr says why) and the live distributors.
type boot struct {
	st        core.State
	found     bool
	clock     uint64
	sourceErr error
	dists     quantum.Distributors
	distRev   int64
}

// lead runs the leader's loop until the session ends, ctx ends or a write is fenced off.
func (s *served) lead(ctx context.Context, session *concurrency.Session, e *concurrency.Election, lease *leaderLease) error {
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
	l, b, err := s.begin(ctx, e, lease)
	if err != nil {
		return err
	}
	s.takeOffice(l, b)
	defer s.leaveOffice(l, cancel)
	lease.step(s.now()) // the loop starts: campaigning is no gap
	if err := s.loop(ctx, l, b); err != nil {
		return err
	}
	switch { // ctx ended
	case isDone(session):
		return errors.New("the etcd session expired")
	case !lease.valid():
		return errLeaseLapsed
	}
	return nil
}

// takeOffice makes l this server's leadership: the API serves from it from now on.
func (s *served) takeOffice(l *leadership, b boot) {
	s.leading.Store(l)
	s.metrics.leader.Set(1)
	s.metrics.term.Set(float64(l.term))
	s.health.SetServingStatus(s.healthName, healthpb.HealthCheckResponse_SERVING)
	switch {
	case b.found && b.st.Assignment != nil:
		l.log.Info("leading", "generation", b.st.Assignment.Generation(), "slices", b.st.Assignment.Len(), "nodes", len(b.st.Nodes), "clock", b.clock)
	case b.found:
		l.log.Info("leading, before the first map", "nodes", len(b.st.Nodes), "clock", b.clock)
	default:
		l.log.Info("leading a new cluster", "clock", b.clock)
	}
	s.observeCore(l.core)
}

// leaveOffice ends l: the snapshots in flight finish, then the API and the watchers are told.
func (s *served) leaveOffice(l *leadership, cancel context.CancelFunc) {
	cancel()
	l.background.Wait()
	l.core.Step(s.now(), core.LeadershipLost{})
	s.leading.Store(nil)
	s.view.Reset()                    // a standby shows no history: the leader's is the one that goes on
	s.metrics.source.Available.Set(1) // a standby follows no source: it knows of no outage
	close(l.done)
	l.feed.Hub().Close()
	s.metrics.leader.Set(0)
	s.health.SetServingStatus(s.healthName, healthpb.HealthCheckResponse_NOT_SERVING)
	l.log.Info("no longer leading")
}

// begin loads the state, starts the core's term and claims it in etcd, and steps in the
// live distributors: they are known before anything is served, as a reinitializing quantum
// without them would tell every distributor that it serves no node.
func (s *served) begin(ctx context.Context, e *concurrency.Election, lease *leaderLease) (*leadership, boot, error) {
	var b boot
	err := s.retry(ctx, lease, "load", func(ctx context.Context) (err error) {
		if b.st, b.found, err = s.store.Load(ctx); err != nil {
			return fmt.Errorf("loading the state: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, b, err
	}
	// The source's clock once, bounded, never retried: a source that does not answer says
	// nothing of leadership, which only the etcd lease decides. The new term then starts
	// from the stored clock, with balancing held until the source answers (sourceLost).
	b.clock, b.sourceErr = s.readClock(ctx)
	cfg, gen := s.coreConfig()
	c, err := core.New(cfg)
	if err != nil {
		return nil, b, err
	}
	term := uint64(e.Rev())
	l := &leadership{term: term, fence: etcdstate.Fence{Key: e.Key(), Rev: e.Rev()}, lease: lease, core: c,
		log: s.log.With("term", term), reqs: make(chan request), done: make(chan struct{}), configGen: gen, sized: -1}
	// Before the first step: a step that changes the map records a column and may persist the
	// history, which must go on from the persisted one, not replace its first chunk.
	s.restoreHistory(ctx, l)
	if !lease.confirm(ctx) {
		return nil, b, errLeaseLapsed
	}
	rep, err := s.run(ctx, l, s.now(), core.LeadershipGained{Term: term, State: b.st, Found: b.found, Clock: b.clock})
	if err == nil {
		err = rep.Err
	}
	if err != nil {
		return nil, b, fmt.Errorf("claiming term %d: %w", term, err)
	}
	a, _, published := c.Assignment()
	l.feed = mapserve.NewFeed(quantum.NewHub(quantum.HubConfig{}, term, a, published))
	err = s.retry(ctx, lease, "load_distributors", func(ctx context.Context) (err error) {
		b.dists, b.distRev, err = membership.Load(ctx, s.cfg.Client, s.cfg.Prefix)
		return err
	})
	if err != nil {
		return nil, b, err
	}
	if _, err := s.run(ctx, l, s.now(), core.DistributorsChanged{Distributors: b.dists}); err != nil {
		return nil, b, err
	}
	return l, b, nil
}

// loop steps the core with what arrives: requests, its timer, the distributors and the
// source's clock. It returns when ctx ends (nil) or leadership is lost.
func (s *served) loop(ctx context.Context, l *leadership, b boot) error {
	watchCtx, stopWatch := context.WithCancel(ctx)
	var following sync.WaitGroup
	defer following.Wait()
	defer stopWatch()
	sourceEvents := make(chan core.Event)
	following.Go(func() { s.followSource(watchCtx, l.log, b.clock, sourceEvents) })
	distributors := membership.Watch(watchCtx, s.cfg.Client, s.cfg.Prefix, b.dists, b.distRev)
	if b.sourceErr != nil { // in office now: the metric may say so
		if err := s.sourceEvent(ctx, l, s.sourceLost(b.sourceErr)); err != nil {
			return err
		}
	}
	if err := s.applyConfig(ctx, l); err != nil { // a change while the term began
		return err
	}
	timer := time.NewTimer(l.untilWake(s.now()))
	defer timer.Stop()
	sizes := time.NewTicker(sizeEvery)
	defer sizes.Stop()
	s.publishSize(ctx, l)
	for {
		var err error
		select {
		case <-ctx.Done():
			return nil
		case r := <-l.reqs:
			err = s.handle(ctx, l, r)
		case <-timer.C:
			err = s.observed(ctx, l, core.Tick{})
		case d, ok := <-distributors:
			if !ok {
				return errors.New("the watch of the distributors ended")
			}
			err = s.observed(ctx, l, core.DistributorsChanged{Distributors: d})
		case ev := <-sourceEvents:
			err = s.sourceEvent(ctx, l, ev)
		case <-s.reconfigured:
			err = s.applyConfig(ctx, l)
		case <-sizes.C:
			s.publishSize(ctx, l)
		}
		if err != nil {
			return err
		}
		timer.Reset(l.untilWake(s.now()))
	}
}

// sizeEvery is how often a leader looks at its target's size for placement; sizeChange, by
// how much it must have changed to be published again, so that splits and merges around a
// size do not move the target between assigners.
const (
	sizeEvery  = 5 * time.Second
	sizeChange = 0.1
)

// publishSize writes the target's size (its map's slices) where every assigner's placement
// reads it (target.Place), when it changed by more than sizeChange since the last. A write
// that fails is tried again at the next look: placement waits, leadership does not.
func (s *served) publishSize(ctx context.Context, l *leadership) {
	a, _, _ := l.core.Assignment()
	if a == nil {
		return
	}
	n := int64(a.Len())
	if l.sized >= 0 && math.Abs(float64(n-l.sized)) <= sizeChange*float64(l.sized) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := s.cfg.Client.Put(ctx, s.sizeKey, strconv.FormatInt(n, 10)); err != nil {
		l.log.Warn("publishing the target's size for placement failed; trying again", "err", err)
		return
	}
	l.sized = n
}

// applyConfig steps the target's latest config into the core, if the core does not have
// it yet. A config the term cannot take (a new role model) is logged: it takes effect when
// the target's runtime restarts (Server.reconcile), not here.
func (s *served) applyConfig(ctx context.Context, l *leadership) error {
	cfg, gen := s.coreConfig()
	if gen == l.configGen {
		return nil
	}
	start, err := s.steady(ctx, l)
	if err != nil {
		return err
	}
	rep, err := s.run(ctx, l, start, core.Reconfigure{Config: cfg})
	l.configGen = gen
	if rep.Err != nil {
		l.log.Error("the target's new config does not apply in this term", "err", rep.Err)
	} else if err == nil {
		l.log.Info("the target's new config applies from the next pass", "algorithm", cfg.Algorithm, "params", cfg.Params, "node_ttl", cfg.NodeTTL)
	}
	return err
}

// untilWake returns how long the loop may wait for the core's next Tick: until its wake, but
// never long on the lease's scale, so that a long gap between iterations (steady) means the
// process was away, not that the core had nothing to do.
func (l *leadership) untilWake(now time.Time) time.Duration {
	if l.wake.IsZero() { // the core wants no tick
		return l.lease.ttl / 4
	}
	return min(l.wake.Sub(now), l.lease.ttl/4)
}

// observed steps an event of the leader's own (time passed, the distributors changed) once
// the lease is certainly valid.
func (s *served) observed(ctx context.Context, l *leadership, ev core.Event) error {
	// Clock quanta are not written to etcd, so no fence guards them: steady checks the lease
	// on this process's clock, and publishing does again.
	start, err := s.steady(ctx, l)
	if err != nil {
		return err
	}
	_, err = s.run(ctx, l, start, ev)
	return err
}

// sourceEvent steps what the follower learned of the source (ClockObserved, SourceLost),
// and says it in the metrics. It changes nothing durable, so it needs no lease.
func (s *served) sourceEvent(ctx context.Context, l *leadership, ev core.Event) error {
	available := 1.0
	if _, lost := ev.(core.SourceLost); lost {
		available = 0
	}
	s.metrics.source.Available.Set(available)
	_, err := s.run(ctx, l, s.now(), ev)
	return err
}

// sourceLost is the event of a source that did not answer, for err.
func (s *served) sourceLost(err error) core.SourceLost {
	return core.SourceLost{Err: err.Error(), Misconfigured: source.ClassOf(err) == source.Misconfigured}
}

// watchClock follows the source's clock: by source.ClockWatcher if the source is one, else
// by the changes it watches.
func (s *served) watchClock(ctx context.Context, from uint64) <-chan source.Batch {
	if cw, ok := s.source.(source.ClockWatcher); ok {
		return cw.WatchClock(ctx, from)
	}
	return s.source.Watch(ctx, from)
}

// handle steps a request in the leader's loop and replies to it. It returns an error only
// when leadership is lost.
func (s *served) handle(ctx context.Context, l *leadership, r request) error {
	start, err := s.steady(ctx, l)
	if err != nil {
		r.reply <- result{err: core.ErrNotLeader}
		return err
	}
	if r.hook != nil {
		r.hook(l.core)
		r.reply <- result{}
		return nil
	}
	rep, err := s.run(ctx, l, start, r.ev)
	if err != nil && rep.Err == nil {
		rep.Err = err // persisted but not published: the leader is stepping down
	}
	r.reply <- result{Reply: rep}
	if errors.Is(err, etcdstate.ErrFenced) {
		return err
	}
	return nil
}

// run steps ev at now and carries out the output: each write persisted with the fence and
// its outcome stepped in turn, quanta published, logs and metrics. It returns the reply to
// ev, and an error if a write or a publication failed (the change is dropped or, once
// persisted, unpublished: leadership is lost either way).
func (s *served) run(ctx context.Context, l *leadership, now time.Time, ev core.Event) (core.Reply, error) {
	var reply *core.Reply
	var failure error
	begun := time.Now()
	out := l.core.Step(now, ev)
	times := phases{computed: time.Since(begun)} // the pass's decision, before persistence
	changed := false                             // the map changed, or a pass ran: the web view records it
	for {
		if reply == nil {
			reply = out.Reply
		}
		changed = changed || out.Pass != nil || slices.ContainsFunc(out.Publish, func(p core.Publication) bool { return !p.Quantum.ClockOnly() })
		if err := s.emit(ctx, l, out, now, times); err != nil && failure == nil {
			failure = err
		}
		if out.Write == nil || failure != nil {
			break
		}
		err := errLeaseLapsed
		wrote := time.Now()
		if l.lease.confirm(ctx) {
			err = s.persist(ctx, l.lease, l.fence, out.Write)
		}
		times.wrote += time.Since(wrote)
		if err != nil {
			failure, out = err, l.core.Step(s.now(), core.WriteFailed{Err: err})
			continue
		}
		committed := time.Now()
		out = l.core.Step(s.now(), core.WriteCommitted{})
		times.committed += time.Since(committed)
	}
	if reply == nil {
		reply = &core.Reply{}
	}
	if changed && failure == nil {
		s.recordHistory(ctx, l, now)
	}
	return *reply, failure
}

// phases are where a step's time went, for the pass log: its decision (the core's step),
// the writes (the lease's confirmation and the etcd transactions) and the commit steps. The
// rest of a pass is its publication and its records.
type phases struct{ computed, wrote, committed time.Duration }

// emit does what an output asks besides writing: logs, publications, a snapshot, metrics.
func (s *served) emit(ctx context.Context, l *leadership, out core.Output, start time.Time, times phases) error {
	l.wake = out.Wake
	for _, r := range out.Log {
		l.log.Log(ctx, r.Level, r.Msg, r.Attrs...)
	}
	if out.PassFailed {
		s.metrics.passFailures.Inc()
	}
	if s.metrics.observeQuarantine(out) {
		s.observeCore(l.core)
	}
	for _, p := range out.Publish {
		if err := s.publish(ctx, l, p); err != nil {
			return err
		}
	}
	if sn := out.Snapshot; sn != nil {
		l.snapshot(ctx, s, sn.Index, sn.Map)
	}
	if p := out.Pass; p != nil {
		took := s.now().Sub(start)
		s.metrics.passDuration.Observe(took.Seconds())
		l.log.Debug("pass", "took", took, "computed", times.computed, "wrote", times.wrote, "committed", times.committed,
			"summary", p.Summary)
		if p.Changed && p.Explanation != nil {
			s.metrics.passChurn.Observe(p.Explanation.Churn.Total())
		}
	}
	if out.Pass != nil || out.PassFailed {
		s.observeCore(l.core)
		s.view.Pass(start, ExplainToProto(l.core.Explain()))
	}
	s.observeHandoffs(l.core, out.Handoffs)
	return nil
}

// observeHandoffs counts the handoffs that a step began and ended.
func (s *served) observeHandoffs(c *core.Core, ho core.HandoffStats) {
	if ho.Started+ho.Completed+ho.RolledBack+ho.Promoted+ho.Forced == 0 {
		return
	}
	s.metrics.primaryHandovers.WithLabelValues("demoted").Add(float64(ho.Promoted))
	s.metrics.primaryHandovers.WithLabelValues("forced").Add(float64(ho.Forced))
	s.metrics.handoffsStarted.Add(float64(ho.Started))
	s.metrics.handoffsCompleted.Add(float64(ho.Completed))
	s.metrics.handoffsRolledBack.Add(float64(ho.RolledBack))
	for _, d := range ho.Durations {
		s.metrics.handoffDuration.Observe(d.Seconds())
	}
	s.metrics.handoffsInProgress.Set(float64(c.Handoffs()))
}

// publish sends a committed quantum to the watchers, encoded once for all of them.
func (s *served) publish(ctx context.Context, l *leadership, p core.Publication) error {
	if !l.lease.confirm(ctx) {
		return errLeaseLapsed // persisting took the rest of the lease
	}
	q := p.Quantum
	q.Time = time.Now() // when it is emitted, which watchers can measure their lag from
	if err := l.feed.Publish(q, p.Map); err != nil {
		return fmt.Errorf("assigner: publishing %s: %w", q.Position, err)
	}
	s.view.Publish(q, p.Map)
	s.metrics.quanta.WithLabelValues(quantumCause(q.Cause)).Inc()
	s.metrics.clock.Set(float64(q.Clock))
	return nil
}

// steady is called before the leader loop acts on anything: it returns the time to act at if
// the lease is certainly still valid. After a long gap since the last iteration (the process
// was suspended or starved) it renews the lease first, and gives every node a fresh lease, as
// a new leader does: their heartbeats may have been waiting unread, and expiring them for
// this process's absence would move every slice.
func (s *served) steady(ctx context.Context, l *leadership) (time.Time, error) {
	now := s.now()
	gap, long := l.lease.step(now)
	if long {
		_ = l.lease.renew(ctx) // whatever the lease's count says now, renew it before acting
	}
	if !l.lease.confirm(ctx) {
		l.log.Warn("the leader lease lapsed; stepping down", "gap", gap)
		return now, errLeaseLapsed
	}
	if long {
		l.wake = l.core.Step(now, core.LoopStalled{Gap: gap}).Wake
		l.log.Warn("the leader loop stalled; every node gets a fresh lease", "gap", gap)
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

// snapshot writes a snapshot in the background, one at a time: it is compaction, not needed
// for correctness (the log has it all), and writing a large map takes longer than a pass.
// One asked for while another is being written is skipped; the next will cover it.
func (l *leadership) snapshot(ctx context.Context, s *served, index uint64, a *assignment.Assignment) {
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

// quantumCause folds the causes of admin and node calls, and of the quarantine's own
// changes, which name their ranges, into one label value each, keeping the label bounded.
func quantumCause(cause string) string {
	for _, prefix := range []string{"admin", "node", "quarantine"} {
		if strings.HasPrefix(cause, prefix+":") {
			return prefix
		}
	}
	return cause
}

// persist writes what a write asks, in order, each write retried through an etcd
// election while the lease lasts (the store's writes may run again: see the store package).
func (s *served) persist(ctx context.Context, lease *leaderLease, f etcdstate.Fence, p *core.Write) error {
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
		what, write = "init", func(ctx context.Context) error { return s.store.Init(ctx, f, p.Meta, p.Map) }
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
func (s *served) observeCore(c *core.Core) {
	st := c.Status()
	s.metrics.nodes.Set(float64(st.Nodes))
	s.metrics.slices.Set(float64(st.Slices))
	s.metrics.imbalance.Set(st.Imbalance)
	s.metrics.handoffsInProgress.Set(float64(st.Handoffs))
	s.metrics.quarantined.Set(float64(len(st.Quarantined)))
	share := 0.0
	for _, q := range st.Quarantined {
		share += q.Range.Fraction()
	}
	s.metrics.quarantinedShare.Set(share)
	s.metrics.nodeLoad.Reset()
	for _, n := range c.Nodes() {
		s.metrics.nodeLoad.WithLabelValues(string(n.ID)).Set(n.Load)
	}
}
