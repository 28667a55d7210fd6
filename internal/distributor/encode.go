package distributor

import (
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
)

// Operations are encoded once, when the router makes them, as DeltaOp messages; the same
// bytes serve every replica they go to, and a delta is assembled from them without
// re-encoding (see appendDelta). The field numbers are those of api/sliceplane/v1/distributor.proto.
const (
	opReset          = 1
	opAddSlice       = 2
	opDropSlice      = 3
	opPut            = 4
	opDelete         = 5
	opPutFragment    = 6
	opDeleteFragment = 7
	opSetSlices      = 8
	opSliceLoaded    = 9
)

func appendRange(b []byte, r keyspace.Range) []byte {
	b = protowire.AppendTag(b, 1, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, r.Start)
	if r.End.IsEnd() {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		return protowire.AppendVarint(b, 1)
	}
	b = protowire.AppendTag(b, 2, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, r.End.Point())
}

func rangeSize(r keyspace.Range) int {
	if r.End.IsEnd() {
		return 1 + 8 + 1 + 1
	}
	return 1 + 8 + 1 + 8
}

// encodeReset returns the DeltaOp that starts a snapshot.
func encodeReset() []byte {
	b := protowire.AppendTag(nil, opReset, protowire.BytesType)
	return protowire.AppendVarint(b, 0)
}

// encodeRangeOp returns an add_slice, drop_slice or slice_loaded DeltaOp.
func encodeRangeOp(field protowire.Number, r keyspace.Range) []byte {
	b := make([]byte, 0, 2+rangeSize(r))
	b = protowire.AppendTag(b, field, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(rangeSize(r)))
	return appendRange(b, r)
}

// encodeSetSlices returns the set_slices DeltaOp listing the slices a node holds.
func encodeSetSlices(rs []keyspace.Range) []byte {
	return appendSliceList(nil, opSetSlices, rs)
}

// appendSliceList appends rs as a SliceList in field.
func appendSliceList(b []byte, field protowire.Number, rs []keyspace.Range) []byte {
	size := 0
	for _, r := range rs {
		size += 1 + protowire.SizeBytes(rangeSize(r))
	}
	b = protowire.AppendTag(b, field, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	for _, r := range rs {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(rangeSize(r)))
		b = appendRange(b, r)
	}
	return b
}

// encodeItemOp returns a DeltaOp about one item or fragment.
func encodeItemOp(field protowire.Number, key []byte, fragment string, value []byte, withValue bool) []byte {
	size := protowire.SizeTag(1) + protowire.SizeBytes(len(key))
	if fragment != "" {
		size += protowire.SizeTag(2) + protowire.SizeBytes(len(fragment))
	}
	if withValue && len(value) > 0 {
		size += protowire.SizeTag(3) + protowire.SizeBytes(len(value))
	}
	b := make([]byte, 0, protowire.SizeTag(field)+protowire.SizeBytes(size))
	b = protowire.AppendTag(b, field, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, key)
	if fragment != "" {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, fragment)
	}
	if withValue && len(value) > 0 {
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, value)
	}
	return b
}

// encodeChange returns the DeltaOp that carries a change of the source.
func encodeChange(c source.Change) []byte {
	switch {
	case c.Delete && c.Fragment == "":
		return encodeItemOp(opDelete, c.Key, "", nil, false)
	case c.Delete:
		return encodeItemOp(opDeleteFragment, c.Key, c.Fragment, nil, false)
	case c.Fragment == "":
		return encodeItemOp(opPut, c.Key, "", c.Value, true)
	}
	return encodeItemOp(opPutFragment, c.Key, c.Fragment, c.Value, true)
}

// encodeItem appends the DeltaOps that recreate a scanned item: its value, then each
// fragment.
func encodeItem(it source.Item, out []op) []op {
	if it.Exists {
		out = append(out, op{data: encodeItemOp(opPut, it.Key, "", it.Value, true), scanned: true})
	}
	for _, f := range it.Fragments {
		out = append(out, op{data: encodeItemOp(opPutFragment, it.Key, f.ID, f.Value, true), scanned: true})
	}
	return out
}

// Field numbers of PullResponse and Delta.
const (
	responseDelta   = 1
	deltaEpoch      = 1
	deltaFrom       = 2
	deltaTo         = 3
	deltaClock      = 4
	deltaOps        = 5
	deltaSlices     = 6
	deltaGeneration = 7
	deltaSource     = 8
	deltaSilence    = 9
)

// sourceStamp is what a delta says of the distributor's source: the clock it had read up
// to (0: none said) and how long it had not heard from it, in milliseconds.
type sourceStamp struct {
	clock     uint64
	silenceMS uint32
}

// appendDelta appends the PullResponse that carries a delta of ops (encoded DeltaOps), with
// the node's slices when slices is not nil, and the map generation gen (see op.gen).
func appendDelta(b []byte, epoch, from, to, clock, gen uint64, ops []op, slices *[]keyspace.Range) []byte {
	return appendDeltaFrom(b, epoch, from, to, clock, sourceStamp{}, gen, ops, slices)
}

// appendDeltaFrom is appendDelta with what the distributor says of its source.
func appendDeltaFrom(b []byte, epoch, from, to, clock uint64, src sourceStamp, gen uint64, ops []op, slices *[]keyspace.Range) []byte {
	source, silence := src.clock, uint64(src.silenceMS)
	size := protowire.SizeTag(deltaEpoch) + 8 + protowire.SizeTag(deltaFrom) + protowire.SizeVarint(from) +
		protowire.SizeTag(deltaTo) + protowire.SizeVarint(to) + protowire.SizeTag(deltaClock) + protowire.SizeVarint(clock)
	if gen != 0 {
		size += protowire.SizeTag(deltaGeneration) + protowire.SizeVarint(gen)
	}
	if source != 0 {
		size += protowire.SizeTag(deltaSource) + protowire.SizeVarint(source)
	}
	if silence != 0 {
		size += protowire.SizeTag(deltaSilence) + protowire.SizeVarint(silence)
	}
	for _, o := range ops {
		size += protowire.SizeTag(deltaOps) + protowire.SizeBytes(len(o.data))
	}
	var list []byte
	if slices != nil {
		list = appendSliceList(nil, deltaSlices, *slices)
		size += len(list)
	}
	b = protowire.AppendTag(b, responseDelta, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	b = protowire.AppendTag(b, deltaEpoch, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, epoch)
	b = protowire.AppendTag(b, deltaFrom, protowire.VarintType)
	b = protowire.AppendVarint(b, from)
	b = protowire.AppendTag(b, deltaTo, protowire.VarintType)
	b = protowire.AppendVarint(b, to)
	b = protowire.AppendTag(b, deltaClock, protowire.VarintType)
	b = protowire.AppendVarint(b, clock)
	for _, o := range ops {
		b = protowire.AppendTag(b, deltaOps, protowire.BytesType)
		b = protowire.AppendBytes(b, o.data)
	}
	b = append(b, list...)
	if gen != 0 {
		b = protowire.AppendTag(b, deltaGeneration, protowire.VarintType)
		b = protowire.AppendVarint(b, gen)
	}
	if source != 0 {
		b = protowire.AppendTag(b, deltaSource, protowire.VarintType)
		b = protowire.AppendVarint(b, source)
	}
	if silence != 0 {
		b = protowire.AppendTag(b, deltaSilence, protowire.VarintType)
		b = protowire.AppendVarint(b, silence)
	}
	return b
}

// deltaGen returns the generation of a delta of ops: that of its last op, or else last, the
// generation of the op before them in the stream.
func deltaGen(ops []op, last uint64) uint64 {
	if len(ops) == 0 {
		return last
	}
	return ops[len(ops)-1].gen
}
