package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/quantum"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A relay vouches for its map only while its stream speaks and its map keeps up with it.
func TestARelayStopsVouchingWhenItsStreamIsSilentOrAhead(t *testing.T) {
	r := New()
	now := time.Now()
	const limit = 2 * time.Second
	assert.False(t, r.Live(now, limit), "it never heard the assigner")
	r.Heard(now)
	assert.True(t, r.Live(now.Add(limit/2), limit))
	assert.False(t, r.Live(now.Add(limit), limit), "silent for the limit")

	m, err := assignment.Uniform(4, func(int) []assignment.NodeID { return []assignment.NodeID{"a"} })
	require.NoError(t, err)
	_, err = r.Take(quantum.Quantum{Position: quantum.Position{Term: 2, Seq: 1}, Snapshot: m, Generation: m.Generation()})
	require.NoError(t, err)
	_, err = r.Take(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 9}, Snapshot: m})
	require.ErrorIs(t, err, ErrOlderTerm)
	assert.True(t, r.Live(now, limit), "a deposed leader's quantum leaves the map as good as it was")

	_, err = r.Take(quantum.Quantum{Position: quantum.Position{Term: 2, Seq: 3}, Generation: 1,
		Ops: []assignment.Op{assignment.Assign{Slice: 0, Replicas: []assignment.NodeID{"b"}}}})
	require.ErrorIs(t, err, ErrRefused)
	assert.False(t, r.Live(now, limit), "a quantum was missed: the map is behind the stream")
	out, err := r.Take(quantum.Quantum{Position: quantum.Position{Term: 2, Seq: 3}, Snapshot: m, Generation: m.Generation()})
	require.NoError(t, err)
	assert.Equal(t, Reset, out)
	assert.True(t, r.Live(now, limit), "the stream started over: the map is current again")
}

// A relay's node list changes version only when what routers use of the leader's list
// changed: its watchers are sent a list again only then, and all of them the one encoding.
func TestTheNodeListIsSentAgainOnlyWhenItChanged(t *testing.T) {
	var n Nodes
	assert.Zero(t, n.watched().Version, "no list read yet")
	list := func(addr string, load float64) *pb.ListNodesResponse {
		return &pb.ListNodesResponse{Nodes: []*pb.NodeInfo{{Node: &pb.Node{Id: "n1"}, Address: addr, Load: load, Slices: uint32(10 * load)}}}
	}
	require.NoError(t, n.store(list("127.0.0.1:1", 0.5)))
	first := n.watched()
	assert.Equal(t, uint64(1), first.Version)
	require.NoError(t, n.store(list("127.0.0.1:1", 0.5)))
	assert.Equal(t, first, n.watched(), "the same list, read again")
	require.NoError(t, n.store(list("127.0.0.1:1", 0.7)))
	assert.Equal(t, first, n.watched(), "the same routing, another load")
	lists, err := NewService(nil, &n, nil).ListNodes(t.Context(), &pb.ListNodesRequest{})
	require.NoError(t, err)
	assert.InDelta(t, 0.7, lists.GetNodes()[0].GetLoad(), 1e-9, "ListNodes answers the whole list, the last read")
	require.NoError(t, n.store(list("127.0.0.1:2", 0.7)))
	second := n.watched()
	assert.Equal(t, uint64(2), second.Version)
	var resp pb.WatchAssignmentResponse
	require.NoError(t, proto.Unmarshal(second.Data, &resp))
	assert.Equal(t, "127.0.0.1:2", resp.GetNodes().GetNodes()[0].GetAddress())
	assert.Zero(t, resp.GetNodes().GetNodes()[0].GetLoad(), "watchers are not sent the counters")
}
