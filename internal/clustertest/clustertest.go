// Package clustertest runs a whole Sliceplane in one test process, on loopback: an embedded
// etcd, assigners, distributors and nodes, each with its own etcd client or gRPC
// connections as separate processes would have. Tests stop and restart the parts, write
// data, and wait for the nodes to converge.
package clustertest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
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
}

// Cluster is a running Sliceplane.
type Cluster struct {
	t    testing.TB
	opts Options
	Etcd *embedetcd.Server
	// Source is the data source, on its own etcd client.
	Source *source.Etcd
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

// New starts an embedded etcd and one assigner.
func New(t testing.TB, opts Options) *Cluster {
	t.Helper()
	c := &Cluster{t: t, opts: opts, Etcd: etcdtest.Start(t), distributors: map[string]*Part{}, nodes: map[string]*Node{}}
	c.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("SLICEPLANE_TEST_LOG") != "" {
		c.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	c.Source = source.NewEtcd(c.client(), "/sliceplane/data/")
	if opts.TLS {
		c.PKI = mtlstest.New(t)
	}
	c.StartAssigner()
	return c
}

// client returns a new etcd client, closed when the test ends.
func (c *Cluster) client() *clientv3.Client { return etcdtest.Client(c.t, c.Etcd) }

// run runs fn until the returned stop is called (or the test ends), reporting its error.
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
		Core:   assigner.CoreConfig{NodeTTL: 2 * sessionTTL, Estimator: load.EstimatorConfig{HalfLife: 200 * time.Millisecond}},
		Logger: c.log.With("part", "assigner"),
	}
	c.mu.Lock()
	name := fmt.Sprintf("a%d", len(c.assigners))
	c.mu.Unlock()
	cfg.TLS = c.source("assigner", name)
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

// Conn returns the cluster's connection to the leading assigner, closed when the test ends.
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
