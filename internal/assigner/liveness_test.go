package assigner_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/dial"
)

// An idle watch carries heartbeats, so that a watcher tells an idle leader from a hung one.
func TestIdleWatchesCarryHeartbeats(t *testing.T) {
	c := newCluster(t)
	a := c.start(small)
	a.leading(t)
	ctx := ctxT(t, 30*time.Second)
	_, err := a.admin.Freeze(ctx, &pb.FreezeRequest{Reason: "idle"})
	require.NoError(t, err)
	_, err = a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: "node-0"}, Address: "127.0.0.1:1"})
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the first map", a.hasMap)

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
