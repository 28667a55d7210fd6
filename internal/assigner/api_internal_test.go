package assigner

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/quantum"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// One encoding serves both watch streams only if their responses encode alike.
func TestOneEncodingServesBothWatchStreams(t *testing.T) {
	q := quantum.Quantum{Position: quantum.Position{Term: 3, Seq: 9}, Clock: 77, Generation: 5, Cause: "pass", Time: time.Unix(1, 2),
		Ops: []assignment.Op{assignment.Split{Slice: 0, At: 4}, assignment.Assign{Slice: 4, Replicas: []assignment.NodeID{"a"}}}}
	data, err := encodeQuantum(q)
	require.NoError(t, err)
	want, err := proto.Marshal(&pb.WatchAssignmentResponse{Quantum: wire.QuantumToProto(q)})
	require.NoError(t, err)
	assert.Equal(t, want, data)
	var back pb.WatchAssignmentResponse
	require.NoError(t, proto.Unmarshal(data, &back))
	assert.Equal(t, uint64(9), back.GetQuantum().GetPosition().GetSeq())
	assert.Len(t, back.GetQuantum().GetOps(), 2)
}

func TestReinitializingQuantaAreEncodedOncePerPosition(t *testing.T) {
	a, err := assignment.Uniform(1000, func(int) []assignment.NodeID { return []assignment.NodeID{"a"} })
	require.NoError(t, err)
	h := quantum.NewHub(quantum.HubConfig{}, 4, a, 9)
	var api api
	first, err := h.Subscribe(nil, true).Next(t.Context())
	require.NoError(t, err)
	second, err := h.Subscribe(nil, true).Next(t.Context())
	require.NoError(t, err)
	x, err := api.reinit(first)
	require.NoError(t, err)
	y, err := api.reinit(second)
	require.NoError(t, err)
	assert.Same(t, &x[0], &y[0], "two watchers starting over at one position share one encoding")

	b, err := a.Apply([]assignment.Op{assignment.Merge{Left: 0}})
	require.NoError(t, err)
	require.NoError(t, h.Publish(quantum.Quantum{Position: quantum.Position{Term: 4, Seq: 1}, Clock: 9, Ops: []assignment.Op{assignment.Merge{Left: 0}}}, b))
	third, err := h.Subscribe(nil, true).Next(t.Context())
	require.NoError(t, err)
	z, err := api.reinit(third)
	require.NoError(t, err)
	assert.NotEqual(t, x, z, "a later position is encoded anew")
	var back pb.WatchQuantaResponse
	require.NoError(t, proto.Unmarshal(z, &back))
	assert.True(t, back.GetQuantum().GetReinitializing())
	assert.Len(t, back.GetQuantum().GetAssignment().GetStarts(), 999)
}
