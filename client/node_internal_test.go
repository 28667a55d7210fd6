package client

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

// TestApplyKeepsTheClockThroughASnapshot follows a node whose distributor restarted: the new
// one has no queue of the node's epoch, so the node takes a snapshot in a new epoch, over
// several deltas of which only the last says a clock. Until then the node's clock stays the
// last one it reached; it never goes back to 0.
func TestApplyKeepsTheClockThroughASnapshot(t *testing.T) {
	n, err := NewNode(NodeConfig{ID: "n1", Assigners: []string{"127.0.0.1:1"}, Address: "127.0.0.1:2", Store: &recordingBatch{}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	start := []Op{{Kind: OpReset}, {Kind: OpAddSlice, Range: rng(0, 100)}, {Kind: OpSetSlices, Slices: []Range{rng(0, 100)}}}
	put := func(k string) Op { return Op{Kind: OpPut, Key: []byte(k), Value: []byte("v")} }
	steps := []struct {
		what    string
		delta   Delta
		clock   uint64
		cursor  Cursor
		loading bool
	}{
		{"the first snapshot, whole in one delta", Delta{Epoch: 1, From: 0, To: 4, Clock: 50, Ops: append(start, put("a"))}, 50, Cursor{1, 4}, false},
		{"a change", Delta{Epoch: 1, From: 4, To: 5, Clock: 55, Ops: []Op{put("b")}}, 55, Cursor{1, 5}, false},
		// The distributor restarts: a snapshot in a new epoch, its scan not done yet.
		{"the new snapshot's start", Delta{Epoch: 2, From: 0, To: 3, Ops: start}, 55, Cursor{2, 3}, true},
		{"a heartbeat while the scan runs", Delta{Epoch: 2, From: 3, To: 3, Ops: []Op{}}, 55, Cursor{2, 3}, true},
		{"the scan's items, more queued behind", Delta{Epoch: 2, From: 3, To: 5, Ops: []Op{put("a"), put("b")}}, 55, Cursor{2, 5}, true},
		{"the end of the snapshot", Delta{Epoch: 2, From: 5, To: 6, Clock: 60, Ops: []Op{put("c")}}, 60, Cursor{2, 6}, false},
		// A stream that resumes behind the end of its queue catches up without a clock.
		{"a resumed stream's first delta", Delta{Epoch: 2, From: 6, To: 7, Ops: []Op{put("d")}, Slices: []Range{rng(0, 100)}}, 60, Cursor{2, 7}, false},
		{"the catch-up's end", Delta{Epoch: 2, From: 7, To: 8, Clock: 70, Ops: []Op{put("e")}}, 70, Cursor{2, 8}, false},
		{"a clock-only delta", Delta{Epoch: 2, From: 8, To: 8, Clock: 75, Ops: []Op{}}, 75, Cursor{2, 8}, false},
	}
	for _, s := range steps {
		require.NoError(t, n.apply(t.Context(), s.delta), s.what)
		assert.Equal(t, s.clock, n.Clock(), "the clock after %s", s.what)
		assert.Equal(t, s.cursor, n.Cursor(), "the cursor after %s", s.what)
		assert.Equal(t, s.loading, n.Health().Loading, "loading after %s", s.what)
		if s.loading {
			assert.True(t, n.Health().Stale, "a loading node is stale, after %s", s.what)
		}
		assert.Equal(t, []Range{rng(0, 100)}, n.Slices(), "the slices after %s", s.what)
	}
}

// oneDelta is a distributor that sends each Pull stream one delta, then holds it open until
// the node ends it, which it says on ended.
type oneDelta struct {
	pb.UnimplementedDistributorServiceServer
	delta *pb.Delta
	ended chan struct{}
}

func (s oneDelta) Pull(stream grpc.BidiStreamingServer[pb.PullRequest, pb.PullResponse]) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	if err := stream.Send(&pb.PullResponse{Delta: s.delta}); err != nil {
		return err
	}
	<-stream.Context().Done()
	close(s.ended)
	return nil
}

// slowStore is a Store whose Begin waits for release, or gives up when its context ends, as
// a database's does.
type slowStore struct {
	*recordingBatch
	begun, release chan struct{}
}

func (s slowStore) Begin(ctx context.Context) (Batch, error) {
	close(s.begun)
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.recordingBatch.Begin(ctx)
}

// TestADistributorChangeDoesNotCutAStoresBatchShort moves a node to another distributor
// while its Store begins a batch for a delta the first one sent: the stream ends, but the
// delta is applied whole and Run goes on. The batch once failed with the stream's
// cancellation, taken for a failure of the Store: Run ended and the node left the cluster.
func TestADistributorChangeDoesNotCutAStoresBatchShort(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	dist := oneDelta{delta: &pb.Delta{Epoch: 7, To: 1, Clock: 40, Ops: []*pb.DeltaOp{{Op: &pb.DeltaOp_Reset_{Reset_: &pb.Reset{}}}}},
		ended: make(chan struct{})}
	pb.RegisterDistributorServiceServer(srv, dist)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	store := slowStore{recordingBatch: &recordingBatch{}, begun: make(chan struct{}), release: make(chan struct{})}
	n, err := NewNode(NodeConfig{ID: "n1", Assigners: []string{"127.0.0.1:1"}, Address: "127.0.0.1:2", Store: store, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	d1 := &pb.Distributor{Id: "d1", Address: lis.Addr().String()}
	n.setDistributor(d1)
	n.mu.Lock()
	changed := n.changed
	n.mu.Unlock()

	ended := make(chan error, 1)
	go func() {
		_, err := n.pullFrom(t.Context(), d1, changed)
		ended <- err
	}()
	select {
	case <-store.begun:
	case <-time.After(30 * time.Second):
		t.Fatal("the node never began a batch for the delta")
	}
	n.setDistributor(&pb.Distributor{Id: "d2", Address: "127.0.0.1:1"})
	select {
	case <-dist.ended: // the node ended the stream: the move reached it
	case <-time.After(30 * time.Second):
		t.Fatal("the node kept the old distributor's stream")
	}
	close(store.release)
	select {
	case err := <-ended:
		var se errStore
		assert.False(t, errors.As(err, &se), "the move is no failure of the Store: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the pull from the old distributor did not end")
	}
	assert.Equal(t, Cursor{Epoch: 7, Index: 1}, n.Cursor(), "the delta was applied whole")
	assert.Equal(t, Cursor{Epoch: 7, Index: 1}, store.cursor, "and committed")
}
