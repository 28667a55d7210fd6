package wire

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/assignment/assignmenttest"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
)

func TestAssignmentRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := assignmenttest.Generator([]assignment.NodeID{"a", "b", "c", "d"}, 50, math.MaxUint64).Draw(t, "assignment")
		b, err := proto.Marshal(AssignmentToProto(a))
		if err != nil {
			t.Fatal(err)
		}
		var m pb.Assignment
		if err := proto.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		got, err := AssignmentFromProto(&m)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Equal(a) || got.Generation() != a.Generation() {
			t.Fatalf("got\n%s\nwant\n%s", got, a)
		}
	})
}

func TestAHandoffTravels(t *testing.T) {
	a, err := assignment.New(3, []assignment.Slice{{Range: keyspace.Full(), Replicas: []assignment.NodeID{"a"}}})
	require.NoError(t, err)
	b, err := a.Apply([]assignment.Op{assignment.Handoff{Slice: 0, Replicas: []assignment.NodeID{"b"}}})
	require.NoError(t, err)
	got, err := AssignmentFromProto(AssignmentToProto(b))
	require.NoError(t, err)
	require.True(t, got.Equal(b), "got\n%s\nwant\n%s", got, b)
	require.Equal(t, []assignment.NodeID{"b"}, got.Slice(0).Loading)
}

func TestOpsRoundTrip(t *testing.T) {
	ops := []assignment.Op{
		assignment.Split{Slice: 0, At: 1 << 62},
		assignment.Assign{Slice: 1 << 62, Replicas: []assignment.NodeID{"a", "b"}},
		assignment.Assign{Slice: 1 << 62, Replicas: []assignment.NodeID{"a", "b"},
			Loading: []assignment.NodeID{"b"}, Leaving: []assignment.NodeID{"a"}, Since: 9},
		assignment.Merge{Left: 0},
	}
	got, err := OpsFromProto(OpsToProto(ops))
	require.NoError(t, err)
	assert.Equal(t, ops, got)
}

func TestBadMessagesAreRejected(t *testing.T) {
	rs := func(ids ...string) *pb.ReplicaSet { return &pb.ReplicaSet{Nodes: ids} }
	for _, c := range []struct {
		m    *pb.Assignment
		want string
	}{
		{nil, "no assignment"},
		{&pb.Assignment{}, "no slices"},
		{&pb.Assignment{Starts: []uint64{0, 5}, Replicas: []*pb.ReplicaSet{rs("a")}}, "2 slice starts but 1 replica sets"},
		{&pb.Assignment{Starts: []uint64{3}, Replicas: []*pb.ReplicaSet{rs("a")}}, "starts at 0x0000000000000003, not 0"},
		{&pb.Assignment{Starts: []uint64{0, 9, 9}, Replicas: []*pb.ReplicaSet{rs("a"), rs("a"), rs("a")}}, "not ascending at 2"},
		{&pb.Assignment{Starts: []uint64{0, 9}, Replicas: []*pb.ReplicaSet{rs("a"), rs()}}, "empty replica set"},
		{&pb.Assignment{Starts: []uint64{0}, Replicas: []*pb.ReplicaSet{rs("a", "a")}}, "duplicate replica"},
		{&pb.Assignment{Starts: []uint64{0}, Replicas: []*pb.ReplicaSet{rs("a b")}}, "bad node ID"},
	} {
		_, err := AssignmentFromProto(c.m)
		require.ErrorIs(t, err, ErrInvalid, fmt.Sprint(c.m))
		assert.Contains(t, err.Error(), c.want)
	}

	for _, c := range []struct {
		ops  []*pb.Op
		want string
	}{
		{[]*pb.Op{{}}, "op 0 is empty"},
		{[]*pb.Op{{Op: &pb.Op_Merge{Merge: &pb.Merge{}}}, {Op: &pb.Op_Assign{Assign: &pb.Assign{Slice: 4}}}}, "op 1 assigns slice 0x0000000000000004 to no node"},
		{[]*pb.Op{{Op: &pb.Op_Assign{Assign: &pb.Assign{Replicas: rs("ok", "not ok")}}}}, "bad node ID"},
	} {
		_, err := OpsFromProto(c.ops)
		require.ErrorIs(t, err, ErrInvalid)
		assert.Contains(t, err.Error(), c.want)
	}

	n, err := NodeFromProto(NodeToProto(assignment.Node{ID: "n1", Capacity: 2}))
	require.NoError(t, err)
	assert.Equal(t, assignment.Node{ID: "n1", Capacity: 2}, n)
	_, err = NodeFromProto(&pb.Node{Id: "n1", Capacity: -1})
	assert.ErrorIs(t, err, ErrInvalid)
}

func TestRanges(t *testing.T) {
	for _, r := range []keyspace.Range{keyspace.Full(), {Start: 5, End: keyspace.At(9)}, {Start: math.MaxUint64, End: keyspace.End}} {
		got, err := RangeFromProto(RangeToProto(r))
		require.NoError(t, err)
		assert.Equal(t, r, got)
	}
	for _, m := range []*pb.Range{nil, {Start: 9, End: 9}, {Start: 9, End: 3}} {
		_, err := RangeFromProto(m)
		assert.ErrorIs(t, err, ErrInvalid)
	}
}

func TestReportRoundTrip(t *testing.T) {
	r := load.Report{Node: "n1", Window: 2 * time.Second,
		Samples: []load.Sample{{Range: keyspace.Range{Start: 0, End: keyspace.At(5)}, Load: 1.5, Keys: 10},
			{Range: keyspace.Range{Start: 5, End: keyspace.End}, Load: 0, Keys: 3}},
		HotKeys: []load.HotKey{{Hash: 7, Load: 1}}}
	got, err := ReportFromProto(ReportToProto(r))
	require.NoError(t, err)
	assert.Equal(t, r, got)

	bad := ReportToProto(r)
	bad.Loads = bad.Loads[:1]
	_, err = ReportFromProto(bad)
	assert.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), "columns differ")
	bad = ReportToProto(r)
	bad.Window = nil
	_, err = ReportFromProto(bad)
	assert.ErrorIs(t, err, ErrInvalid)
	noKeys := ReportToProto(r)
	noKeys.Keys = nil
	got, err = ReportFromProto(noKeys)
	require.NoError(t, err)
	assert.Zero(t, got.Samples[0].Keys, "keys are optional")
}
