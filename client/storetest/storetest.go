// Package storetest checks that a client.Store does what Sliceplane relies on, so that every
// store (this module's and an application's own) is held to one set of rules rather than to
// whatever its author happened to test.
//
// The rules the suite settles where the client.Store interface leaves room:
//
//   - Put and PutFragment are accepted whatever slice the key hashes to, held or not: the
//     distributor sends only items of held slices, and a store does not police it. DropSlice
//     removes the items whose hash lies in the range, held or not.
//   - AddSlice fails for an empty range or one that overlaps a held slice: that would mean the
//     store and the distributor disagree about what the node holds. The batch then fails as a
//     whole, at the operation or at Commit.
//   - DropSlice need not name a held slice: it stops holding every point of the range, so a
//     held slice it cuts through keeps its parts outside the range.
//   - Slices come back as they were added (adjacent slices are not merged), by start.
//   - Put keeps the item's fragments. An item with neither a value nor fragments is not held:
//     deleting the last fragment of an item without a value removes it.
//   - Deleting an absent item or fragment is not an error.
//   - A store copies what it is given and what it returns: callers reuse their buffers.
//   - Fragments may come back in any order.
//   - Readers run on other goroutines while a batch is applied; they see a committed cursor only
//     with its batch, and Items sees at least every item held throughout its walk.
//   - A store that keeps the ranges a node loads (client.LoadingStore) commits them with the
//     cursor, only with it, keeps them through batches that do not set them, and across a
//     reopen when durable.
package storetest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// Run runs the suite. open returns a new, empty store that also implements client.Reader.
// When durable is true, reopen must close the store and open it again from the same files,
// and return the new instance; the suite calls it only with no batch in progress, and open
// is responsible for closing whichever instance is open when the test ends.
func Run(t *testing.T, durable bool, open func(t *testing.T) (s client.Store, reopen func() client.Store)) {
	tests := []suiteTest{
		{"Empty", testEmpty},
		{"PutGet", testPutGet},
		{"Copies", testCopies},
		{"Fragments", testFragments},
		{"OpsInOrder", testOpsInOrder},
		{"Slices", testSlices},
		{"SliceErrors", testSliceErrors},
		{"DropSlice", testDropSlice},
		{"Reset", testReset},
		{"Abort", testAbort},
		{"BatchDone", testBatchDone},
		{"Isolation", testIsolation},
		{"Cursor", testCursor},
		{"Loading", testLoading},
		{"ItemsError", testItemsError},
		{"ConcurrentReaders", testConcurrentReaders},
		{"Random", testRandom},
	}
	if durable {
		tests = append(tests, suiteTest{"Reopen", testReopen})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, reopen := open(t)
			e := &env{t: t, ctx: t.Context(), s: s, reopen: reopen, durable: durable}
			e.r = e.reader(s)
			tc.fn(e)
		})
	}
}

type suiteTest struct {
	name string
	fn   func(*env)
}

// env is the store under test.
type env struct {
	t       *testing.T
	ctx     context.Context
	s       client.Store
	r       client.Reader
	reopen  func() client.Store
	durable bool
	seq     uint64 // index of the last cursor apply committed
}

func (e *env) reader(s client.Store) client.Reader {
	e.t.Helper()
	r, ok := s.(client.Reader)
	require.True(e.t, ok, "%T does not implement client.Reader", s)
	return r
}

// apply commits ops in one batch, at the next cursor of epoch 1, and returns that cursor.
func (e *env) apply(ops ...client.Op) client.Cursor {
	e.t.Helper()
	e.seq++
	require.NoError(e.t, client.Apply(e.ctx, e.s, client.Delta{Epoch: 1, From: e.seq - 1, To: e.seq, Ops: ops}))
	return client.Cursor{Epoch: 1, Index: e.seq}
}

// begin starts a batch. It is aborted when the test ends, in case a failure cut the test
// short: a store may not close with a batch in progress.
func (e *env) begin() client.Batch {
	e.t.Helper()
	b, err := e.s.Begin(e.ctx)
	require.NoError(e.t, err)
	e.t.Cleanup(b.Abort)
	return b
}

func (e *env) doReopen() {
	e.t.Helper()
	e.s = e.reopen()
	e.r = e.reader(e.s)
}

// state is everything a store holds, as its Reader shows it.
type state struct {
	Cursor client.Cursor
	Slices []client.Range
	Items  map[string]client.Item
}

// dump reads the whole state, checking on the way that Items lists each item once and that
// Get agrees with it.
func (e *env) dump() state {
	e.t.Helper()
	var st state
	var err error
	st.Cursor, err = e.s.Cursor(e.ctx)
	require.NoError(e.t, err)
	st.Slices, err = e.r.Slices(e.ctx)
	require.NoError(e.t, err)
	if len(st.Slices) == 0 {
		st.Slices = nil
	}
	st.Items = map[string]client.Item{}
	require.NoError(e.t, e.r.Items(e.ctx, func(it client.Item) error {
		k := string(it.Key)
		if _, dup := st.Items[k]; dup {
			return fmt.Errorf("item %q listed twice", k)
		}
		st.Items[k] = norm(it)
		return nil
	}))
	for k, want := range st.Items {
		got, ok := e.get(k)
		require.True(e.t, ok, "Items lists %q but Get does not find it", k)
		require.Equal(e.t, want, got, "Get and Items disagree on %q", k)
	}
	return st
}

// get returns an item, normalised.
func (e *env) get(key string) (client.Item, bool) {
	e.t.Helper()
	it, ok, err := e.r.Get(e.ctx, []byte(key))
	require.NoError(e.t, err)
	if !ok {
		return client.Item{}, false
	}
	return norm(it), true
}

// requireItems checks that the store holds exactly want.
func (e *env) requireItems(want ...client.Item) {
	e.t.Helper()
	require.Equal(e.t, itemMap(want...), e.dump().Items)
}

// norm makes items comparable: fragments by ID, and empty slices nil.
func norm(it client.Item) client.Item {
	out := client.Item{Key: it.Key, Value: it.Value, HasValue: it.HasValue}
	if len(out.Value) == 0 {
		out.Value = nil
	}
	for _, f := range it.Fragments {
		if len(f.Value) == 0 {
			f.Value = nil
		}
		out.Fragments = append(out.Fragments, f)
	}
	slices.SortFunc(out.Fragments, func(a, b client.Fragment) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func itemMap(items ...client.Item) map[string]client.Item {
	m := make(map[string]client.Item, len(items))
	for _, it := range items {
		m[string(it.Key)] = norm(it)
	}
	return m
}

func item(key, value string, frags ...client.Fragment) client.Item {
	return client.Item{Key: []byte(key), Value: []byte(value), HasValue: true, Fragments: frags}
}

func fragItem(key string, frags ...client.Fragment) client.Item {
	return client.Item{Key: []byte(key), Fragments: frags}
}

func frag(id, value string) client.Fragment { return client.Fragment{ID: id, Value: []byte(value)} }

func reset() client.Op { return client.Op{Kind: client.OpReset} }

func addSlice(r client.Range) client.Op { return client.Op{Kind: client.OpAddSlice, Range: r} }

func dropSlice(r client.Range) client.Op { return client.Op{Kind: client.OpDropSlice, Range: r} }

func put(k, v string) client.Op {
	return client.Op{Kind: client.OpPut, Key: []byte(k), Value: []byte(v)}
}

func del(k string) client.Op { return client.Op{Kind: client.OpDelete, Key: []byte(k)} }

func putFrag(k, id, v string) client.Op {
	return client.Op{Kind: client.OpPutFragment, Key: []byte(k), Fragment: id, Value: []byte(v)}
}

func delFrag(k, id string) client.Op {
	return client.Op{Kind: client.OpDeleteFragment, Key: []byte(k), Fragment: id}
}

func rng(start uint64, end client.Bound) client.Range { return client.Range{Start: start, End: end} }

// quarters are the four quarters of the space; the last reaches its end.
var quarters = equalParts(4)

// equalParts divides the whole space into n contiguous ranges of equal size, in order.
func equalParts(n int) []client.Range {
	out := make([]client.Range, n)
	for i, k := range keyspace.Equal(n) {
		out[i] = client.Range{Start: k.Start, End: client.EndOfSpace()}
		if !k.End.IsEnd() {
			out[i].End = client.BoundAt(k.End.Point())
		}
	}
	return out
}

// keysIn returns n keys, named after tag, whose hash lies in r. r must be a sizeable share of
// the space: keys are found by trying one after another.
func keysIn(r client.Range, n int, tag string) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		k := fmt.Sprintf("%s-%d", tag, i)
		if r.Contains(client.Hash([]byte(k))) {
			out = append(out, k)
		}
	}
	return out
}

func testEmpty(e *env) {
	st := e.dump()
	assert.Equal(e.t, client.Cursor{}, st.Cursor, "an empty store asks for a snapshot")
	assert.Empty(e.t, st.Slices)
	assert.Empty(e.t, st.Items)
	_, ok := e.get("absent")
	assert.False(e.t, ok)
}

// oddKeys are keys that a store must not confuse with one another, whatever it builds from
// them: NUL bytes, prefixes of each other, non-UTF-8, long. (Sources reject empty keys and
// fragment IDs, so stores need not take them.)
var oddKeys = []string{"\x00", "\x00\x00", "a", "a\x00", "ab", "\xff\xfe", string(bytes.Repeat([]byte("k"), 1000))}

func testPutGet(e *env) {
	ops := []client.Op{addSlice(client.FullRange())}
	var want []client.Item
	for i, k := range oddKeys {
		v := fmt.Sprintf("value %d", i)
		ops = append(ops, put(k, v))
		want = append(want, item(k, v))
	}
	ops = append(ops, put("empty", ""))
	want = append(want, item("empty", ""))
	e.apply(ops...)
	e.requireItems(want...)
	it, ok := e.get("empty")
	require.True(e.t, ok)
	assert.True(e.t, it.HasValue, "an empty value is a value")

	// Put replaces the value.
	e.apply(put("a", "new"))
	want[slices.Index(oddKeys, "a")] = item("a", "new")
	e.requireItems(want...)

	// Put is accepted for a key whose hash lies in no held slice.
	e.apply(dropSlice(client.FullRange()), put("outside", "v"))
	assert.Empty(e.t, e.dump().Slices)
	e.requireItems(item("outside", "v"))
}

func testCopies(e *env) {
	key, value, fragValue := []byte("key"), []byte("value"), []byte("frag")
	b := e.begin()
	defer b.Abort()
	require.NoError(e.t, b.Put(key, value))
	require.NoError(e.t, b.PutFragment(key, "f", fragValue))
	// The caller reuses its buffers before Commit.
	copy(key, "XXX")
	copy(value, "XXXXX")
	copy(fragValue, "XXXX")
	require.NoError(e.t, b.Commit(client.Cursor{Epoch: 1, Index: 1}))
	e.requireItems(item("key", "value", frag("f", "frag")))

	it, ok, err := e.r.Get(e.ctx, []byte("key"))
	require.NoError(e.t, err)
	require.True(e.t, ok)
	copy(it.Key, "YYY")
	copy(it.Value, "YYYYY")
	copy(it.Fragments[0].Value, "YYYY")
	e.requireItems(item("key", "value", frag("f", "frag")))
}

func testFragments(e *env) {
	e.apply(addSlice(client.FullRange()), putFrag("k", "b", "B"), putFrag("k", "a", "A"), putFrag("k", "c", "C"))
	e.requireItems(fragItem("k", frag("a", "A"), frag("b", "B"), frag("c", "C")))
	it, _ := e.get("k")
	assert.False(e.t, it.HasValue, "an item with only fragments has no value")

	// Put keeps the fragments; PutFragment replaces one; DeleteFragment removes one.
	e.apply(put("k", "V"), putFrag("k", "a", "A2"), delFrag("k", "c"), delFrag("k", "absent"), delFrag("absent", "a"))
	e.requireItems(item("k", "V", frag("a", "A2"), frag("b", "B")))

	// An item with a value outlives its fragments.
	e.apply(delFrag("k", "a"), delFrag("k", "b"))
	e.requireItems(item("k", "V"))

	// An item without a value does not.
	e.apply(putFrag("f", "x", "X"), putFrag("f", "y", ""))
	e.requireItems(item("k", "V"), fragItem("f", frag("x", "X"), frag("y", "")))
	e.apply(delFrag("f", "x"), delFrag("f", "y"))
	e.requireItems(item("k", "V"))

	// Delete removes the item and its fragments: a new item of the same key starts bare.
	e.apply(putFrag("k", "a", "A"), putFrag("k", "b", "B"), putFrag("ka", "a", "other item"))
	e.apply(del("k"), del("absent"))
	e.requireItems(fragItem("ka", frag("a", "other item")))
	e.apply(putFrag("k", "c", "C"))
	e.requireItems(fragItem("k", frag("c", "C")), fragItem("ka", frag("a", "other item")))

	// Fragments of keys that prefix one another stay apart.
	var ops []client.Op
	var want []client.Item
	for i, k := range oddKeys {
		ops = append(ops, putFrag(k, oddKeys[len(oddKeys)-1-i], k))
		want = append(want, fragItem(k, frag(oddKeys[len(oddKeys)-1-i], k)))
	}
	e.apply(append([]client.Op{reset()}, ops...)...)
	e.requireItems(want...)
}

func testOpsInOrder(e *env) {
	e.apply(put("a", "1"), del("a"), del("b"), put("b", "2"), putFrag("c", "x", "X"), del("c"), putFrag("c", "y", "Y"),
		put("d", "1"), put("d", "2"))
	e.requireItems(item("b", "2"), fragItem("c", frag("y", "Y")), item("d", "2"))
}

func testSlices(e *env) {
	q := quarters
	// Added out of order, listed by start; adjacent slices stay apart.
	e.apply(addSlice(q[3]), addSlice(q[0]), addSlice(q[1]))
	assert.Equal(e.t, []client.Range{q[0], q[1], q[3]}, e.dump().Slices)

	// Dropping a range cut out of the middle of a slice keeps both sides.
	mid := rng(q[1].Start+1<<60, client.BoundAt(q[1].Start+2<<60))
	e.apply(dropSlice(mid))
	assert.Equal(e.t, []client.Range{q[0], rng(q[1].Start, client.BoundAt(mid.Start)), rng(mid.End.Point(), q[1].End), q[3]},
		e.dump().Slices)

	// Dropping a range that straddles slices keeps the parts outside it.
	e.apply(dropSlice(rng(q[0].Start+1<<61, client.BoundAt(q[1].Start+3<<60))))
	assert.Equal(e.t, []client.Range{rng(0, client.BoundAt(1<<61)), rng(q[1].Start+3<<60, q[1].End), q[3]}, e.dump().Slices)

	// A range that reaches the end of the space drops the end of the last slice.
	e.apply(dropSlice(rng(q[3].Start+1<<60, client.EndOfSpace())))
	assert.Equal(e.t, []client.Range{rng(0, client.BoundAt(1<<61)), rng(q[1].Start+3<<60, q[1].End), rng(q[3].Start, client.BoundAt(q[3].Start+1<<60))},
		e.dump().Slices)

	// Dropping what is not held changes nothing.
	e.apply(dropSlice(q[2]))
	assert.Len(e.t, e.dump().Slices, 3)

	// A freed range can be added again.
	e.apply(addSlice(rng(q[3].Start+1<<60, client.EndOfSpace())))
	assert.Equal(e.t, rng(q[3].Start+1<<60, client.EndOfSpace()), e.dump().Slices[3])

	// The one slice that covers the whole space.
	e.apply(reset(), addSlice(client.FullRange()))
	assert.Equal(e.t, []client.Range{client.FullRange()}, e.dump().Slices)
	e.apply(dropSlice(client.FullRange()))
	assert.Empty(e.t, e.dump().Slices)
}

func testSliceErrors(e *env) {
	q := quarters
	tail := rng(q[3].Start+1<<60, client.EndOfSpace())
	ops := []client.Op{addSlice(q[1]), addSlice(q[3]), put("k", "v")}
	for _, k := range keysIn(tail, 3, "tail") {
		ops = append(ops, put(k, "v"))
	}
	e.apply(ops...)
	before := e.dump()
	bad := map[string]client.Op{
		"same slice":        addSlice(q[1]),
		"overlap start":     addSlice(rng(q[0].Start, client.BoundAt(q[1].Start+1))),
		"overlap end":       addSlice(rng(q[1].End.Point()-1, client.BoundAt(q[2].Start+5))),
		"inside":            addSlice(rng(q[1].Start+1, client.BoundAt(q[1].Start+2))),
		"around":            addSlice(client.FullRange()),
		"overlap last":      addSlice(rng(q[3].Start+7, client.EndOfSpace())),
		"empty":             addSlice(rng(5, client.BoundAt(5))),
		"backwards":         addSlice(rng(6, client.BoundAt(5))),
		"empty drop":        dropSlice(rng(5, client.BoundAt(5))),
		"backwards drop":    dropSlice(rng(q[1].Start, client.BoundAt(1))),
		"after added slice": addSlice(rng(q[2].Start+1, client.BoundAt(q[2].Start+3))),
	}
	for name, op := range bad {
		ops := []client.Op{put("k", "changed"), putFrag("new", "f", "x"), dropSlice(tail), addSlice(rng(q[2].Start, client.BoundAt(q[2].Start+2))), op}
		err := client.Apply(e.ctx, e.s, client.Delta{Epoch: 9, To: 9, Ops: ops})
		require.Error(e.t, err, name)
		require.Equal(e.t, before, e.dump(), "%s: a failed batch changes nothing", name)
	}
	// The store still takes batches.
	e.apply(addSlice(q[0]))
	assert.Equal(e.t, []client.Range{q[0], q[1], q[3]}, e.dump().Slices)
}

func testDropSlice(e *env) {
	q := quarters
	const n = 300
	var keys [4][]string
	var ops []client.Op
	for i := range q {
		keys[i] = keysIn(q[i], n, fmt.Sprintf("q%d", i))
		for j, k := range keys[i] {
			ops = append(ops, put(k, "v"+k))
			if j%3 == 0 {
				ops = append(ops, putFrag(k, "f", "F"+k))
			}
		}
	}
	// Quarter 2 is not held; its items are accepted anyway.
	e.apply(append([]client.Op{addSlice(q[0]), addSlice(q[1]), addSlice(q[3])}, ops...)...)
	want := func(qs ...int) []client.Item {
		var out []client.Item
		for _, i := range qs {
			for j, k := range keys[i] {
				it := item(k, "v"+k)
				if j%3 == 0 {
					it.Fragments = []client.Fragment{frag("f", "F"+k)}
				}
				out = append(out, it)
			}
		}
		return out
	}
	e.requireItems(want(0, 1, 2, 3)...)

	e.apply(dropSlice(q[1]))
	e.requireItems(want(0, 2, 3)...)
	e.apply(dropSlice(q[3]))
	e.requireItems(want(0, 2)...)
	assert.Equal(e.t, []client.Range{q[0]}, e.dump().Slices)

	// Items of a range not held go by their hash too.
	e.apply(dropSlice(q[2]))
	e.requireItems(want(0)...)

	// A range inside a slice drops exactly the items whose hash lies in it, bounds included.
	sorted := slices.Clone(keys[0])
	slices.SortFunc(sorted, func(a, b string) int { return cmp.Compare(client.Hash([]byte(a)), client.Hash([]byte(b))) })
	first, last := sorted[n/3], sorted[2*n/3]
	sub := rng(client.Hash([]byte(first)), client.BoundAt(client.Hash([]byte(last))))
	e.apply(dropSlice(sub))
	var left []client.Item
	for _, it := range want(0) {
		if !sub.Contains(client.Hash(it.Key)) {
			left = append(left, it)
		}
	}
	require.Len(e.t, left, n-(2*n/3-n/3), "the first key of the range goes, the key at its end stays")
	e.requireItems(left...)

	// Dropped items took their fragments with them.
	e.apply(addSlice(q[1]), putFrag(keys[1][0], "g", "G"))
	got, _ := e.get(keys[1][0])
	assert.Equal(e.t, norm(fragItem(keys[1][0], frag("g", "G"))), got)
}

func testReset(e *env) {
	e.apply(addSlice(quarters[0]), addSlice(quarters[3]), put("a", "1"), putFrag("b", "f", "F"))
	e.apply(put("c", "old"), reset(), addSlice(quarters[2]), put("c", "new"), putFrag("d", "f", "F"))
	st := e.dump()
	assert.Equal(e.t, []client.Range{quarters[2]}, st.Slices)
	e.requireItems(item("c", "new"), fragItem("d", frag("f", "F")))
	e.apply(reset())
	st = e.dump()
	assert.Empty(e.t, st.Slices)
	assert.Empty(e.t, st.Items)
	assert.Equal(e.t, client.Cursor{Epoch: 1, Index: 3}, st.Cursor, "a reset keeps the cursor it commits")
}

func testAbort(e *env) {
	e.apply(addSlice(quarters[0]), put("a", "1"), putFrag("a", "f", "F"))
	before := e.dump()
	b := e.begin()
	require.NoError(e.t, b.Put([]byte("a"), []byte("2")))
	require.NoError(e.t, b.Put([]byte("b"), []byte("2")))
	require.NoError(e.t, b.DeleteFragment([]byte("a"), "f"))
	require.NoError(e.t, b.AddSlice(quarters[1]))
	require.NoError(e.t, b.DropSlice(quarters[0]))
	require.NoError(e.t, b.Reset())
	require.NoError(e.t, b.PutFragment([]byte("c"), "g", nil))
	b.Abort()
	assert.Equal(e.t, before, e.dump())

	// An aborted batch cannot be used again, and aborting twice is harmless.
	assert.Error(e.t, b.Put([]byte("a"), []byte("3")))
	assert.Error(e.t, b.Commit(client.Cursor{Epoch: 5, Index: 5}))
	b.Abort()
	assert.Equal(e.t, before, e.dump())

	// The store takes the next batch.
	e.apply(put("b", "3"))
	e.requireItems(item("a", "1", frag("f", "F")), item("b", "3"))
}

func testBatchDone(e *env) {
	b := e.begin()
	require.NoError(e.t, b.AddSlice(quarters[0]))
	require.NoError(e.t, b.Put([]byte("a"), []byte("1")))
	c := client.Cursor{Epoch: 3, Index: 7}
	require.NoError(e.t, b.Commit(c))
	// Apply aborts after a commit; that must not undo it.
	b.Abort()
	st := e.dump()
	assert.Equal(e.t, c, st.Cursor)
	assert.Equal(e.t, []client.Range{quarters[0]}, st.Slices)
	e.requireItems(item("a", "1"))

	for name, op := range map[string]func() error{
		"Reset":          b.Reset,
		"AddSlice":       func() error { return b.AddSlice(quarters[1]) },
		"DropSlice":      func() error { return b.DropSlice(quarters[0]) },
		"Put":            func() error { return b.Put([]byte("b"), nil) },
		"Delete":         func() error { return b.Delete([]byte("a")) },
		"PutFragment":    func() error { return b.PutFragment([]byte("a"), "f", nil) },
		"DeleteFragment": func() error { return b.DeleteFragment([]byte("a"), "f") },
		"Commit":         func() error { return b.Commit(client.Cursor{Epoch: 4}) },
	} {
		assert.Error(e.t, op(), "%s after Commit", name)
	}
	assert.Equal(e.t, st, e.dump())
}

func testIsolation(e *env) {
	e.apply(addSlice(quarters[0]), put("a", "1"))
	before := e.dump()
	b := e.begin()
	defer b.Abort()
	require.NoError(e.t, b.Put([]byte("a"), []byte("2")))
	require.NoError(e.t, b.Put([]byte("b"), []byte("2")))
	require.NoError(e.t, b.AddSlice(quarters[1]))
	assert.Equal(e.t, before, e.dump(), "a batch is invisible before Commit")
	c := client.Cursor{Epoch: 1, Index: 2}
	require.NoError(e.t, b.Commit(c))
	st := e.dump()
	assert.Equal(e.t, c, st.Cursor)
	assert.Equal(e.t, []client.Range{quarters[0], quarters[1]}, st.Slices)
	e.requireItems(item("a", "2"), item("b", "2"))
}

func testCursor(e *env) {
	for _, c := range []client.Cursor{{Epoch: 1, Index: 10}, {Epoch: 1, Index: 25}, {Epoch: 2, Index: 0}, {Epoch: 1<<64 - 1, Index: 1<<64 - 1}} {
		// An empty batch moves the cursor too.
		b := e.begin()
		require.NoError(e.t, b.Commit(c))
		got, err := e.s.Cursor(e.ctx)
		require.NoError(e.t, err)
		require.Equal(e.t, c, got)
	}
}

func testLoading(e *env) {
	ls, ok := e.s.(client.LoadingStore)
	if !ok {
		e.t.Skip("the store does not keep loading ranges")
	}
	loading := func() []client.Range {
		e.t.Helper()
		rs, err := e.s.(client.LoadingStore).Loading(e.ctx)
		require.NoError(e.t, err)
		return rs
	}
	rs, err := ls.Loading(e.ctx)
	require.NoError(e.t, err)
	require.Empty(e.t, rs, "a new store loads nothing")

	want := []client.Range{rng(0, client.BoundAt(10)), rng(1<<63, client.EndOfSpace())}
	b := e.begin()
	lb, ok := b.(client.LoadingBatch)
	require.True(e.t, ok, "a LoadingStore's batches are LoadingBatches")
	in := slices.Clone(want)
	require.NoError(e.t, lb.SetLoading(in))
	in[0] = rng(5, client.BoundAt(6)) // the store keeps a copy
	require.Empty(e.t, loading(), "not before Commit")
	require.NoError(e.t, b.Commit(client.Cursor{Epoch: 1, Index: 1}))
	require.Equal(e.t, want, loading())

	b = e.begin()
	require.NoError(e.t, b.(client.LoadingBatch).SetLoading(nil))
	b.Abort()
	require.Equal(e.t, want, loading(), "an aborted batch changes nothing")

	e.apply(put("a", "1"))
	require.Equal(e.t, want, loading(), "a batch that does not set them keeps them")
	if e.durable {
		e.doReopen()
		require.Equal(e.t, want, loading(), "kept across a reopen")
	}
	b = e.begin()
	require.NoError(e.t, b.(client.LoadingBatch).SetLoading(nil))
	require.NoError(e.t, b.Commit(client.Cursor{Epoch: 1, Index: 9}))
	require.Empty(e.t, loading())
}

func testItemsError(e *env) {
	e.apply(put("a", "1"), put("b", "2"), put("c", "3"))
	stop := errors.New("stop")
	calls := 0
	err := e.r.Items(e.ctx, func(client.Item) error {
		calls++
		return stop
	})
	assert.ErrorIs(e.t, err, stop)
	assert.Equal(e.t, 1, calls, "Items stops at the first error")
}

func testConcurrentReaders(e *env) {
	const batches = 40
	key := func(i uint64) []byte { return fmt.Appendf(nil, "item-%d", i) }
	var done atomic.Bool
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for !done.Load() {
				c, err := e.s.Cursor(e.ctx)
				if !assert.NoError(e.t, err) {
					return
				}
				// A cursor is visible only with the batch it commits.
				if c.Index > 0 {
					_, ok, err := e.r.Get(e.ctx, key(c.Index))
					if !assert.NoError(e.t, err) || !assert.True(e.t, ok, "cursor %s visible without its item", c) {
						return
					}
				}
				if _, err := e.r.Slices(e.ctx); !assert.NoError(e.t, err) {
					return
				}
				// Items are only added, so Items sees at least those committed before it began.
				n := uint64(0)
				if !assert.NoError(e.t, e.r.Items(e.ctx, func(client.Item) error { n++; return nil })) ||
					!assert.GreaterOrEqual(e.t, n, c.Index) {
					return
				}
			}
		})
	}
	for i := uint64(1); i <= batches; i++ {
		err := client.Apply(e.ctx, e.s, client.Delta{Epoch: 1, From: i - 1, To: i, Ops: []client.Op{
			{Kind: client.OpPut, Key: key(i), Value: []byte("v")},
		}})
		if !assert.NoError(e.t, err) {
			break
		}
	}
	done.Store(true)
	wg.Wait()
	assert.Len(e.t, e.dump().Items, batches)
}

func testReopen(e *env) {
	q := quarters
	keys := keysIn(q[3], 50, "durable")
	ops := []client.Op{addSlice(q[0]), addSlice(q[3]), putFrag("frag-only", "f", "F")}
	want := []client.Item{fragItem("frag-only", frag("f", "F"))}
	for _, k := range keys {
		ops = append(ops, put(k, k), putFrag(k, "id", "x"))
		want = append(want, item(k, k, frag("id", "x")))
	}
	c := e.apply(ops...)

	// An aborted batch and a failed one leave no trace.
	b := e.begin()
	require.NoError(e.t, b.Reset())
	require.NoError(e.t, b.Put([]byte("aborted"), []byte("x")))
	b.Abort()
	require.Error(e.t, client.Apply(e.ctx, e.s, client.Delta{Epoch: 7, To: 7, Ops: []client.Op{
		put("failed", "x"), dropSlice(q[3]), addSlice(q[0]),
	}}))

	before := e.dump()
	e.doReopen()
	after := e.dump()
	assert.Equal(e.t, before, after)
	assert.Equal(e.t, c, after.Cursor)
	assert.Equal(e.t, []client.Range{q[0], q[3]}, after.Slices)
	e.requireItems(want...)

	// The reopened store takes batches, and they last too.
	e.apply(dropSlice(q[3]), put("later", "v"))
	before = e.dump()
	e.doReopen()
	assert.Equal(e.t, before, e.dump())
	e.requireItems(fragItem("frag-only", frag("f", "F")), item("later", "v"))
}
