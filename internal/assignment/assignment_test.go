package assignment

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

func r(start uint64, end uint64) keyspace.Range {
	return keyspace.Range{Start: start, End: keyspace.At(end)}
}
func rEnd(start uint64) keyspace.Range { return keyspace.Range{Start: start, End: keyspace.End} }
func ids(s ...string) []NodeID {
	out := make([]NodeID, len(s))
	for i, x := range s {
		out[i] = NodeID(x)
	}
	return out
}

func TestNewValidatesPartition(t *testing.T) {
	cases := []struct {
		name   string
		slices []Slice
		want   []error
		text   []string
	}{
		{
			name:   "ok, unsorted input",
			slices: []Slice{{Range: rEnd(100), Replicas: ids("b")}, {Range: r(0, 100), Replicas: ids("a")}},
		},
		{
			name:   "gap at start, in the middle and at the end",
			slices: []Slice{{Range: r(10, 20), Replicas: ids("a")}, {Range: r(30, 40), Replicas: ids("a")}},
			want:   []error{ErrGap},
			text: []string{
				"[0x0000000000000000, 0x000000000000000a) is not covered",
				"[0x0000000000000014, 0x000000000000001e) is not covered",
				"[0x0000000000000028, end) is not covered",
			},
		},
		{
			name:   "overlap",
			slices: []Slice{{Range: r(0, 20), Replicas: ids("a")}, {Range: rEnd(10), Replicas: ids("b")}},
			want:   []error{ErrOverlap},
			text:   []string{"starts before 0x0000000000000014"},
		},
		{
			name:   "empty range",
			slices: []Slice{{Range: r(0, 0), Replicas: ids("a")}, {Range: rEnd(0), Replicas: ids("a")}},
			want:   []error{ErrEmptyRange},
		},
		{
			name:   "empty, duplicate and malformed replicas, all reported",
			slices: []Slice{{Range: r(0, 10)}, {Range: r(10, 20), Replicas: ids("a", "a")}, {Range: rEnd(20), Replicas: ids("bad id")}},
			want:   []error{ErrNoReplicas, ErrDuplicateReplica, ErrBadNodeID},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, err := New(3, c.slices)
			if len(c.want) == 0 {
				require.NoError(t, err)
				assert.Equal(t, uint64(3), a.Generation())
				assert.Equal(t, uint64(0), a.Slice(0).Range.Start, "slices are sorted")
				return
			}
			require.Error(t, err)
			assert.Nil(t, a)
			for _, w := range c.want {
				assert.ErrorIs(t, err, w)
			}
			for _, txt := range c.text {
				assert.Contains(t, err.Error(), txt)
			}
		})
	}
}

func TestNewCapsTheNumberOfReportedProblems(t *testing.T) {
	var ss []Slice
	for i := range uint64(100) {
		ss = append(ss, Slice{Range: r(i*10, i*10+5), Replicas: ids("a")})
	}
	_, err := New(0, ss)
	require.ErrorIs(t, err, ErrGap)
	assert.Contains(t, err.Error(), "and 80 more problems")
}

func TestValidateAgainstNodes(t *testing.T) {
	a, err := Uniform(4, func(i int) []NodeID { return ids([]string{"a", "b", "c", "gone"}[i]) })
	require.NoError(t, err)
	err = a.Validate(MustNodeSet(Node{ID: "a"}, Node{ID: "b"}, Node{ID: "c"}))
	require.ErrorIs(t, err, ErrUnknownNode)
	assert.Contains(t, err.Error(), "held by gone")
	require.NoError(t, a.Validate(MustNodeSet(Node{ID: "a"}, Node{ID: "b"}, Node{ID: "c"}, Node{ID: "gone"})))
}

func TestNodeSet(t *testing.T) {
	s, err := NewNodeSet([]Node{{ID: "b", Capacity: 2}, {ID: "a"}})
	require.NoError(t, err)
	assert.Equal(t, ids("a", "b"), s.IDs())
	assert.Equal(t, 1.0, s.Nodes()[0].Weight())
	assert.Equal(t, 2.0, s.Nodes()[1].Weight())
	i, ok := s.Index("b")
	assert.True(t, ok)
	assert.Equal(t, 1, i)

	for _, bad := range [][]Node{
		{{ID: "a"}, {ID: "a"}},
		{{ID: ""}},
		{{ID: "a,b"}},
		{{ID: "a", Capacity: -1}},
		{{ID: "a", Capacity: math.NaN()}},
		{{ID: "a", Capacity: math.Inf(1)}},
	} {
		_, err := NewNodeSet(bad)
		assert.Error(t, err, "%v", bad)
	}
}

func TestLookupAndFind(t *testing.T) {
	a, err := Uniform(4, func(i int) []NodeID { return ids("a") })
	require.NoError(t, err)
	for _, c := range []struct {
		h    uint64
		want int
	}{{0, 0}, {1<<62 - 1, 0}, {1 << 62, 1}, {math.MaxUint64, 3}} {
		i, s := a.Lookup(c.h)
		assert.Equal(t, c.want, i, "hash %x", c.h)
		assert.True(t, s.Range.Contains(c.h))
	}
	i, ok := a.Find(1 << 63)
	assert.True(t, ok)
	assert.Equal(t, 2, i)
	_, ok = a.Find(5)
	assert.False(t, ok)
}

func TestApply(t *testing.T) {
	a, err := New(7, []Slice{{Range: r(0, 100), Replicas: ids("a")}, {Range: rEnd(100), Replicas: ids("b")}})
	require.NoError(t, err)

	b, err := a.Apply([]Op{
		Split{Slice: 0, At: 50},
		Split{Slice: 50, At: 75},
		Assign{Slice: 75, Replicas: ids("c", "b")},
		Assign{Slice: 100, Replicas: ids("c", "b")},
		Merge{Left: 75},
	})
	require.NoError(t, err)
	want, err := New(8, []Slice{{Range: r(0, 50), Replicas: ids("a")}, {Range: r(50, 75), Replicas: ids("a")}, {Range: rEnd(75), Replicas: ids("b", "c")}})
	require.NoError(t, err)
	assert.True(t, b.Equal(want), "got\n%s", b)
	assert.Equal(t, uint64(8), b.Generation())
	assert.Equal(t, 2, a.Len(), "the original is unchanged")

	same, err := a.Apply(nil)
	require.NoError(t, err)
	assert.Same(t, a, same)
}

func TestApplyRejectsBadOps(t *testing.T) {
	a, err := New(0, []Slice{{Range: r(0, 100), Replicas: ids("a")}, {Range: r(100, 200), Replicas: ids("b")}, {Range: rEnd(200), Replicas: ids("b")}})
	require.NoError(t, err)
	cases := []struct {
		op   Op
		want error
		text string
	}{
		{Split{Slice: 5, At: 10}, ErrNoSlice, "no slice starts at 0x0000000000000005"},
		{Split{Slice: 0, At: 100}, ErrBadOp, "not strictly inside"},
		{Split{Slice: 0, At: 0}, ErrBadOp, "not strictly inside"},
		{Merge{Left: 0}, ErrBadOp, "different replica sets"},
		{Merge{Left: 200}, ErrBadOp, "last one"},
		{Assign{Slice: 0}, ErrNoReplicas, ""},
		{Assign{Slice: 0, Replicas: ids("x", "x")}, ErrDuplicateReplica, ""},
		{Assign{Slice: 0, Replicas: ids("x y")}, ErrBadNodeID, ""},
	}
	for _, c := range cases {
		b, err := a.Apply([]Op{Assign{Slice: 100, Replicas: ids("z")}, c.op})
		require.Error(t, err, "%s", c.op)
		assert.Nil(t, b)
		assert.ErrorIs(t, err, c.want, "%s", c.op)
		assert.Contains(t, err.Error(), "op 1 ("+c.op.String()+")")
		assert.Contains(t, err.Error(), c.text)
	}
	assert.Equal(t, ids("b"), a.Slice(1).Replicas, "a failed Apply changes nothing")

	// A slice merged away no longer exists, and a slice created by a split can be merged away.
	_, err = a.Apply([]Op{Merge{Left: 100}, Split{Slice: 200, At: 300}})
	assert.ErrorIs(t, err, ErrNoSlice)
	c, err := a.Apply([]Op{Split{Slice: 100, At: 150}, Merge{Left: 100}, Merge{Left: 100}})
	require.NoError(t, err)
	assert.Equal(t, 2, c.Len())
}

// refApply is a deliberately simple model of Apply: it edits a sorted slice in place.
func refApply(ss []Slice, op Op) ([]Slice, bool) {
	idx := slices.IndexFunc(ss, func(s Slice) bool {
		switch o := op.(type) {
		case Split:
			return s.Range.Start == o.Slice
		case Merge:
			return s.Range.Start == o.Left
		case Assign:
			return s.Range.Start == o.Slice
		}
		return false
	})
	if idx < 0 {
		return ss, false
	}
	out := slices.Clone(ss)
	switch o := op.(type) {
	case Split:
		lo, hi, err := out[idx].Range.Split(o.At)
		if err != nil {
			return ss, false
		}
		reps := out[idx].Replicas
		out[idx].Range = lo
		out = slices.Insert(out, idx+1, Slice{Range: hi, Replicas: reps})
	case Merge:
		if idx+1 == len(out) || !slices.Equal(out[idx].Replicas, out[idx+1].Replicas) {
			return ss, false
		}
		out[idx].Range.End = out[idx+1].Range.End
		out = slices.Delete(out, idx+1, idx+2)
	case Assign:
		out[idx].Replicas = normalize(o.Replicas)
	}
	return out, true
}

var nodePool = ids("a", "b", "c", "d")

func drawReplicas(t *rapid.T, label string) []NodeID {
	set := rapid.SliceOfNDistinct(rapid.SampledFrom(nodePool), 1, 3, rapid.ID[NodeID]).Draw(t, label)
	return normalize(set)
}

// drawAssignment draws a random valid assignment with boundaries from a small set of points,
// so that random operations often hit existing slices.
func drawAssignment(t *rapid.T, label string) *Assignment {
	bounds := rapid.SliceOfNDistinct(rapid.Uint64Range(1, 64), 0, 12, rapid.ID[uint64]).Draw(t, label+" bounds")
	slices.Sort(bounds)
	starts := append([]uint64{0}, bounds...)
	ss := make([]Slice, len(starts))
	for i, s := range starts {
		end := keyspace.End
		if i+1 < len(starts) {
			end = keyspace.At(starts[i+1])
		}
		ss[i] = Slice{Range: keyspace.Range{Start: s, End: end}, Replicas: drawReplicas(t, label+" replicas")}
	}
	a, err := New(0, ss)
	if err != nil {
		t.Fatalf("fixture: %v", err)
	}
	return a
}

func TestApplyMatchesReferenceModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := drawAssignment(t, "a")
		model := slices.Clone(a.slices)
		n := rapid.IntRange(1, 30).Draw(t, "ops")
		cur := a
		for k := range n {
			point := rapid.Uint64Range(0, 70).Draw(t, "point")
			var op Op
			switch rapid.IntRange(0, 2).Draw(t, "kind") {
			case 0:
				op = Split{Slice: point, At: point + rapid.Uint64Range(0, 10).Draw(t, "delta")}
			case 1:
				op = Merge{Left: point}
			default:
				op = Assign{Slice: point, Replicas: drawReplicas(t, "assign")}
			}
			next, err := cur.Apply([]Op{op})
			want, ok := refApply(model, op)
			if ok != (err == nil) {
				t.Fatalf("op %d %s: Apply error %v, model ok=%v", k, op, err, ok)
			}
			if err != nil {
				continue
			}
			model, cur = want, next
			if !slices.EqualFunc(cur.slices, model, func(x, y Slice) bool {
				return x.Range == y.Range && slices.Equal(x.Replicas, y.Replicas)
			}) {
				t.Fatalf("after %s: got\n%s\nwant %v", op, cur, model)
			}
			// Every result is itself a valid assignment.
			if _, err := New(0, cur.slices); err != nil {
				t.Fatalf("after %s: invalid result: %v", op, err)
			}
		}
	})
}

func TestApplyBatchEqualsOneByOne(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := drawAssignment(t, "a")
		b := drawAssignment(t, "b")
		ops := Diff(a, b)
		batch, err := a.Apply(ops)
		if err != nil {
			t.Fatalf("batch: %v", err)
		}
		cur := a
		for _, op := range ops {
			if cur, err = cur.Apply([]Op{op}); err != nil {
				t.Fatalf("%s: %v", op, err)
			}
		}
		if !batch.Equal(cur) {
			t.Fatalf("batch\n%s\none by one\n%s", batch, cur)
		}
	})
}

func TestDiffTransformsOneAssignmentIntoAnother(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := drawAssignment(t, "from")
		b := drawAssignment(t, "to")
		got, err := a.Apply(Diff(a, b))
		if err != nil {
			t.Fatalf("Diff produced inapplicable ops: %v\nfrom\n%s\nto\n%s", err, a, b)
		}
		if !got.Equal(b) {
			t.Fatalf("got\n%s\nwant\n%s", got, b)
		}
		if len(Diff(b, b)) != 0 {
			t.Fatalf("Diff of equal assignments is not empty")
		}
	})
}

func TestErrorsAreDistinct(t *testing.T) {
	all := []error{ErrGap, ErrOverlap, ErrEmptyRange, ErrNoReplicas, ErrDuplicateReplica, ErrUnknownNode,
		ErrBadNodeID, ErrBadCapacity, ErrDuplicateNode, ErrNoSlice, ErrBadOp}
	for i, a := range all {
		for j, b := range all {
			if i != j && errors.Is(a, b) {
				t.Fatalf("%v is %v", a, b)
			}
		}
	}
}

func TestAppendIndicesKeepsOnlyMembersInOrder(t *testing.T) {
	ns := MustNodeSet(Node{ID: "b"}, Node{ID: "a"}, Node{ID: "c"})
	ia, _ := ns.Index("a")
	ic, _ := ns.Index("c")
	buf := make([]int, 0, 4)
	got := ns.AppendIndices(buf, []NodeID{"c", "gone", "a"})
	assert.Equal(t, []int{ic, ia}, got)
	assert.Empty(t, ns.AppendIndices(nil, []NodeID{"gone"}))
	assert.Equal(t, []int{7, ia}, ns.AppendIndices([]int{7}, []NodeID{"a"}), "it appends")
}
