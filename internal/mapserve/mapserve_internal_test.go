package mapserve

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/frame"
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

// sentStream is a watch's server stream that hands each message sent to the test.
type sentStream struct {
	grpc.ServerStream
	ctx  context.Context
	sent chan *pb.WatchAssignmentResponse
}

func (s *sentStream) Context() context.Context { return s.ctx }

func (s *sentStream) SendMsg(m any) error {
	var resp pb.WatchAssignmentResponse
	if err := proto.Unmarshal(m.(*frame.Frame).Data, &resp); err != nil {
		return err
	}
	s.sent <- &resp
	return nil
}

// A watcher that asks for the node list gets it first, and again only once it changed: on
// the next quantum, or in place of a heartbeat. One that does not ask never gets it.
func TestAWatchSendsTheNodeListWhenItChanges(t *testing.T) {
	a, err := assignment.Uniform(4, func(int) []assignment.NodeID { return []assignment.NodeID{"a"} })
	require.NoError(t, err)
	feed := NewFeed(quantum.NewHub(quantum.HubConfig{}, 1, a, 1))
	var list atomic.Pointer[NodeList]
	setList := func(version uint64, addr string) {
		data, err := EncodeNodes(&pb.ListNodesResponse{Nodes: []*pb.NodeInfo{{Node: &pb.Node{Id: "a"}, Address: addr}}})
		require.NoError(t, err)
		list.Store(&NodeList{Version: version, Data: data})
	}
	setList(1, "127.0.0.1:1")
	srv := &Server{Name: "test", Feed: func() (*Feed, error) { return feed, nil }, Nodes: func() NodeList { return *list.Load() }}
	watch := func(nodes bool) chan *pb.WatchAssignmentResponse {
		s := &sentStream{ctx: t.Context(), sent: make(chan *pb.WatchAssignmentResponse, 16)}
		go func() { _ = srv.Watch(s, Want{Nodes: nodes}) }()
		return s.sent
	}
	with, without := watch(true), watch(false)
	recv := func(c chan *pb.WatchAssignmentResponse) *pb.WatchAssignmentResponse {
		select {
		case resp := <-c:
			return resp
		case <-time.After(10 * time.Second):
			t.Fatal("nothing sent within 10 s")
			return nil
		}
	}
	addrOf := func(resp *pb.WatchAssignmentResponse) string { return resp.GetNodes().GetNodes()[0].GetAddress() }

	assert.Equal(t, "127.0.0.1:1", addrOf(recv(with)), "the node list comes first")
	assert.True(t, recv(with).GetQuantum().GetReinitializing(), "then the map")
	assert.True(t, recv(without).GetQuantum().GetReinitializing(), "the map alone to a watcher that did not ask")

	setList(2, "127.0.0.1:2")
	b, err := a.Apply([]assignment.Op{assignment.Merge{Left: 0}})
	require.NoError(t, err)
	require.NoError(t, feed.Publish(quantum.Quantum{Position: quantum.Position{Term: 1, Seq: 1}, Clock: 2, Generation: b.Generation(), Ops: []assignment.Op{assignment.Merge{Left: 0}}}, b))
	assert.Equal(t, "127.0.0.1:2", addrOf(recv(with)), "a changed list goes before the next quantum")
	assert.Equal(t, uint64(1), recv(with).GetQuantum().GetPosition().GetSeq())
	assert.Equal(t, uint64(1), recv(without).GetQuantum().GetPosition().GetSeq())

	setList(3, "127.0.0.1:3")
	assert.Equal(t, "127.0.0.1:3", addrOf(recv(with)), "an idle watch sends a changed list instead of a heartbeat")
	assert.True(t, recv(with).GetHeartbeat(), "and heartbeats while it stays the same")
	assert.True(t, recv(without).GetHeartbeat())
	assert.True(t, recv(without).GetHeartbeat(), "never the list to a watcher that did not ask")
}
