package client_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/distributor"
	"github.com/sliceplane/sliceplane/internal/source/sourcetest"
)

// readCount counts how reads of existing keys ended.
type readCount struct{ hits, misses, failed, misdirected atomic.Int64 }

// read reads key as a client of a storage node would: through the router, from a replica
// that serves the key's slice (a node that does not, or no longer, answers "not mine, ask
// the owners", and the reader asks again, as kvclient does with a 421's owners). A miss is a
// serving replica without the item; a read fails when no replica serves it within a few
// lookups.
func read(r *client.Router, nodes map[string]*clustertest.Node, key []byte, n *readCount) {
	for range 50 {
		route, err := r.Lookup(key)
		if err != nil {
			break
		}
		for _, rep := range route.Replicas {
			node := nodes[rep.ID]
			if node == nil {
				n.misdirected.Add(1)
				continue
			}
			guard := node.GuardRead(key)
			if !guard.Serving() {
				n.misdirected.Add(1)
				continue
			}
			_, ok, err := node.Store.Get(context.Background(), key)
			switch {
			case err == nil && ok:
				n.hits.Add(1)
				return
			case !guard.Unchanged(): // dropped or reset around the read: not its key any more
				n.misdirected.Add(1)
				continue
			}
			n.misses.Add(1)
			return
		}
		time.Sleep(10 * time.Millisecond) // the owners' map catches up
	}
	n.failed.Add(1)
}

// fillKeys writes items keys into c's source and waits until the nodes hold them.
func fillKeys(ctx context.Context, t *testing.T, c *clustertest.Cluster, items int) [][]byte {
	t.Helper()
	keys := make([][]byte, items)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "item-%d", i)
		_, err := c.Source.Put(ctx, keys[i], []byte("v"))
		require.NoError(t, err)
	}
	report, err := c.WaitConverged(ctx)
	require.NoError(t, err, "%s", report)
	return keys
}

// startReaders reads keys round and round from two goroutines, through r and the nodes
// nodes returns at each read, counting into n, until the returned stop is called.
func startReaders(r *client.Router, nodes func() map[string]*clustertest.Node, keys [][]byte, n *readCount) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := w; ; i = (i + 2) % len(keys) {
				select {
				case <-done:
					return
				default:
				}
				read(r, nodes(), keys[i], n)
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

// TestNoReaderSeesAMove reads every key continuously while an operator moves, splits,
// merges and replicates slices over three nodes (I7, make-before-break): no read of an
// existing key is answered "not found", and every read finds a replica that serves it.
func TestNoReaderSeesAMove(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{}) // make-before-break is the default
	c.StartDistributor("d1")
	ids := []string{"n1", "n2", "n3"}
	nodes := map[string]*clustertest.Node{}
	for _, id := range ids {
		nodes[id] = c.StartNode(id, nil)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const items = 600
	keys := fillKeys(ctx, t, c, items)
	adm := newAdmin(c)
	_, err := adm.Freeze(ctx, &pb.FreezeRequest{Reason: "handoff test"}, grpc.WaitForReady(true))
	require.NoError(t, err)
	r, err := client.NewRouter(client.RouterConfig{Assigners: c.Assigners(), Logger: quiet()})
	require.NoError(t, err)
	runRouter(t, r)
	require.NoError(t, r.WaitReady(ctx))

	var n readCount
	stopReads := startReaders(r, func() map[string]*clustertest.Node { return nodes }, keys, &n)
	changes := operate(ctx, t, adm, r, keys, ids)
	// Let the last handoffs end and be read through.
	report, err := c.WaitConverged(ctx)
	stopReads()
	require.NoError(t, err, "%s", report)
	t.Logf("%d changes; reads: %d hits, %d misses, %d failed, %d misdirected on the way",
		changes, n.hits.Load(), n.misses.Load(), n.failed.Load(), n.misdirected.Load())
	assert.GreaterOrEqual(t, changes, 20, "the operator changed the map")
	assert.Greater(t, n.hits.Load(), int64(items), "every key read at least once on average")
	assert.Zero(t, n.misses.Load(), "reads of existing keys answered not found")
	assert.Zero(t, n.failed.Load(), "reads no replica answered")
}

// operate makes 30 random changes to the map (a move to one or two nodes, a split, a
// merge), each once the previous one's handoff has ended or after a short while, and returns
// how many the assigner took. A change refused (a slice in handoff, a merge of the last slice)
// is skipped.
func operate(ctx context.Context, t *testing.T, adm admin, r *client.Router, keys [][]byte, ids []string) int {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	took := 0
	for range 30 {
		ref := &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: keys[rng.IntN(len(keys))]}}
		var err error
		switch k := rng.IntN(5); {
		case k < 3:
			to := []string{ids[rng.IntN(len(ids))]}
			if k == 2 {
				to = append(to, ids[(slices.Index(ids, to[0])+1)%len(ids)])
			}
			_, err = adm.Move(ctx, &pb.MoveRequest{Slice: ref, To: to})
		case k == 3:
			_, err = adm.Split(ctx, &pb.SplitRequest{Slice: ref})
		default:
			route, lerr := r.Lookup(keys[rng.IntN(len(keys))])
			if lerr != nil || route.Slice.End.IsEnd() {
				continue
			}
			_, err = adm.Merge(ctx, &pb.MergeRequest{Left: &pb.SliceRef{Ref: &pb.SliceRef_Start{Start: route.Slice.Start}},
				Right: &pb.SliceRef{Ref: &pb.SliceRef_Start{Start: route.Slice.End.Point()}}})
		}
		if err == nil {
			took++
		}
		time.Sleep(100 * time.Millisecond) // readers read between changes
	}
	require.NoError(t, ctx.Err())
	return took
}

// TestTheOldHolderServesUntilTheNewOneHasLoaded holds the distributor's scans while a slice
// moves from n1 to n2 (make-before-break, I7): meanwhile the router sends the slice's reads to
// n1, which still serves them, and n2 says it is loading; once the scan runs, n2 serves, the
// router follows and n1 drops the slice. Breaking before making, every read in between would
// find no replica serving the key.
func TestTheOldHolderServesUntilTheNewOneHasLoaded(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	gs := &sourcetest.Gated{}
	c := clustertest.New(t, clustertest.Options{
		Distributor: func(cfg *distributor.Config) { cfg.Source = gs },
	})
	gs.Source = c.Source
	c.StartDistributor("d1")
	nodes := map[string]*clustertest.Node{"n1": c.StartNode("n1", nil)}
	key := []byte("item-moving")
	clock, err := c.Source.Put(ctx, key, []byte("v"))
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "n1 serves the key", func() bool { return nodes["n1"].Serving(key) && nodes["n1"].Clock() >= clock })
	adm := newAdmin(c)
	_, err = adm.Freeze(ctx, &pb.FreezeRequest{Reason: "client test"}, grpc.WaitForReady(true))
	require.NoError(t, err)
	nodes["n2"] = c.StartNode("n2", nil)
	r, err := client.NewRouter(client.RouterConfig{Assigners: c.Assigners(), Logger: quiet()})
	require.NoError(t, err)
	runRouter(t, r)
	require.NoError(t, r.WaitReady(ctx))

	gs.Shut()
	ref := &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: key}}
	waitFor(t, 30*time.Second, "the key's slice moves to n2", func() bool {
		_, err := adm.Move(ctx, &pb.MoveRequest{Slice: ref, To: []string{"n2"}})
		return err == nil
	})
	waitFor(t, 30*time.Second, "n2 loads the slice", func() bool { return nodes["n2"].Loading(client.Hash(key)) })
	var n readCount
	for range 200 { // while the scan is held: every read served by n1
		read(r, nodes, key, &n)
	}
	require.Equal(t, int64(200), n.hits.Load(), "reads while n2 loads: %d misses, %d failed", n.misses.Load(), n.failed.Load())
	route, err := r.Lookup(key)
	require.NoError(t, err)
	require.Equal(t, []string{"n1"}, replicaIDs(route.Replicas), "the router sends reads to the serving holder only")

	gs.Open()
	waitFor(t, 30*time.Second, "the router follows the slice to n2 once it has loaded", func() bool {
		route, err := r.Lookup(key)
		return err == nil && slices.Equal(replicaIDs(route.Replicas), []string{"n2"}) && nodes["n2"].Serving(key)
	})
	waitFor(t, 30*time.Second, "n1 drops the slice", func() bool { return !nodes["n1"].Serving(key) })
	read(r, nodes, key, &n)
	require.Equal(t, int64(201), n.hits.Load())
}
