package assigner_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// TestMoveIsAHandoffUntilTheNodeHasLoaded checks make-before-break through the API: an
// operator's move leaves the old holder serving and the new one loading, as the listing and
// the status show; the new holder's heartbeat ends the handoff only once it has applied
// the move's generation and lists no part of the slice as loading.
func TestMoveIsAHandoffUntilTheNodeHasLoaded(t *testing.T) {
	c := newCluster(t)
	a := c.start(small, func(cfg *assigner.Config) { cfg.Core.BreakBeforeMake = false })
	a.leading(t)
	f := startFleet(t, hot, 2, a)
	eventually(t, 10*time.Second, "two nodes and a map", func() bool { return len(a.nodesList(t)) == 2 && a.hasMap() })
	ctx := ctxT(t, 30*time.Second)
	_, err := a.admin.Freeze(ctx, &pb.FreezeRequest{Reason: "test"})
	require.NoError(t, err)

	// A slice held by one node and not in handoff (passes before the freeze may have
	// replicated or moved some), moving to the other node.
	var s0 assignment.Slice
	for _, s := range a.assignment(t).All() {
		if len(s.Replicas) == 1 && !s.InHandoff() {
			s0 = s
			break
		}
	}
	require.Len(t, s0.Replicas, 1, "a slice on one node")
	from, to := s0.Replicas[0], f.ids[0]
	if s0.Holds(to) {
		to = f.ids[1]
	}
	before, err := a.admin.Status(ctx, &pb.StatusRequest{})
	require.NoError(t, err)
	started0, err := metric(a, "sliceplane_assigner_handoffs_started_total", "")
	require.NoError(t, err)
	done0, err := metric(a, "sliceplane_assigner_handoffs_completed_total", "")
	require.NoError(t, err)
	mv, err := a.admin.Move(ctx, &pb.MoveRequest{Slice: startRef(s0.Range.Start), To: []string{string(to)}})
	require.NoError(t, err)
	gen := mv.GetChange().GetGeneration()
	_, got := a.assignment(t).Lookup(s0.Range.Start)
	assert.Equal(t, []assignment.NodeID{to}, got.Loading)
	assert.Equal(t, []assignment.NodeID{from}, got.Leaving)
	assert.Equal(t, gen, got.Since)
	assert.Equal(t, []assignment.NodeID{from}, got.Serving(), "readers stay on the old holder")

	ls, err := a.admin.ListSlices(ctx, &pb.ListSlicesRequest{Node: string(to)})
	require.NoError(t, err)
	listed := false
	for _, sl := range ls.GetSlices() {
		if sl.GetRange().GetStart() == s0.Range.Start {
			listed = true
			assert.Equal(t, []string{string(to)}, sl.GetLoading())
			assert.Equal(t, []string{string(from)}, sl.GetLeaving())
			assert.Equal(t, gen, sl.GetSince())
		}
	}
	assert.True(t, listed, "the slice is listed among the new node's")
	st, err := a.admin.Status(ctx, &pb.StatusRequest{})
	require.NoError(t, err)
	assert.Equal(t, before.GetHandoffs()+1, st.GetHandoffs())

	// Not yet: the generation is older, or the node still loads the slice.
	_, err = a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: string(to), Generation: gen - 1})
	require.NoError(t, err)
	_, err = a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: string(to), Generation: gen,
		Loading: []*pb.Range{wire.RangeToProto(s0.Range)}})
	require.NoError(t, err)
	_, got = a.assignment(t).Lookup(s0.Range.Start)
	assert.True(t, got.InHandoff(), "the handoff goes on")

	_, err = a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: string(to), Generation: gen})
	require.NoError(t, err)
	_, got = a.assignment(t).Lookup(s0.Range.Start)
	assert.Empty(t, got.Loading, "the new holder serves")
	assert.Equal(t, []assignment.NodeID{from}, got.Leaving, "the old holder lingers")
	assert.ElementsMatch(t, []assignment.NodeID{from, to}, got.Serving(), "both serve meanwhile")
	eventually(t, 10*time.Second, "the old holder drops the slice after the linger", func() bool {
		_, got = a.assignment(t).Lookup(s0.Range.Start)
		return !got.InHandoff() && slices.Equal(got.Replicas, []assignment.NodeID{to})
	})
	eventually(t, 10*time.Second, "handoff metrics", func() bool {
		done, err1 := metric(a, "sliceplane_assigner_handoffs_completed_total", "")
		started, err2 := metric(a, "sliceplane_assigner_handoffs_started_total", "")
		return err1 == nil && err2 == nil && done >= done0+1 && started >= started0+1
	})
}
