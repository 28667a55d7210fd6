package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/target"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// participantConfig is what a Node and a Member are to the assigner, from their configs.
type participantConfig struct {
	ID             string
	Capacity       float64
	Address        string
	Labels         map[string]string
	Assigners      []string
	Target         string
	ReportInterval time.Duration
	HotKeys        int
	// Roles is the role model the participant acts on, as it registers; "" for none (a
	// node: the assigner moves its primary role without waiting for a demotion).
	Roles string
	// LeaseMargin ends the participant's count of its lease on primary roles that much
	// early (0: a tenth of the lease).
	LeaseMargin time.Duration
	Logger      *slog.Logger
}

// participant is what a Node and a Member share, the one implementation of taking part in
// the map: it registers with the leading assigner and keeps its lease with heartbeats,
// which say which ranges it loads and the generation of the map it has seen (the
// assigner's readiness rule ends handoffs on them, I7), and carry the load RecordLoad
// counted every ReportInterval; it drains, and leaves. What it holds and loads (pending, and
// the slices it counts load for) its owner sets: from its distributor's deltas for a Node,
// from the map and its application's answers for a Member.
type participant struct {
	cfg  participantConfig
	log  *slog.Logger
	load *loadCounter
	tls  *mtls.Source // nil: plaintext

	kick    chan struct{} // asks the session for a heartbeat now
	loaded  chan struct{} // asks the session for a heartbeat soon: a range finished loading
	running atomic.Bool
	// registeredOnce says an assigner took the participant's registration.
	registeredOnce atomic.Bool
	started        time.Time
	// incarnation names this process's participant among those that ran under its ID: an
	// assigner takes a registration under a new one for a restart (a drain the last one
	// left unfinished ends).
	incarnation string
	lease       *lease // on primary roles, in an exclusive cluster
	// pending is what the participant loads and holds, and the generation of the map it
	// has seen; only its owner's loop replaces it.
	pending atomic.Pointer[loadingState]

	// The owner's hooks, set before Run: beat completes a heartbeat (a node's freshness),
	// answered takes the distributor a heartbeat or registration names (a node pulls from
	// it), and holds says how many slices the owner still holds, for Drain.
	beat     func(*pb.HeartbeatRequest)
	answered func(*pb.Distributor)
	holds    func() int
}

func newParticipant(cfg participantConfig, tls *mtls.Source) *participant {
	p := &participant{cfg: cfg, log: cfg.Logger.With("node", cfg.ID), load: newLoadCounter(max(cfg.HotKeys, 0), time.Now()),
		tls: tls, kick: make(chan struct{}, 1), loaded: make(chan struct{}, 1), started: time.Now(), lease: newLease(cfg.LeaseMargin),
		incarnation: fmt.Sprintf("%016x", rand.Uint64()),
		beat:        func(*pb.HeartbeatRequest) {}, answered: func(*pb.Distributor) {}}
	p.holds = func() int { return len(p.load.slices()) }
	p.pending.Store(&loadingState{})
	return p
}

// run registers and keeps the lease and the load reports going while own runs, which does
// the owner's part (a node's pulls, a member's map); it returns own's error. It runs once.
func (p *participant) run(ctx context.Context, what string, own func(context.Context) error) error {
	if !p.running.CompareAndSwap(false, true) {
		return fmt.Errorf("client: %s.Run called twice", what)
	}
	assigner, err := dial.FollowTarget(p.cfg.Target, p.cfg.Assigners, p.tls.DialOption("assigner"))
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	defer assigner.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var refused error
	wg.Go(func() {
		if refused = p.session(ctx, assigner); refused != nil {
			cancel() // no assigner will take the participant as it is: stop
		}
	})
	err = own(ctx)
	cancel()
	wg.Wait()
	if err == nil {
		err = refused
	}
	return err
}

// Slices returns the slices of the map the member or node holds: as of the last map for a
// Member, of the last delta applied for a Node.
func (p *participant) Slices() []Range { return p.load.slices() }

// RecordLoad counts cost (in the unit the application chooses: requests, CPU-seconds) of
// serving key against the slice that holds it. It is cheap enough to call on every request.
func (p *participant) RecordLoad(key []byte, cost float64) {
	if cost > 0 {
		p.load.record(Hash(key), cost)
	}
}

// Loading reports whether point h (the Hash of a key) lies in a slice the member or node is
// loading: a member's application has not acquired it yet; a node's data is arriving and may
// be incomplete. During a handoff (make-before-break) routers do not send reads for such a
// slice to it; a read that comes all the same (from a router that has not caught up) is best
// answered "not mine yet": the slice's serving replicas have the data.
func (p *participant) Loading(h uint64) bool {
	s := p.pending.Load()
	return s.set.Contains(h) || (p.load.holds(h) && !s.held.Contains(h))
}

// Serving reports whether the participant holds key's slice with all its data: it holds the
// slice and is not loading it. It answers reads for the keys it serves; for a key it does
// not, a "not found" would be wrong, and it should send the reader to the slice's replicas.
// For a Node, a read of the store that found nothing may answer "not found" only if the
// node served the key throughout the read: see ReadGuard.
func (p *participant) Serving(key []byte) bool {
	h := Hash(key)
	return p.load.holds(h) && !p.Loading(h)
}

// LoadingRanges returns the ranges being loaded, in order.
func (p *participant) LoadingRanges() []Range { return rangesOf(p.pending.Load().set) }

// Generation returns the map generation the member or node has seen every slice of: of the
// last map acted on for a Member, of the last delta applied for a Node. 0 until then.
func (p *participant) Generation() uint64 { return p.pending.Load().gen }

// Leave takes the member or node out of the map at once, so that its slices move without
// waiting for its lease to lapse. Call it after Run returned, before it goes away for good;
// Drain leaves without a failed read, LeaveFor keeps the slices through a restart.
func (p *participant) Leave(ctx context.Context) error {
	conn, err := dial.TargetLeader(p.cfg.Target, p.cfg.Assigners, p.tls.DialOption("assigner"))
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	defer conn.Close()
	if _, err := pb.NewNodeServiceClient(conn).Deregister(ctx, &pb.DeregisterRequest{NodeId: p.cfg.ID}, grpc.WaitForReady(true)); err != nil {
		return fmt.Errorf("client: deregistering %s: %w", p.cfg.ID, err)
	}
	return nil
}

func newBackoff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = 50*time.Millisecond, 2*time.Second
	return b
}

// sleep waits d or until ctx ends, and reports whether ctx is still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// session registers the participant and keeps its lease with heartbeats, until ctx ends
// (nil) or the assigner refuses the registration as it is (a role model that is not the
// cluster's, an address it cannot take): no retry would mend that.
func (p *participant) session(ctx context.Context, assigner *dial.Follower) error {
	b := newBackoff()
	req := &pb.RegisterRequest{Node: wire.NodeToProto(assignment.Node{ID: assignment.NodeID(p.cfg.ID), Capacity: p.cfg.Capacity}),
		Address: p.cfg.Address, Labels: maps.Clone(p.cfg.Labels), Roles: p.cfg.Roles, Incarnation: p.incarnation}
	for ctx.Err() == nil {
		sent := time.Now()
		resp, err := callLeader(ctx, assigner, 5*time.Second, func(ctx context.Context, c pb.NodeServiceClient) (*pb.RegisterResponse, error) {
			return c.Register(ctx, req, grpc.WaitForReady(true))
		})
		if err != nil {
			if c := status.Code(err); c == codes.InvalidArgument || c == codes.FailedPrecondition {
				p.log.Error("the assigner refused the registration; stopping", "err", err)
				return fmt.Errorf("client: the assigner refused to register %s: %w", p.cfg.ID, err)
			}
			if ctx.Err() == nil {
				p.log.Warn("registering", "err", err)
			}
			sleep(ctx, b.NextBackOff())
			continue
		}
		b.Reset()
		p.lease.registered(sent, resp.GetLease().AsDuration(), resp.GetGeneration())
		p.registeredOnce.Store(true)
		p.answered(resp.GetDistributor())
		every := max(resp.GetTtl().AsDuration()/3, 100*time.Millisecond)
		p.heartbeat(ctx, assigner, every)
	}
	return nil
}

// loadedBeatGap is the least time between a heartbeat and one sent early because a range
// finished loading: a handoff ends soon after, and a participant that loads many small
// ranges sends at most one extra heartbeat per gap.
const loadedBeatGap = 100 * time.Millisecond

// heartbeat renews the lease every interval, and carries the load counted every
// ReportInterval (one call, not two: at 10,000 members, the leader's CPU went to the calls
// themselves), until the assigner forgot the participant (it must register again) or ctx
// ends. A range that finished loading brings the next heartbeat forward, to loadedBeatGap
// after the last.
func (p *participant) heartbeat(ctx context.Context, assigner *dial.Follower, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	reports := time.NewTicker(p.cfg.ReportInterval)
	defer reports.Stop()
	var last time.Time
	var soon <-chan time.Time
	for {
		var report *pb.ReportLoadRequest
		select {
		case <-t.C:
		case now := <-reports.C:
			r := p.load.take(p.cfg.ID, now)
			if len(r.Samples) == 0 {
				continue
			}
			report = wire.ReportToProto(r)
		case <-p.kick:
		case <-p.loaded:
			if wait := loadedBeatGap - time.Since(last); wait > 0 {
				if soon == nil {
					soon = time.After(wait)
				}
				continue
			}
		case <-soon:
		case <-ctx.Done():
			return
		}
		soon, last = nil, time.Now()
		t.Reset(every) // this one renews the lease
		if !p.beatOnce(ctx, assigner, every, report) {
			return
		}
	}
}

// beatOnce sends a heartbeat, with report if not nil, and takes its answer. It reports
// false when the assigner forgot the participant, which must register again. A heartbeat
// refused for its report is sent again without it: a bad load report must not cost the
// lease.
func (p *participant) beatOnce(ctx context.Context, assigner *dial.Follower, every time.Duration, report *pb.ReportLoadRequest) bool {
	req := p.heartbeatRequest()
	req.Load = report
	sent := time.Now()
	// A heartbeat that does not return before the next is due went to a leader that hangs,
	// or to none: give up on it then.
	resp, err := callLeader(ctx, assigner, max(every, time.Second), func(ctx context.Context, c pb.NodeServiceClient) (*pb.HeartbeatResponse, error) {
		return c.Heartbeat(ctx, req, grpc.WaitForReady(true))
	})
	switch {
	case status.Code(err) == codes.NotFound:
		p.log.Info("the assigner forgot the node; registering again")
		return false
	case status.Code(err) == codes.InvalidArgument && report != nil:
		p.log.Warn("load report refused; heartbeating without it", "err", err)
		return p.beatOnce(ctx, assigner, every, nil)
	case err != nil:
		if ctx.Err() == nil {
			p.log.Warn("heartbeat", "err", err)
		}
	default:
		p.lease.renewed(sent, resp.GetLease().AsDuration(), resp.GetGeneration())
		p.answered(resp.GetDistributor())
	}
	return true
}

// heartbeatRequest says the generation of the map the participant has seen and the ranges
// it is still loading, and what its owner adds.
func (p *participant) heartbeatRequest() *pb.HeartbeatRequest {
	s := p.pending.Load()
	req := &pb.HeartbeatRequest{NodeId: p.cfg.ID, Generation: s.gen}
	for _, r := range s.set.Ranges() {
		req.Loading = append(req.Loading, wire.RangeToProto(r))
	}
	for _, p := range s.primaries {
		req.Primaries = append(req.Primaries, wire.RangeToProto(p.r))
		req.PrimaryTokens = append(req.PrimaryTokens, p.token)
	}
	p.beat(req)
	return req
}

// callLeader makes a call to the leading assigner, given up after timeout. A call that
// timed out may have gone to a leader that hangs, which keeps looking healthy: the
// connection is renewed, and the next call finds whoever leads now.
func callLeader[T any](ctx context.Context, leader *dial.Follower, timeout time.Duration, call func(context.Context, pb.NodeServiceClient) (T, error)) (T, error) {
	conn := leader.Conn()
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err := call(callCtx, pb.NewNodeServiceClient(conn))
	if status.Code(err) == codes.DeadlineExceeded && ctx.Err() == nil {
		leader.Renew(conn)
	}
	return res, err
}

// askAssigner makes the session heartbeat now.
func (p *participant) askAssigner() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// loadedSoon asks the session for a heartbeat soon: the assigner ends a handoff once the
// loading participants say they have it all.
func (p *participant) loadedSoon() {
	select {
	case p.loaded <- struct{}{}:
	default:
	}
}

// ErrNowhereToDrain says that a drain ended with nothing handed off because there is nowhere
// to hand the slices to: no assigner runs (every assigner's address refuses connections), or
// the assigner refused the drain (the last node, or every node draining). The member or node
// may stop all the same: its slices move once its lease lapses, as after a crash.
var ErrNowhereToDrain = errors.New("nowhere to drain to")

// drainNowhereAfter is how long every assigner's address must refuse the drain's
// connections before the drain gives up. A refused connection says that nothing listens
// there: no assigner runs, and none will take the slices however long the drain waits (an
// orphaned node whose cluster was gone waited out its whole drain timeout). It is short, for
// a stop with no assigner left is better prompt, yet spans several of the connection's
// attempts, so that one refused while an assigner restarts is not taken for an outage.
const drainNowhereAfter = 500 * time.Millisecond

// refusals follows the drain connection's dials, which gRPC makes and retries by itself:
// learning that no assigner listens costs no connection of its own. It gives the drain up
// once every address has refused every dial for drainNowhereAfter.
type refusals struct {
	addrs  int // distinct addresses
	giveUp context.CancelCauseFunc

	mu    sync.Mutex
	since map[string]time.Time // per address refusing, since when
}

func newRefusals(addrs []string, giveUp context.CancelCauseFunc) *refusals {
	distinct := map[string]bool{}
	for _, a := range addrs {
		if a = strings.TrimSpace(a); a != "" {
			distinct[a] = true
		}
	}
	return &refusals{addrs: len(distinct), giveUp: giveUp, since: map[string]time.Time{}}
}

// dial dials addr as gRPC does by default, and notes whether it was refused. Only a refusal
// counts: a dial that times out may reach an assigner behind a slow link, and one that
// connects may reach a standby, or a leader to be.
func (r *refusals) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !errors.Is(err, syscall.ECONNREFUSED) {
		delete(r.since, addr)
		return conn, err
	}
	now := time.Now()
	if _, ok := r.since[addr]; !ok {
		r.since[addr] = now
	}
	if len(r.since) < r.addrs {
		return conn, err
	}
	for _, t := range r.since {
		if now.Sub(t) < drainNowhereAfter {
			return conn, err
		}
	}
	r.giveUp(fmt.Errorf("%w: no assigner runs: every assigner's address refused connections for %s", ErrNowhereToDrain, drainNowhereAfter))
	return conn, err
}

// drainPoll is how often Drain looks whether the participant still holds a slice, by the
// map and by its own state; a poll keeps Drain out of the owner's loop's way.
const drainPoll = 100 * time.Millisecond

// Drain leaves gracefully, make-before-break: it asks the assigner to move the slices away,
// waits while they are served until none is held (each slice handed off to a replica that
// has loaded it, and the old holder's linger over), then deregisters. Run must keep running
// until Drain returns: it is Run that serves and lets go of the slices; cancel Run's context
// afterwards. If ctx ends first, Drain cancels the drain and returns ctx's error: the
// member or node is still registered, and not draining (a member left draining would hold
// nothing, also after a restart); it may go on, take slices again, or go (call Leave, or its
// slices move when its lease lapses). The assigner refuses to drain the last node, and ends a drain when every node is
// draining (FAILED_PRECONDITION, as when a whole cluster stops): then Drain returns that
// error at once. So it does when no assigner runs (every assigner's address refuses
// connections, for drainNowhereAfter), rather than wait for one until ctx ends; both
// errors are ErrNowhereToDrain.
func (p *participant) Drain(ctx context.Context) error {
	ctx, giveUp := context.WithCancelCause(ctx)
	defer giveUp(nil)
	refused := newRefusals(p.cfg.Assigners, giveUp)
	conn, err := dial.TargetLeader(p.cfg.Target, p.cfg.Assigners, p.tls.DialOption("assigner"), grpc.WithContextDialer(refused.dial))
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	defer conn.Close()
	nodes := pb.NewNodeServiceClient(conn)
	p.log.Info("draining: serving the slices until each is handed off", "slices", p.holds())
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	// Both must say nothing is held: the participant's own view alone would end a drain at
	// once when what gives it slices the map already holds on it has not arrived yet, and
	// the map's alone would end it before it let them go. Asking again also learns when the
	// drain cannot go on (every node is draining).
	for {
		held, err := p.askDrain(ctx, nodes)
		if err != nil && ctx.Err() != nil {
			return p.gaveUp(ctx, nodes, "")
		}
		if err != nil {
			return err
		}
		if held == 0 && p.holds() == 0 {
			break
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return p.gaveUp(ctx, nodes, fmt.Sprintf("%d slices left: ", max(held, p.holds())))
		}
	}
	if _, err := nodes.Deregister(ctx, &pb.DeregisterRequest{NodeId: p.cfg.ID}, grpc.WaitForReady(true)); err != nil {
		if cause := context.Cause(ctx); errors.Is(cause, ErrNowhereToDrain) {
			err = cause
		}
		return fmt.Errorf("client: deregistering %s: %w", p.cfg.ID, err)
	}
	p.log.Info("drained: no slice held, and left")
	return nil
}

// gaveUp ends a drain whose ctx ended: it cancels the drain with the assigner, unless none
// runs, and returns why, prefixed with left.
func (p *participant) gaveUp(ctx context.Context, nodes pb.NodeServiceClient, left string) error {
	cause := context.Cause(ctx)
	if errors.Is(cause, ErrNowhereToDrain) {
		// No assigner to tell, nor to wait for.
		return fmt.Errorf("client: draining %s: %s%w", p.cfg.ID, left, cause)
	}
	p.cancelDrain(nodes)
	return fmt.Errorf("client: draining %s: %s%w", p.cfg.ID, left, ctx.Err())
}

// cancelDrain tells the assigner that the participant gave its drain up, so that it is not
// left draining, holding nothing: it takes slices again while it runs, and its slices move
// when its lease lapses if it goes. It tries for a second past the drain's own context, no
// more: an orchestrator's grace period may be the drain's.
func (p *participant) cancelDrain(nodes pb.NodeServiceClient) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := nodes.Drain(ctx, &pb.NodeServiceDrainRequest{NodeId: p.cfg.ID, Cancel: true}, grpc.WaitForReady(true)); err != nil {
		p.log.Warn("the drain was given up, but cancelling it failed: the assigner keeps the node draining until it registers anew or its lease lapses", "err", err)
		return
	}
	p.log.Info("the drain was given up and cancelled")
}

// askDrain asks the assigner to drain the participant, again while no leader answers (one
// that drains as the assigners roll too), and returns how many slices the map still holds
// on it. Asking a draining participant again changes nothing.
func (p *participant) askDrain(ctx context.Context, nodes pb.NodeServiceClient) (int, error) {
	b := newBackoff()
	for {
		resp, err := nodes.Drain(ctx, &pb.NodeServiceDrainRequest{NodeId: p.cfg.ID}, grpc.WaitForReady(true))
		switch status.Code(err) {
		case codes.OK:
			return int(resp.GetSlices()), nil
		case codes.Unavailable, codes.DeadlineExceeded, codes.NotFound:
			// No leader, or one that has not heard of the participant yet: its session
			// registers it.
			if ctx.Err() == nil {
				sleep(ctx, b.NextBackOff())
				continue
			}
		case codes.FailedPrecondition:
			// The last node, or every node draining: no other to take the slices.
			return 0, fmt.Errorf("client: draining %s: %w: %w", p.cfg.ID, ErrNowhereToDrain, err)
		}
		return 0, fmt.Errorf("client: draining %s: %w", p.cfg.ID, err)
	}
}

// LeaveFor tells the assigner that the member or node restarts within grace with what it
// holds intact (maintenance): rather than move its slices away and back, the assigner keeps them
// where they are, its lease lasting grace (capped by the assigner). Its slices have no
// serving replica meanwhile, unless they have others: prefer Drain when reads must not fail.
// Call it after Run returned.
func (p *participant) LeaveFor(ctx context.Context, grace time.Duration) error {
	if grace <= 0 {
		return fmt.Errorf("client: grace %s: want > 0 (Leave leaves for good)", grace)
	}
	conn, err := dial.TargetLeader(p.cfg.Target, p.cfg.Assigners, p.tls.DialOption("assigner"))
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	defer conn.Close()
	req := &pb.DeregisterRequest{NodeId: p.cfg.ID, Grace: durationpb.New(grace)}
	if _, err := pb.NewNodeServiceClient(conn).Deregister(ctx, req, grpc.WaitForReady(true)); err != nil {
		return fmt.Errorf("client: leaving %s for %s: %w", p.cfg.ID, grace, err)
	}
	return nil
}

// checkIDs checks a participant's node ID and target name.
func checkIDs(id, name string) error {
	if err := assignment.NodeID(id).Validate(); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if err := target.CheckRef(name); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	return nil
}
