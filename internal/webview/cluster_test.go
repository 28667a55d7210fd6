package webview_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// cluster is an assigner behind mutual TLS and a fleet of stand-in nodes that report a load
// with a hot band at the start of the space.
type cluster struct {
	srv    *assigner.Server
	pki    *mtlstest.PKI
	assign pb.AssignmentServiceClient
}

func startCluster(t *testing.T, nodes int) *cluster {
	t.Helper()
	pki := mtlstest.New(t)
	srv, err := assigner.New(assigner.Config{
		Client: etcdtest.Client(t, etcdtest.Start(t)), TLS: pki.Source("assigner", "a1"), MetricsListen: "127.0.0.1:0",
		PassInterval: 200 * time.Millisecond, SessionTTL: 2 * time.Second,
		Core:   core.Config{NodeTTL: time.Minute, BreakBeforeMake: true},
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { srv.Run(ctx) }) //nolint:errcheck // ends with the test
	t.Cleanup(func() { cancel(); wg.Wait() })
	c := &cluster{srv: srv, pki: pki, assign: pb.NewAssignmentServiceClient(dial(t, srv.Addr(), pki.Source("admin", "alice").DialOption("assigner")))}
	for i := range nodes {
		id := fmt.Sprintf("n%d", i+1)
		conn := dial(t, srv.Addr(), pki.Source("node", id).DialOption("assigner"))
		wg.Go(func() { report(ctx, id, conn) })
	}
	return c
}

func dial(t *testing.T, addr string, creds grpc.DialOption) *grpc.ClientConn {
	conn, err := grpc.NewClient(addr, creds)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// report registers node id and reports the load of what it holds every 200 ms until ctx ends:
// the first eighth of the space carries half the load.
func report(ctx context.Context, id string, conn *grpc.ClientConn) {
	nodes, assign := pb.NewNodeServiceClient(conn), pb.NewAssignmentServiceClient(conn)
	registered := false
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for ; ; <-tick.C {
		if ctx.Err() != nil {
			return
		}
		if !registered {
			_, err := nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: id}, Address: "127.0.0.1:1"})
			registered = err == nil
			continue
		}
		resp, err := assign.GetAssignment(ctx, &pb.GetAssignmentRequest{})
		if err != nil {
			continue
		}
		m, err := wire.AssignmentFromProto(resp.GetAssignment())
		if err != nil {
			continue
		}
		r := load.Report{Node: assignment.NodeID(id), Window: time.Second}
		for _, s := range m.All() {
			if s.Holds(assignment.NodeID(id)) {
				hot := math.Max(0, math.Min(1.0/8, s.Range.Fraction()+float64(s.Range.Start)/math.Exp2(64))-float64(s.Range.Start)/math.Exp2(64))
				r.Samples = append(r.Samples, load.Sample{Range: s.Range, Load: 500*s.Range.Fraction() + 4000*hot})
			}
		}
		nodes.ReportLoad(ctx, wire.ReportToProto(r)) //nolint:errcheck // the next tick tries again
	}
}

// sliceToMove returns the start of the map's first slice and a node that does not hold it.
func (c *cluster) sliceToMove(t *testing.T) (string, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.assign.GetAssignment(ctx, &pb.GetAssignmentRequest{})
	require.NoError(t, err)
	m, err := wire.AssignmentFromProto(resp.GetAssignment())
	require.NoError(t, err)
	s := m.Slice(0)
	for i := 1; ; i++ {
		if id := assignment.NodeID(fmt.Sprintf("n%d", i)); !s.Holds(id) {
			return keyspace.FormatPoint(s.Range.Start), string(id)
		}
	}
}
