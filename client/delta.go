package client

import (
	"fmt"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// deltaFromProto decodes a delta, checking that every operation is well formed.
func deltaFromProto(m *pb.Delta) (Delta, error) {
	d := Delta{Epoch: m.GetEpoch(), From: m.GetFrom(), To: m.GetTo(), Clock: m.GetClock(), Generation: m.GetGeneration(),
		Ops: make([]Op, len(m.GetOps()))}
	if d.To < d.From {
		return Delta{}, fmt.Errorf("client: delta %d..%d ends before it starts", d.From, d.To)
	}
	// The node's cursor moves to To once the ops are applied: a count that does not match
	// would make it skip operations, or ask for ones it already has.
	if d.To-d.From != uint64(len(d.Ops)) {
		return Delta{}, fmt.Errorf("client: delta %d..%d carries %d ops, not %d", d.From, d.To, len(d.Ops), d.To-d.From)
	}
	if m.GetSlices() != nil {
		list, err := rangesFromProto(m.GetSlices().GetRanges())
		if err != nil {
			return Delta{}, fmt.Errorf("client: delta %d..%d: slices: %w", d.From, d.To, err)
		}
		d.Slices = list
	}
	for i, o := range m.GetOps() {
		op, err := opFromProto(o)
		if err != nil {
			return Delta{}, fmt.Errorf("client: delta %d..%d: op %d: %w", d.From, d.To, i, err)
		}
		d.Ops[i] = op
	}
	return d, nil
}

func opFromProto(o *pb.DeltaOp) (Op, error) {
	switch x := o.GetOp().(type) {
	case *pb.DeltaOp_Reset_:
		return Op{Kind: OpReset}, nil
	case *pb.DeltaOp_AddSlice:
		r, err := wire.RangeFromProto(x.AddSlice)
		return Op{Kind: OpAddSlice, Range: rangeOf(r)}, err
	case *pb.DeltaOp_DropSlice:
		r, err := wire.RangeFromProto(x.DropSlice)
		return Op{Kind: OpDropSlice, Range: rangeOf(r)}, err
	case *pb.DeltaOp_SliceLoaded:
		r, err := wire.RangeFromProto(x.SliceLoaded)
		return Op{Kind: OpSliceLoaded, Range: rangeOf(r)}, err
	case *pb.DeltaOp_SetSlices:
		list, err := rangesFromProto(x.SetSlices.GetRanges())
		return Op{Kind: OpSetSlices, Slices: list}, err
	case *pb.DeltaOp_Put:
		return itemOp(OpPut, x.Put, false)
	case *pb.DeltaOp_Delete:
		return itemOp(OpDelete, x.Delete, false)
	case *pb.DeltaOp_PutFragment:
		return itemOp(OpPutFragment, x.PutFragment, true)
	case *pb.DeltaOp_DeleteFragment:
		return itemOp(OpDeleteFragment, x.DeleteFragment, true)
	}
	return Op{}, fmt.Errorf("empty or unknown operation")
}

func itemOp(kind OpKind, c *pb.ItemChange, fragment bool) (Op, error) {
	switch {
	case len(c.GetKey()) == 0:
		return Op{}, fmt.Errorf("%s of an empty key", kind)
	case fragment && c.GetFragment() == "":
		return Op{}, fmt.Errorf("%s of %q without a fragment ID", kind, c.GetKey())
	case !fragment && c.GetFragment() != "":
		// Not to be taken for an operation on the item: the sender meant a fragment.
		return Op{}, fmt.Errorf("%s of %q with a fragment ID", kind, c.GetKey())
	}
	return Op{Kind: kind, Key: c.GetKey(), Fragment: c.GetFragment(), Value: c.GetValue()}, nil
}

func rangesFromProto(ms []*pb.Range) ([]Range, error) {
	out := make([]Range, len(ms))
	for i, m := range ms {
		r, err := wire.RangeFromProto(m)
		if err != nil {
			return nil, err
		}
		if i > 0 && out[i-1].End.Compare(BoundAt(r.Start)) > 0 {
			return nil, fmt.Errorf("slices %s and %s overlap or are out of order", out[i-1], r)
		}
		out[i] = rangeOf(r)
	}
	return out, nil
}
