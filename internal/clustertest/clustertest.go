// Package clustertest runs a whole Sliceplane in one test process, on loopback: an embedded
// etcd, assigners, distributors and nodes, each with its own etcd client or gRPC
// connections as separate processes would have. Tests stop and restart the parts, write
// data, and wait for the nodes to converge.
//
// New ties a Cluster to a test, which fails when a part does and closes the cluster when it
// ends. Start runs one for code that has no test, such as runnable examples, and Close
// stops it.
package clustertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"
	"github.com/sliceplane/sliceplane/internal/target"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/memstore"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/converge"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/distributor"
	"github.com/sliceplane/sliceplane/internal/embedetcd"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/source/postgres"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// Options tune the parts a Cluster starts.
type Options struct {
	Assigner    func(*assigner.Config)
	Distributor func(*distributor.Config)
	Node        func(*client.NodeConfig)
	// TLS runs the gRPC links with mutual TLS, every part with a certificate of its own from
	// a throwaway CA (Cluster.PKI): assigner-a<i>, distributor-<id>, node-<id>, and the
	// cluster's own admin-clustertest for Conn; the servers authorize every call (package
	// authz). The functions above see the TLS set and may change it. Etcd stays plaintext
	// on loopback.
	TLS bool
	// Postgres, a DSN, keeps the items in that database's default table (created) instead
	// of etcd: the assigner follows its clock, each distributor reads it through a slot of
	// its own, and Cluster.Source writes to it.
	Postgres string
}

// Cluster is a running Sliceplane.
type Cluster struct {
	t    reporter
	own  *standalone // nil for a cluster of New: its test closes it
	opts Options
	Etcd *embedetcd.Server
	// Source is the data source: the etcd prefix /sliceplane/data/, on its own client, or
	// the table of Options.Postgres.
	Source source.Writer
	// PKI is the CA and the certificate files of a cluster run with Options.TLS, nil
	// otherwise. Issuing a part's certificate again (PKI.Config) rotates it in place.
	PKI *mtlstest.PKI
	log *slog.Logger

	mu           sync.Mutex
	assigners    []*Part
	distributors map[string]*Part
	nodes        map[string]*Node
	conn         *grpc.ClientConn // to the leader, made at first use
}

// Part is a running assigner or distributor.
type Part struct {
	Addr string
	// TLS is the part's certificate source with Options.TLS, nil otherwise.
	TLS  *mtls.Source
	stop func()
}

// Stop stops the part and waits for it; stopping twice does nothing.
func (p *Part) Stop() { p.stop() }

// Store is what a node of a Cluster holds its data in: the checker reads it back.
type Store interface {
	client.Store
	client.Reader
}

// Node is a running node and its store, which outlives it.
type Node struct {
	ID    string
	Store Store
	*client.Node
	stop func()
}

// Stop stops the node (its store keeps what it applied).
func (n *Node) Stop() { n.stop() }

// New starts an embedded etcd and one assigner for test t, and stops them when it ends.
func New(t testing.TB, opts Options) *Cluster {
	t.Helper()
	c := &Cluster{t: t, opts: opts, Etcd: etcdtest.Start(t)}
	if opts.TLS {
		c.PKI = mtlstest.New(t)
	}
	c.init()
	return c
}

// Start starts an embedded etcd and one assigner, as New does, outside any test; Close
// stops them. Ctx bounds the etcd's start. It does not run Options.TLS, whose certificates
// live in a test's directory. The other methods of the Cluster panic where a test's cluster
// would fail the test.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.TLS {
		return nil, errors.New("clustertest: Start runs no TLS; use New")
	}
	own := &standalone{}
	c = &Cluster{t: own, own: own, opts: opts}
	defer func() {
		if err == nil {
			err = own.recover(recover())
		}
		if err != nil {
			c, err = nil, errors.Join(err, own.close())
		}
	}()
	dir, err := os.MkdirTemp("", "clustertest-")
	if err != nil {
		return nil, fmt.Errorf("clustertest: %w", err)
	}
	own.Cleanup(func() { os.RemoveAll(dir) })
	c.Etcd, err = embedetcd.Start(ctx, embedetcd.Options{Dir: dir, Fast: true, LogLevel: "fatal"})
	if err != nil {
		return nil, fmt.Errorf("clustertest: %w", err)
	}
	own.Cleanup(c.Etcd.Close)
	c.init()
	return c, nil
}

// Close stops a cluster of Start, every part it started and its etcd, and returns the
// errors the parts ended with. The test of a cluster of New closes it: Close does nothing.
func (c *Cluster) Close() error {
	if c.own == nil {
		return nil
	}
	return c.own.close()
}

// init starts what New and Start share once the etcd serves: the source and an assigner.
func (c *Cluster) init() {
	c.distributors, c.nodes = map[string]*Part{}, map[string]*Node{}
	c.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("SLICEPLANE_TEST_LOG") != "" {
		c.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	c.Source = source.NewEtcd(c.client(), "/sliceplane/data/")
	if c.opts.Postgres != "" {
		c.Source = c.postgres("")
	}
	c.StartAssigner()
}

// postgres opens the PostgreSQL source of Options.Postgres, through slot, closed with the
// cluster; the first call creates the table.
func (c *Cluster) postgres(slot string) *postgres.Source {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := postgres.Config{DSN: c.opts.Postgres, Slot: slot, Logger: c.log.With("part", "postgres")}
	if err := postgres.Init(ctx, cfg); err != nil {
		c.t.Fatalf("clustertest: %v", err)
	}
	s, err := postgres.Open(ctx, cfg)
	if err != nil {
		c.t.Fatalf("clustertest: %v", err)
	}
	c.t.Cleanup(s.Close)
	return s
}

// client returns a new etcd client, closed with the cluster.
func (c *Cluster) client() *clientv3.Client {
	c.t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Etcd.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.t.Fatalf("clustertest: etcd client: %v", err)
	}
	c.t.Cleanup(func() { cli.Close() })
	return cli
}

// run runs fn until the returned stop is called (or the cluster closes), reporting its error.
func (c *Cluster) run(what string, fn func(ctx context.Context) error) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				c.t.Errorf("%s: %v", what, err)
			}
		})
	}
	c.t.Cleanup(stop)
	return stop
}

// sessionTTL is the lease of every part. Parts stop gracefully here, revoking their leases, so
// a long TTL slows no test down; a short one lets a lease lapse on a loaded machine (the race
// detector on two cores), which costs an election in the middle of a scenario.
const sessionTTL = 5 * time.Second

// StartAssigner starts an assigner with fast intervals.
func (c *Cluster) StartAssigner() *Part {
	c.t.Helper()
	cfg := assigner.Config{
		Client: c.client(), PassInterval: 100 * time.Millisecond, ClockInterval: 10 * time.Millisecond, SessionTTL: sessionTTL,
		Core:   core.Config{NodeTTL: 2 * sessionTTL, Estimator: load.EstimatorConfig{HalfLife: 200 * time.Millisecond}},
		Logger: c.log.With("part", "assigner"),
	}
	c.mu.Lock()
	name := fmt.Sprintf("a%d", len(c.assigners))
	c.mu.Unlock()
	cfg.TLS = c.source("assigner", name)
	if c.opts.Postgres != "" {
		cfg.Source = c.postgres("")
	}
	if c.opts.Assigner != nil {
		c.opts.Assigner(&cfg)
	}
	srv, err := assigner.New(cfg)
	if err != nil {
		c.t.Fatalf("clustertest: %v", err)
	}
	p := &Part{Addr: srv.Addr(), TLS: cfg.TLS, stop: c.run("assigner", srv.Run)}
	c.mu.Lock()
	c.assigners = append(c.assigners, p)
	c.mu.Unlock()
	return p
}

// Assigners returns the addresses of every assigner started.
func (c *Cluster) Assigners() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, p := range c.assigners {
		out = append(out, p.Addr)
	}
	return out
}

// StartDistributor starts distributor id.
func (c *Cluster) StartDistributor(id string) *Part {
	c.t.Helper()
	cfg := distributor.Config{ID: id, Client: c.client(), Assigners: c.Assigners(), SessionTTL: sessionTTL,
		ClockInterval: 10 * time.Millisecond, Logger: c.log.With("part", "distributor"), TLS: c.source("distributor", id)}
	if c.opts.Postgres != "" {
		cfg.Source = c.postgres(postgres.SlotName(id))
	}
	if c.opts.Distributor != nil {
		c.opts.Distributor(&cfg)
	}
	srv, err := distributor.New(cfg)
	if err != nil {
		c.t.Fatalf("clustertest: %v", err)
	}
	p := &Part{Addr: srv.Addr(), TLS: cfg.TLS, stop: c.run("distributor "+id, srv.Run)}
	c.mu.Lock()
	c.distributors[id] = p
	c.mu.Unlock()
	return p
}

// StartNode starts node id on store (a new memstore if nil).
func (c *Cluster) StartNode(id string, store Store) *Node {
	c.t.Helper()
	if store == nil {
		store = memstore.New()
	}
	cfg := client.NodeConfig{ID: id, Assigners: c.Assigners(), Store: store, ReportInterval: 100 * time.Millisecond,
		Address: "127.0.0.1:1", Logger: c.log.With("part", "node")}
	if c.PKI != nil {
		f := c.PKI.Config("node", id)
		cfg.TLS = client.TLS{Cert: f.Cert, Key: f.Key, CA: f.CA}
	}
	if c.opts.Node != nil {
		c.opts.Node(&cfg)
	}
	n, err := client.NewNode(cfg)
	if err != nil {
		c.t.Fatalf("clustertest: %v", err)
	}
	node := &Node{ID: id, Store: store, Node: n}
	node.stop = c.run("node "+id, n.Run)
	c.mu.Lock()
	c.nodes[id] = node
	c.mu.Unlock()
	return node
}

// source issues a certificate for kind/name with Options.TLS and loads it; nil without.
func (c *Cluster) source(kind, name string) *mtls.Source {
	if c.PKI == nil {
		return nil
	}
	return c.PKI.Source(kind, name)
}

// Distributors returns the distributors started last under each ID.
func (c *Cluster) Distributors() map[string]*Part {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.distributors)
}

// Nodes returns the nodes started last under each ID.
func (c *Cluster) Nodes() map[string]*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.nodes)
}

// Conn returns the cluster's connection to the leading assigner, closed with the cluster.
// It follows the assigners started before its first use.
func (c *Cluster) Conn() *grpc.ClientConn {
	c.t.Helper()
	addrs := c.Assigners()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		conn, err := dial.Leader(addrs, c.source("admin", "clustertest").DialOption("assigner"))
		if err != nil {
			c.t.Fatalf("clustertest: %v", err)
		}
		c.t.Cleanup(func() { conn.Close() })
		c.conn = conn
	}
	return c.conn
}

// Assignment returns the leader's map and the clock of its last quantum.
func (c *Cluster) Assignment(ctx context.Context) (*assignment.Assignment, uint64, error) {
	resp, err := pb.NewAssignmentServiceClient(c.Conn()).GetAssignment(ctx, &pb.GetAssignmentRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return nil, 0, fmt.Errorf("clustertest: getting the map: %w", err)
	}
	a, err := wire.AssignmentFromProto(resp.GetAssignment())
	return a, resp.GetClock(), err
}

// fenceKey is the item WaitConverged writes to mark a clock every node must reach.
var fenceKey = []byte("clustertest-fence")

// WaitConverged waits until the nodes hold exactly what they must (converge.Wait), or ctx
// ends; it returns the last report. Writers must have stopped, and the map should be still
// (balancing frozen) for the wait to end: it checks against one map at a time.
func (c *Cluster) WaitConverged(ctx context.Context) (converge.Report, error) {
	return converge.Wait(ctx, c.Source, inProcess{c}, 100*time.Millisecond)
}

// inProcess is what converge.Wait needs, read from the nodes' stores directly.
type inProcess struct{ c *Cluster }

func (p inProcess) Fence(ctx context.Context) (uint64, error) {
	return p.c.Source.Put(ctx, fenceKey, []byte(time.Now().String()))
}

func (p inProcess) Map(ctx context.Context) (*assignment.Assignment, error) {
	a, _, err := p.c.Assignment(ctx)
	return a, err
}

func (p inProcess) Nodes(context.Context) (map[assignment.NodeID]converge.Node, error) {
	out := map[assignment.NodeID]converge.Node{}
	for id, n := range p.c.Nodes() {
		out[assignment.NodeID(id)] = converge.Node{Clock: n.Clock(), Reader: n.Store}
	}
	return out, nil
}

// WaitClock waits until every running node applied clock, or ctx ends.
func (c *Cluster) WaitClock(ctx context.Context, clock uint64) error {
	for {
		var behind []string
		for id, n := range c.Nodes() {
			if n.Clock() < clock {
				behind = append(behind, fmt.Sprintf("%s at %d", id, n.Clock()))
			}
		}
		if len(behind) == 0 {
			return nil
		}
		slices.Sort(behind)
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("clustertest: nodes did not reach clock %d: %v: %w", clock, behind, ctx.Err())
		}
	}
}

// reporter is what a Cluster needs of testing.TB: a test's, or a standalone for Start.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(fn func())
}

// standalone reports for a cluster of Start: it keeps the errors and the cleanups for Close,
// and turns a fatal failure into a panic, which Start recovers into its error.
type standalone struct {
	mu       sync.Mutex
	errs     []error
	cleanups []func()
}

// fatal is the panic value of standalone.Fatalf; a panic that nothing recovers prints it.
type fatal struct{ err error }

func (f fatal) Error() string { return f.err.Error() }

func (s *standalone) Helper() {}

func (s *standalone) Errorf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs = append(s.errs, fmt.Errorf(format, args...))
}

func (s *standalone) Fatalf(format string, args ...any) { panic(fatal{fmt.Errorf(format, args...)}) }

func (s *standalone) Cleanup(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, fn)
}

// recover returns the error of a Fatalf panic r (nil for none), and panics again with any
// other value.
func (s *standalone) recover(r any) error {
	if r == nil {
		return nil
	}
	if f, ok := r.(fatal); ok {
		return f.err
	}
	panic(r)
}

// close runs the cleanups, the last registered first as a test does, and returns the errors
// reported.
func (s *standalone) close() error {
	for {
		s.mu.Lock()
		n := len(s.cleanups)
		if n == 0 {
			errs := s.errs
			s.errs = nil
			s.mu.Unlock()
			return errors.Join(errs...)
		}
		fn := s.cleanups[n-1]
		s.cleanups = s.cleanups[:n-1]
		s.mu.Unlock()
		fn() // unlocked: stopping a part reports its error
	}
}

// StandbyAddress returns a free loopback address at which an assigner started beside the
// assigners at addrs does not own the default target (target.Rank): it stands by, as an
// assigner added to a cluster of one target did before targets, instead of taking the
// target over once it is queued in the election.
func StandbyAddress(t testing.TB, addrs ...string) string {
	t.Helper()
	for range 100 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("clustertest: %v", err)
		}
		addr := lis.Addr().String()
		lis.Close()
		if target.Rank(target.Default, append(slices.Clone(addrs), addr))[0] != addr {
			return addr
		}
	}
	t.Fatal("clustertest: no free address ranks below the assigners")
	return ""
}
