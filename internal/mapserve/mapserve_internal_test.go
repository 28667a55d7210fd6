package mapserve

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
	"github.com/sliceplane/sliceplane/internal/wire"
)

// One encoding serves both watch streams only if their responses encode alike.
func TestOneEncodingServesBothWatchStreams(t *testing.T) {
	q := quantum.Quantum{Position: quantum.Position{Term: 3, Seq: 9}, Clock: 77, Generation: 5, Cause: "pass", Time: time.Unix(1, 2),
		Ops: []assignment.Op{assignment.Split{Slice: 0, At: 4}, assignment.Assign{Slice: 4, Replicas: []assignment.NodeID{"a"}}}}
	data, err := Encode(q)
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
	var f Feed
	first, err := h.Subscribe(nil, true).Next(t.Context())
	require.NoError(t, err)
	second, err := h.Subscribe(nil, true).Next(t.Context())
	require.NoError(t, err)
	x, err := f.reinits.get(first)
	require.NoError(t, err)
	y, err := f.reinits.get(second)
	require.NoError(t, err)
	assert.Same(t, &x[0], &y[0], "two watchers starting over at one position share one encoding")

	b, err := a.Apply([]assignment.Op{assignment.Merge{Left: 0}})
	require.NoError(t, err)
	require.NoError(t, h.Publish(quantum.Quantum{Position: quantum.Position{Term: 4, Seq: 1}, Clock: 9, Ops: []assignment.Op{assignment.Merge{Left: 0}}}, b))
	third, err := h.Subscribe(nil, true).Next(t.Context())
	require.NoError(t, err)
	z, err := f.reinits.get(third)
	require.NoError(t, err)
	assert.NotEqual(t, x, z, "a later position is encoded anew")
	var back pb.WatchQuantaResponse
	require.NoError(t, proto.Unmarshal(z, &back))
	assert.True(t, back.GetQuantum().GetReinitializing())
	assert.Len(t, back.GetQuantum().GetAssignment().GetStarts(), 999)
}

// Every watcher of a quantum sends the encoding the leader made once, as it published it.
func TestQuantaAreEncodedOnceForEveryWatcher(t *testing.T) {
	f := NewFeed(nil)
	q := quantum.Quantum{Position: quantum.Position{Term: 2, Seq: 5}, Clock: 9, Cause: "pass",
		Ops: []assignment.Op{assignment.Split{Slice: 0, At: 4}}}
	data, err := Encode(q)
	require.NoError(t, err)
	f.encoded.put(q.Position, data)
	x, err := f.encode(q)
	require.NoError(t, err)
	y, err := f.encode(q)
	require.NoError(t, err)
	assert.Same(t, &data[0], &x[0], "the publisher's encoding")
	assert.Same(t, &x[0], &y[0])

	// The cache is bounded as the hub is; a quantum that left it is encoded anew, alike.
	for i := range maxEncodings {
		f.encoded.put(quantum.Position{Term: 2, Seq: 6 + uint64(i)}, []byte{1})
	}
	_, ok := f.encoded.get(q.Position)
	assert.False(t, ok)
	assert.LessOrEqual(t, len(f.encoded.data), maxEncodings)
	z, err := f.encode(q)
	require.NoError(t, err)
	assert.Equal(t, data, z)

	// A watcher starting over at a published quantum's position gets the hub's
	// reinitializing quantum, not the published one.
	m, err := assignment.Uniform(4, func(int) []assignment.NodeID { return []assignment.NodeID{"a"} })
	require.NoError(t, err)
	h := quantum.NewHub(quantum.HubConfig{}, 2, m, 9)
	pub := quantum.Quantum{Position: quantum.Position{Term: 2, Seq: 1}, Clock: 9, Snapshot: m, Cause: "distributors"}
	data, err = Encode(pub)
	require.NoError(t, err)
	f.encoded.put(pub.Position, data)
	require.NoError(t, h.Publish(pub, m))
	re, err := h.Subscribe(nil, true).Next(t.Context())
	require.NoError(t, err)
	require.Equal(t, pub.Position, re.Position)
	got, err := f.encode(re)
	require.NoError(t, err)
	var back pb.WatchQuantaResponse
	require.NoError(t, proto.Unmarshal(got, &back))
	assert.Equal(t, "reinit", back.GetQuantum().GetCause())
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
