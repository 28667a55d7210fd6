package distributor_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/memstore"
	"github.com/sliceplane/sliceplane/client/pgwriter"
	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/distributor"
	"github.com/sliceplane/sliceplane/internal/source/postgres"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgtest"
	"github.com/sliceplane/sliceplane/internal/target"
	"github.com/sliceplane/sliceplane/internal/target/registry"
)

// TestOneDistributorServesTwoTargets: a distributor of two targets (Config.Lanes) serves
// the nodes of each from its target's source alone, on one address, and labels each
// target's metrics.
func TestOneDistributorServesTwoTargets(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := clustertest.New(t, clustertest.Options{
		Assigner: func(cfg *assigner.Config) { cfg.Targets = []registry.Record{{Name: "blue"}} },
		Distributor: func(cfg *distributor.Config) {
			cfg.Lanes, cfg.Registry = []distributor.Lane{{Target: target.Default}, {Target: "blue"}}, reg
		},
	})
	c.StartDistributor("d1")
	plain := c.StartNode("n1", nil)
	blue, blueStore := startNode(t, c, "b1", "blue")

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Etcd.Endpoint()}, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	blueWriter := writer.New(cli, target.DataPrefix("/sliceplane/", "blue"))
	var want, wantBlue []string
	for i := range 50 {
		k := fmt.Sprintf("k%02d", i)
		_, err := c.Source.Put(ctx, []byte(k), []byte("plain"))
		require.NoError(t, err)
		want = append(want, k)
		if i%2 == 0 {
			_, err := blueWriter.Put(ctx, []byte(k), []byte("blue"))
			require.NoError(t, err)
			wantBlue = append(wantBlue, k)
		}
	}
	require.Eventually(t, func() bool { return slices.Equal(held(ctx, t, plain.Store, "plain"), want) }, 30*time.Second, 20*time.Millisecond,
		"the default target's node holds the default target's items")
	require.Eventually(t, func() bool { return slices.Equal(held(ctx, t, blueStore, "blue"), wantBlue) }, 30*time.Second, 20*time.Millisecond,
		"blue's node holds blue's items alone, from the same distributor")
	_, addr, _ := blue.Distributor()
	require.Equal(t, c.Distributors()["d1"].Addr, addr, "one distributor serves both")
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	health, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "a probe that names no target: health is the process's")
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, health.GetStatus())
	_, err = pb.NewAdminServiceClient(conn).ListNodes(metadata.AppendToOutgoingContext(ctx, target.MetadataKey, "green"), &pb.ListNodesRequest{})
	require.Equal(t, codes.NotFound, status.Code(err), "a target it does not serve: %v", err)
	require.ErrorContains(t, err, `serves targets "blue", "default", not target "green"`)
	require.Eventually(t, func() bool { // the relay reads the node list every relay.NodesInterval
		nodes, err := pb.NewAdminServiceClient(conn).ListNodes(metadata.AppendToOutgoingContext(ctx, target.MetadataKey, "blue"), &pb.ListNodesRequest{})
		return err == nil && len(nodes.GetNodes()) == 1 && nodes.GetNodes()[0].GetNode().GetId() == "b1"
	}, 30*time.Second, 20*time.Millisecond, "blue's relay lists blue's node alone")
	want1 := `
# HELP sliceplane_distributor_nodes Nodes this distributor serves.
# TYPE sliceplane_distributor_nodes gauge
sliceplane_distributor_nodes{target="blue"} 1
sliceplane_distributor_nodes{target="default"} 1
`
	require.Eventually(t, func() bool {
		return testutil.GatherAndCompare(reg, strings.NewReader(want1), "sliceplane_distributor_nodes") == nil
	}, 10*time.Second, 20*time.Millisecond, "each target's metrics carry its name")
}

// startNode runs node id of target tgt on a store of its own until the test ends.
func startNode(t *testing.T, c *clustertest.Cluster, id, tgt string) (*client.Node, *memstore.Store) {
	store := memstore.New()
	n, err := client.NewNode(client.NodeConfig{ID: id, Target: tgt, Assigners: c.Assigners(), Store: store,
		ReportInterval: 100 * time.Millisecond, Address: "127.0.0.1:1"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return n, store
}

// held returns the keys r holds, sorted; nil, logged, when an item's value is not value
// (another target's): a condition of Eventually may not fail the test itself.
func held(ctx context.Context, t *testing.T, r client.Reader, value string) []string {
	var keys []string
	err := r.Items(ctx, func(it client.Item) error {
		if string(it.Value) != value {
			return fmt.Errorf("item %q holds %q, not %q: another target's", it.Key, it.Value, value)
		}
		keys = append(keys, string(it.Key))
		return nil
	})
	if err != nil {
		t.Log(err)
		return nil
	}
	slices.Sort(keys)
	return keys
}

// TestATargetOnPostgresBesideOneOnEtcd: a target whose config names a PostgreSQL table is
// followed by its assigner on that table's clock, and served by a distributor lane reading
// the same table through a slot of its own, beside the default target on etcd.
func TestATargetOnPostgresBesideOneOnEtcd(t *testing.T) {
	pg := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pcfg := postgres.Config{DSN: pg.DSN, Table: "blue_items", Publication: "blue"}
	require.NoError(t, postgres.Init(ctx, pcfg))
	source := map[string]string{"source": "postgres", "pg-dsn": pg.DSN, "pg-table": "blue_items", "pg-publication": "blue"}
	c := clustertest.New(t, clustertest.Options{
		Assigner: func(cfg *assigner.Config) {
			cfg.Targets = []registry.Record{{Name: "blue", Config: registry.Config{Source: source}}}
		},
		Distributor: func(cfg *distributor.Config) {
			slot := pcfg
			slot.Slot = postgres.SlotName("d1_blue")
			src, err := postgres.Open(ctx, slot)
			require.NoError(t, err)
			t.Cleanup(src.Close)
			cfg.Lanes = []distributor.Lane{{Target: target.Default}, {Target: "blue", Source: src}}
		},
	})
	c.StartDistributor("d1")
	plain := c.StartNode("n1", nil)
	_, blueStore := startNode(t, c, "b1", "blue")

	w, err := pgwriter.Open(ctx, pgwriter.Config{DSN: pg.DSN, Table: "blue_items"})
	require.NoError(t, err)
	defer w.Close()
	at, err := w.Put(ctx, []byte("k1"), []byte("blue"))
	require.NoError(t, err)
	_, err = c.Source.Put(ctx, []byte("k1"), []byte("plain"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return slices.Equal(held(ctx, t, blueStore, "blue"), []string{"k1"}) }, 60*time.Second, 20*time.Millisecond,
		"blue's node holds blue's row, from the table")
	require.Eventually(t, func() bool { return slices.Equal(held(ctx, t, plain.Store, "plain"), []string{"k1"}) }, 30*time.Second, 20*time.Millisecond,
		"the default target's node holds the etcd item")
	conn, err := dial.TargetLeader("blue", c.Assigners(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	require.Eventually(t, func() bool {
		st, err := pb.NewAdminServiceClient(conn).Status(ctx, &pb.StatusRequest{})
		return err == nil && st.GetClock() >= at
	}, 30*time.Second, 20*time.Millisecond, "blue's assigner follows the table's clock (its LSNs), not etcd's revisions")
}
