package assigner_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"
	"github.com/sliceplane/sliceplane/internal/target"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/embedetcd"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/wire"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChild() // the assigner process of BenchmarkAssignerScale
		return
	}
	if os.Getenv(targetsChildEnv) != "" {
		runTargetsChild() // an assigner process of BenchmarkAssignerTargets
		return
	}
	goleak.VerifyTestMain(m, etcdtest.ClusterLeaks()...)
}

// cluster is an etcd and the assigners started on it.
type cluster struct {
	t    *testing.T
	etcd *embedetcd.Server
	cli  *clientv3.Client
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	s := etcdtest.Start(t)
	return &cluster{t: t, etcd: s, cli: etcdtest.Client(t, s)}
}

// node is a running assigner.
type node struct {
	srv      *assigner.Server
	conn     *grpc.ClientConn
	registry *prometheus.Registry
	stop     func()
	assign   pb.AssignmentServiceClient
	quanta   pb.QuantaServiceClient
	nodes    pb.NodeServiceClient
	admin    pb.AdminServiceClient
}

type tweak func(*assigner.Config)

// start starts an assigner with fast intervals; stop (also at cleanup) stops it.
func (c *cluster) start(tweaks ...tweak) *node {
	c.t.Helper()
	return c.startAs(grpc.WithTransportCredentials(insecure.NewCredentials()), tweaks...)
}

// startAs starts an assigner as start does, its clients dialing with creds.
func (c *cluster) startAs(creds grpc.DialOption, tweaks ...tweak) *node {
	c.t.Helper()
	reg := prometheus.NewRegistry()
	cfg := assigner.Config{
		Client: c.cli, PassInterval: 50 * time.Millisecond, ClockInterval: 10 * time.Millisecond, SessionTTL: time.Second,
		// The harness's nodes are stand-ins that load nothing: moves take effect at once
		// unless a test asks for make-before-break.
		Core: core.Config{NodeTTL: 2 * time.Second, Estimator: load.EstimatorConfig{HalfLife: 100 * time.Millisecond},
			BreakBeforeMake: true},
		Logger:   testLogger(),
		Registry: reg,
	}
	for _, tw := range tweaks {
		tw(&cfg)
	}
	srv, err := assigner.New(cfg)
	require.NoError(c.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	conn, err := grpc.NewClient(srv.Addr(), creds)
	require.NoError(c.t, err)
	var once sync.Once
	n := &node{srv: srv, conn: conn, registry: reg,
		assign: pb.NewAssignmentServiceClient(conn), quanta: pb.NewQuantaServiceClient(conn),
		nodes: pb.NewNodeServiceClient(conn), admin: pb.NewAdminServiceClient(conn)}
	n.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				c.t.Errorf("assigner run: %v", err)
			}
			conn.Close()
		})
	}
	c.t.Cleanup(n.stop)
	return n
}

// testLogger discards the assigner's logs, unless SLICEPLANE_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("SLICEPLANE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// leading waits until n leads.
func (n *node) leading(t *testing.T) *pb.StatusResponse {
	t.Helper()
	var st *pb.StatusResponse
	eventually(t, 15*time.Second, "the assigner leads", func() bool {
		var err error
		st, err = n.admin.Status(context.Background(), &pb.StatusRequest{})
		return err == nil && st.GetLeader()
	})
	return st
}

// owner waits until the owner of the default target among nodes (target.Rank) leads it, as
// it does once every one of them is up, and returns it and the others.
func owner(t *testing.T, nodes ...*node) (*node, []*node) {
	t.Helper()
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.srv.Addr()
	}
	first := target.Rank(target.Default, addrs)[0]
	i := slices.Index(addrs, first)
	nodes[i].leading(t)
	return nodes[i], slices.Delete(slices.Clone(nodes), i, i+1)
}

func (n *node) hasMap() bool {
	_, err := n.assign.GetAssignment(context.Background(), &pb.GetAssignmentRequest{})
	return err == nil
}

func (n *node) assignment(t *testing.T) *assignment.Assignment {
	t.Helper()
	resp, err := n.assign.GetAssignment(ctxT(t, 5*time.Second), &pb.GetAssignmentRequest{})
	require.NoError(t, err)
	a, err := wire.AssignmentFromProto(resp.GetAssignment())
	require.NoError(t, err)
	return a
}

// density is the load of the space, per unit of its fraction: a hot band [0, hotEnd)
// carries hotShare of all load, the rest is even.
type density struct {
	hotEnd   uint64
	hotShare float64
	total    float64
}

// of returns the load of range r.
func (d density) of(r keyspace.Range) float64 {
	hot := keyspace.Range{Start: 0, End: keyspace.At(d.hotEnd)}
	cold := keyspace.Range{Start: d.hotEnd, End: keyspace.End}
	var l float64
	if o, ok := r.Intersect(hot); ok {
		l += d.total * d.hotShare * o.Width() / hot.Width()
	}
	if o, ok := r.Intersect(cold); ok {
		l += d.total * (1 - d.hotShare) * o.Width() / cold.Width()
	}
	return l
}

// imbalance is the true imbalance of a under d.
func (d density) imbalance(a *assignment.Assignment, ids []assignment.NodeID) float64 {
	loads := make([]float64, a.Len())
	for i, s := range a.All() {
		loads[i] = d.of(s.Range)
	}
	ns := make([]assignment.Node, len(ids))
	for i, id := range ids {
		ns[i] = assignment.Node{ID: id}
	}
	return load.Imbalance(load.NodeLoads(a, loads, assignment.MustNodeSet(ns...)))
}

// fleet simulates storage nodes: each registers, then every tick reports, for each slice it
// holds in the current map, its share of the slice's load under d. It follows the leader
// among the given assigners.
type fleet struct {
	ids    []assignment.NodeID
	d      density
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startFleet(t *testing.T, d density, n int, assigners ...*node) *fleet {
	t.Helper()
	f := &fleet{d: d, ids: fleetIDs(n)}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	for _, id := range f.ids {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.run(ctx, id, assigners)
		}()
	}
	t.Cleanup(f.stop)
	return f
}

// fleetIDs returns the IDs of a fleet of n nodes.
func fleetIDs(n int) []assignment.NodeID {
	ids := make([]assignment.NodeID, n)
	for i := range ids {
		ids[i] = assignment.NodeID(fmt.Sprintf("node-%d", i))
	}
	return ids
}

// preRegister registers ids, and freezes balancing if reason is not empty, with an assigner
// that then goes before it makes a map: the next leader's first map is made over all of them.
// Else the first pass after the first registration makes it, over the nodes registered by
// then; passes are 50 ms apart here, and a busy machine can take longer to register a few
// nodes. (A first map over one node of four keeps three quarters of the space on it: slices of
// a quarter of the keys each cost more than the churn budget allows a pass to move.)
func (c *cluster) preRegister(t *testing.T, ids []assignment.NodeID, reason string) {
	t.Helper()
	// Without passes, nodes do not expire either (expiry runs with the passes).
	setUp := c.start(small, func(c *assigner.Config) { c.PassInterval = time.Hour })
	setUp.leading(t)
	ctx := ctxT(t, 30*time.Second)
	if reason != "" {
		_, err := setUp.admin.Freeze(ctx, &pb.FreezeRequest{Reason: reason})
		require.NoError(t, err)
	}
	for _, id := range ids {
		_, err := setUp.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: string(id)}, Address: "127.0.0.1:1"})
		require.NoError(t, err)
	}
	require.False(t, setUp.hasMap(), "no pass has run")
	setUp.stop()
}

func (f *fleet) stop() {
	f.cancel()
	f.wg.Wait()
}

func (f *fleet) run(ctx context.Context, id assignment.NodeID, assigners []*node) {
	registered := map[*node]bool{}
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, a := range assigners {
			if !registered[a] {
				_, err := a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: string(id)}, Address: "127.0.0.1:1"})
				if err != nil {
					continue // a standby, or a stopped one
				}
				registered[a] = true
			}
			resp, err := a.assign.GetAssignment(ctx, &pb.GetAssignmentRequest{})
			if err != nil {
				if status.Code(err) == codes.Unavailable {
					registered[a] = false // re-register with whoever leads next
				}
				continue
			}
			m, err := wire.AssignmentFromProto(resp.GetAssignment())
			if err != nil {
				continue
			}
			r := load.Report{Node: id, Window: time.Second}
			for _, s := range m.All() {
				if s.Holds(id) {
					r.Samples = append(r.Samples, load.Sample{Range: s.Range, Load: f.d.of(s.Range) / float64(len(s.Replicas))})
				}
			}
			if _, err := a.nodes.ReportLoad(ctx, wire.ReportToProto(r)); status.Code(err) == codes.NotFound {
				registered[a] = false
			}
		}
	}
}

func code(err error) codes.Code { return status.Code(err) }

// metric returns the value of a gauge or counter of n, the one with a label of value label
// if label is not empty.
func metric(n *node, name, label string) (float64, error) {
	families, err := n.registry.Gather()
	if err != nil {
		return 0, err
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if label != "" && (len(m.GetLabel()) == 0 || m.GetLabel()[0].GetValue() != label) {
				continue
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue(), nil
			}
			return m.GetCounter().GetValue(), nil
		}
	}
	return 0, fmt.Errorf("no metric %s{%s}", name, label)
}

func assertHealth(t *testing.T, conn *grpc.ClientConn, service string) {
	t.Helper()
	resp, err := healthpb.NewHealthClient(conn).Check(ctxT(t, 5*time.Second), &healthpb.HealthCheckRequest{Service: service})
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.GetStatus())
}

// recv returns the next message of a watch that carries a quantum, skipping the heartbeats
// an idle stream carries.
func recv[T interface{ GetHeartbeat() bool }](w interface{ Recv() (T, error) }) (T, error) {
	for {
		m, err := w.Recv()
		if err != nil || !m.GetHeartbeat() {
			return m, err
		}
	}
}
