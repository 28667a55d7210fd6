package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// Application is what a service that keeps its own state implements to be a Member: the
// member tells it which ranges of the key space it owns, and it answers once it has done
// what owning them takes.
//
// Calls about one point of the key space come one at a time, in order; calls about
// disjoint ranges may run at once (MemberConfig.ConcurrentCalls), so that a member given
// many ranges at once, after another member died, loads them in parallel. Each call has a
// context that ends when the map takes the range away while the application acquires it,
// or after MemberConfig.CallTimeout; a call must return when its context ends.
//
// A call's range is a maximal run of adjacent points gained, lost or changing role alike:
// it may cover part of the range of an earlier call, or several. A split or a merge of
// slices calls nothing.
type Application interface {
	// Acquire makes r the application's, in grant g. It loads what serving r takes (a cache
	// warmed, a table read, files fetched) and returns nil once it can serve r; or it
	// returns an error saying why it cannot, and then holds nothing of r. Until Acquire
	// returns nil, the member tells the assigner that it still loads r, so that r's
	// previous holders keep serving it (make-before-break). An acquire that failed is tried
	// again after a backoff, while the map still gives r.
	Acquire(ctx context.Context, r Range, g Grant) error
	// Release gives r up: the application stops serving r and drops what it holds of it.
	// The member takes r as released whatever Release returns.
	Release(ctx context.Context, r Range) error
	// ChangeRole makes g the grant of r, which the application holds: a promotion to
	// primary (with a new fencing token), or a demotion, after which the application takes
	// no more writes of r. The member takes a demotion as done whatever ChangeRole returns;
	// a promotion that failed is tried again after a backoff.
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
	// Target names the sharded service this member belongs to, one of the control plane's
	// targets (slicectl targets); "" is the default target. Its certificate, if it names a
	// target, must name this one.
	Target string

	// TLS is the member's mutual TLS with the assigners; zero for plaintext. Its certificate
	// must name the member as a node, spiffe://sliceplane/node/<ID>: the assigners let it
	// act only as itself. The files are re-read when they change.
	TLS TLS
	// App is told what the member owns. Required.
	App Application
	// Roles is the cluster's role model, which the application acts on: RolesReplicas (the
	// default: it holds every range as RoleReplica) or RolesPrimarySecondary (as RolePrimary
	// or RoleSecondary). An assigner whose model (--roles) is another refuses the member,
	// and Run returns that error.
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
	// ConcurrentCalls is how many calls of App may run at once, each about ranges the
	// others do not touch; default 16. 1 makes every call wait for the one before.
	ConcurrentCalls int
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
}

// DefaultConcurrentCalls is MemberConfig.ConcurrentCalls's default.
const DefaultConcurrentCalls = 16

// Validate fills in the defaults of c and rejects a configuration no member can run with; it
// does no I/O.
func (c *MemberConfig) Validate() error {
	if err := checkIDs(c.ID, c.Target); err != nil {
		return err
	}
	switch {
	case c.App == nil:
		return errors.New("client: a member needs an App to tell what it owns")
	case len(c.Assigners) == 0:
		return errors.New("client: a member needs the assigners' addresses")
	case c.Address == "":
		return errors.New("client: a member needs its Address, where routers reach it")
	case c.ReportInterval < 0 || c.CallTimeout < 0 || c.LeaseMargin < 0 || c.ConcurrentCalls < 0:
		return fmt.Errorf("client: negative report interval %s, call timeout %s, lease margin %s or concurrent calls %d",
			c.ReportInterval, c.CallTimeout, c.LeaseMargin, c.ConcurrentCalls)
	}
	roles, err := assignment.ParseRoleModel(c.Roles)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	c.Roles = roles.Name
	if c.ReportInterval == 0 {
		c.ReportInterval = time.Second
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = 30 * time.Second
	}
	if c.ConcurrentCalls == 0 {
		c.ConcurrentCalls = DefaultConcurrentCalls
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
// limiter, a session host, a search shard) and takes part in the map without a data path:
// it registers with the assigners, heartbeats, reports the load it serves (RecordLoad) and
// drains, watches the map, and tells its Application which ranges it owns. Its request
// handlers ask it whether it owns a key (Grant), or run a request under the key's grant
// (Read, Write), which a call taking the grant away waits for. Run drives it; the other
// methods are safe to call at any time, from any goroutine.
type Member struct {
	*participant
	cfg    MemberConfig
	roles  assignment.RoleModel // cfg.Roles'
	router *Router
	guards *guards
	held   atomic.Int64 // ranges the application holds, for Drain
}

// NewMember validates cfg and returns a member; Run starts it.
func NewMember(cfg MemberConfig) (*Member, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	src, err := nodeTLS(cfg.ID, cfg.Target, cfg.TLS)
	if err != nil {
		return nil, err
	}
	router, err := NewRouter(RouterConfig{ID: cfg.ID, Assigners: cfg.Assigners, Target: cfg.Target, TLS: cfg.TLS, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	p := newParticipant(participantConfig{ID: cfg.ID, Capacity: cfg.Capacity, Address: cfg.Address, Labels: cfg.Labels,
		Assigners: cfg.Assigners, Target: cfg.Target, ReportInterval: cfg.ReportInterval, HotKeys: cfg.HotKeys, Roles: cfg.Roles, LeaseMargin: cfg.LeaseMargin, Logger: cfg.Logger}, src)
	roles, _ := assignment.ParseRoleModel(cfg.Roles) // Validate checked it
	m := &Member{participant: p, cfg: cfg, roles: roles, router: router, guards: newGuards()}
	p.holds = func() int { return int(m.held.Load()) }
	return m, nil
}

// Leased reports whether the member may act as a primary now: in an exclusive cluster (the
// assigner's --exclusive), whether its lease on primary roles is valid by its own count;
// always in a cluster that is not. Grant and Write fold it in.
func (m *Member) Leased() bool {
	ok, _, _ := m.lease.valid(time.Now())
	return ok
}

// Grant returns the grant in which the member's application serves key now, and whether it
// serves it at all: it acquired the key's range (Acquire returned), and no call has begun
// to take it away. A primary grant is given only while the member is leased (Leased): past
// its lease, the key's range is reported as secondary until the member has demoted it.
// An application that checks Grant before a write must order the write against its own
// ChangeRole; Write does that for it.
func (m *Member) Grant(key []byte) (Grant, bool) {
	v := m.guards.view.Load()
	g, _, ok := v.find(Hash(key))
	return m.leasedGrant(g, v.gen), ok
}

// leasedGrant returns g, held as of the map of generation gen, or a secondary grant for a
// primary one while the lease does not cover it: the lease is not valid, or began after
// that map (the member re-registered after it had lapsed, and acts on an older map, whose
// roles the assigner may have given to others meanwhile).
func (m *Member) leasedGrant(g Grant, gen uint64) Grant {
	if g.Role == RolePrimary && !m.covered(gen) {
		return Grant{Role: RoleSecondary}
	}
	return g
}

// covered reports whether the member's lease covers the map of generation gen now: it is
// valid and began no later than that map; always in a cluster that is not exclusive. Past
// it, in an exclusive cluster, the member serves no read either: the assigner may have taken
// it out, and its ranges are others' by now.
func (m *Member) covered(gen uint64) bool {
	ok, _ := m.lease.covers(time.Now(), gen)
	return ok
}

// Serving reports whether the member's application serves key now, in any role (Grant).
func (m *Member) Serving(key []byte) bool {
	_, ok := m.Grant(key)
	return ok
}

// Read runs fn with the grant of key, if the member serves key in any role; otherwise it
// returns a *NotOwnerError (ErrNotOwner) and does not run fn. A read of a key the member is
// acquiring waits for the acquire, until ctx ends. A release of key's range waits until fn
// has returned, so that fn never reads data the application dropped meanwhile. In an
// exclusive cluster a member past its lease (it was paused, or cut off) serves no read
// either. A secondary answers with what it holds: a read that must see every write
// acknowledged goes to the primary (routed with WithWriteKey, run with Write).
func (m *Member) Read(ctx context.Context, key []byte, fn func(Grant) error) error {
	return m.under(ctx, key, false, fn)
}

// Write runs fn with the grant of key, if the member may take writes of key: it is the
// primary of key's range and leased, or, in a cluster without roles, it serves the range.
// Otherwise it returns a *NotOwnerError (ErrNotOwner) and does not run fn. A write of a key
// whose range the map has just given the member (its acquire or promotion is due or under
// way) waits for it, until ctx ends, rather than be refused and sent back. A demotion or
// release of key's range waits until fn has returned (at most MemberConfig.CallTimeout), so
// that the next primary, promoted only once this one has demoted, sees every write this one
// acknowledged. Write through the grant's fencing token (client/fence) where a paused
// process could outlive its lease.
func (m *Member) Write(ctx context.Context, key []byte, fn func(Grant) error) error {
	return m.under(ctx, key, true, fn)
}

// under runs fn as Read (write false) or Write does.
func (m *Member) under(ctx context.Context, key []byte, write bool, fn func(Grant) error) error {
	h := Hash(key)
	ok := func(g Grant, held bool, gen uint64) (Grant, bool) {
		if !held || !write && !m.covered(gen) {
			return Grant{}, false
		}
		g = m.leasedGrant(g, gen)
		return g, !write || g.Role == RolePrimary || g.Role == RoleReplica
	}
	have, entered := m.guards.enter(ctx, h, write, ok)
	if !entered {
		e := &NotOwnerError{Key: key, Have: have}
		if write && m.roles.Primaries {
			e.Need = RolePrimary
		}
		return e
	}
	defer m.guards.leave(h, write)
	return fn(have)
}

// Ready reports whether the member takes part in the cluster: an assigner took its
// registration and its router has a map. For a readiness probe: a member not ready owns
// nothing yet.
func (m *Member) Ready() bool { return m.registeredOnce.Load() && m.router.view.Load() != nil }

// WaitReady waits until the member is Ready, or ctx ends.
func (m *Member) WaitReady(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !m.Ready() {
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("client: waiting for member %s to register and get a map: %w", m.cfg.ID, ctx.Err())
		}
	}
	return nil
}

// Router returns the member's router: the map it follows, for lookups (where to forward a
// request for a key the member does not serve).
func (m *Member) Router() *Router { return m.router }

// Run registers the member and tells its application what it owns until ctx ends; it
// returns nil then, or the error that stopped it (the assigners refused to register it: its
// role model is not theirs, say). It runs once. To leave gracefully, call Drain while Run
// runs and end Run once Drain returned. When Run returns, the application holds what it
// held: it should stop serving.
func (m *Member) Run(ctx context.Context) error { return m.run(ctx, "Member", m.follow) }

// result is an application's answer to call id, with how long the call waited for the
// requests running under the grant it took away (guard) and how long the application took
// (app): the rest of the call's time is the member's own.
type result struct {
	id         uint64
	err        error
	guard, app time.Duration
}

// calls are the application's calls in flight, each on a goroutine of its own, and how to
// cancel each; results has room for the answer of every call that may be in flight.
type calls struct {
	wg      sync.WaitGroup
	results chan result
	cancel  map[uint64]context.CancelFunc
}

// follow follows the map and makes the calls ownership asks for, until ctx ends.
func (m *Member) follow(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	rctx, stopRouter := context.WithCancel(ctx)
	defer stopRouter()
	wg.Go(func() { m.router.Run(rctx) }) //nolint:errcheck // it returns nil when rctx ends
	views, stopViews := m.router.watchViews()
	defer stopViews()
	own := newOwnership(m.cfg.ConcurrentCalls)
	inflight := &calls{results: make(chan result, m.cfg.ConcurrentCalls), cancel: map[uint64]context.CancelFunc{}}
	defer inflight.stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var leaseEnd time.Time
	for {
		select {
		case <-views: // a new map, or new addresses (setMap of the same map changes nothing)
			leaseEnd = m.reconcile(own, inflight, leaseEnd)
		case <-m.lease.changed:
			leaseEnd = m.reconcile(own, inflight, leaseEnd)
		case <-timer.C: // a retry is due, or the lease ends
			leaseEnd = m.reconcile(own, inflight, leaseEnd)
		case res := <-inflight.results:
			// Every answer that came is taken before the next calls and the view: calls
			// answered together cost one step, not one each.
			for more := true; more; {
				m.taken(own, inflight, res)
				select {
				case res = <-inflight.results:
				default:
					more = false
				}
			}
		case <-ctx.Done():
			return nil
		}
		started := own.next(time.Now())
		// Published before the calls start: a promotion counts as primary from its start,
		// and a demotion's requests stop before the application is told.
		m.publish(own)
		for _, c := range started {
			m.start(ctx, c, inflight)
		}
		timer.Reset(untilRetry(own, leaseEnd))
	}
}

// taken takes the application's answer res to a call.
func (m *Member) taken(own *ownership, inflight *calls, res result) {
	inflight.cancel[res.id]()
	delete(inflight.cancel, res.id)
	m.answered(own, res)
	own.done(res.id, res.err, time.Now())
}

// start makes call c on a goroutine of its own.
func (m *Member) start(ctx context.Context, c appCall, inflight *calls) {
	cctx, cancel := context.WithTimeout(ctx, m.cfg.CallTimeout)
	inflight.cancel[c.id] = cancel
	inflight.wg.Go(func() {
		res := result{id: c.id}
		res.err = m.invoke(cctx, c, &res)
		inflight.results <- res
	})
}

// stop cancels the calls in flight and waits for them.
func (c *calls) stop() {
	for _, cancel := range c.cancel {
		cancel()
	}
	c.wg.Wait() // results holds a place for each call in flight: none blocks on its answer
}

// errNotPromoted answers a call that would have made the application primary when, as it
// came to be made, its context had ended or the member's lease had: the call was not made.
var errNotPromoted = errors.New("client: not made primary: the call's context or the member's lease ended first")

// invoke makes one call of the application. A call that would make the application primary
// is not made once its context or the lease has ended (a process paused between deciding it
// and making it): ownership tries it again, if the map still wants it. A call that takes a
// grant away first waits for the requests running under it (Read, Write). It times both
// parts into res.
func (m *Member) invoke(ctx context.Context, c appCall, res *result) error {
	r := rangeOf(c.rng)
	if c.promotes() && (ctx.Err() != nil || !m.Leased()) {
		return errNotPromoted
	}
	if c.kind == callRelease || c.demotes {
		start := time.Now()
		if err := m.guards.wait(ctx, c.rng, c.kind == callRelease); err != nil {
			m.log.Warn("the requests in flight did not end before the call's deadline; making it all the same", "call", c.String(), "err", err)
		}
		res.guard = time.Since(start)
	}
	start := time.Now()
	defer func() { res.app = time.Since(start) }()
	switch c.kind {
	case callAcquire:
		return m.cfg.App.Acquire(ctx, r, c.grant)
	case callRelease:
		return m.cfg.App.Release(ctx, r)
	}
	return m.cfg.App.ChangeRole(ctx, r, c.grant)
}

// LogLeaseEnded is the message a member logs when its lease on primary roles ended
// unrenewed, with the time it ended ("ended"): a checker of its windows as primary reads it.
const LogLeaseEnded = "the lease on primary roles ended unrenewed: demoting the primary ranges"

// reconcile takes the member's ranges of the map as they are now into own, cancelling the
// calls in flight that the map made moot, and returns when the lease on primary roles ends
// (zero: none runs); leaseEnd is what it returned last, so that a lease that ended is said
// once.
func (m *Member) reconcile(own *ownership, inflight *calls, leaseEnd time.Time) time.Time {
	want, gen, list, end := m.owned(time.Now())
	m.load.setSlices(list)
	for _, id := range own.setMap(want, gen, time.Now()) {
		inflight.cancel[id]()
	}
	if end.IsZero() && !leaseEnd.IsZero() {
		m.log.Warn(LogLeaseEnded, "ended", leaseEnd)
	}
	return end
}

// answered logs what the application answered to call res.id: a change of what it owns at
// info, a failure at warn (tried again) or error (taken as done all the same).
func (m *Member) answered(own *ownership, res result) {
	c := own.calls[res.id]
	if c == nil {
		return
	}
	attrs := append(c.attrs(time.Now()), "guard", res.guard, "app", res.app)
	switch {
	case res.err == nil:
		m.log.Info(LogOwnershipChanged, attrs...)
	case c.retried() && c.cancelled:
		m.log.Info("a call ended: the map took the range or the role away", append(attrs, "err", res.err)...)
	case c.retried():
		m.log.Warn("the application could not take a range or its primary role; trying again after a backoff", append(attrs, "err", res.err)...)
	default:
		m.log.Error(LogOwnershipChanged+": the application failed the call; the member takes it as done", append(attrs, "err", res.err)...)
	}
}

// LogOwnershipChanged is the message a member logs when its application has taken a call
// that changes what it owns, with the call's attributes (appCall.attrs), how long it waited
// for the requests in flight under the grant it took away ("guard") and how long the
// application took ("app"): a checker of handovers reads it.
const LogOwnershipChanged = "ownership changed"

// owned returns the member's ranges in the router's map at now, in order, each with its
// grant, the map's generation, the slices the member holds in it, and when its lease on
// primary roles ends (zero: it holds none, or the cluster gives no leases). Without a valid
// lease its primary ranges are secondary: it demotes itself.
func (m *Member) owned(now time.Time) ([]granted, uint64, []Range, time.Time) {
	v := m.router.view.Load()
	if v == nil {
		return nil, 0, nil, time.Time{}
	}
	id := assignment.NodeID(m.cfg.ID)
	leased, until := m.lease.covers(now, v.a.Generation())
	var want []granted
	var list []Range
	for _, s := range v.a.All() {
		if !s.Holds(id) {
			continue
		}
		g := grantOf(m.roles, s, id, leased)
		list = append(list, rangeOf(s.Range))
		if n := len(want); n > 0 && want[n-1].grant == g && want[n-1].r.End == keyspace.At(s.Range.Start) {
			want[n-1].r.End = s.Range.End
			continue
		}
		want = append(want, granted{r: s.Range, grant: g})
	}
	if !leased {
		until = time.Time{}
	}
	return want, v.a.Generation(), list, until
}

// publish makes what the member holds and loads its heartbeats', readers' and requests'
// view: what it loads, serves, holds as primary, and the map's generation. A range that
// finished loading or became primary brings the next heartbeat forward (a handoff waits for
// it), and one that stopped being primary makes it go now (a promotion elsewhere waits for
// it).
func (m *Member) publish(own *ownership) {
	before := m.pending.Load()
	next := &loadingState{set: keyspace.NewSet(own.loading()...), held: keyspace.NewSet(own.given()...), gen: own.gen,
		primaries: own.primaries()}
	m.pending.Store(next)
	m.held.Store(int64(len(own.holding())))
	m.guards.publish(own.serving(), own.gen)
	was, is := pointsOf(before.primaries), pointsOf(next.primaries)
	switch {
	case !was.Minus(is).Empty():
		m.askAssigner()
	case !before.set.Minus(next.set).Empty() || !is.Minus(was).Empty():
		m.loadedSoon() // the old primary of a range this one took lets go once it hears
	}
}

// pointsOf returns the points of rs.
func pointsOf(rs []primaryRange) keyspace.Set {
	ks := make([]keyspace.Range, len(rs))
	for i, p := range rs {
		ks[i] = p.r
	}
	return keyspace.NewSet(ks...)
}

// untilRetry returns how long to wait before a failed acquire is due or the lease ends
// (zero: none runs), or long.
func untilRetry(own *ownership, leaseEnd time.Time) time.Duration {
	wait := time.Hour
	if at, ok := own.wake(); ok && own.free() > 0 {
		wait = max(time.Until(at), 0)
	}
	if !leaseEnd.IsZero() {
		wait = min(wait, max(time.Until(leaseEnd), 0))
	}
	return wait
}

// KeyFunc returns the key of a gRPC request (fullMethod is "/package.Service/Method"),
// whether the call writes, and whether it is about a key at all. Return ok false for a
// request without a valid key (an empty one), and let the handler refuse it
// (InvalidArgument): answered NotOwner, the caller would send it again until its deadline.
type KeyFunc func(fullMethod string, req any) (key []byte, write, ok bool)

// UnaryServerInterceptor returns the interceptor that runs each call of the member's gRPC
// service that keyOf knows under its key's grant (it records no load: the handler says what
// a call cost, with RecordLoad): a write through Write, a read through
// Read, so that a call for a key the member does not own in the role it needs is answered
// NotOwner (the caller's GRPCDialOptions interceptor sends it again where the map says)
// and a demotion or release of the key's range waits for the calls running under it. The
// handler finds the grant (its fencing token) with GrantFrom. Calls keyOf does not know
// run as they are.
//
//	grpc.NewServer(creds, grpc.UnaryInterceptor(m.UnaryServerInterceptor(keyOf)))
func (m *Member) UnaryServerInterceptor(keyOf KeyFunc) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		key, write, ok := keyOf(info.FullMethod, req)
		if !ok {
			return handler(ctx, req)
		}
		var resp any
		err := m.under(ctx, key, write, func(g Grant) error {
			var err error
			resp, err = handler(context.WithValue(ctx, grantCtx{}, g), req)
			return err
		})
		return resp, err
	}
}
