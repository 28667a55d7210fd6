package client_test

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/memstore"
	"github.com/sliceplane/sliceplane/internal/clustertest"
)

// TestARollingRestartFailsNoRead restarts each of three nodes in turn, each draining first
// (Node.Drain, make-before-break) and coming back on its store, while readers read every
// key through the router: no read of an existing key is answered "not found", and every
// read finds a replica that serves it.
func TestARollingRestartFailsNoRead(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{})
	c.StartDistributor("d1")
	ids := []string{"n1", "n2", "n3"}
	stores := map[string]*memstore.Store{}
	nodes := map[string]*clustertest.Node{}
	for _, id := range ids {
		stores[id] = memstore.New()
		nodes[id] = c.StartNode(id, stores[id])
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	const items = 600
	keys := make([][]byte, items)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "item-%d", i)
		_, err := c.Source.Put(ctx, keys[i], []byte("v"))
		require.NoError(t, err)
	}
	report, err := c.WaitConverged(ctx)
	require.NoError(t, err, "%s", report)
	r, err := client.NewRouter(client.RouterConfig{Assigners: c.Assigners(), Logger: quiet()})
	require.NoError(t, err)
	runRouter(t, r)
	require.NoError(t, r.WaitReady(ctx))

	// The readers see the nodes as a client would at each moment: a restarted node replaces
	// the one that left.
	var live atomic.Pointer[map[string]*clustertest.Node]
	first := nodes
	live.Store(&first)
	var n readCount
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := w; ; i = (i + 2) % items {
				select {
				case <-stop:
					return
				default:
				}
				read(r, *live.Load(), keys[i], &n)
			}
		})
	}
	for _, id := range ids {
		held := len(nodes[id].Slices())
		dctx, dcancel := context.WithTimeout(ctx, time.Minute)
		err := nodes[id].Drain(dctx)
		dcancel()
		require.NoError(t, err, "%s drains", id)
		nodes[id].Stop()
		next := maps.Clone(nodes)
		next[id] = c.StartNode(id, stores[id])
		live.Store(&next)
		nodes = next
		t.Logf("%s drained %d slices and restarted; reads so far: %d hits, %d misses, %d failed",
			id, held, n.hits.Load(), n.misses.Load(), n.failed.Load())
		waitFor(t, time.Minute, id+" holds slices again", func() bool { return len(nodes[id].Slices()) > 0 })
		report, err = c.WaitConverged(ctx)
		require.NoError(t, err, "%s", report)
	}
	close(stop)
	wg.Wait()
	t.Logf("rolling restart of %d nodes; reads: %d hits, %d misses, %d failed, %d misdirected on the way",
		len(ids), n.hits.Load(), n.misses.Load(), n.failed.Load(), n.misdirected.Load())
	assert.Greater(t, n.hits.Load(), int64(items), "every key read at least once on average")
	assert.Zero(t, n.misses.Load(), "reads of existing keys answered not found")
	assert.Zero(t, n.failed.Load(), "reads no replica answered")
}
