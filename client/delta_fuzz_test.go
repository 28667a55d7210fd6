package client

import (
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

// FuzzDeltaFromProto decodes what a distributor could send and checks that every delta the
// node accepts is one it can apply as the stream says: as many ops as From..To spans, each
// well formed.
func FuzzDeltaFromProto(f *testing.F) {
	for _, m := range []*pb.Delta{
		{Epoch: 0xfeed, From: 0, To: 5, Clock: 42, Ops: []*pb.DeltaOp{
			{Op: &pb.DeltaOp_Reset_{Reset_: &pb.Reset{}}},
			{Op: &pb.DeltaOp_SetSlices{SetSlices: &pb.SliceList{Ranges: []*pb.Range{pbRange(0, 1<<62), pbRangeEnd(1 << 63)}}}},
			{Op: &pb.DeltaOp_AddSlice{AddSlice: pbRange(0, 1<<62)}},
			{Op: &pb.DeltaOp_Put{Put: pbItem("user:42", "", "v")}},
			{Op: &pb.DeltaOp_PutFragment{PutFragment: pbItem("user:42", "f1", "fv")}},
		}},
		{Epoch: 0xfeed, From: 5, To: 8, Clock: 43, Ops: []*pb.DeltaOp{
			{Op: &pb.DeltaOp_DeleteFragment{DeleteFragment: pbItem("user:42", "f1", "")}},
			{Op: &pb.DeltaOp_Delete{Delete: pbItem("user:42", "", "")}},
			{Op: &pb.DeltaOp_DropSlice{DropSlice: pbRange(0, 1<<62)}},
		}},
		{Epoch: 1, From: 7, To: 7, Clock: 99, Slices: &pb.SliceList{}},
		{Epoch: 1, From: 3, To: 3, Slices: &pb.SliceList{Ranges: []*pb.Range{pbRange(5, 10), pbRangeEnd(5)}}},
		{Epoch: 1, From: 5, To: 4},
		{Epoch: 1, From: 0, To: 9, Ops: []*pb.DeltaOp{{Op: &pb.DeltaOp_Put{Put: pbItem("k", "", "v")}}}},
		{Epoch: 1, From: 0, To: 1, Ops: []*pb.DeltaOp{{Op: &pb.DeltaOp_Put{Put: pbItem("k", "f", "v")}}}},
		{Epoch: 1, From: 0, To: 1, Ops: []*pb.DeltaOp{{}}},
		{Epoch: 1, From: 0, To: 1, Ops: []*pb.DeltaOp{{Op: &pb.DeltaOp_PutFragment{PutFragment: pbItem("k", "", "v")}}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m pb.Delta
		if proto.Unmarshal(b, &m) != nil {
			return
		}
		d, err := deltaFromProto(&m)
		if err != nil {
			return
		}
		if d.To < d.From || d.To-d.From != uint64(len(d.Ops)) {
			t.Fatalf("accepted delta %d..%d with %d ops", d.From, d.To, len(d.Ops))
		}
		if (d.Slices == nil) != (m.GetSlices() == nil) {
			t.Fatalf("slice list %v decoded from %v", d.Slices, m.GetSlices())
		}
		checkRanges(t, d.Slices)
		for i, op := range d.Ops {
			checkOp(t, i, op)
		}
	})
}

func checkOp(t *testing.T, i int, op Op) {
	t.Helper()
	switch op.Kind {
	case OpReset:
	case OpAddSlice, OpDropSlice:
		if !op.Range.Valid() {
			t.Fatalf("op %d: %s of the empty range %s", i, op.Kind, op.Range)
		}
	case OpSetSlices:
		checkRanges(t, op.Slices)
	case OpPut, OpDelete, OpPutFragment, OpDeleteFragment:
		fragment := op.Kind == OpPutFragment || op.Kind == OpDeleteFragment
		if len(op.Key) == 0 || fragment != (op.Fragment != "") {
			t.Fatalf("op %d: %s of key %q, fragment %q", i, op.Kind, op.Key, op.Fragment)
		}
	default:
		t.Fatalf("op %d is of kind %s", i, op.Kind)
	}
}

// checkRanges checks that a slice list is valid ranges in order, without overlap.
func checkRanges(t *testing.T, rs []Range) {
	t.Helper()
	for i, r := range rs {
		if !r.Valid() {
			t.Fatalf("slice %d, %s, is empty", i, r)
		}
		if i > 0 && (rs[i-1].End.IsEnd() || rs[i-1].End.Point() > r.Start) {
			t.Fatalf("slices %s and %s overlap or are out of order", rs[i-1], r)
		}
	}
}
