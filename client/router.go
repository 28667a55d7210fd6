package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/target"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// ErrNotReady is returned by lookups before the router has applied its first map.
var ErrNotReady = errors.New("client: router not ready: no assignment applied yet")

// ErrNoPrimary is returned by Primary for a key whose slice has no primary that takes
// writes: the cluster has no roles, or the slice's primary is handing the role over (a
// moment), or none of its replicas serves yet. Retry after the next map.
var ErrNoPrimary = errors.New("client: no primary takes the key's writes now")

// ErrQuarantined is returned by Pick and Primary for a key in a quarantined range: nodes
// crashed shortly after acquiring it, so the assigner holds it on no node until an
// operator lifts the quarantine (slicectl unquarantine). Retrying does not help until then.
var ErrQuarantined = errors.New("client: the key is quarantined: no node serves it until an operator lifts the quarantine")

// RouterConfig configures a Router.
type RouterConfig struct {
	// Assigners are the gRPC addresses of the assigners (leader and standbys). Required.
	Assigners []string
	// Target names the sharded service this router belongs to, one of the control plane's
	// targets (slicectl targets); "" is the default target. Its certificate, if it names a
	// target, must name this one.
	Target string

	// TLS is the router's mutual TLS with the assigners; zero for plaintext. Its
	// certificate must name an identity with the router role, which reads the map and the
	// node list: a router, viewer, admin, node or distributor identity, or one the
	// assigners' policy grants it. The files are re-read when they change (rotation needs
	// no restart).
	TLS TLS
	// Policy chooses the replica Pick returns; default RoundRobin.
	Policy Policy
	// ID names the router among the others: it chooses the relay it watches (rendezvous
	// hashing over the distributors, which relay the map), so that routers spread evenly over
	// them. A member's is its node ID; default a random one.
	ID string
	// RefreshInterval is how often the nodes' addresses and capacities are read again; default
	// 5 s. A map that names a node the router does not know makes it read them at once. A
	// relay sends them on the watch whenever they change, and a router that watches one
	// reads them only for such a map.
	RefreshInterval time.Duration
	// Logger receives structured logs; default none.
	Logger *slog.Logger
}

// Replica is a node holding a slice, as a router sends requests to it.
type Replica struct {
	ID string
	// Address is where the node serves its application, as it registered. It is "" while the
	// router has not learned it yet (the node is newer than the router's last read of the
	// node list, which a map naming it triggers): treat such a replica as unreachable.
	Address string
	// Capacity is the node's capacity weight: 1 for a node that did not set one, and for a
	// node the router does not know yet.
	Capacity float64
	// Stale says the node's last heartbeat found its data beyond its freshness bound (or its
	// distributor silent), as of the router's last read of the node list: it answers no
	// reads. Pick avoids it while the slice has a replica that is not stale.
	Stale bool
	// Role is the replica's role in the slice: RoleReplica in a cluster without roles,
	// else RolePrimary (the one that takes writes) or RoleSecondary.
	Role Role
	// Token is the fencing token of a primary's grant (0 for other roles): a request may
	// carry it so that the primary, or the store it writes to, refuses one routed by a map
	// older than its grant or newer (see Grant).
	Token uint64
}

// Route is where a key lives: its hash, the slice that holds it and the slice's replicas in
// the router's current map.
type Route struct {
	Hash  uint64
	Slice Range
	// Replicas are sorted by ID. The router shares the array between lookups: do not modify it.
	Replicas   []Replica
	Generation uint64
}

// Router answers which nodes hold a key, from a copy of the assignment that it keeps up to
// date by watching the assigner: lookups make no network call and take no lock. Run drives
// it; the other methods are safe to call at any time, from any goroutine, and lookups fail
// with ErrNotReady until Run has applied the first map (WaitReady waits for it).
type Router struct {
	cfg  RouterConfig
	log  *slog.Logger
	tls  *mtls.Source  // nil: plaintext
	rand func() uint64 // uniform random numbers for the policies; tests make it deterministic

	view  atomic.Pointer[view] // nil until the first map
	ready chan struct{}        // closed when the first map is applied
	// viewers are signalled (each holds at most one signal) when any view is published: a
	// new map, or new addresses (watchViews).
	viewersMu sync.Mutex
	viewers   map[chan struct{}]struct{}
	running   atomic.Bool
	// started is closed when Run starts, stopped when it returns: a call through a router
	// that does not run fails (ErrRouterNotRunning) rather than wait for a map that will not
	// change.
	started, stopped chan struct{}
	kick             chan struct{} // asks for the node list now
	stats            retryStats
	// relayConn is the connection to the relay the map is watched from, nil while the
	// router watches the leader: the node list is read from it too.
	relayConn atomic.Pointer[grpc.ClientConn]
	// pushed says the stream the map is watched on sends the node list too, whenever it
	// changes (a relay's does): the list is then not read every RefreshInterval.
	pushed atomic.Bool
	// unknown says the current map names a node the last node list did not: the list is
	// read again soon, for a relay's copy of it may be a second older than the map.
	unknown atomic.Bool
	// watchErr is why the last watch ended, for WaitReady.
	watchErr atomic.Pointer[error]

	loads sync.Map // node ID (string) -> *nodeLoad: requests in flight, from Begin

	// mu serializes the publishing of views: both the watch (a new map) and the node refresh
	// (new addresses) publish one.
	mu    sync.Mutex
	nodes map[assignment.NodeID]nodeInfo // from the last node list; nil before the first
	sets  map[string]*replicaSet         // the replica sets of the current view, by setKey
}

// view is what lookups read: one map, the replicas of each of its slices, and the stream
// position it was applied at. A new view replaces it whole, so that a lookup sees one
// consistent state.
type view struct {
	a *assignment.Assignment
	// starts and sets hold the first point and the replicas of each slice of a, in order.
	// Lookups search starts, 8 bytes a slice (1.2 MB for 150k slices), rather than the
	// map's slices, 48 bytes each, which miss the cache more.
	starts []uint64
	sets   []*replicaSet
	pos    quantum.Position
	clock  uint64
	// since is when the router took the map's generation: a map younger than freshMapFor
	// may be newer than its members'.
	since time.Time
}

// setOf returns the replica set of the slice holding key: the key's route.
func (v *view) setOf(key []byte) *replicaSet { return v.sets[v.find(Hash(key))] }

// find returns the index of the slice holding point h.
func (v *view) find(h uint64) int {
	// The first slice starts at 0: the slice holding h is the last one starting at or
	// before it.
	lo, hi := 0, len(v.starts) // v.starts[lo] <= h < v.starts[hi], with starts[len] = 2^64
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if v.starts[mid] <= h {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// nodeInfo is what the node list says of a node.
type nodeInfo struct {
	address  string
	capacity float64
	// stale says the node's last heartbeat found its data beyond its freshness bound (or its
	// distributor silent): it answers no reads, so a slice's fresh replicas take them.
	stale bool
}

// maxMapBytes bounds the message carrying a whole map. The assigner sends a map of 150k
// slices in about 4.5 MB, over gRPC's default limit of 4 MB.
const maxMapBytes = 256 << 20

// minRefreshGap spaces the reads of the node list that maps naming unknown nodes trigger,
// so that a node the assigner no longer lists (it is leaving) cannot make every quantum
// cost a call.
const minRefreshGap = 100 * time.Millisecond

// Validate fills in the defaults of c and rejects a configuration no router can run with;
// it does no I/O.
func (c *RouterConfig) Validate() error {
	var addrs []string
	for _, a := range c.Assigners {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if err := target.CheckRef(c.Target); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	switch {
	case len(addrs) == 0:
		return errors.New("client: a router needs the assigners' addresses")
	case !c.Policy.valid():
		return fmt.Errorf("client: unknown replica policy %s; use one of %s", c.Policy, strings.Join(Policies(), ", "))
	case c.RefreshInterval < 0:
		return fmt.Errorf("client: negative refresh interval %s", c.RefreshInterval)
	}
	c.Assigners = addrs
	if c.ID == "" {
		c.ID = fmt.Sprintf("router-%016x", rand.Uint64())
	}
	if c.RefreshInterval == 0 {
		c.RefreshInterval = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// NewRouter validates cfg and returns a router; Run starts it. It reads cfg.TLS's files,
// and does no other I/O.
func NewRouter(cfg RouterConfig) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	src, err := cfg.TLS.load()
	if err != nil {
		return nil, err
	}
	return &Router{cfg: cfg, log: cfg.Logger, tls: src, rand: rand.Uint64, ready: make(chan struct{}),
		started: make(chan struct{}), stopped: make(chan struct{}), kick: make(chan struct{}, 1)}, nil
}

// Run watches the assignment and the node list until ctx ends, and returns nil then. When
// the assigner is out of reach it keeps the map it has, retries with backoff, and resumes
// the watch from the last quantum it applied. It runs once.
func (r *Router) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("client: Router.Run called twice")
	}
	close(r.started)
	defer close(r.stopped)
	leader, err := dial.FollowTarget(r.cfg.Target, r.cfg.Assigners, r.tls.DialOption("assigner"))
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	defer leader.Close()
	var wg sync.WaitGroup
	wg.Go(func() { r.refreshNodes(ctx, leader) })
	r.watch(ctx, leader)
	wg.Wait()
	return nil
}

// WaitReady waits until the router has applied its first map, or ctx ends; its error then
// says why the router's last watch ended, if one did (a certificate the assigners refuse,
// none reachable).
func (r *Router) WaitReady(ctx context.Context) error {
	select {
	case <-r.ready:
		return nil
	case <-ctx.Done():
		last := r.watchErr.Load()
		if last == nil { // a watch of the leader waits for a connection: ask why there is none
			err := r.reachAssigners()
			last = &err
		}
		if *last != nil {
			return fmt.Errorf("client: waiting for the router's first map: %w; the last watch: %w", ctx.Err(), *last)
		}
		return fmt.Errorf("client: waiting for the router's first map: %w", ctx.Err())
	}
}

// reachAssigners makes one call to the assigners that does not wait for a connection, and
// returns what stopped it (a refused certificate, none listening), nil if it went through.
func (r *Router) reachAssigners() error {
	conn, err := dial.TargetLeader(r.cfg.Target, r.cfg.Assigners, r.tls.DialOption("assigner"))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = pb.NewAdminServiceClient(conn).ListNodes(ctx, &pb.ListNodesRequest{})
	return err
}

// Lookup returns the route of key, in O(log slices).
func (r *Router) Lookup(key []byte) (Route, error) { return r.LookupHash(Hash(key)) }

// LookupHash returns the route of the point h of the hash space.
func (r *Router) LookupHash(h uint64) (Route, error) {
	v := r.view.Load()
	if v == nil {
		return Route{}, ErrNotReady
	}
	i := v.find(h)
	return Route{Hash: h, Slice: rangeOf(v.a.Slice(i).Range), Replicas: v.sets[i].replicas, Generation: v.a.Generation()}, nil
}

// Pick returns the replica of key's slice that the router's policy chooses.
func (r *Router) Pick(key []byte) (Replica, error) {
	_, rep, _, err := r.pickFor(key, false)
	if err != nil {
		return Replica{}, err
	}
	return *rep, nil
}

// Primary returns the replica of key's slice that takes its writes, or ErrNoPrimary.
func (r *Router) Primary(key []byte) (Replica, error) {
	v := r.view.Load()
	if v == nil {
		return Replica{}, ErrNotReady
	}
	set := v.setOf(key)
	if quarantined(set) {
		return Replica{}, ErrQuarantined
	}
	if set.primary < 0 {
		return Replica{}, ErrNoPrimary
	}
	return set.replicas[set.primary], nil
}

// Begin reports that the application sent a request to node nodeID; calling done reports
// that it finished (calling it again does nothing). The counts of requests in flight steer
// LeastOutstanding and PowerOfTwo; other policies do not need them.
func (r *Router) Begin(nodeID string) (done func()) {
	l := r.loadOf(nodeID)
	l.n.Add(1)
	var finished atomic.Bool
	return func() {
		if finished.CompareAndSwap(false, true) {
			l.n.Add(-1)
		}
	}
}

// Generation returns the generation of the router's map; 0 before the first.
func (r *Router) Generation() uint64 {
	if v := r.view.Load(); v != nil {
		return v.a.Generation()
	}
	return 0
}

// freshMapFor is how long after its map changed a router's calls say the map's generation
// to the member they reach (MapGenerationHeader): long enough for every member to have the
// map too, so that calls routed by an older map need not carry it.
const freshMapFor = time.Second

// freshGeneration returns the generation of the router's map and whether the map is younger
// than freshMapFor.
func (r *Router) freshGeneration() (uint64, bool) {
	v := r.view.Load()
	if v == nil || time.Since(v.since) >= freshMapFor {
		return 0, false
	}
	return v.a.Generation(), true
}

// Clock returns the Lamport clock of the last quantum applied: the map reflects every
// change of the data source up to it. The assigner sends routers only the quanta that
// change the map (and skips clock-only ones), so the clock moves with the map.
func (r *Router) Clock() uint64 {
	if v := r.view.Load(); v != nil {
		return v.clock
	}
	return 0
}

// Position returns the position (term, sequence) in the assigner's stream of quanta of the
// last quantum applied; 0, 0 before the first. Positions order maps across leaders: a new
// leader's term is higher.
func (r *Router) Position() (term, seq uint64) {
	if v := r.view.Load(); v != nil {
		return v.pos.Term, v.pos.Seq
	}
	return 0, 0
}

// loadOf returns the in-flight counter of a node, making it at first use.
func (r *Router) loadOf(id string) *nodeLoad {
	if l, ok := r.loads.Load(id); ok {
		return l.(*nodeLoad)
	}
	l, _ := r.loads.LoadOrStore(id, newNodeLoad())
	return l.(*nodeLoad)
}

// watch follows the assignment until ctx ends, reconnecting after failures. A stream that
// stays silent (the leader sends heartbeats when idle) went to a leader that hangs: the
// connection, which would keep choosing it, is renewed.
func (r *Router) watch(ctx context.Context, leader *dial.Follower) {
	b := newBackoff()
	rs := newRelays(r.cfg.ID, r.relayDialer)
	defer rs.close()
	defer r.relayConn.Store(nil)
	var from *quantum.Position // the last position applied; nil asks for the whole map
	for ctx.Err() == nil {
		w := r.upstream(rs, leader)
		applied, err := r.follow(ctx, w, &from)
		if ctx.Err() != nil {
			return
		}
		if err != nil && !errors.Is(err, errBetterRelay) {
			r.watchErr.Store(&err)
		}
		if applied {
			b.Reset()
		}
		switch {
		case errors.Is(err, errBetterRelay):
			continue
		case w.relay != "":
			// Another relay, or the assigner, at once: the map must not wait for this one.
			rs.fail(w.relay, time.Now())
			r.log.Info("relay watch ended; watching another", "relay", w.relay, "err", err, "from", resumeOf(from))
			continue
		case errors.Is(err, dial.ErrSilent):
			leader.Renew(w.conn)
		}
		wait := b.NextBackOff()
		r.log.Info("assignment watch ended; reconnecting", "err", err, "from", resumeOf(from), "retry_in", wait)
		sleep(ctx, wait)
	}
}

// resumeOf says where a watch resumes, for the logs.
func resumeOf(from *quantum.Position) string {
	if from == nil {
		return "the whole map"
	}
	return from.String()
}

// watched is what one watch stream follows: a relay, or the leader ("" relay).
type watched struct {
	relay string
	conn  *grpc.ClientConn
	rs    *relays
}

// upstream returns what to watch now: the preferred relay, or the leader when the router
// knows no relay yet, or every relay failed lately.
func (r *Router) upstream(rs *relays, leader *dial.Follower) watched {
	now := time.Now()
	if id := rs.preferred(now); id != "" {
		conn, err := rs.conn(id)
		if err == nil {
			rs.watching(id, now)
			r.relayConn.Store(conn)
			return watched{relay: id, conn: conn, rs: rs}
		}
		rs.fail(id, now)
	}
	r.relayConn.Store(nil)
	return watched{conn: leader.Conn(), rs: rs}
}

// errBetterRelay ends a watch when a relay ranked before the one watched can be watched:
// the relay set changed, or a failed relay's time out ended.
var errBetterRelay = errors.New("client: a better relay can be watched")

// follow runs one watch stream, applying its quanta, until it fails. It keeps *from at the
// last position applied, and sets it to nil when the router must start over from the whole
// map. It reports whether it applied any quantum.
func (r *Router) follow(ctx context.Context, w watched, from **quantum.Position) (applied bool, err error) {
	defer r.pushed.Store(false)
	idle, req := dial.StreamIdleTimeout, &pb.WatchAssignmentRequest{Nodes: true}
	if w.relay != "" {
		idle, req.Heartbeat = relayIdleTimeout, durationpb.New(relayHeartbeat)
	}
	ctx, watchdog := dial.NewWatchdog(ctx, idle)
	defer watchdog.Stop()
	if *from != nil {
		req.From = wire.PositionToProto(**from)
	}
	stream, err := pb.NewAssignmentServiceClient(w.conn).WatchAssignment(ctx, req, grpc.WaitForReady(w.relay == ""), grpc.MaxCallRecvMsgSize(maxMapBytes))
	if err != nil {
		return false, fmt.Errorf("client: watching the assignment: %w", err)
	}
	for {
		resp, err := dial.Receive(watchdog, stream.Recv)
		if err != nil {
			return applied, fmt.Errorf("client: watching the assignment: %w", err)
		}
		switch {
		case resp.GetNodes() != nil:
			r.recordNodes(resp.GetNodes())
			r.pushed.Store(true)
		case !resp.GetHeartbeat():
			q, err := wire.QuantumFromProto(resp.GetQuantum())
			if err == nil {
				err = r.apply(q)
			}
			if err != nil {
				// The map the router holds is still whole and consistent, so lookups go on
				// with it; the stream is not to be trusted any more, so start over.
				*from = nil
				err = fmt.Errorf("client: from the assignment watch: %w", err)
				r.log.Warn("quantum rejected; starting over from the whole map", "err", err)
				return applied, err
			}
			pos := q.Position
			*from, applied = &pos, true
			w.rs.update(q.Distributors)
		}
		now := time.Now()
		w.rs.tick(now)
		if w.rs.preferred(now) != w.relay {
			return applied, errBetterRelay
		}
	}
}

// apply applies a quantum and publishes the map it leads to. A quantum that does not
// follow the router's map leaves it unchanged, and the error says why.
func (r *Router) apply(q quantum.Quantum) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := r.view.Load()
	f := quantum.Follower{Holder: "the router"}
	var prev *assignment.Assignment
	if cur != nil {
		f.Pos, f.Started, prev = cur.pos, true, cur.a
	}
	a, err := f.Follow(prev, q)
	if err != nil {
		return err
	}
	next := &view{pos: q.Position, clock: q.Clock, a: a}
	if q.ClockOnly() {
		// The map and its replicas stay as they are.
		next.starts, next.sets = cur.starts, cur.sets
	}
	unknown := false
	if next.sets == nil {
		next.starts, next.sets, unknown = r.buildSets(next.a, false)
		r.unknown.Store(unknown)
	}
	r.publish(next)
	if unknown {
		r.refreshSoon()
	}
	return nil
}

// publish makes v the view that lookups read. r.mu must be held.
func (r *Router) publish(v *view) {
	prev := r.view.Load() // r.mu held: no other publication runs
	v.since = time.Now()
	if prev != nil && prev.a.Generation() == v.a.Generation() {
		v.since = prev.since
	}
	r.view.Store(v)
	if prev == nil {
		close(r.ready)
	}
	r.viewersMu.Lock()
	defer r.viewersMu.Unlock()
	for c := range r.viewers {
		signal(c)
	}
}

// signal leaves a signal in c, unless one waits there already.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// watchViews returns a channel signalled whenever the router publishes a view (a new map or
// new addresses), and the function that stops the signals.
func (r *Router) watchViews() (<-chan struct{}, func()) {
	c := make(chan struct{}, 1)
	r.viewersMu.Lock()
	defer r.viewersMu.Unlock()
	if r.viewers == nil {
		r.viewers = map[chan struct{}]struct{}{}
	}
	r.viewers[c] = struct{}{}
	if r.view.Load() != nil {
		signal(c)
	}
	return c, func() {
		r.viewersMu.Lock()
		defer r.viewersMu.Unlock()
		delete(r.viewers, c)
	}
}

// pickFor returns the replica of key's slice that takes its writes (write, in a cluster with
// roles) or that the policy chooses, in the key's route (the slice's replica set), with its
// node's in-flight counter. The route is nil before the first map; the replica nil with an
// error.
func (r *Router) pickFor(key []byte, write bool) (*replicaSet, *Replica, *nodeLoad, error) {
	v := r.view.Load()
	if v == nil {
		return nil, nil, nil, ErrNotReady
	}
	set := v.setOf(key)
	switch {
	case quarantined(set):
		return set, nil, nil, ErrQuarantined
	case !write || !set.hasRoles():
	case set.primary < 0:
		return set, nil, nil, ErrNoPrimary
	default:
		return set, &set.replicas[set.primary], set.load[set.primary], nil
	}
	readers := set.readers()
	i := readers.pick(r.cfg.Policy, r.rand)
	return set, &readers.replicas[i], readers.load[i], nil
}

// quarantined reports whether a slice's replica set is Nobody alone.
func quarantined(set *replicaSet) bool {
	return len(set.replicas) == 1 && set.replicas[0].ID == string(assignment.Nobody)
}

// refreshSoon asks the node refresh to read the node list now.
func (r *Router) refreshSoon() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// setNodes records the node list and, if it changed what the router knows, publishes the
// current map again with the new addresses and capacities.
func (r *Router) setNodes(nodes map[assignment.NodeID]nodeInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodes != nil && maps.Equal(r.nodes, nodes) {
		return
	}
	r.nodes = nodes
	if cur := r.view.Load(); cur != nil {
		starts, sets, unknown := r.buildSets(cur.a, true)
		r.unknown.Store(unknown)
		r.publish(&view{a: cur.a, starts: starts, sets: sets, pos: cur.pos, clock: cur.clock})
	}
	r.pruneLoads()
}

// buildSets returns the start and the replica set of every slice of a, and whether any
// replica is a node the router does not know. Slices with the same replicas share a replicaSet. Those of the
// current view are reused while the node list is the same (renewed, the node list having
// changed, they keep their round-robin turn). r.mu must be held.
func (r *Router) buildSets(a *assignment.Assignment, nodesChanged bool) ([]uint64, []*replicaSet, bool) {
	starts, out := make([]uint64, a.Len()), make([]*replicaSet, a.Len())
	byKey := make(map[string]*replicaSet, len(r.sets))
	unknown := false
	var (
		key      []byte
		prev     []assignment.NodeID
		prevLead lead
		prevSet  *replicaSet
		prevSeen bool
	)
	for i, s := range a.All() {
		starts[i] = s.Range.Start
		// Reads go to the replicas that serve the slice: one still loading it has not all
		// its data yet (make-before-break, I7).
		serving, lead := s.Serving(), leadOf(s)
		// Neighbouring slices are often held by the same nodes: a split keeps them.
		if prevSeen && slices.Equal(serving, prev) && lead == prevLead {
			out[i] = prevSet
			continue
		}
		key = binary.BigEndian.AppendUint64(append(append(setKey(key[:0], serving), byte(lead.kind)), lead.id...), lead.token)
		set, ok := byKey[string(key)] // no allocation: the compiler does not copy key to look up
		if !ok {
			old, had := r.sets[string(key)]
			switch {
			case had && !nodesChanged:
				set = old
			default:
				set = r.newReplicaSet(serving, lead)
				if had {
					set.turn.Store(old.turn.Load())
				}
			}
			byKey[string(key)] = set
			for _, rep := range serving {
				// Nobody, the holder of quarantined ranges, is no node: no list names it.
				if _, known := r.nodes[rep]; !known && rep != assignment.Nobody {
					unknown = true
				}
			}
		}
		out[i], prev, prevLead, prevSet, prevSeen = set, serving, lead, set, true
	}
	r.sets = byKey
	return starts, out, unknown
}

// setKey appends the key of a replica set to b: the IDs, each followed by a 0 byte (which no
// ID holds); buildSets appends the primary's and its token, for a set carries its primary's
// token: two slices with one primary under two grants are two sets.
func setKey(b []byte, ids []assignment.NodeID) []byte {
	for _, id := range ids {
		b = append(append(b, id...), 0)
	}
	return b
}

// lead says how a slice's replicas divide the roles: alike (a cluster without roles), or
// one primary, id, and secondaries, or secondaries only (its primary hands the role over).
type lead struct {
	kind  uint8 // 0: alike; 1: primary id; 2: secondaries only
	id    assignment.NodeID
	token uint64 // of the primary's grant
}

// leadOf returns the lead of slice s.
func leadOf(s assignment.Slice) lead {
	switch {
	case s.Primary == "":
		return lead{}
	case s.Next != "":
		return lead{kind: 2}
	}
	return lead{kind: 1, id: s.Primary, token: s.Token}
}

// role returns the role of replica id under l.
func (l lead) role(id assignment.NodeID) Role {
	switch {
	case l.kind == 0:
		return RoleReplica
	case l.id == id:
		return RolePrimary
	}
	return RoleSecondary
}

// newReplicaSet makes the replica set of nodes ids, their roles by l, from the node list.
// r.mu must be held.
func (r *Router) newReplicaSet(ids []assignment.NodeID, l lead) *replicaSet {
	set := &replicaSet{replicas: make([]Replica, len(ids)), load: make([]*nodeLoad, len(ids)), primary: -1}
	for i, id := range ids {
		rep := Replica{ID: string(id), Capacity: 1, Role: l.role(id)}
		if n, ok := r.nodes[id]; ok {
			rep.Address, rep.Capacity, rep.Stale = n.address, n.capacity, n.stale
		}
		if rep.Role == RolePrimary {
			set.primary, rep.Token = i, l.token
		}
		set.replicas[i], set.load[i] = rep, r.loadOf(rep.ID)
		set.capacity += rep.Capacity
	}
	if fresh := r.freshOf(ids); len(fresh) < len(ids) {
		set.fresh = r.newReplicaSet(fresh, l)
	}
	return set
}

// pruneLoads forgets the in-flight counters of nodes that are neither listed nor in the map
// and have nothing in flight, so that a long-lived router's memory does not grow with every
// node that ever came and went. r.mu must be held.
func (r *Router) pruneLoads() {
	inMap := map[string]bool{}
	for _, set := range r.sets {
		for _, rep := range set.replicas {
			inMap[rep.ID] = true
		}
	}
	r.loads.Range(func(k, v any) bool {
		id := k.(string)
		if _, listed := r.nodes[assignment.NodeID(id)]; !listed && !inMap[id] && v.(*nodeLoad).n.Load() == 0 {
			r.loads.Delete(id)
		}
		return true
	})
}

// refreshNodes reads the node list at once, then every RefreshInterval unless the watch
// stream sends it, and whenever a map names a node the router does not know, until ctx
// ends. After a failure it tries again with backoff.
func (r *Router) refreshNodes(ctx context.Context, leader *dial.Follower) {
	b := newBackoff()
	for {
		start := time.Now()
		wait := r.cfg.RefreshInterval
		if r.pushed.Load() && !r.unknown.Load() {
			b.Reset() // the stream keeps the list: nothing to read
		} else if err := r.listNodes(ctx, leader); err != nil {
			if ctx.Err() != nil {
				return
			}
			wait = min(wait, b.NextBackOff())
			r.log.Warn("listing the nodes", "err", err, "retry_in", wait)
		} else {
			b.Reset()
		}
		if r.anyStale() || r.unknown.Load() {
			// Reads avoid a stale node: learn soon that it is fresh again. A node the map
			// names and the list did not: learn its address soon.
			wait = min(wait, staleRefreshInterval)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-r.kick:
			t.Stop()
			if !sleep(ctx, time.Until(start.Add(minRefreshGap))) {
				return
			}
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// listNodes reads the node list from the relay the map is watched from, or from the leader
// (when the router watches it, or the relay could not answer), and records it.
func (r *Router) listNodes(ctx context.Context, leader *dial.Follower) error {
	callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var resp *pb.ListNodesResponse
	err := errors.New("no relay")
	if conn := r.relayConn.Load(); conn != nil {
		resp, err = pb.NewAdminServiceClient(conn).ListNodes(callCtx, &pb.ListNodesRequest{})
	}
	if err != nil {
		conn := leader.Conn()
		resp, err = pb.NewAdminServiceClient(conn).ListNodes(callCtx, &pb.ListNodesRequest{}, grpc.WaitForReady(true))
		if status.Code(err) == codes.DeadlineExceeded && ctx.Err() == nil {
			leader.Renew(conn) // it may have gone to a leader that hangs
		}
	}
	if err != nil {
		return fmt.Errorf("client: listing the nodes: %w", err)
	}
	r.recordNodes(resp)
	return nil
}

// recordNodes records a node list, read or sent on the watch stream.
func (r *Router) recordNodes(resp *pb.ListNodesResponse) {
	nodes := make(map[assignment.NodeID]nodeInfo, len(resp.GetNodes()))
	for _, info := range resp.GetNodes() {
		n, err := wire.NodeFromProto(info.GetNode())
		if err != nil {
			r.log.Warn("the assigner lists a malformed node; ignoring it", "err", err)
			continue
		}
		nodes[n.ID] = nodeInfo{address: info.GetAddress(), capacity: n.Weight(), stale: info.GetStale()}
	}
	r.setNodes(nodes)
}
