package clustertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/clustertest"
)

// goleak checks that Close, or a Start that fails, leaves nothing running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartRunsAClusterThatCloseStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c, err := clustertest.Start(ctx, clustertest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() }) // when the test fails before it closes c
	c.StartDistributor("d1")
	n := c.StartNode("n1", nil)
	clock, err := c.Source.Put(ctx, []byte("k"), []byte("v"))
	require.NoError(t, err)
	require.NoError(t, c.WaitClock(ctx, clock))
	report, err := c.WaitConverged(ctx)
	require.NoError(t, err, "%s", report)
	assert.Equal(t, 2, report.Items, "the item, and the fence WaitConverged writes")
	it, ok, err := n.Store.Get(ctx, []byte("k"))
	require.NoError(t, err)
	require.True(t, ok, "the node holds the item written")
	assert.Equal(t, "v", string(it.Value))

	require.NoError(t, c.Close(), "the parts stop without error")
	require.NoError(t, c.Close(), "closing again does nothing")
	_, err = c.Source.Put(ctx, []byte("k"), []byte("w"))
	assert.Error(t, err, "the etcd is gone")
}

func TestStartThatFailsStopsWhatItStarted(t *testing.T) {
	c, err := clustertest.Start(t.Context(), clustertest.Options{Assigner: func(cfg *assigner.Config) { cfg.Client = nil }})
	require.ErrorContains(t, err, "assigner: no etcd client")
	assert.Nil(t, c)
}

func TestStartRefusesTLS(t *testing.T) {
	_, err := clustertest.Start(t.Context(), clustertest.Options{TLS: true})
	require.ErrorContains(t, err, "clustertest: Start runs no TLS")
}
