package client

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

func pbRange(start, end uint64) *pb.Range { return &pb.Range{Start: start, End: end} }

func pbRangeEnd(start uint64) *pb.Range { return &pb.Range{Start: start, EndOfSpace: true} }

func pbItem(key, fragment, value string) *pb.ItemChange {
	c := &pb.ItemChange{Key: []byte(key), Fragment: fragment}
	if value != "" {
		c.Value = []byte(value)
	}
	return c
}

func TestDeltaFromProtoDecodesEveryOp(t *testing.T) {
	m := &pb.Delta{
		Epoch: 0xfeed, From: 10, To: 19, Clock: 4242, Generation: 77,
		Ops: []*pb.DeltaOp{
			{Op: &pb.DeltaOp_Reset_{Reset_: &pb.Reset{}}},
			{Op: &pb.DeltaOp_AddSlice{AddSlice: pbRange(0, 1<<63)}},
			{Op: &pb.DeltaOp_DropSlice{DropSlice: pbRangeEnd(1 << 63)}},
			{Op: &pb.DeltaOp_SetSlices{SetSlices: &pb.SliceList{Ranges: []*pb.Range{pbRange(0, 100), pbRange(100, 200), pbRangeEnd(500)}}}},
			{Op: &pb.DeltaOp_Put{Put: pbItem("k1", "", "v1")}},
			{Op: &pb.DeltaOp_Delete{Delete: pbItem("k2", "", "")}},
			{Op: &pb.DeltaOp_PutFragment{PutFragment: pbItem("k3", "f1", "fv")}},
			{Op: &pb.DeltaOp_DeleteFragment{DeleteFragment: pbItem("k4", "f2", "")}},
			{Op: &pb.DeltaOp_SliceLoaded{SliceLoaded: pbRange(0, 1<<62)}},
		},
	}
	d, err := deltaFromProto(m)
	require.NoError(t, err)
	assert.Equal(t, Delta{
		Epoch: 0xfeed, From: 10, To: 19, Clock: 4242, Generation: 77,
		Ops: []Op{
			{Kind: OpReset},
			{Kind: OpAddSlice, Range: rng(0, 1<<63)},
			{Kind: OpDropSlice, Range: rngEnd(1 << 63)},
			{Kind: OpSetSlices, Slices: []Range{rng(0, 100), rng(100, 200), rngEnd(500)}},
			{Kind: OpPut, Key: []byte("k1"), Value: []byte("v1")},
			{Kind: OpDelete, Key: []byte("k2")},
			{Kind: OpPutFragment, Key: []byte("k3"), Fragment: "f1", Value: []byte("fv")},
			{Kind: OpDeleteFragment, Key: []byte("k4"), Fragment: "f2"},
			{Kind: OpSliceLoaded, Range: rng(0, 1<<62)},
		},
	}, d)
	assert.Nil(t, d.Slices, "no slice list in the message, none in the delta")
}

func TestDeltaFromProtoEmpty(t *testing.T) {
	// A clock-only delta: no operations, From == To.
	d, err := deltaFromProto(&pb.Delta{Epoch: 3, From: 7, To: 7, Clock: 99})
	require.NoError(t, err)
	assert.Equal(t, Delta{Epoch: 3, From: 7, To: 7, Clock: 99, Ops: []Op{}}, d)
}

func TestDeltaFromProtoSlices(t *testing.T) {
	t.Run("absent", func(t *testing.T) {
		d, err := deltaFromProto(&pb.Delta{Epoch: 1, From: 0, To: 0})
		require.NoError(t, err)
		assert.Nil(t, d.Slices)
	})
	t.Run("empty list", func(t *testing.T) {
		// A node that resumes holding nothing must learn that it holds nothing: an empty
		// list is not the absence of a list.
		d, err := deltaFromProto(&pb.Delta{Epoch: 1, From: 0, To: 0, Slices: &pb.SliceList{}})
		require.NoError(t, err)
		assert.NotNil(t, d.Slices)
		assert.Empty(t, d.Slices)
	})
	t.Run("list", func(t *testing.T) {
		d, err := deltaFromProto(&pb.Delta{Epoch: 1, From: 4, To: 4,
			Slices: &pb.SliceList{Ranges: []*pb.Range{pbRange(5, 10), pbRange(10, 20), pbRangeEnd(30)}}})
		require.NoError(t, err)
		assert.Equal(t, []Range{rng(5, 10), rng(10, 20), rngEnd(30)}, d.Slices)
	})
}

func TestDeltaFromProtoRejects(t *testing.T) {
	op := func(o *pb.DeltaOp) *pb.Delta { return &pb.Delta{Epoch: 1, From: 0, To: 1, Ops: []*pb.DeltaOp{o}} }
	setSlices := func(rs ...*pb.Range) *pb.Delta {
		return op(&pb.DeltaOp{Op: &pb.DeltaOp_SetSlices{SetSlices: &pb.SliceList{Ranges: rs}}})
	}
	withSlices := func(rs ...*pb.Range) *pb.Delta {
		return &pb.Delta{Epoch: 1, From: 2, To: 2, Slices: &pb.SliceList{Ranges: rs}}
	}
	cases := []struct {
		name string
		m    *pb.Delta
		want string
	}{
		{"to before from", &pb.Delta{Epoch: 1, From: 5, To: 4}, "ends before it starts"},
		{"to beyond its ops", &pb.Delta{Epoch: 1, From: 5, To: 9, Ops: []*pb.DeltaOp{
			{Op: &pb.DeltaOp_Put{Put: pbItem("k", "", "v")}}}}, "carries 1 ops, not 4"},
		{"more ops than from..to", &pb.Delta{Epoch: 1, From: 5, To: 5, Ops: []*pb.DeltaOp{
			{Op: &pb.DeltaOp_Put{Put: pbItem("k", "", "v")}}}}, "carries 1 ops, not 0"},
		{"put with a fragment ID", op(&pb.DeltaOp{Op: &pb.DeltaOp_Put{Put: pbItem("k", "f", "v")}}), "with a fragment ID"},
		{"delete with a fragment ID", op(&pb.DeltaOp{Op: &pb.DeltaOp_Delete{Delete: pbItem("k", "f", "")}}), "with a fragment ID"},
		{"empty op", op(&pb.DeltaOp{}), "empty or unknown operation"},
		{"put of an empty key", op(&pb.DeltaOp{Op: &pb.DeltaOp_Put{Put: pbItem("", "", "v")}}), "put of an empty key"},
		{"put without an item", op(&pb.DeltaOp{Op: &pb.DeltaOp_Put{}}), "put of an empty key"},
		{"delete of an empty key", op(&pb.DeltaOp{Op: &pb.DeltaOp_Delete{Delete: pbItem("", "", "")}}), "delete of an empty key"},
		{"put_fragment of an empty key", op(&pb.DeltaOp{Op: &pb.DeltaOp_PutFragment{PutFragment: pbItem("", "f", "v")}}), "put_fragment of an empty key"},
		{"put_fragment without fragment ID", op(&pb.DeltaOp{Op: &pb.DeltaOp_PutFragment{PutFragment: pbItem("k", "", "v")}}), "without a fragment ID"},
		{"delete_fragment without fragment ID", op(&pb.DeltaOp{Op: &pb.DeltaOp_DeleteFragment{DeleteFragment: pbItem("k", "", "")}}), "without a fragment ID"},
		{"add_slice ending before its start", op(&pb.DeltaOp{Op: &pb.DeltaOp_AddSlice{AddSlice: pbRange(10, 5)}}), "empty"},
		{"add_slice of an empty range", op(&pb.DeltaOp{Op: &pb.DeltaOp_AddSlice{AddSlice: pbRange(10, 10)}}), "empty"},
		{"add_slice without a range", op(&pb.DeltaOp{Op: &pb.DeltaOp_AddSlice{}}), "no range"},
		{"drop_slice ending before its start", op(&pb.DeltaOp{Op: &pb.DeltaOp_DropSlice{DropSlice: pbRange(10, 5)}}), "empty"},
		{"set_slices with an invalid range", setSlices(pbRange(0, 10), pbRange(30, 20)), "empty"},
		{"set_slices out of order", setSlices(pbRange(20, 30), pbRange(0, 10)), "overlap or are out of order"},
		{"set_slices overlapping", setSlices(pbRange(0, 20), pbRange(10, 30)), "overlap or are out of order"},
		{"set_slices after one reaching the end", setSlices(pbRangeEnd(10), pbRange(20, 30)), "overlap or are out of order"},
		{"set_slices twice the same", setSlices(pbRange(0, 10), pbRange(0, 10)), "overlap or are out of order"},
		{"slices with an invalid range", withSlices(pbRange(7, 3)), "slices"},
		{"slices out of order", withSlices(pbRange(20, 30), pbRange(0, 10)), "overlap or are out of order"},
		{"slices overlapping", withSlices(pbRange(0, 20), pbRange(19, 30)), "overlap or are out of order"},
		{"a bad op after good ones", &pb.Delta{Epoch: 1, From: 0, To: 3, Ops: []*pb.DeltaOp{
			{Op: &pb.DeltaOp_Reset_{Reset_: &pb.Reset{}}},
			{Op: &pb.DeltaOp_Put{Put: pbItem("k", "", "v")}},
			{},
		}}, "op 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := deltaFromProto(tc.m)
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.want)
			assert.Zero(t, d, "nothing decoded on error")
		})
	}
}

// call is one call a recordingBatch received.
type call struct {
	name string
	arg  string
}

// recordingBatch is a Store and Batch that records every call, and fails the call named by
// failOn (or Begin, or Commit).
type recordingBatch struct {
	calls  []call
	failOn string
	err    error
	cursor Cursor // committed
}

func (b *recordingBatch) do(name, arg string) error {
	b.calls = append(b.calls, call{name, arg})
	if name == b.failOn {
		return b.err
	}
	return nil
}

func (b *recordingBatch) Begin(context.Context) (Batch, error) {
	if err := b.do("begin", ""); err != nil {
		return nil, err
	}
	return b, nil
}
func (b *recordingBatch) Cursor(context.Context) (Cursor, error) { return b.cursor, nil }
func (b *recordingBatch) Reset() error                           { return b.do("reset", "") }
func (b *recordingBatch) AddSlice(r Range) error                 { return b.do("add_slice", r.String()) }
func (b *recordingBatch) DropSlice(r Range) error                { return b.do("drop_slice", r.String()) }
func (b *recordingBatch) Put(k, v []byte) error                  { return b.do("put", string(k)+"="+string(v)) }
func (b *recordingBatch) Delete(k []byte) error                  { return b.do("delete", string(k)) }
func (b *recordingBatch) PutFragment(k []byte, id string, v []byte) error {
	return b.do("put_fragment", string(k)+"/"+id+"="+string(v))
}
func (b *recordingBatch) DeleteFragment(k []byte, id string) error {
	return b.do("delete_fragment", string(k)+"/"+id)
}
func (b *recordingBatch) Commit(c Cursor) error {
	if err := b.do("commit", c.String()); err != nil {
		return err
	}
	b.cursor = c
	return nil
}
func (b *recordingBatch) Abort() { b.calls = append(b.calls, call{"abort", ""}) }

func (b *recordingBatch) names() []string {
	var out []string
	for _, c := range b.calls {
		out = append(out, c.name)
	}
	return out
}

var everyOp = []Op{
	{Kind: OpReset},
	{Kind: OpAddSlice, Range: rng(0, 100)},
	{Kind: OpPut, Key: []byte("a"), Value: []byte("1")},
	{Kind: OpSetSlices, Slices: []Range{rng(0, 100)}},
	{Kind: OpPutFragment, Key: []byte("a"), Fragment: "f", Value: []byte("2")},
	{Kind: OpDeleteFragment, Key: []byte("a"), Fragment: "f"},
	{Kind: OpDelete, Key: []byte("a")},
	{Kind: OpDropSlice, Range: rng(0, 100)},
}

func TestApplyRunsTheOpsInOrderAndCommitsTheCursor(t *testing.T) {
	b := &recordingBatch{}
	require.NoError(t, Apply(t.Context(), b, Delta{Epoch: 9, From: 3, To: 11, Clock: 77, Ops: everyOp}))
	assert.Equal(t, []call{
		{"begin", ""},
		{"reset", ""},
		{"add_slice", rng(0, 100).String()},
		{"put", "a=1"},
		// set_slices is not the store's business
		{"put_fragment", "a/f=2"},
		{"delete_fragment", "a/f"},
		{"delete", "a"},
		{"drop_slice", rng(0, 100).String()},
		{"commit", "9/11"},
		{"abort", ""}, // after Commit, allowed
	}, b.calls)
	assert.Equal(t, Cursor{Epoch: 9, Index: 11}, b.cursor)
}

func TestApplyAbortsOnFailure(t *testing.T) {
	boom := errors.New("boom")
	for _, failOn := range []string{"begin", "reset", "add_slice", "put", "put_fragment", "delete_fragment", "delete", "drop_slice", "commit"} {
		t.Run(failOn, func(t *testing.T) {
			b := &recordingBatch{failOn: failOn, err: boom, cursor: Cursor{Epoch: 1, Index: 2}}
			err := Apply(t.Context(), b, Delta{Epoch: 9, From: 3, To: 11, Ops: everyOp})
			require.ErrorIs(t, err, boom)
			names := b.names()
			if failOn == "begin" {
				assert.Equal(t, []string{"begin"}, names, "no batch, nothing to abort")
			} else {
				require.GreaterOrEqual(t, len(names), 2)
				assert.Equal(t, []string{failOn, "abort"}, names[len(names)-2:], "stops at the failing call and aborts")
				if failOn != "commit" {
					assert.NotContains(t, names, "commit")
				}
			}
			assert.Equal(t, Cursor{Epoch: 1, Index: 2}, b.cursor, "no new cursor")
		})
	}
}

func TestApplyNamesTheFailingOp(t *testing.T) {
	b := &recordingBatch{failOn: "put", err: errors.New("disk full")}
	err := Apply(t.Context(), b, Delta{Epoch: 1, To: 3, Ops: everyOp[:3]})
	assert.EqualError(t, err, "client: op 2 (put): disk full")
}

func TestApplyRejectsAnUnknownOpKind(t *testing.T) {
	b := &recordingBatch{}
	err := Apply(t.Context(), b, Delta{Epoch: 1, To: 2, Ops: []Op{{Kind: OpReset}, {Kind: OpKind(200)}}})
	require.Error(t, err)
	assert.ErrorContains(t, err, "unknown operation kind 200")
	assert.Equal(t, []string{"begin", "reset", "abort"}, b.names())
	assert.Zero(t, b.cursor)
}

func TestOpKindString(t *testing.T) {
	want := map[OpKind]string{OpReset: "reset", OpAddSlice: "add_slice", OpDropSlice: "drop_slice", OpPut: "put",
		OpDelete: "delete", OpPutFragment: "put_fragment", OpDeleteFragment: "delete_fragment", OpSetSlices: "set_slices",
		0: "op(0)", 200: "op(200)"}
	for k, s := range want {
		assert.Equal(t, s, k.String(), "kind %d", uint8(k))
	}
	assert.Equal(t, "3/17", Cursor{Epoch: 3, Index: 17}.String())
}
