package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// Application is what a service that keeps its own state implements to be a Member: it is
// told which ranges of the key space it owns, and answers once it has done what owning them
// takes. The member calls it from one goroutine, one call at a time, in order, each with a
// context that ends when the map takes the range away (an acquire) or after
// MemberConfig.CallTimeout; a call must return when its context ends.
//
// A call's range is a maximal run of points gained, lost or changing role: it may cover part
// of the range of an earlier call, or several. A split or a merge of slices calls nothing.
type Application interface {
	// Acquire makes r the application's, in role: it loads what serving r takes (a cache
	// warmed, a table read, files fetched) and returns nil once it can serve r, or an error
	// saying why it cannot, and then holds nothing of r. Until Acquire returns nil the
	// member tells the assigner it is still loading r, so that the previous holders keep
	// serving it (make-before-break); an acquire that failed is tried again after a backoff
	// while the map still gives r.
	Acquire(ctx context.Context, r Range, g Grant) error
	// Release gives r up: the application stops serving it and drops what it holds of it.
	// The member takes r as released whatever Release returns.
	Release(ctx context.Context, r Range) error
	// ChangeRole makes r, which the application holds, its in role. The member takes r as
	// changed whatever ChangeRole returns.
	ChangeRole(ctx context.Context, r Range, g Grant) error
}

// MemberConfig configures a Member.
type MemberConfig struct {
	// ID names the member: 1-128 letters, digits and . _ - :. A member that restarts keeps
	// its ID.
	ID string
	// Capacity weighs the load the member should carry relative to others; 0 means 1.
	Capacity float64
	// Address is where the member serves its application, for routers. Required.
	Address string
	Labels  map[string]string
	// Assigners are the addresses of the assigners (leader and standbys). Required.
	Assigners []string
	// TLS is the member's mutual TLS with the assigners; zero for plaintext. Its certificate
	// must name the member as a node, spiffe://sliceplane/node/<ID>: the assigners let it
	// act only as itself. The files are re-read when they change.
	TLS TLS
	// App is told what the member owns. Required.
	App Application
	// Roles is the cluster's role model, which the application acts on: RolesReplicas (the
	// default: it holds every range as RoleReplica) or RolesPrimarySecondary (as RolePrimary
	// or RoleSecondary). The assigners refuse a member whose model is not theirs (--roles).
	Roles string
	// ReportInterval is the time between load reports; default 1 s.
	ReportInterval time.Duration
	// HotKeys is how many of its heaviest keys the member tracks and reports; default 16,
	// negative for none.
	HotKeys int
	// LeaseMargin, in an exclusive cluster (the assigner's --exclusive), is how much earlier
	// than the assigner the member counts its lease on primary roles as ended, for a
	// difference in clock rates: 0 means a tenth of the lease. A member whose lease ends
	// (its heartbeats fail, or are refused) demotes its primary ranges itself.
	LeaseMargin time.Duration
	// CallTimeout bounds each call of App; default 30 s, the assigner's default handoff
	// timeout, after which a handoff that waits for an acquire is rolled back anyway.
	CallTimeout time.Duration
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
}

// Validate fills in the defaults of c and rejects a configuration no member can run with; it
// does no I/O.
func (c *MemberConfig) Validate() error {
	if err := assignment.NodeID(c.ID).Validate(); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	switch {
	case c.App == nil:
		return errors.New("client: a member needs an App to tell what it owns")
	case len(c.Assigners) == 0:
		return errors.New("client: a member needs the assigners' addresses")
	case c.Address == "":
		return errors.New("client: a member needs its Address, where routers reach it")
	case c.ReportInterval < 0 || c.CallTimeout < 0 || c.LeaseMargin < 0:
		return fmt.Errorf("client: negative report interval %s, call timeout %s or lease margin %s", c.ReportInterval, c.CallTimeout, c.LeaseMargin)
	}
	roles, err := assignment.RoleModel(c.Roles)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	c.Roles = roles
	if c.ReportInterval == 0 {
		c.ReportInterval = time.Second
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = 30 * time.Second
	}
	if c.HotKeys == 0 {
		c.HotKeys = 16
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Member is a process of a service that keeps its own state per key (a cache, a rate
// limiter, a session host, a search shard) taking part in the map without a data path: it
// registers, heartbeats, reports the load it serves (RecordLoad) and drains as a Node does,
// watches the map, and tells its Application what it owns. Run drives it; the other methods
// are safe to call at any time, from any goroutine.
type Member struct {
	*participant
	cfg    MemberConfig
	router *Router
	held   atomic.Int64 // ranges the application holds, for Drain
}

// NewMember validates cfg and returns a member; Run starts it.
func NewMember(cfg MemberConfig) (*Member, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	src, err := nodeTLS(cfg.ID, cfg.TLS)
	if err != nil {
		return nil, err
	}
	router, err := NewRouter(RouterConfig{ID: cfg.ID, Assigners: cfg.Assigners, TLS: cfg.TLS, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	p := newParticipant(participantConfig{ID: cfg.ID, Capacity: cfg.Capacity, Address: cfg.Address, Labels: cfg.Labels,
		Assigners: cfg.Assigners, ReportInterval: cfg.ReportInterval, HotKeys: cfg.HotKeys, Roles: cfg.Roles, LeaseMargin: cfg.LeaseMargin, Logger: cfg.Logger}, src)
	m := &Member{participant: p, cfg: cfg, router: router}
	p.holds = func() int { return int(m.held.Load()) }
	return m, nil
}

// Leased reports whether the member may act as a primary now: in an exclusive cluster (the
// assigner's --exclusive), whether its lease on primary roles is valid by its own count;
// always in a cluster that is not. An application that checks it before a write of a
// primary stops at its lease's end even while its demotion waits for a call in flight;
// the fencing token covers the rest (a pause between the check and the write).
func (m *Member) Leased() bool {
	ok, _, _ := m.lease.valid(time.Now())
	return ok
}

// Router returns the member's router: the map it follows, for lookups (where to forward a
// request for a key the member does not serve).
func (m *Member) Router() *Router { return m.router }

// Run registers the member and tells its application what it owns until ctx ends; it
// returns nil then. It runs once. To leave gracefully, call Drain while Run runs and end Run
// once Drain returned. When Run returns, the application holds what it held: it should stop
// serving.
func (m *Member) Run(ctx context.Context) error { return m.run(ctx, "Member", m.follow) }

// calling is a call handed to the application's goroutine, with its context.
type calling struct {
	c   appCall
	ctx context.Context
}

// follow follows the map and makes the calls ownership asks for, until ctx ends.
func (m *Member) follow(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	rctx, stopRouter := context.WithCancel(ctx)
	defer stopRouter()
	wg.Go(func() { m.router.Run(rctx) }) //nolint:errcheck // it returns nil when rctx ends
	calls, results := make(chan calling), make(chan error)
	wg.Go(func() { m.serve(calls, results) })
	defer close(calls)
	views, stopViews := m.router.watchViews()
	defer stopViews()
	own := newOwnership()
	var cancelCall context.CancelFunc = func() {}
	defer func() { cancelCall() }()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var leaseEnd time.Time
	for {
		select {
		case <-views: // a new map, or new addresses (setMap of the same map changes nothing)
			leaseEnd = m.reconcile(own, cancelCall, leaseEnd)
		case <-m.lease.changed:
			leaseEnd = m.reconcile(own, cancelCall, leaseEnd)
		case <-timer.C: // a retry is due, or the lease ends
			leaseEnd = m.reconcile(own, cancelCall, leaseEnd)
		case err := <-results:
			cancelCall()
			m.answered(own, err)
			own.done(err, time.Now())
		case <-ctx.Done():
			if own.busy != nil {
				cancelCall()
				<-results
			}
			return nil
		}
		c, ok := own.next(time.Now())
		// Published once the call is in flight: a promotion counts as primary from its start.
		m.publish(own)
		if ok {
			cctx, cancel := context.WithTimeout(ctx, m.cfg.CallTimeout)
			cancelCall = cancel
			calls <- calling{c: c, ctx: cctx}
		}
		timer.Reset(untilRetry(own, leaseEnd))
	}
}

// errNotPromoted answers a call that would have made the application primary when, as it
// came to be made, its context had ended or the member's lease had: the call was not made.
var errNotPromoted = errors.New("client: not made primary: the call's context or the member's lease ended first")

// serve makes the application's calls, one at a time, until calls is closed. A call that
// would make the application primary is not made once its context or the lease has ended (a
// process paused between deciding it and making it): ownership tries it again, if the map
// still wants it.
func (m *Member) serve(calls <-chan calling, results chan<- error) {
	for cl := range calls {
		var err error
		r := rangeOf(cl.c.rng)
		if cl.c.promotes() && (cl.ctx.Err() != nil || !m.Leased()) {
			results <- errNotPromoted
			continue
		}
		switch cl.c.kind {
		case callAcquire:
			err = m.cfg.App.Acquire(cl.ctx, r, cl.c.grant)
		case callRelease:
			err = m.cfg.App.Release(cl.ctx, r)
		case callChangeRole:
			err = m.cfg.App.ChangeRole(cl.ctx, r, cl.c.grant)
		}
		results <- err
	}
}

// LogLeaseEnded is the message a member logs when its lease on primary roles ended
// unrenewed, with the time it ended ("ended"): a checker of its windows as primary reads it.
const LogLeaseEnded = "the lease on primary roles ended unrenewed: demoting the primary ranges"

// reconcile takes the member's ranges of the map as they are now into own, cancelling the
// call in flight if the map took its range away, and returns when the lease on primary
// roles ends (zero: none runs); leaseEnd is what it returned last, so that a lease that
// ended is said once.
func (m *Member) reconcile(own *ownership, cancelCall context.CancelFunc, leaseEnd time.Time) time.Time {
	want, gen, list, end := m.owned(time.Now())
	m.load.setSlices(list)
	if own.setMap(want, gen) {
		cancelCall()
	}
	if end.IsZero() && !leaseEnd.IsZero() {
		m.log.Warn(LogLeaseEnded, "ended", leaseEnd)
	}
	return end
}

// answered logs what the application answered to the call in flight.
func (m *Member) answered(own *ownership, err error) {
	c := own.busy
	switch {
	case c == nil:
	case err == nil:
		m.log.Debug("the application answered", "call", c.String(), "took", time.Since(c.since))
	case c.retried() && c.cancelled:
		m.log.Info("a call ended: the map took the range or the role away", "call", c.String(), "err", err)
	case c.retried():
		m.log.Warn("the application could not take a range or its primary role; trying again after a backoff", "call", c.String(), "err", err)
	default:
		m.log.Error("the application failed a call; the member takes it as done", "call", c.String(), "err", err)
	}
}

// owned returns the member's ranges in the router's map at now, by grant, the map's
// generation, the slices the member holds in it, and when its lease on primary roles ends
// (zero: it holds none, or the cluster gives no leases). Without a valid lease its primary
// ranges are secondary: it demotes itself.
func (m *Member) owned(now time.Time) (map[Grant]keyspace.Set, uint64, []Range, time.Time) {
	v := m.router.view.Load()
	if v == nil {
		return map[Grant]keyspace.Set{}, 0, nil, time.Time{}
	}
	id, primaries := assignment.NodeID(m.cfg.ID), m.cfg.Roles == RolesPrimarySecondary
	leased, until, since := m.lease.valid(now)
	// A view older than the lease's beginning may give roles that went to others meanwhile.
	leased = leased && v.a.Generation() >= since
	byGrant := map[Grant][]keyspace.Range{}
	var list []Range
	for _, s := range v.a.All() {
		if s.Holds(id) {
			g := grantOf(s, id, primaries, leased)
			byGrant[g] = append(byGrant[g], s.Range)
			list = append(list, rangeOf(s.Range))
		}
	}
	want := make(map[Grant]keyspace.Set, len(byGrant))
	for g, rs := range byGrant {
		want[g] = keyspace.NewSet(rs...)
	}
	if !leased {
		until = time.Time{}
	}
	return want, v.a.Generation(), list, until
}

// publish makes what the member holds and loads its heartbeats' and readers' view: what it
// loads, holds as primary, and the map's generation; a range that finished loading or
// stopped being primary brings the next heartbeat forward (a handoff waits for it).
func (m *Member) publish(own *ownership) {
	before := m.pending.Load()
	next := &loadingState{set: own.loading(), held: union(own.want), gen: own.gen, primaries: own.primaries()}
	m.pending.Store(next)
	m.held.Store(int64(len(own.holding().Ranges())))
	if !before.set.Minus(next.set).Empty() || !pointsOf(before.primaries).Minus(pointsOf(next.primaries)).Empty() {
		m.loadedSoon()
	}
}

// untilRetry returns how long to wait before a failed acquire is due or the lease ends
// (zero: none runs), or long.
func untilRetry(own *ownership, leaseEnd time.Time) time.Duration {
	wait := time.Hour
	if at, ok := own.wake(); ok {
		wait = max(time.Until(at), 0)
	}
	if !leaseEnd.IsZero() {
		wait = min(wait, max(time.Until(leaseEnd), 0))
	}
	return wait
}
