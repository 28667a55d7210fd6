package converge_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/memstore"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/converge"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/source/memsource"
)

const (
	n1 = assignment.NodeID("n1")
	n2 = assignment.NodeID("n2")
	n3 = assignment.NodeID("n3")
	n4 = assignment.NodeID("n4") // not in the map
)

// keyIn returns the first key name-0, name-1, ... whose hash lies in r.
func keyIn(t *testing.T, r keyspace.Range, name string) []byte {
	t.Helper()
	for i := range 1 << 20 {
		k := fmt.Appendf(nil, "%s-%d", name, i)
		if r.Contains(keyspace.Hash(k)) {
			return k
		}
	}
	require.FailNow(t, "no key in range", "%s", r)
	return nil
}

// held is an item as a node must hold it.
type held struct {
	name     string
	value    string
	hasValue bool
	frags    [][2]string // ID, value
}

// fixture is a source, a map and nodes that hold exactly the source as of at.
//
//	slice s0 (first third of the space):  n1, n2   items a0, a1 (and d, deleted)
//	slice s1 (second third):              n2, n3   items b0, b1 (fragments only)
//	slice s2 (last third):                n3       item c0
type fixture struct {
	src    *memsource.Source
	a      *assignment.Assignment
	s      []keyspace.Range
	k      map[string][]byte
	at     uint64 // the clock the nodes reflect
	dPut   uint64 // the clock at which d existed
	latest uint64 // after changes the nodes have not seen
	items  []held // the items at at
	nodes  map[assignment.NodeID]*memstore.Store
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	s := keyspace.Equal(3)
	a, err := assignment.New(7, []assignment.Slice{
		{Range: s[0], Replicas: []assignment.NodeID{n1, n2}},
		{Range: s[1], Replicas: []assignment.NodeID{n3, n2}},
		{Range: s[2], Replicas: []assignment.NodeID{n3}},
	})
	require.NoError(t, err)
	f := &fixture{src: memsource.New(), a: a, s: s, k: map[string][]byte{}}
	for name, r := range map[string]keyspace.Range{
		"a0": s[0], "a1": s[0], "d": s[0],
		"b0": s[1], "b1": s[1], "late": s[1],
		"c0": s[2],
	} {
		f.k[name] = keyIn(t, r, name)
	}
	src, k := f.src, f.k
	src.Put(k["a0"], []byte("v1"))
	src.Put(k["a0"], []byte("v2"))
	src.Put(k["a1"], []byte("x"))
	src.PutFragment(k["a1"], "f1", []byte("F1"))
	src.PutFragment(k["a1"], "f2", []byte("F2"))
	src.PutFragment(k["a1"], "f3", []byte("F3"))
	src.DeleteFragment(k["a1"], "f3")
	src.Put(k["b0"], []byte("b"))
	src.PutFragment(k["b1"], "f", []byte("ff"))
	src.Put(k["c0"], []byte("c"))
	f.dPut = src.Put(k["d"], []byte("gone"))
	f.at = src.Delete(k["d"])
	// Changes the nodes have not seen yet.
	src.Put(k["late"], []byte("late"))
	src.Put(k["a0"], []byte("v3"))
	f.latest = src.Delete(k["c0"])

	f.items = []held{
		{name: "a0", value: "v2", hasValue: true},
		{name: "a1", value: "x", hasValue: true, frags: [][2]string{{"f1", "F1"}, {"f2", "F2"}}},
		{name: "b0", value: "b", hasValue: true},
		{name: "b1", frags: [][2]string{{"f", "ff"}}},
		{name: "c0", value: "c", hasValue: true},
	}
	f.nodes = map[assignment.NodeID]*memstore.Store{}
	for _, id := range []assignment.NodeID{n1, n2, n3} {
		var rs []keyspace.Range
		for _, sl := range a.All() {
			if sl.Holds(id) {
				rs = append(rs, sl.Range)
			}
		}
		f.nodes[id] = memstore.New()
		f.apply(t, id, f.fill(rs...)...)
	}
	return f
}

// clientRange returns the client's form of a range of the map.
func clientRange(r keyspace.Range) client.Range {
	out := client.Range{Start: r.Start, End: client.EndOfSpace()}
	if !r.End.IsEnd() {
		out.End = client.BoundAt(r.End.Point())
	}
	return out
}

// fill returns the operations that make a node hold exactly ranges rs and their items.
func (f *fixture) fill(rs ...keyspace.Range) []client.Op {
	ops := []client.Op{{Kind: client.OpReset}}
	for _, r := range rs {
		ops = append(ops, client.Op{Kind: client.OpAddSlice, Range: clientRange(r)})
	}
	for _, it := range f.items {
		k := f.k[it.name]
		if !slices.ContainsFunc(rs, func(r keyspace.Range) bool { return r.Contains(keyspace.Hash(k)) }) {
			continue
		}
		if it.hasValue {
			ops = append(ops, client.Op{Kind: client.OpPut, Key: k, Value: []byte(it.value)})
		}
		for _, fr := range it.frags {
			ops = append(ops, client.Op{Kind: client.OpPutFragment, Key: k, Fragment: fr[0], Value: []byte(fr[1])})
		}
	}
	return ops
}

// apply applies ops to node id in one delta, creating the node if needed.
func (f *fixture) apply(t *testing.T, id assignment.NodeID, ops ...client.Op) {
	t.Helper()
	s := f.nodes[id]
	if s == nil {
		s = memstore.New()
		f.nodes[id] = s
	}
	c, err := s.Cursor(t.Context())
	require.NoError(t, err)
	require.NoError(t, client.Apply(t.Context(), s, client.Delta{Epoch: 1, From: c.Index, To: c.Index + 1, Ops: ops}))
}

func (f *fixture) put(name, value string) client.Op {
	return client.Op{Kind: client.OpPut, Key: f.k[name], Value: []byte(value)}
}

func (f *fixture) del(name string) client.Op {
	return client.Op{Kind: client.OpDelete, Key: f.k[name]}
}

func (f *fixture) putFrag(name, id, value string) client.Op {
	return client.Op{Kind: client.OpPutFragment, Key: f.k[name], Fragment: id, Value: []byte(value)}
}

func (f *fixture) delFrag(name, id string) client.Op {
	return client.Op{Kind: client.OpDeleteFragment, Key: f.k[name], Fragment: id}
}

func (f *fixture) check(t *testing.T, at uint64) converge.Report {
	t.Helper()
	readers := map[assignment.NodeID]client.Reader{}
	for id, s := range f.nodes {
		readers[id] = s
	}
	r, err := converge.Check(t.Context(), f.src, at, f.a, readers)
	require.NoError(t, err)
	return r
}

// counts are the problem counts of a report.
type counts struct{ Missing, Leaked, Stale, Slices int }

func countsOf(r converge.Report) counts { return counts{r.Missing, r.Leaked, r.Stale, r.Slices} }

// problem is an expected problem: node, kind, key name ("" for none) and a piece of its
// detail.
type problem struct {
	node   assignment.NodeID
	kind   string
	key    string
	detail string
}

// assertReport checks a report's counts, its problems (in any order) and its text.
func assertReport(t *testing.T, f *fixture, r converge.Report, items, copies int, want counts, problems []problem) {
	t.Helper()
	assert.Equal(t, items, r.Items, "items")
	assert.Equal(t, copies, r.Copies, "copies")
	assert.Equal(t, want, countsOf(r))
	assert.Equal(t, want == counts{}, r.OK(), "OK")

	type id struct {
		node      assignment.NodeID
		kind, key string
	}
	var wantIDs, gotIDs []id
	for _, p := range problems {
		wantIDs = append(wantIDs, id{p.node, p.kind, string(f.k[p.key])})
	}
	for _, p := range r.Problems {
		gotIDs = append(gotIDs, id{p.Node, p.Kind, string(p.Key)})
	}
	if !assert.ElementsMatch(t, wantIDs, gotIDs, "problems") {
		return
	}
	text := r.String()
	for _, w := range problems {
		i := slices.IndexFunc(r.Problems, func(p converge.Problem) bool {
			return p.Node == w.node && p.Kind == w.kind && string(p.Key) == string(f.k[w.key])
		})
		p := r.Problems[i]
		assert.Contains(t, p.Detail, w.detail, "detail of %s", p)
		// The text names the node, the kind and the key of every problem.
		assert.Contains(t, text, fmt.Sprintf("\n  %s: %s %q: ", w.node, w.kind, f.k[w.key]))
	}
	if r.OK() {
		assert.Equal(t, fmt.Sprintf("converged: %d items, %d copies", items, copies), text)
	} else {
		assert.True(t, strings.HasPrefix(text, fmt.Sprintf(
			"not converged: %d items, %d copies; %d missing, %d leaked, %d stale, %d slice mismatches\n",
			items, copies, want.Missing, want.Leaked, want.Stale, want.Slices)), "text:\n%s", text)
		assert.Equal(t, len(problems), strings.Count(text, "\n  "), "one line per problem:\n%s", text)
	}
}

type checkCase struct {
	name     string
	mutate   func(t *testing.T, f *fixture)
	want     counts
	problems []problem
}

// checkCases mutate the fixture's converged cluster, and give what Check must then report.
var checkCases = []checkCase{
	{name: "converged", mutate: func(*testing.T, *fixture) {}},
	{
		name: "slices cut differently, same points",
		mutate: func(t *testing.T, f *fixture) {
			merged := keyspace.Range{Start: f.s[1].Start, End: f.s[2].End}
			f.apply(t, n3, f.fill(merged)...)
		},
	},
	{
		name: "node outside the map holding nothing",
		mutate: func(t *testing.T, f *fixture) {
			f.apply(t, n4)
		},
	},
	{
		name:     "missing on one replica",
		mutate:   func(t *testing.T, f *fixture) { f.apply(t, n2, f.del("a1")) },
		want:     counts{Missing: 1},
		problems: []problem{{n2, "missing", "a1", "in the source and in its slices"}},
	},
	{
		name: "missing on every replica",
		mutate: func(t *testing.T, f *fixture) {
			f.apply(t, n2, f.del("b0"))
			f.apply(t, n3, f.del("b0"))
		},
		want:     counts{Missing: 2},
		problems: []problem{{n2, "missing", "b0", ""}, {n3, "missing", "b0", ""}},
	},
	{
		name:     "leaked to a node outside its slice",
		mutate:   func(t *testing.T, f *fixture) { f.apply(t, n1, f.put("c0", "c")) },
		want:     counts{Leaked: 1},
		problems: []problem{{n1, "leaked", "c0", "is not in its slices"}},
	},
	{
		name: "deleted item kept",
		mutate: func(t *testing.T, f *fixture) {
			f.apply(t, n1, f.put("d", "gone"))
			f.apply(t, n2, f.put("d", "gone"))
		},
		want:     counts{Leaked: 2},
		problems: []problem{{n1, "leaked", "d", ""}, {n2, "leaked", "d", ""}},
	},
	{
		name:     "item written after the clock held early",
		mutate:   func(t *testing.T, f *fixture) { f.apply(t, n3, f.put("late", "late")) },
		want:     counts{Leaked: 1},
		problems: []problem{{n3, "leaked", "late", ""}},
	},
	{
		name:     "stale value",
		mutate:   func(t *testing.T, f *fixture) { f.apply(t, n1, f.put("a0", "v1")) },
		want:     counts{Stale: 1},
		problems: []problem{{n1, "stale", "a0", `value "v1", the source "v2"`}},
	},
	{
		name:     "newer value than at the clock",
		mutate:   func(t *testing.T, f *fixture) { f.apply(t, n2, f.put("a0", "v3")) },
		want:     counts{Stale: 1},
		problems: []problem{{n2, "stale", "a0", `value "v3", the source "v2"`}},
	},
	{
		name:     "value where the source has only fragments",
		mutate:   func(t *testing.T, f *fixture) { f.apply(t, n3, f.put("b1", "")) },
		want:     counts{Stale: 1},
		problems: []problem{{n3, "stale", "b1", "has value true, the source false"}},
	},
	{
		name: "value lost, fragments kept",
		mutate: func(t *testing.T, f *fixture) {
			f.apply(t, n2, f.del("a1"), f.putFrag("a1", "f1", "F1"), f.putFrag("a1", "f2", "F2"))
		},
		want:     counts{Stale: 1},
		problems: []problem{{n2, "stale", "a1", "has value false, the source true"}},
	},
	{
		name:     "stale fragment",
		mutate:   func(t *testing.T, f *fixture) { f.apply(t, n1, f.putFrag("a1", "f1", "old")) },
		want:     counts{Stale: 1},
		problems: []problem{{n1, "stale", "a1", `fragment "f1" is "old", the source "F1"`}},
	},
	{
		name:     "missing fragment",
		mutate:   func(t *testing.T, f *fixture) { f.apply(t, n2, f.delFrag("a1", "f2")) },
		want:     counts{Stale: 1},
		problems: []problem{{n2, "stale", "a1", "1 fragments, the source 2"}},
	},
	{
		name:     "extra fragment, deleted in the source",
		mutate:   func(t *testing.T, f *fixture) { f.apply(t, n1, f.putFrag("a1", "f3", "F3")) },
		want:     counts{Stale: 1},
		problems: []problem{{n1, "stale", "a1", "3 fragments, the source 2"}},
	},
	{
		name: "wrong fragment",
		mutate: func(t *testing.T, f *fixture) {
			f.apply(t, n1, f.delFrag("a1", "f2"), f.putFrag("a1", "f9", "F2"))
		},
		want:     counts{Stale: 1},
		problems: []problem{{n1, "stale", "a1", `fragment "f2" missing`}},
	},
	{
		name: "extra fragment on a fragment-only item",
		mutate: func(t *testing.T, f *fixture) {
			f.apply(t, n2, f.putFrag("b1", "g", "gg"))
			f.apply(t, n3, f.putFrag("b1", "g", "gg"))
		},
		want:     counts{Stale: 2},
		problems: []problem{{n2, "stale", "b1", "2 fragments, the source 1"}, {n3, "stale", "b1", "2 fragments, the source 1"}},
	},
	{
		name: "slice it must not hold",
		mutate: func(t *testing.T, f *fixture) {
			f.apply(t, n1, client.Op{Kind: client.OpAddSlice, Range: clientRange(f.s[2])})
		},
		want:     counts{Slices: 1},
		problems: []problem{{n1, "slices", "", "must hold"}},
	},
	{
		name: "slice it must not hold, with its items",
		mutate: func(t *testing.T, f *fixture) {
			f.apply(t, n2, client.Op{Kind: client.OpAddSlice, Range: clientRange(f.s[2])}, f.put("c0", "c"))
		},
		want:     counts{Slices: 1, Leaked: 1},
		problems: []problem{{n2, "slices", "", "must hold"}, {n2, "leaked", "c0", ""}},
	},
	{
		name: "slice dropped with its items",
		mutate: func(t *testing.T, f *fixture) {
			f.apply(t, n3, client.Op{Kind: client.OpDropSlice, Range: clientRange(f.s[1])})
		},
		want: counts{Slices: 1, Missing: 2},
		problems: []problem{
			{n3, "slices", "", fmt.Sprintf("holds %s, must hold %s", keyspace.NewSet(third(2)), keyspace.NewSet(third(1), third(2)))},
			{n3, "missing", "b0", ""}, {n3, "missing", "b1", ""},
		},
	},
	{
		name: "slice held, items not yet",
		mutate: func(t *testing.T, f *fixture) {
			f.apply(t, n1, client.Op{Kind: client.OpReset}, client.Op{Kind: client.OpAddSlice, Range: clientRange(f.s[0])})
		},
		want:     counts{Missing: 2},
		problems: []problem{{n1, "missing", "a0", ""}, {n1, "missing", "a1", ""}},
	},
	{
		name: "node outside the map holding data",
		mutate: func(t *testing.T, f *fixture) {
			f.apply(t, n4, f.fill(f.s[2])...)
		},
		want:     counts{Slices: 1, Leaked: 1},
		problems: []problem{{n4, "slices", "", "must hold {}"}, {n4, "leaked", "c0", ""}},
	},
	{
		name: "several problems on several nodes",
		mutate: func(t *testing.T, f *fixture) {
			f.apply(t, n1, f.put("a0", "v1"), f.put("d", "gone"))
			f.apply(t, n2, f.del("a1"), f.delFrag("b1", "f"))
			f.apply(t, n3, client.Op{Kind: client.OpDropSlice, Range: clientRange(f.s[2])})
		},
		want: counts{Missing: 3, Leaked: 1, Stale: 1, Slices: 1},
		problems: []problem{
			{n1, "stale", "a0", ""}, {n1, "leaked", "d", ""},
			{n2, "missing", "a1", ""}, {n2, "missing", "b1", ""},
			{n3, "slices", "", ""}, {n3, "missing", "c0", ""},
		},
	},
}

func TestCheck(t *testing.T) {
	// As of the fixture's clock: a0, a1, b0, b1 on two nodes each, c0 on one.
	const items, copies = 5, 9
	for _, tc := range checkCases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.mutate(t, f)
			assertReport(t, f, f.check(t, f.at), items, copies, tc.want, tc.problems)
		})
	}
}

// third returns the i-th of three equal slices, as the fixture cuts them.
func third(i int) keyspace.Range { return keyspace.Equal(3)[i] }

// TestCheckAsOfClock checks that the clock decides what the nodes must hold: changes after it
// are not required, and items deleted before it must be gone.
func TestCheckAsOfClock(t *testing.T) {
	f := newFixture(t)

	// Before d was deleted, s0's replicas had to hold it.
	assertReport(t, f, f.check(t, f.dPut), 6, 11, counts{Missing: 2}, []problem{
		{n1, "missing", "d", ""}, {n2, "missing", "d", ""},
	})
	// At the nodes' clock, the later put of a0, the new item and the delete of c0 do not count.
	assertReport(t, f, f.check(t, f.at), 5, 9, counts{}, nil)
	// At the latest clock they do: late (s1, two replicas) replaces c0 (s2, one replica).
	assertReport(t, f, f.check(t, f.latest), 5, 10, counts{Missing: 2, Leaked: 1, Stale: 2}, []problem{
		{n2, "missing", "late", ""}, {n3, "missing", "late", ""},
		{n1, "stale", "a0", `value "v2", the source "v3"`}, {n2, "stale", "a0", `value "v2", the source "v3"`},
		{n3, "leaked", "c0", "or the item is gone"},
	})

	// Once the nodes catch up, the latest clock is OK, and the old one is not.
	for _, id := range []assignment.NodeID{n1, n2} {
		f.apply(t, id, f.put("a0", "v3"))
	}
	for _, id := range []assignment.NodeID{n2, n3} {
		f.apply(t, id, f.put("late", "late"))
	}
	f.apply(t, n3, f.del("c0"))
	assertReport(t, f, f.check(t, f.latest), 5, 10, counts{}, nil)
	r := f.check(t, f.at)
	assert.Equal(t, counts{Missing: 1, Leaked: 2, Stale: 2}, countsOf(r), "%s", r)
}

func TestCheckListsTheFirstProblems(t *testing.T) {
	src := memsource.New()
	const n = 30
	for i := range n {
		src.Put(fmt.Appendf(nil, "k%02d", i), []byte("v"))
	}
	a, err := assignment.New(1, []assignment.Slice{{Range: keyspace.Full(), Replicas: []assignment.NodeID{n1, n2}}})
	require.NoError(t, err)
	nodes := map[assignment.NodeID]client.Reader{}
	for _, id := range []assignment.NodeID{n1, n2} {
		s := memstore.New()
		require.NoError(t, client.Apply(t.Context(), s, client.Delta{Epoch: 1, To: 1, Ops: []client.Op{
			{Kind: client.OpAddSlice, Range: client.FullRange()},
		}}))
		nodes[id] = s
	}
	r, err := converge.Check(t.Context(), src, n, a, nodes)
	require.NoError(t, err)
	assert.Equal(t, n, r.Items)
	assert.Equal(t, 2*n, r.Copies)
	assert.Equal(t, counts{Missing: 2 * n}, countsOf(r), "the counts are exact")
	require.Len(t, r.Problems, 20, "the list is bounded")
	for i, p := range r.Problems {
		// Nodes in order, then missing keys in order: n1's 20 first keys.
		assert.Equal(t, converge.Problem{Node: n1, Kind: "missing", Key: fmt.Appendf(nil, "k%02d", i), Detail: "in the source and in its slices"}, p)
	}
	assert.Equal(t, 20, strings.Count(r.String(), "\n  "))
	assert.Contains(t, r.String(), "60 missing")
}

// failing is a reader whose Slices or Items fail.
type failing struct {
	client.Reader
	slicesErr, itemsErr error
}

func (f failing) Slices(ctx context.Context) ([]client.Range, error) {
	if f.slicesErr != nil {
		return nil, f.slicesErr
	}
	return f.Reader.Slices(ctx)
}

func (f failing) Items(ctx context.Context, fn func(client.Item) error) error {
	if f.itemsErr != nil {
		return f.itemsErr
	}
	return f.Reader.Items(ctx, fn)
}

func TestCheckErrors(t *testing.T) {
	boom := errors.New("boom")
	readers := func(f *fixture) map[assignment.NodeID]client.Reader {
		m := map[assignment.NodeID]client.Reader{}
		for id, s := range f.nodes {
			m[id] = s
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		prepare func(f *fixture, nodes map[assignment.NodeID]client.Reader) uint64
		is      error
		text    string
	}{
		{
			name: "node of the map not given",
			prepare: func(f *fixture, nodes map[assignment.NodeID]client.Reader) uint64 {
				delete(nodes, n3)
				return f.at
			},
			text: "node n3",
		},
		{
			name: "source compacted",
			prepare: func(f *fixture, _ map[assignment.NodeID]client.Reader) uint64 {
				f.src.Compact(f.latest)
				return f.at
			},
			is: source.ErrCompacted,
		},
		{
			name: "scan past the source's clock",
			prepare: func(f *fixture, _ map[assignment.NodeID]client.Reader) uint64 {
				return f.latest + 1
			},
			text: "scanning the source",
		},
		{
			name: "slices fail",
			prepare: func(f *fixture, nodes map[assignment.NodeID]client.Reader) uint64 {
				nodes[n2] = failing{Reader: nodes[n2], slicesErr: boom}
				return f.at
			},
			is:   boom,
			text: "the slices of n2",
		},
		{
			name: "items fail",
			prepare: func(f *fixture, nodes map[assignment.NodeID]client.Reader) uint64 {
				nodes[n1] = failing{Reader: nodes[n1], itemsErr: boom}
				return f.at
			},
			is:   boom,
			text: "the items of n1",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			nodes := readers(f)
			at := tc.prepare(f, nodes)
			r, err := converge.Check(t.Context(), f.src, at, f.a, nodes)
			require.Error(t, err)
			if tc.is != nil {
				assert.ErrorIs(t, err, tc.is)
			}
			assert.Contains(t, err.Error(), tc.text)
			assert.Equal(t, converge.Report{}, r)
		})
	}
}

// TestCheckWantsAQuarantinedRangeNowhere checks that a range held by Nobody (quarantined)
// is required of no node: its items count no copy, and a node still holding it leaks them.
func TestCheckWantsAQuarantinedRangeNowhere(t *testing.T) {
	f := newFixture(t)
	a, err := f.a.Apply([]assignment.Op{assignment.Assign{Slice: f.s[2].Start, Replicas: []assignment.NodeID{assignment.Nobody}}})
	require.NoError(t, err)
	f.a = a
	r := f.check(t, f.at)
	assert.Equal(t, 5, r.Items)
	assert.Equal(t, 8, r.Copies, "c0, in the quarantined range, is wanted nowhere")
	assert.Equal(t, counts{Leaked: 1, Slices: 1}, countsOf(r), "%s", r)
	for _, p := range r.Problems {
		assert.Equal(t, n3, p.Node, "%s", r)
	}
}
