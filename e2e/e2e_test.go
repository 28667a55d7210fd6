// Package e2e_test runs Sliceplane as separate processes built from this module (two
// assigners, two distributors, three nodes of the example key-value store) and breaks it
// with kill -9, driving it only through its public gRPC API, slicectl and the nodes' HTTP
// API; after each failure the convergence checker must find nothing lost or leaked.
package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvcheck"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvcluster"
	"github.com/sliceplane/sliceplane/examples/kvstore/loadgen"
	"github.com/sliceplane/sliceplane/internal/converge"
	"github.com/sliceplane/sliceplane/internal/embedetcd"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/testchild"
)

func TestMain(m *testing.M) {
	var spec routerSpec
	testchild.Main(routerChildEnv, &spec, routerJob(&spec))
	goleak.VerifyTestMain(m)
}

// patience bounds every wait of the scenario; it is long because the machine may be busy
// with other packages' tests.
const patience = 2 * time.Minute

type scenario struct {
	t       *testing.T
	ctx     context.Context
	bin     string
	cluster *kvcluster.Cluster
	src     source.Writer
	writer  *writer.Writer
	written int
	// pki made every process's certificate; admin is the files of slicectl's, an admin's.
	pki   *launch.PKI
	admin mtls.Config
}

func (s *scenario) slicectl(args ...string) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	flags := append([]string{"--assigner", strings.Join(s.cluster.Assigners(), ",")}, launch.TLSArgs(s.admin)...)
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, "slicectl"), append(flags, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := launch.Run(cmd); err != nil {
		s.t.Fatalf("slicectl %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errOut.String())
	}
	return out.String()
}

// write writes n new items and rewrites some old ones.
func (s *scenario) write(n int) {
	s.t.Helper()
	var items []writer.Item
	for i := s.written; i < s.written+n; i++ {
		k := loadgen.Key(i)
		items = append(items, writer.Item{Key: k, Value: fmt.Appendf(nil, "v%d", i), HasValue: true})
		if i%10 == 9 && i > 100 { // and rewrite an old one
			items = append(items, writer.Item{Key: loadgen.Key(i / 10), Value: fmt.Appendf(nil, "w%d", i), HasValue: true})
		}
		if len(items) >= 100 {
			if _, err := s.writer.PutMany(s.ctx, items); err != nil {
				s.t.Fatalf("writing: %v", err)
			}
			items = items[:0]
		}
	}
	if len(items) > 0 {
		if _, err := s.writer.PutMany(s.ctx, items); err != nil {
			s.t.Fatalf("writing: %v", err)
		}
	}
	s.written += n
}

// converged waits until every node holds exactly what it must, and every item written is
// in the source.
func (s *scenario) converged(after string) {
	s.t.Helper()
	r := s.check(after)
	if r.Items != s.written+1 { // the checker's fence is an item too
		s.t.Fatalf("after %s: the source holds %d items, want %d", after, r.Items-1, s.written)
	}
	if err := s.cluster.Exited(); err != nil {
		s.t.Fatalf("after %s: %v", after, err)
	}
}

// check waits until every node holds exactly what the source says it must, and returns the
// checker's report.
func (s *scenario) check(after string) converge.Report {
	s.t.Helper()
	start := time.Now()
	conn, err := s.cluster.Dial()
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(s.ctx, patience)
	defer cancel()
	r, err := (&kvcheck.Checker{Source: s.src, Assigner: conn, Nodes: s.cluster.Nodes()}).Wait(ctx)
	if err != nil {
		s.t.Fatalf("after %s: %v\nlogs in %s", after, err, s.cluster.LogDir())
	}
	s.t.Logf("after %s: %s (in %s)", after, r, time.Since(start).Round(time.Millisecond))
	return r
}

// leader returns the assigner that leads, waiting for one.
func (s *scenario) leader() *kvcluster.Member {
	s.t.Helper()
	var lead *kvcluster.Member
	ctx, cancel := context.WithTimeout(s.ctx, patience)
	defer cancel()
	err := launch.WaitFor(ctx, "a leader", 100*time.Millisecond, func(ctx context.Context) error {
		for _, m := range s.cluster.Members("assigner") {
			if done, _ := m.Proc().Exited(); done {
				continue
			}
			st, err := s.status(ctx, m.Addr)
			if err == nil && st.GetLeader() {
				lead = m
				return nil
			}
		}
		return fmt.Errorf("no assigner leads")
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return lead
}

// status asks one assigner (not the leader) for its status.
func (s *scenario) status(ctx context.Context, addr string) (*pb.StatusResponse, error) {
	conn, err := grpc.NewClient(addr, s.cluster.TLS().DialOption("assigner"))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return pb.NewAdminServiceClient(conn).Status(ctx, &pb.StatusRequest{})
}

func (s *scenario) assignment() *pb.GetAssignmentResponse {
	s.t.Helper()
	conn, err := s.cluster.Dial()
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(s.ctx, patience)
	defer cancel()
	resp, err := pb.NewAssignmentServiceClient(conn).GetAssignment(ctx, &pb.GetAssignmentRequest{}, grpc.WaitForReady(true))
	if err != nil {
		s.t.Fatal(err)
	}
	return resp
}

func (s *scenario) nodeState(id string) kvclient.State {
	s.t.Helper()
	m, ok := s.cluster.Member("node", id)
	if !ok {
		s.t.Fatalf("no node %s", id)
	}
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	st, err := kvclient.New(m.Addr, s.cluster.HTTPClient()).State(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	return st
}

// startCluster skips in -short mode and under the race detector; otherwise it builds the
// binaries and starts two assigners, two distributors and the nodes given, with a 2 s
// session TTL, every link mutual TLS from a throwaway CA; it writes fill items, waits until
// every node holds slices, freezes the map and checks convergence.
func startCluster(t *testing.T, ctx context.Context, fill int, nodes ...string) *scenario {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binaries; skipped in -short mode")
	}
	if raceEnabled {
		t.Skip("runs without the race detector, in make test's second step (the binaries it starts are not instrumented either)")
	}
	s := newScenario(t, ctx)
	etcd, cli := s.startEtcd()
	s.src, s.writer = source.NewEtcd(cli, writer.DefaultPrefix), writer.New(cli, writer.DefaultPrefix)
	s.newCluster(etcd.Endpoint())
	for _, id := range []string{"a1", "a2"} {
		if _, err := s.cluster.StartAssigner(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"d1", "d2"} {
		if _, err := s.cluster.StartDistributor(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range nodes {
		if _, err := s.cluster.StartNode(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	s.write(fill)
	wctx, wcancel := context.WithTimeout(ctx, patience)
	defer wcancel()
	err := launch.WaitFor(wctx, "every node to hold slices", 100*time.Millisecond, func(ctx context.Context) error {
		for _, n := range s.cluster.Nodes() {
			for i := range 300 {
				n.Get(ctx, loadgen.Key(i)) //nolint:errcheck // only the load counts here
			}
		}
		for _, id := range nodes {
			if st := s.nodeState(id); len(st.Slices) == 0 {
				return fmt.Errorf("%s holds no slice", id)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s.slicectl("freeze", "--reason", "e2e")
	s.converged("the first fill")
	return s
}

// newCluster prepares the scenario's cluster on the etcd at endpoint, with 2 s leases and
// quick passes; source are the assigners' and distributors' flags of the data source (none:
// the etcd prefix). It is stopped when the test ends.
func (s *scenario) newCluster(endpoint string, source ...string) {
	t := s.t
	var err error
	s.cluster, err = kvcluster.New(kvcluster.Options{Bin: s.bin, Dir: t.TempDir(), Etcd: []string{endpoint}, PKI: s.pki,
		AssignerArgs:    append([]string{"--pass-interval", "200ms", "--session-ttl", "2s", "--node-ttl", "20s"}, source...),
		DistributorArgs: append([]string{"--session-ttl", "2s"}, source...),
		NodeArgs:        []string{"--report-interval", "200ms"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.cluster.Stop(10 * time.Second); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
}

// newScenario builds the binaries and makes the PKI and the certificate of slicectl, an
// admin's.
func newScenario(t *testing.T, ctx context.Context) *scenario {
	t.Helper()
	s := &scenario{t: t, ctx: ctx, bin: buildBinaries(t, ctx)}
	var err error
	if s.pki, err = launch.NewPKI(t.TempDir(), 0); err != nil {
		t.Fatal(err)
	}
	if s.admin, err = s.pki.Issue("admin", "e2e"); err != nil {
		t.Fatal(err)
	}
	return s
}

// buildBinaries builds the binaries of kvcluster.Binaries into a directory of t's.
func buildBinaries(t *testing.T, ctx context.Context) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	var pkgs []string
	for _, p := range kvcluster.Binaries {
		pkgs = append(pkgs, p)
	}
	if err := launch.Build(ctx, root, bin, false, pkgs...); err != nil {
		t.Fatal(err)
	}
	return bin
}

// startEtcd starts an embedded etcd that serves mutual TLS, and a client of it with the
// admin's certificate; both stop when the test ends.
func (s *scenario) startEtcd() (*embedetcd.Server, *clientv3.Client) {
	t := s.t
	t.Helper()
	own, err := s.pki.Issue("etcd", "e2e")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	etcd, err := embedetcd.Start(ctx, embedetcd.Options{Dir: t.TempDir(), Fast: true, LogLevel: "fatal", TLS: own})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	src, err := s.admin.Load()
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second,
		TLS: src.ClientTLS(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return etcd, cli
}

// phase runs one step of the scenario. It is not a subtest: every step needs the ones
// before it, and the scenario's helpers fail the test as a whole.
func (s *scenario) phase(name string, fn func()) {
	s.t.Logf("=== %s", name)
	fn()
}

func TestKillAndRecover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	s := startCluster(t, ctx, 3000, "n1", "n2", "n3")

	s.phase("kill -9 the leading assigner", func() {
		before := s.assignment()
		old := s.leader()
		old.Proc().Kill()
		killed := time.Now()
		lead := s.leader()
		if lead == old {
			t.Fatalf("%s still leads after kill -9", old.ID)
		}
		t.Logf("%s took over from %s in %s", lead.ID, old.ID, time.Since(killed).Round(time.Millisecond))
		after := s.assignment()
		if !proto.Equal(before.GetAssignment(), after.GetAssignment()) {
			t.Errorf("the map changed in the failover: generation %d -> %d", before.GetAssignment().GetGeneration(), after.GetAssignment().GetGeneration())
		}
		if after.GetPosition().GetTerm() <= before.GetPosition().GetTerm() {
			t.Errorf("term %d after the failover, %d before", after.GetPosition().GetTerm(), before.GetPosition().GetTerm())
		}
		s.write(500)
		s.converged("kill -9 of the leader")
		if err := s.cluster.Restart(ctx, old); err != nil {
			t.Fatal(err)
		}
	})

	s.phase("kill -9 a distributor", func() {
		d1, _ := s.cluster.Member("distributor", "d1")
		d1.Proc().Kill()
		s.write(500)
		s.converged("kill -9 of distributor d1")
		if err := s.cluster.Restart(ctx, d1); err != nil {
			t.Fatal(err)
		}
		s.write(200)
		s.converged("restart of distributor d1")
	})

	s.phase("kill -9 a node and restart it", func() {
		before := s.nodeState("n2")
		n2, _ := s.cluster.Member("node", "n2")
		n2.Proc().Kill()
		s.write(500)
		if err := s.cluster.Restart(ctx, n2); err != nil {
			t.Fatal(err)
		}
		s.converged("kill -9 and restart of node n2")
		after := s.nodeState("n2")
		var be, ae uint64
		fmt.Sscanf(before.Cursor, "%d/", &be) //nolint:errcheck // checked below
		fmt.Sscanf(after.Cursor, "%d/", &ae)  //nolint:errcheck // checked below
		if be == 0 || ae != be {
			t.Errorf("n2's cursor went from %s to %s: want it to resume in the same epoch, not take a snapshot", before.Cursor, after.Cursor)
		}
		if after.Clock <= before.Clock {
			t.Errorf("n2's clock went from %d to %d", before.Clock, after.Clock)
		}
	})
}
