package assigner_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/dial"
)

// idleLeader starts a leader with one node and a map, frozen so that nothing changes: its
// watches carry only heartbeats after the map.
func idleLeader(t *testing.T) (*node, context.Context) {
	c := newCluster(t)
	a := c.start(small)
	a.leading(t)
	ctx := ctxT(t, 30*time.Second)
	_, err := a.admin.Freeze(ctx, &pb.FreezeRequest{Reason: "idle"})
	require.NoError(t, err)
	_, err = a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: "node-0"}, Address: "127.0.0.1:1"})
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the first map", a.hasMap)
	return a, ctx
}

// An idle watch carries heartbeats, so that a watcher tells an idle leader from a hung one.
func TestIdleWatchesCarryHeartbeats(t *testing.T) {
	a, ctx := idleLeader(t)

	assign, err := a.assign.WatchAssignment(ctx, &pb.WatchAssignmentRequest{})
	require.NoError(t, err)
	quanta, err := a.quanta.WatchQuanta(ctx, &pb.WatchQuantaRequest{})
	require.NoError(t, err)
	for name, next := range map[string]func() (interface{ GetHeartbeat() bool }, error){
		"assignment": func() (interface{ GetHeartbeat() bool }, error) { return assign.Recv() },
		"quanta":     func() (interface{ GetHeartbeat() bool }, error) { return quanta.Recv() },
	} {
		first, err := next()
		require.NoError(t, err)
		require.False(t, first.GetHeartbeat(), "%s: the map comes first", name)
		for range 3 {
			start := time.Now()
			m, err := next()
			require.NoError(t, err)
			require.True(t, m.GetHeartbeat(), "%s: nothing changes, so only heartbeats come", name)
			require.Less(t, time.Since(start), dial.StreamIdleTimeout, "%s: heartbeats come often enough", name)
		}
	}
}

// A watcher may ask for fewer heartbeats (routers ask their relays, which serve the same
// protocol): an idle watch that asked for 2 s gets one no more often than that. An interval
// out of bounds is refused.
func TestAWatcherChoosesItsHeartbeat(t *testing.T) {
	a, ctx := idleLeader(t)

	for _, bad := range []time.Duration{100 * time.Millisecond, time.Minute, -time.Second} {
		w, err := a.assign.WatchAssignment(ctx, &pb.WatchAssignmentRequest{Heartbeat: durationpb.New(bad)})
		require.NoError(t, err)
		_, err = w.Recv()
		require.Equal(t, codes.InvalidArgument, code(err), "heartbeat %s: %v", bad, err)
		require.ErrorContains(t, err, "want between 500ms and 5s")
	}
	w, err := a.assign.WatchAssignment(ctx, &pb.WatchAssignmentRequest{Heartbeat: durationpb.New(2 * time.Second)})
	require.NoError(t, err)
	first, err := w.Recv()
	require.NoError(t, err)
	require.False(t, first.GetHeartbeat(), "the map comes first")
	last := time.Now()
	for range 2 {
		m, err := w.Recv()
		require.NoError(t, err)
		require.True(t, m.GetHeartbeat())
		// Well above the default 500 ms: the map's own delivery may have been late.
		require.Greater(t, time.Since(last), time.Second, "a heartbeat came sooner than asked")
		last = time.Now()
	}
}

// A node's heartbeat says whether its data is stale; the assigner lists it per node and
// counts the stale nodes.
func TestHeartbeatsSayWhetherANodesDataIsStale(t *testing.T) {
	c := newCluster(t)
	a := c.start(small)
	a.leading(t)
	ctx := ctxT(t, 30*time.Second)
	for _, id := range []string{"n1", "n2"} {
		_, err := a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: id}, Address: "127.0.0.1:1"})
		require.NoError(t, err)
	}
	listed := func() map[string]*pb.NodeInfo {
		resp, err := a.admin.ListNodes(ctx, &pb.ListNodesRequest{})
		require.NoError(t, err)
		out := map[string]*pb.NodeInfo{}
		for _, n := range resp.GetNodes() {
			out[n.GetNode().GetId()] = n
		}
		return out
	}
	stale := func() float64 {
		v, err := metric(a, "sliceplane_assigner_nodes_stale", "")
		require.NoError(t, err)
		return v
	}
	nodes := listed()
	require.False(t, nodes["n1"].GetStale())
	require.Nil(t, nodes["n1"].GetSilence(), "n1 said nothing yet")

	_, err := a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "n1", Stale: true, Silence: durationpb.New(7 * time.Second)})
	require.NoError(t, err)
	_, err = a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "n2", Silence: durationpb.New(100 * time.Millisecond)})
	require.NoError(t, err)
	nodes = listed()
	require.True(t, nodes["n1"].GetStale())
	require.Equal(t, 7*time.Second, nodes["n1"].GetSilence().AsDuration())
	require.False(t, nodes["n2"].GetStale())
	require.Equal(t, 1.0, stale())

	_, err = a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "n1", Silence: durationpb.New(time.Second)})
	require.NoError(t, err)
	require.False(t, listed()["n1"].GetStale(), "fresh again")
	require.Equal(t, 0.0, stale())
}
