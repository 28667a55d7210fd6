package distributor_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/distributor"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/source"
)

// TestStrayKeyUnderThePrefixLeavesTheItem writes an item, then the item's etcd key with an
// empty fragment ID after it, and deletes that: the stray key was read as the item itself, so
// its delete made the owner drop the live item, and a snapshot taken meanwhile read the stray
// value as the item's. Now the node keeps the item as it is, and the distributor counts the
// key it skipped.
func TestStrayKeyUnderThePrefixLeavesTheItem(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := clustertest.New(t, clustertest.Options{Distributor: func(cfg *distributor.Config) { cfg.Registry = reg }})
	c.StartDistributor("d1")
	n := c.StartNode("n0", nil)
	waitFor(t, patience, "n0 pulls", func() bool { return n.Cursor().Epoch != 0 })
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	_, err := pb.NewAdminServiceClient(c.Conn()).Freeze(ctx, &pb.FreezeRequest{Reason: "the map stays put"}, grpc.WaitForReady(true))
	require.NoError(t, err)

	key := []byte("user:1")
	_, err = c.Source.Put(ctx, key, []byte("v"))
	require.NoError(t, err)
	_, err = c.WaitConverged(ctx)
	require.NoError(t, err)

	raw := etcdtest.Client(t, c.Etcd)
	stray := c.Source.(*source.Etcd).ItemKey(key) + "/"
	_, err = raw.Put(ctx, stray, "stray")
	require.NoError(t, err)
	// A node that starts over takes a snapshot while the stray key is there: the scan must
	// not read it as the item's value either.
	n.Stop()
	n = c.StartNode("n0", nil)
	report, err := c.WaitConverged(ctx)
	require.NoError(t, err, "%s", report)
	got, ok, err := n.Store.Get(ctx, key)
	require.NoError(t, err)
	require.True(t, ok, "n0's snapshot holds the item")
	assert.Equal(t, []byte("v"), got.Value)
	_, err = raw.Delete(ctx, stray)
	require.NoError(t, err)

	report, err = c.WaitConverged(ctx)
	require.NoError(t, err, "%s", report)
	got, ok, err = n.Store.Get(ctx, key)
	require.NoError(t, err)
	require.True(t, ok, "n0 still holds the item")
	assert.Equal(t, []byte("v"), got.Value)
	assert.GreaterOrEqual(t, rejected(t, reg, "empty_fragment"), 2.0, "the stray key's put and delete were counted")
	assert.Zero(t, rejected(t, reg, "hash_mismatch"), "every reason is exported from the start")
	problems, err := testutil.GatherAndLint(reg, "sliceplane_distributor_source_rejected_total")
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// rejected returns the count of keys the distributor's source skipped for reason.
func rejected(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "sliceplane_distributor_source_rejected_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no sliceplane_distributor_source_rejected_total{reason=%q}", reason)
	return 0
}
