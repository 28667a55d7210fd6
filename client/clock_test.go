package client_test

import (
	"context"
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
	"github.com/sliceplane/sliceplane/client/memstore"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/distributor"
)

// clockWatch is a node's store that notes the node's clock as each delta begins: the clock
// the delta before left, however briefly the node reported it.
type clockWatch struct {
	*memstore.Store
	node atomic.Pointer[client.Node]

	mu     sync.Mutex
	clocks []uint64
}

func (s *clockWatch) Begin(ctx context.Context) (client.Batch, error) {
	if n := s.node.Load(); n != nil {
		s.mu.Lock()
		s.clocks = append(s.clocks, n.Clock())
		s.mu.Unlock()
	}
	return s.Store.Begin(ctx)
}

// since returns the clocks noted from the i-th on.
func (s *clockWatch) since(i int) []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.clocks[min(i, len(s.clocks)):])
}

func (s *clockWatch) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.clocks)
}

// A distributor that restarts has no queue of the node's epoch: the node takes a snapshot,
// over many deltas (small ones here), of which only the last says a clock. The node's clock
// stays where it was until then; it never reports 0 in between.
func TestTheClockHoldsThroughASnapshotAfterADistributorRestart(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{
		Distributor: func(cfg *distributor.Config) { cfg.MaxDeltaOps = 16 },
	})
	d1 := c.StartDistributor("d1")
	store := &clockWatch{Store: memstore.New()}
	n1 := c.StartNode("n1", store)
	store.node.Store(n1.Node)
	adm := newAdmin(c)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	const items = 200
	var last uint64
	for i := range items {
		last = putItem(ctx, t, c, i)
	}
	require.NoError(t, c.WaitClock(ctx, last))
	// The distributor that starts again follows the source from the assigner's clock: once
	// that is past the last write, the snapshot it serves is too.
	waitFor(t, 30*time.Second, "the assigner's clock reaches the last write", func() bool {
		resp, err := adm.assignments.GetAssignment(ctx, &pb.GetAssignmentRequest{}, grpc.WaitForReady(true))
		return err == nil && resp.GetClock() >= last
	})

	before, old, mark := n1.Clock(), n1.Cursor().Epoch, store.count()
	d1.Stop()
	c.StartDistributor("d1")
	waitFor(t, 60*time.Second, "the node takes a snapshot from the new distributor and reaches the last write", func() bool {
		return n1.Cursor().Epoch != old && n1.Clock() >= last
	})
	report, err := c.WaitConverged(ctx)
	require.NoError(t, err, "%s", report)

	seen := store.since(mark)
	require.Greater(t, len(seen), items/16, "the snapshot came in many deltas")
	for i, clock := range seen {
		assert.GreaterOrEqual(t, clock, before, "the clock after delta %d of %d since the restart", i, len(seen))
	}
}
