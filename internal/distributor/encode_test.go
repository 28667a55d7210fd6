package distributor

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
)

// decodeOp decodes one DeltaOp, requiring it to parse.
func decodeOp(t require.TestingT, b []byte) *pb.DeltaOp {
	m := &pb.DeltaOp{}
	require.NoError(t, proto.Unmarshal(b, m))
	return m
}

func pbRange(r keyspace.Range) *pb.Range {
	if r.End.IsEnd() {
		return &pb.Range{Start: r.Start, EndOfSpace: true}
	}
	return &pb.Range{Start: r.Start, End: r.End.Point()}
}

func pbRanges(rs []keyspace.Range) []*pb.Range {
	out := make([]*pb.Range, len(rs))
	for i, r := range rs {
		out[i] = pbRange(r)
	}
	return out
}

func putOp(key, value []byte) *pb.DeltaOp {
	return &pb.DeltaOp{Op: &pb.DeltaOp_Put{Put: &pb.ItemChange{Key: key, Value: value}}}
}

func putFragmentOp(key []byte, frag string, value []byte) *pb.DeltaOp {
	return &pb.DeltaOp{Op: &pb.DeltaOp_PutFragment{PutFragment: &pb.ItemChange{Key: key, Fragment: frag, Value: value}}}
}

// assertOp checks that data decodes into want; proto.Equal treats nil and empty bytes alike,
// as the wire does.
func assertOp(t *testing.T, want *pb.DeltaOp, data []byte, msgAndArgs ...any) {
	t.Helper()
	got := decodeOp(t, data)
	assert.True(t, proto.Equal(want, got), "%v: want %v, got %v", fmt.Sprint(msgAndArgs...), want, got)
}

var (
	bounded    = keyspace.Range{Start: 0x10, End: keyspace.At(0x2000000000000000)}
	toTheEnd   = keyspace.Range{Start: 0xC000000000000000, End: keyspace.End}
	fullSpace  = keyspace.Full()
	topPoint   = keyspace.Range{Start: math.MaxUint64 - 1, End: keyspace.At(math.MaxUint64)}
	testRanges = []keyspace.Range{bounded, toTheEnd, fullSpace, topPoint}
)

func TestEncodeReset(t *testing.T) {
	m := decodeOp(t, encodeReset())
	require.IsType(t, &pb.DeltaOp_Reset_{}, m.GetOp())
	assert.NotNil(t, m.GetReset_())
	assertOp(t, &pb.DeltaOp{Op: &pb.DeltaOp_Reset_{Reset_: &pb.Reset{}}}, encodeReset())
}

func TestEncodeRangeOp(t *testing.T) {
	for _, r := range testRanges {
		for _, tc := range []struct {
			name  string
			field protowire.Number
			want  func(*pb.Range) *pb.DeltaOp
			get   func(*pb.DeltaOp) *pb.Range
		}{
			{"add_slice", opAddSlice, func(r *pb.Range) *pb.DeltaOp { return &pb.DeltaOp{Op: &pb.DeltaOp_AddSlice{AddSlice: r}} }, (*pb.DeltaOp).GetAddSlice},
			{"drop_slice", opDropSlice, func(r *pb.Range) *pb.DeltaOp { return &pb.DeltaOp{Op: &pb.DeltaOp_DropSlice{DropSlice: r}} }, (*pb.DeltaOp).GetDropSlice},
		} {
			data := encodeRangeOp(tc.field, r)
			m := decodeOp(t, data)
			got := tc.get(m)
			require.NotNil(t, got, "%s %v: decoded %v", tc.name, r, m)
			assert.Equal(t, r.Start, got.GetStart(), "%s %v", tc.name, r)
			assert.Equal(t, r.End.IsEnd(), got.GetEndOfSpace(), "%s %v", tc.name, r)
			if !r.End.IsEnd() {
				assert.Equal(t, r.End.Point(), got.GetEnd(), "%s %v", tc.name, r)
			}
			assertOp(t, tc.want(pbRange(r)), data, tc.name, " ", r)
		}
	}
}

func TestEncodeSetSlices(t *testing.T) {
	for _, tc := range []struct {
		name string
		rs   []keyspace.Range
	}{
		{"nil", nil},
		{"empty", []keyspace.Range{}},
		{"one bounded", []keyspace.Range{bounded}},
		{"one to the end", []keyspace.Range{toTheEnd}},
		{"several", testRanges},
	} {
		data := encodeSetSlices(tc.rs)
		m := decodeOp(t, data)
		require.IsType(t, &pb.DeltaOp_SetSlices{}, m.GetOp(), tc.name)
		list := m.GetSetSlices()
		require.NotNil(t, list, "%s: an empty list is still a set_slices", tc.name)
		require.Len(t, list.GetRanges(), len(tc.rs), tc.name)
		for i, r := range tc.rs {
			assert.True(t, proto.Equal(pbRange(r), list.GetRanges()[i]), "%s: range %d", tc.name, i)
		}
		assertOp(t, &pb.DeltaOp{Op: &pb.DeltaOp_SetSlices{SetSlices: &pb.SliceList{Ranges: pbRanges(tc.rs)}}}, data, tc.name)
	}
}

func TestEncodeChange(t *testing.T) {
	key := []byte("user/42")
	for _, tc := range []struct {
		name string
		c    source.Change
		want *pb.DeltaOp
	}{
		{"put", source.Change{Key: key, Value: []byte("v1")}, putOp(key, []byte("v1"))},
		{"put with empty value", source.Change{Key: key, Value: []byte{}}, putOp(key, nil)},
		{"put with nil value", source.Change{Key: key}, putOp(key, nil)},
		{"delete", source.Change{Key: key, Delete: true},
			&pb.DeltaOp{Op: &pb.DeltaOp_Delete{Delete: &pb.ItemChange{Key: key}}}},
		{"put fragment", source.Change{Key: key, Fragment: "kw/7", Value: []byte("frag")}, putFragmentOp(key, "kw/7", []byte("frag"))},
		{"put fragment with empty value", source.Change{Key: key, Fragment: "kw/7", Value: []byte{}}, putFragmentOp(key, "kw/7", nil)},
		{"delete fragment", source.Change{Key: key, Fragment: "kw/7", Delete: true},
			&pb.DeltaOp{Op: &pb.DeltaOp_DeleteFragment{DeleteFragment: &pb.ItemChange{Key: key, Fragment: "kw/7"}}}},
		{"delete ignores a value", source.Change{Key: key, Value: []byte("stale"), Delete: true},
			&pb.DeltaOp{Op: &pb.DeltaOp_Delete{Delete: &pb.ItemChange{Key: key}}}},
		{"binary key and value", source.Change{Key: []byte{0, 0xff, 1}, Value: []byte{0, 0}}, putOp([]byte{0, 0xff, 1}, []byte{0, 0})},
		{"large value", source.Change{Key: key, Value: make([]byte, 70000)}, putOp(key, make([]byte, 70000))},
	} {
		data := encodeChange(tc.c)
		m := decodeOp(t, data)
		require.IsType(t, tc.want.GetOp(), m.GetOp(), tc.name)
		assertOp(t, tc.want, data, tc.name)
	}

	// An empty value is a put of an empty value, not a delete nor nothing.
	m := decodeOp(t, encodeChange(source.Change{Key: key, Value: []byte{}}))
	require.NotNil(t, m.GetPut())
	assert.Equal(t, key, m.GetPut().GetKey())
	assert.Empty(t, m.GetPut().GetValue())
	assert.Nil(t, m.GetDelete())
}

func TestEncodeItem(t *testing.T) {
	key := []byte("ad-group/9")
	frags := []source.Fragment{{ID: "kw/1", Value: []byte("one")}, {ID: "kw/2", Value: []byte{}}, {ID: "kw/3", Value: []byte("three")}}
	for _, tc := range []struct {
		name string
		it   source.Item
		want []*pb.DeltaOp
	}{
		{"value only", source.Item{Key: key, Value: []byte("v"), Exists: true}, []*pb.DeltaOp{putOp(key, []byte("v"))}},
		{"empty value", source.Item{Key: key, Value: []byte{}, Exists: true}, []*pb.DeltaOp{putOp(key, nil)}},
		{"value and fragments", source.Item{Key: key, Value: []byte("v"), Fragments: frags, Exists: true}, []*pb.DeltaOp{
			putOp(key, []byte("v")), putFragmentOp(key, "kw/1", []byte("one")),
			putFragmentOp(key, "kw/2", nil), putFragmentOp(key, "kw/3", []byte("three")),
		}},
		{"fragments only", source.Item{Key: key, Fragments: frags}, []*pb.DeltaOp{
			putFragmentOp(key, "kw/1", []byte("one")), putFragmentOp(key, "kw/2", nil), putFragmentOp(key, "kw/3", []byte("three")),
		}},
		{"nothing", source.Item{Key: key}, nil},
	} {
		prior := []op{{data: encodeReset()}}
		out := encodeItem(tc.it, prior)
		require.Len(t, out, 1+len(tc.want), tc.name)
		assert.Equal(t, encodeReset(), out[0].data, "%s: encodeItem appends after what is there", tc.name)
		for i, want := range tc.want {
			o := out[1+i]
			assert.True(t, o.scanned, "%s: op %d is marked scanned", tc.name, i)
			assert.Nil(t, o.slices, tc.name)
			assertOp(t, want, o.data, tc.name, " op ", i)
		}
	}
}

func TestAppendDelta(t *testing.T) {
	ops := []op{
		{data: encodeReset()},
		{data: encodeRangeOp(opAddSlice, bounded)},
		{data: encodeChange(source.Change{Key: []byte("k"), Value: []byte("v")})},
		{data: encodeChange(source.Change{Key: []byte("k"), Value: []byte{}})},
		{data: encodeSetSlices([]keyspace.Range{bounded, toTheEnd})},
	}
	slices := []keyspace.Range{bounded, toTheEnd}
	empty := []keyspace.Range{}
	for _, tc := range []struct {
		name                   string
		prefix                 []byte
		epoch, from, to, clock uint64
		ops                    []op
		slices                 *[]keyspace.Range
	}{
		{"no ops", nil, 1, 0, 0, 0, nil, nil},
		{"ops without slices", nil, 0xDEADBEEFCAFEF00D, 0, 5, 1234, ops, nil},
		{"ops with slices", nil, 7, 3, 8, 99, ops, &slices},
		{"empty slice list", nil, 7, 3, 8, 99, ops[:1], &empty},
		{"large numbers", nil, math.MaxUint64, math.MaxUint64 - 5, math.MaxUint64, math.MaxUint64, ops, &slices},
		{"after other bytes", []byte("previous response"), 2, 10, 15, 500, ops, &slices},
		{"after another delta", appendDelta(nil, 1, 0, 1, 1, 0, ops[:1], nil), 1, 1, 6, 2, ops, nil},
	} {
		prefix := append([]byte(nil), tc.prefix...)
		gen := tc.clock / 3 // any generation: it is encoded, not checked
		b := appendDelta(prefix, tc.epoch, tc.from, tc.to, tc.clock, gen, tc.ops, tc.slices)
		require.GreaterOrEqual(t, len(b), len(tc.prefix), tc.name)
		assert.Equal(t, string(tc.prefix), string(b[:len(tc.prefix)]), "%s: the bytes before are kept", tc.name)
		resp := &pb.PullResponse{}
		require.NoError(t, proto.Unmarshal(b[len(tc.prefix):], resp), tc.name)
		d := resp.GetDelta()
		require.NotNil(t, d, tc.name)
		assert.Equal(t, tc.epoch, d.GetEpoch(), tc.name)
		assert.Equal(t, tc.from, d.GetFrom(), tc.name)
		assert.Equal(t, tc.to, d.GetTo(), tc.name)
		assert.Equal(t, tc.clock, d.GetClock(), tc.name)
		assert.Equal(t, gen, d.GetGeneration(), tc.name)
		require.Len(t, d.GetOps(), len(tc.ops), tc.name)
		for i, o := range tc.ops {
			assert.True(t, proto.Equal(decodeOp(t, o.data), d.GetOps()[i]), "%s: op %d", tc.name, i)
		}
		if tc.slices == nil {
			assert.Nil(t, d.GetSlices(), "%s: no slices unless asked", tc.name)
		} else {
			require.NotNil(t, d.GetSlices(), "%s: slices asked for, even an empty list, are present", tc.name)
			assert.True(t, proto.Equal(&pb.SliceList{Ranges: pbRanges(*tc.slices)}, d.GetSlices()), tc.name)
		}
		// The whole message, as the generated code would write it.
		want := &pb.PullResponse{Delta: &pb.Delta{Epoch: tc.epoch, From: tc.from, To: tc.to, Clock: tc.clock, Generation: gen}}
		for _, o := range tc.ops {
			want.Delta.Ops = append(want.Delta.Ops, decodeOp(t, o.data))
		}
		if tc.slices != nil {
			want.Delta.Slices = &pb.SliceList{Ranges: pbRanges(*tc.slices)}
		}
		assert.True(t, proto.Equal(want, resp), "%s: want %v, got %v", tc.name, want, resp)
	}
}

func TestAppendDeltaSequenceDecodesOneByOne(t *testing.T) {
	// Responses appended one after another in one buffer are each delimited exactly.
	var b []byte
	var ends []int
	for i := range 3 {
		b = appendDelta(b, 1, uint64(i), uint64(i+1), uint64(10*i), uint64(i), []op{{data: encodeChange(source.Change{Key: []byte{byte(i)}, Value: []byte("v")})}}, nil)
		ends = append(ends, len(b))
	}
	start := 0
	for i, end := range ends {
		resp := &pb.PullResponse{}
		require.NoError(t, proto.Unmarshal(b[start:end], resp))
		assert.Equal(t, uint64(i), resp.GetDelta().GetFrom())
		assert.Equal(t, []byte{byte(i)}, resp.GetDelta().GetOps()[0].GetPut().GetKey())
		start = end
	}
}

func drawRange(t *rapid.T, label string) keyspace.Range {
	start := rapid.Uint64().Draw(t, label+" start")
	if start == math.MaxUint64 || rapid.Bool().Draw(t, label+" to the end") {
		return keyspace.Range{Start: start, End: keyspace.End}
	}
	return keyspace.Range{Start: start, End: keyspace.At(rapid.Uint64Range(start+1, math.MaxUint64).Draw(t, label+" end"))}
}

func drawRanges(t *rapid.T, label string) []keyspace.Range {
	n := rapid.IntRange(0, 4).Draw(t, label+" count")
	out := make([]keyspace.Range, n)
	for i := range out {
		out[i] = drawRange(t, fmt.Sprintf("%s %d", label, i))
	}
	return out
}

// drawOp draws an operation and the message it must decode to.
func drawOp(t *rapid.T, i int) (op, *pb.DeltaOp) {
	label := fmt.Sprintf("op %d", i)
	key := rapid.SliceOfN(rapid.Byte(), 0, 24).Draw(t, label+" key")
	frag := rapid.StringMatching(`[a-z0-9/]{1,8}`).Draw(t, label+" fragment")
	value := rapid.SliceOfN(rapid.Byte(), 0, 300).Draw(t, label+" value")
	ic := func(frag string, value []byte) *pb.ItemChange {
		return &pb.ItemChange{Key: key, Fragment: frag, Value: value}
	}
	switch rapid.IntRange(0, 7).Draw(t, label+" kind") {
	case 0:
		return op{data: encodeReset()}, &pb.DeltaOp{Op: &pb.DeltaOp_Reset_{Reset_: &pb.Reset{}}}
	case 1:
		r := drawRange(t, label)
		return op{data: encodeRangeOp(opAddSlice, r)}, &pb.DeltaOp{Op: &pb.DeltaOp_AddSlice{AddSlice: pbRange(r)}}
	case 2:
		r := drawRange(t, label)
		return op{data: encodeRangeOp(opDropSlice, r)}, &pb.DeltaOp{Op: &pb.DeltaOp_DropSlice{DropSlice: pbRange(r)}}
	case 3:
		return op{data: encodeChange(source.Change{Key: key, Value: value})}, &pb.DeltaOp{Op: &pb.DeltaOp_Put{Put: ic("", value)}}
	case 4:
		return op{data: encodeChange(source.Change{Key: key, Delete: true})}, &pb.DeltaOp{Op: &pb.DeltaOp_Delete{Delete: ic("", nil)}}
	case 5:
		return op{data: encodeChange(source.Change{Key: key, Fragment: frag, Value: value})},
			&pb.DeltaOp{Op: &pb.DeltaOp_PutFragment{PutFragment: ic(frag, value)}}
	case 6:
		return op{data: encodeChange(source.Change{Key: key, Fragment: frag, Delete: true})},
			&pb.DeltaOp{Op: &pb.DeltaOp_DeleteFragment{DeleteFragment: ic(frag, nil)}}
	}
	rs := drawRanges(t, label)
	return op{data: encodeSetSlices(rs), slices: rs}, &pb.DeltaOp{Op: &pb.DeltaOp_SetSlices{SetSlices: &pb.SliceList{Ranges: pbRanges(rs)}}}
}

func TestAppendDeltaRoundTripProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		prefix := rapid.SliceOfN(rapid.Byte(), 0, 16).Draw(t, "prefix")
		epoch := rapid.Uint64().Draw(t, "epoch")
		from := rapid.Uint64().Draw(t, "from")
		to := rapid.Uint64().Draw(t, "to")
		clock := rapid.Uint64().Draw(t, "clock")
		gen := rapid.Uint64().Draw(t, "generation")
		source := rapid.Uint64().Draw(t, "source clock")
		silence := rapid.Uint32().Draw(t, "source silence")
		n := rapid.IntRange(0, 20).Draw(t, "ops")
		ops := make([]op, n)
		want := &pb.PullResponse{Delta: &pb.Delta{Epoch: epoch, From: from, To: to, Clock: clock, Generation: gen,
			SourceClock: source, SourceSilenceMs: silence}}
		for i := range ops {
			var m *pb.DeltaOp
			ops[i], m = drawOp(t, i)
			want.Delta.Ops = append(want.Delta.Ops, m)
		}
		var slices *[]keyspace.Range
		if rapid.Bool().Draw(t, "with slices") {
			rs := drawRanges(t, "slices")
			slices = &rs
			want.Delta.Slices = &pb.SliceList{Ranges: pbRanges(rs)}
		}
		b := appendDeltaFrom(append([]byte(nil), prefix...), epoch, from, to, clock, sourceStamp{clock: source, silenceMS: silence}, gen, ops, slices)
		if string(b[:len(prefix)]) != string(prefix) {
			t.Fatalf("the prefix changed: %x -> %x", prefix, b[:len(prefix)])
		}
		got := &pb.PullResponse{}
		if err := proto.Unmarshal(b[len(prefix):], got); err != nil {
			t.Fatalf("decoding: %v", err)
		}
		if !proto.Equal(want, got) {
			t.Fatalf("want %v\ngot  %v", want, got)
		}
	})
}
