package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/target"
)

// NodeConfig configures a Node.
type NodeConfig struct {
	// ID names the node: 1-128 letters, digits and . _ - :. A node that restarts keeps its ID
	// (and its store), so that it resumes where it stopped.
	ID string
	// Capacity weighs the load the node should carry relative to others; 0 means 1.
	Capacity float64
	// Address is where the node serves its application, for routers. Required.
	Address string
	Labels  map[string]string
	// Assigners are the addresses of the assigners (leader and standbys).
	Assigners []string
	// Target names the sharded service this node belongs to, one of the control plane's
	// targets (slicectl targets); "" is the default target. Its certificate, if it names a
	// target, must name this one.
	Target string

	// TLS is the node's mutual TLS with the assigners and its distributor; zero for
	// plaintext. Its certificate must name the node, spiffe://sliceplane/node/<ID>: the
	// servers let a node act only as itself, so NewNode refuses another identity at once.
	// The files are re-read when they change (rotation needs no restart).
	TLS TLS
	// Store holds the node's data. Required.
	Store Store
	// ReportInterval is the time between load reports; default 1 s.
	ReportInterval time.Duration
	// HotKeys is how many of its heaviest keys the node tracks and reports; default 16,
	// negative for none.
	HotKeys int
	// StallTimeout is how long the pull stream may stay silent before the node takes it for
	// dead, says so (log, Health, its heartbeats) and reconnects. Distributors send an idle
	// stream a heartbeat every dial.StreamHeartbeat; default 5 s.
	StallTimeout time.Duration
	// FreshnessBound is how far behind its source the node's data may be for the node to
	// answer from it (Fresh): the node must have heard from its distributor within the bound
	// and applied every change its distributor had read a bound ago; default 3 s.
	FreshnessBound time.Duration
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
}

// Node is a storage node's membership of Sliceplane: it registers with the assigner, pulls
// the deltas of its data from its distributor and applies them to its Store, and reports
// the load it serves. Run drives it; the other methods are safe to call at any time, from
// any goroutine.
type Node struct {
	*participant
	cfg NodeConfig

	mu      sync.Mutex
	dist    *pb.Distributor // nil until the assigner names one
	changed chan struct{}   // closed and replaced when dist changes

	cursor  atomic.Pointer[Cursor]
	clock   atomic.Uint64
	heard   atomic.Int64  // unix nanoseconds of the last message from a distributor; 0: none yet
	stalls  atomic.Uint64 // pull streams given up because they went silent
	loading atomic.Bool   // a snapshot has reset the store and has not reached a clock yet
	// drops counts the deltas that dropped data (a reset, a slice dropped), each counted
	// before its data goes: see ReadGuard.
	drops atomic.Uint64
	fresh lockedFreshness
}

// Health is what a node knows of its own data's freshness.
type Health struct {
	// Stale says the node's data may be behind its source: it has not heard from its
	// distributor within StallTimeout, or not at all since it started.
	Stale bool
	// Silence is how long the node has not heard from its distributor (since it started, if
	// it never did).
	Silence time.Duration
	// Stalls counts the pull streams the node gave up because they went silent.
	Stalls uint64
	// Loading says a snapshot is being applied: the store was reset and holds only part of
	// the node's data until the snapshot reaches its clock. Clock keeps the last clock
	// reached meanwhile, so Loading, not the clock, says the data is incomplete; a loading
	// node is Stale too.
	Loading bool
}

// Health returns the node's view of its data's freshness.
func (n *Node) Health() Health {
	now := time.Now()
	h := Health{Stalls: n.stalls.Load(), Silence: now.Sub(n.started)}
	heard := n.heard.Load()
	if heard != 0 {
		h.Silence = now.Sub(time.Unix(0, heard))
	}
	h.Loading = n.loading.Load()
	h.Stale = heard == 0 || h.Silence > n.cfg.StallTimeout || h.Loading
	return h
}

// Validate fills in the defaults of c and rejects a configuration no node can run with; it
// does no I/O (NewNode then reads the TLS files).
func (c *NodeConfig) Validate() error {
	if err := checkIDs(c.ID, c.Target); err != nil {
		return err
	}
	switch {
	case c.Store == nil:
		return errors.New("client: a node needs a Store")
	case len(c.Assigners) == 0:
		return errors.New("client: a node needs the assigners' addresses")
	case c.Address == "":
		// The assigner refuses such a registration: nobody could reach the node's slices.
		return errors.New("client: a node needs its Address, where routers reach it")
	case c.ReportInterval < 0:
		return fmt.Errorf("client: negative report interval %s", c.ReportInterval)
	case c.StallTimeout < 0:
		return fmt.Errorf("client: negative stall timeout %s", c.StallTimeout)
	case c.FreshnessBound < 0:
		return fmt.Errorf("client: negative freshness bound %s", c.FreshnessBound)
	}
	if c.FreshnessBound == 0 {
		c.FreshnessBound = 3 * time.Second
	}
	if c.StallTimeout == 0 {
		c.StallTimeout = 5 * time.Second
	}
	if c.ReportInterval == 0 {
		c.ReportInterval = time.Second
	}
	if c.HotKeys == 0 {
		c.HotKeys = 16
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// NewNode validates cfg and returns a node; Run starts it.
func NewNode(cfg NodeConfig) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	src, err := nodeTLS(cfg.ID, cfg.Target, cfg.TLS)
	if err != nil {
		return nil, err
	}
	p := newParticipant(participantConfig{ID: cfg.ID, Capacity: cfg.Capacity, Address: cfg.Address, Labels: cfg.Labels,
		Assigners: cfg.Assigners, Target: cfg.Target, ReportInterval: cfg.ReportInterval, HotKeys: cfg.HotKeys, Logger: cfg.Logger}, src)
	n := &Node{participant: p, cfg: cfg, changed: make(chan struct{})}
	p.beat, p.answered = n.beat, n.setDistributor
	n.cursor.Store(&Cursor{})
	n.fresh.f = newFreshness(cfg.FreshnessBound, n.started)
	return n, nil
}

// nodeTLS loads t and checks that its certificate names node id of target name: a
// certificate of another identity would have every call refused, as a node acting as another
// or in another target. The default target also takes a certificate that names no target.
func nodeTLS(id, name string, t TLS) (*mtls.Source, error) {
	src, err := t.load()
	if err != nil || src == nil {
		return nil, err
	}
	got := src.Identity()
	want := "spiffe://" + mtls.TrustDomain + "/target/" + target.Name(name) + "/node/" + id
	if target.Name(name) == target.Default && got.Target != target.Default {
		want = "spiffe://" + mtls.TrustDomain + "/node/" + id
	}
	if got.ID != want {
		return nil, fmt.Errorf("client: %w: node %q of target %q: the certificate %s names %s, not %s", ErrTLS, id, target.Name(name), t.Cert, got.ID, want)
	}
	return src, nil
}

// Clock returns the source clock the node's data reflects: every change up to it that
// belongs to the node's slices has been applied. It never goes back within a run, except
// when a snapshot completes at an earlier clock than the node had (its data is then that
// older state of the source). While a snapshot or a catch-up is under way it stays the
// last clock reached, though during a snapshot the store holds only part of the data.
func (n *Node) Clock() uint64 { return n.clock.Load() }

// Cursor returns the cursor of the last delta applied.
func (n *Node) Cursor() Cursor { return *n.cursor.Load() }

// Distributor returns the ID and address of the distributor the node pulls from, if the
// assigner named one.
func (n *Node) Distributor() (id, addr string, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dist.GetId(), n.dist.GetAddress(), n.dist != nil
}

// Run registers the node and keeps its data up to date until ctx ends; it returns nil then,
// or the error that stopped it (only a Store that fails does). It runs once. To leave
// gracefully, call Drain while Run runs and end Run once Drain returned.
func (n *Node) Run(ctx context.Context) error {
	if n.running.Load() {
		return errors.New("client: Node.Run called twice")
	}
	if err := n.restore(ctx); err != nil {
		return err
	}
	return n.run(ctx, "Node", n.pull)
}

// restore reads where the node stopped from its store: the cursor, and the ranges it was
// loading.
func (n *Node) restore(ctx context.Context) error {
	c, err := n.cfg.Store.Cursor(ctx)
	if err != nil {
		return fmt.Errorf("client: reading the stored cursor: %w", err)
	}
	set, err := storedLoading(ctx, n.cfg.Store)
	if err != nil {
		return err
	}
	n.cursor.Store(&c)
	n.pending.Store(&loadingState{set: set})
	return nil
}

// setDistributor records the distributor the assigner named.
func (n *Node) setDistributor(d *pb.Distributor) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if (n.dist == nil) == (d == nil) && n.dist.GetId() == d.GetId() && n.dist.GetAddress() == d.GetAddress() {
		return // the same: nothing to do
	}
	n.log.Info("distributor", "id", d.GetId(), "address", d.GetAddress())
	n.dist = d
	close(n.changed)
	n.changed = make(chan struct{})
}

// beat adds to a heartbeat what the node's data says of its freshness.
func (n *Node) beat(req *pb.HeartbeatRequest) {
	h := n.Health()
	fresh, why := n.Fresh()
	// A node beyond its freshness bound answers no reads: stale tells routers to go to the
	// slices' other replicas.
	req.Stale = h.Stale || !fresh
	if n.heard.Load() != 0 {
		req.Silence = durationpb.New(h.Silence)
	}
	if h.Stale {
		n.log.Warn("the node's data may be stale: its distributor is silent", "silence", h.Silence)
	} else if !fresh {
		n.log.Warn("the node's data is beyond its freshness bound", "reason", why)
	}
}

// errStore marks a failure of the Store, which ends Run.
type errStore struct{ error }

func (e errStore) Unwrap() error { return e.error }

// pull keeps pulling from the node's distributor until ctx ends or the Store fails.
func (n *Node) pull(ctx context.Context) error {
	b := newBackoff()
	for ctx.Err() == nil {
		n.mu.Lock()
		d, changed := n.dist, n.changed
		n.mu.Unlock()
		if d == nil {
			// Registered before any distributor did: ask the assigner again soon rather than
			// at the next heartbeat, which may be seconds away.
			n.askAssigner()
			select {
			case <-changed:
			case <-ctx.Done():
			case <-time.After(b.NextBackOff()):
			}
			continue
		}
		progressed, err := n.pullFrom(ctx, d, changed)
		var se errStore
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &se):
			return se.error
		case errors.Is(err, dial.ErrSilent):
			n.stalls.Add(1)
			n.log.Warn("the pull stream went silent; reconnecting", "distributor", d.GetId(), "timeout", n.cfg.StallTimeout)
			n.askAssigner()
		case status.Code(err) == codes.FailedPrecondition:
			n.log.Info("the distributor does not serve this node; asking the assigner", "distributor", d.GetId(), "err", err)
			n.askAssigner()
		case err != nil:
			// The distributor may be gone for good: the assigner knows where to go next.
			n.log.Info("pull stream ended; reconnecting", "distributor", d.GetId(), "err", err)
			n.askAssigner()
		}
		if progressed {
			b.Reset()
		}
		select {
		case <-changed: // a new distributor: go at once
		default:
			sleep(ctx, b.NextBackOff())
		}
	}
	return nil
}

// pullFrom pulls from distributor d until the stream fails, ctx ends or changed is closed
// (the assigner named another distributor). It reports whether any delta was applied.
//
// Only the stream ends when the distributor changes: a delta received is applied under ctx,
// whole. Cut short, the Store's Begin would fail with the stream's cancellation, a failure
// of the Store that ends Run: a node whose distributor moved while its store was slow left
// the cluster.
func (n *Node) pullFrom(ctx context.Context, d *pb.Distributor, changed <-chan struct{}) (progressed bool, err error) {
	pullCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-changed:
			cancel()
		case <-pullCtx.Done():
		}
	}()
	conn, err := dial.Peer(d.GetAddress(), append(dial.Target(n.cfg.Target), n.tls.DialOption("distributor"))...)
	if err != nil {
		return false, fmt.Errorf("client: distributor %s: %w", d.GetId(), err)
	}
	defer conn.Close()
	// Distributors send an idle stream heartbeats: a stream silent for StallTimeout is
	// dead, though its connection may look open (a stalled link holds bytes, resets nothing).
	streamCtx, watchdog := dial.NewWatchdog(pullCtx, n.cfg.StallTimeout)
	defer watchdog.Stop()
	watchdog.Waiting() // the stream's start counts: a distributor that never answers is dead too
	stream, err := pb.NewDistributorServiceClient(conn).Pull(streamCtx)
	if err != nil {
		return false, err
	}
	cur := n.Cursor()
	start := &pb.PullStart{NodeId: n.cfg.ID, Cursor: &pb.Cursor{Epoch: cur.Epoch, Index: cur.Index}}
	if err := stream.Send(&pb.PullRequest{Request: &pb.PullRequest_Start{Start: start}}); err != nil {
		return false, err
	}
	for {
		resp, err := dial.Receive(watchdog, stream.Recv)
		if err != nil {
			return progressed, err
		}
		n.heard.Store(time.Now().UnixNano())
		delta, err := deltaFromProto(resp.GetDelta())
		if err != nil {
			return progressed, fmt.Errorf("client: from distributor %s: %w", d.GetId(), err)
		}
		if err := n.apply(ctx, delta); err != nil {
			return progressed, err
		}
		silence := time.Duration(resp.GetDelta().GetSourceSilenceMs()) * time.Millisecond
		n.fresh.heardFrom(time.Now(), resp.GetDelta().GetSourceClock(), silence, n.clock.Load(), n.loading.Load())
		progressed = true
		if len(delta.Ops) > 0 {
			ack := &pb.Cursor{Epoch: delta.Epoch, Index: delta.To}
			if err := stream.Send(&pb.PullRequest{Request: &pb.PullRequest_Ack{Ack: ack}}); err != nil {
				return progressed, err
			}
		}
	}
}

// apply checks that a delta continues what the node applied, applies it and records where
// the node stands.
func (n *Node) apply(ctx context.Context, d Delta) error {
	cur := n.Cursor()
	if len(d.Ops) == 0 && d.Slices == nil && d.Epoch != cur.Epoch {
		// A heartbeat of a stream that prepares the node's snapshot: it says only that the
		// stream lives.
		return nil
	}
	switch {
	case d.Epoch != cur.Epoch && (d.From != 0 || len(d.Ops) == 0 || d.Ops[0].Kind != OpReset):
		return fmt.Errorf("client: a delta of epoch %x does not start a snapshot, and the node is in epoch %x", d.Epoch, cur.Epoch)
	case d.Epoch == cur.Epoch && d.From != cur.Index:
		return fmt.Errorf("client: a delta from %d, and the node applied up to %d", d.From, cur.Index)
	}
	if d.Slices != nil {
		n.load.setSlices(d.Slices)
		// A stream that resumes says where the node stands: a node that restarted forgot it.
		n.pending.Store(&loadingState{set: n.pending.Load().set, held: setOf(d.Slices), gen: d.Generation})
	}
	if len(d.Ops) > 0 {
		p := n.pending.Load()
		set, held, loaded := nextLoading(p.set, p.held, d.Ops)
		if gone, ok := dropping(d.Ops); ok {
			// The store's data goes before the node's state can say so: until it does, the
			// ranges the delta drops count as loading, so that no reader takes a key it
			// finds missing for one the node serves (I7; see ReadGuard).
			n.drops.Add(1)
			n.pending.Store(&loadingState{set: p.set.Union(gone), held: p.held, gen: p.gen})
		}
		if err := commitDelta(ctx, n.cfg.Store, d, set, !set.Equal(p.set)); err != nil {
			n.pending.Store(p) // the batch was not committed: nothing was dropped
			return errStore{err}
		}
		n.pending.Store(&loadingState{set: set, held: held, gen: d.Generation})
		if loaded {
			n.loadedSoon()
		}
		if d.Ops[0].Kind == OpReset {
			n.loading.Store(true)
		}
		for _, op := range d.Ops {
			if op.Kind == OpSetSlices {
				n.load.setSlices(op.Slices)
			}
		}
		n.cursor.Store(&Cursor{Epoch: d.Epoch, Index: d.To})
	}
	// A delta without a clock leaves the node's data in no state of the source yet: a
	// snapshot not whole, or a stream resumed behind the end of its queue. The node keeps
	// the last clock it reached: its clock must not go back to 0 for the span of a snapshot
	// or a catch-up, which would take a healthy node for one that knows nothing.
	if d.Clock > 0 {
		n.clock.Store(d.Clock)
		n.loading.Store(false)
	}
	return nil
}

// ReadGuard brackets an application's read of its store for one key, so that a key it finds
// missing is answered "not found" only if the node held the key's data all along: a slice
// can leave the node (its handoff ended, a snapshot began) between the check and the read.
// Take it with GuardRead before reading, and ask Unchanged after a read that found nothing:
//
//	g := node.GuardRead(key)
//	if !g.Serving() { /* send the reader to the slice's replicas */ }
//	item, ok := store.Get(key)
//	if !ok && !g.Unchanged() { /* the same: the slice may have left meanwhile */ }
//
// A read that found the item may answer it either way: the item was there.
type ReadGuard struct {
	n       *Node
	key     []byte
	drops   uint64
	serving bool
}

// GuardRead returns a guard for a read of key, taken now.
func (n *Node) GuardRead(key []byte) ReadGuard {
	drops := n.drops.Load()
	return ReadGuard{n: n, key: key, drops: drops, serving: n.Serving(key)}
}

// Serving reports whether the node served the key when the guard was taken (Node.Serving).
func (g ReadGuard) Serving() bool { return g.serving }

// Unchanged reports whether the node served the key when the guard was taken and still
// does, and no data left the node in between: what its store said of the key then is what
// the node holds.
func (g ReadGuard) Unchanged() bool {
	return g.serving && g.n.drops.Load() == g.drops && g.n.Serving(g.key)
}
