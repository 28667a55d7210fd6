package distributor_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/authz/authztest"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/distributor"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

// tlsCluster runs a cluster with mutual TLS, distributor d1 and nodes; it returns d1's
// metrics registry.
func tlsCluster(t *testing.T, nodes ...string) (*clustertest.Cluster, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	c := clustertest.New(t, clustertest.Options{TLS: true, Distributor: func(cfg *distributor.Config) { cfg.Registry = reg }})
	c.StartDistributor("d1")
	for _, id := range nodes {
		c.StartNode(id, nil)
	}
	return c, reg
}

// delivered writes an item and waits until every node applied it.
func delivered(t *testing.T, c *clustertest.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	clock, err := c.Source.Put(ctx, []byte("tls-probe"), []byte(time.Now().String()))
	require.NoError(t, err)
	require.NoError(t, c.WaitClock(ctx, clock))
}

// pullAs opens a Pull stream to addr with creds, starting as node, and returns the error of
// its first receive.
func pullAs(t *testing.T, addr string, creds grpc.DialOption, node string) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, creds)
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	stream, err := pb.NewDistributorServiceClient(conn).Pull(ctx)
	if err != nil {
		return err
	}
	start := &pb.PullRequest{Request: &pb.PullRequest_Start{Start: &pb.PullStart{NodeId: node}}}
	if err := stream.Send(start); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = stream.Recv()
	return err
}

func TestPullOverMutualTLSIsAuthorized(t *testing.T) {
	c, reg := tlsCluster(t, "n1", "n2")
	// n2 pulling as itself, over mTLS, works: the real node receives what is written.
	delivered(t, c)
	n2 := c.Nodes()["n2"]
	epoch := n2.Cursor().Epoch
	addr := c.Distributors()["d1"].Addr

	// No certificate: TLS, but nothing to say who calls.
	noCert := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})) //nolint:gosec // the test calls without a certificate
	err := pullAs(t, addr, noCert, "n2")
	assert.Equal(t, codes.Unauthenticated, status.Code(err), "no certificate: %v", err)

	// A certificate of another CA names n2, but nobody this cluster trusts vouches for it.
	f := mtlstest.New(t).Config("node", "n2")
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	require.NoError(t, err)
	otherCA := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}})) //nolint:gosec // only the server's check matters here
	err = pullAs(t, addr, otherCA, "n2")
	assert.Equal(t, codes.Unauthenticated, status.Code(err), "another CA: %v", err)

	// n1's certificate pulling as n2.
	err = pullAs(t, addr, c.PKI.Source("node", "n1").DialOption("distributor"), "n2")
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "n1 as n2: %v", err)
	assert.ErrorContains(t, err, `not as node "n2"`)

	// People and tools may inspect the cluster; none of them pulls a node's data.
	for _, kind := range []string{"admin", "viewer", "router"} {
		err = pullAs(t, addr, c.PKI.Source(kind, "alice").DialOption("distributor"), "n2")
		assert.Equal(t, codes.PermissionDenied, status.Code(err), "%s: %v", kind, err)
	}

	assert.Equal(t, map[string]float64{"unauthenticated": 2, "impersonation": 1, "role": 3}, authztest.Denied(t, reg, "distributor", pb.DistributorService_Pull_FullMethodName))
	// The real n2's stream was never touched: it keeps its epoch (a stream replaced would
	// start over from a snapshot) and keeps receiving.
	delivered(t, c)
	assert.Equal(t, epoch, n2.Cursor().Epoch, "n2's stream was replaced")
	assert.Zero(t, n2.Health().Stalls)
}

func TestNewRefusesPlaintextOffLoopback(t *testing.T) {
	cli := etcdtest.New(t)
	for _, cfg := range []distributor.Config{
		{Listen: "0.0.0.0:0"},
		{Listen: ":0"},
		{Listen: "127.0.0.1:0", MetricsListen: "0.0.0.0:0"},
	} {
		cfg.ID, cfg.Client, cfg.Assigners = "d1", cli, []string{"127.0.0.1:1"}
		_, err := distributor.New(cfg)
		require.ErrorIs(t, err, mtls.ErrConfig, "%+v", cfg)
		assert.ErrorContains(t, err, "without TLS")
	}
}
