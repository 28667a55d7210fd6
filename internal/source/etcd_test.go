package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// next receives the next batch or fails after a deadline.
func next(t *testing.T, ch <-chan Batch) Batch {
	t.Helper()
	select {
	case b, ok := <-ch:
		require.True(t, ok, "watch closed")
		return b
	case <-time.After(10 * time.Second):
		t.Fatal("no batch within 10s")
	}
	return Batch{}
}

func TestWatchDeliversChangesInClockOrder(t *testing.T) {
	c := etcdtest.New(t)
	s := NewEtcd(c, "/data/")
	ctx := ctx(t)
	start, err := s.Clock(ctx)
	require.NoError(t, err)
	w := s.Watch(ctx, start)

	odd := []byte("a/b\x00c")
	c1, err := s.Put(ctx, odd, []byte("v1"))
	require.NoError(t, err)
	c2, err := s.PutFragment(ctx, odd, "kw/1", []byte("f1"))
	require.NoError(t, err)
	_, err = c.Put(ctx, "/data/not-an-item", "x") // written by hand: ignored
	require.NoError(t, err)
	c3, err := s.Delete(ctx, odd)
	require.NoError(t, err)

	b := next(t, w)
	assert.Equal(t, Batch{Clock: c1, Changes: []Change{{Clock: c1, Hash: keyspace.Hash(odd), Key: odd, Value: []byte("v1")}}}, b)
	b = next(t, w)
	assert.Equal(t, []Change{{Clock: c2, Hash: keyspace.Hash(odd), Key: odd, Fragment: "kw/1", Value: []byte("f1")}}, b.Changes)
	b = next(t, w)
	assert.Equal(t, c3, b.Clock, "deleting an item and its fragments is one change")
	require.Len(t, b.Changes, 2)
	for _, ch := range b.Changes {
		assert.True(t, ch.Delete)
		assert.Equal(t, c3, ch.Clock)
	}
	assert.ElementsMatch(t, []string{"", "kw/1"}, []string{b.Changes[0].Fragment, b.Changes[1].Fragment})

	now, err := s.Clock(ctx)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, now, c3)
}

func TestWatchResumesFromAClock(t *testing.T) {
	c := etcdtest.New(t)
	s := NewEtcd(c, "/data/")
	ctx := ctx(t)
	var clocks []uint64
	for i := range 5 {
		cl, err := s.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte("v"))
		require.NoError(t, err)
		clocks = append(clocks, cl)
	}
	w := s.Watch(ctx, clocks[2])
	assert.Equal(t, clocks[3], next(t, w).Clock, "changes after the clock, not at it")
	assert.Equal(t, clocks[4], next(t, w).Clock)
}

func TestScanReadsARangeAsOfAClock(t *testing.T) {
	c := etcdtest.New(t)
	s := NewEtcd(c, "/data/")
	s.page = 3 // force several pages
	ctx := ctx(t)
	var keys [][]byte
	for i := range 40 {
		k := fmt.Appendf(nil, "user:%d", i)
		keys = append(keys, k)
		_, err := s.Put(ctx, k, fmt.Appendf(nil, "v%d", i))
		require.NoError(t, err)
	}
	_, err := s.PutFragment(ctx, keys[7], "msg/2", []byte("m2"))
	require.NoError(t, err)
	_, err = s.PutFragment(ctx, keys[7], "msg/1", []byte("m1"))
	require.NoError(t, err)
	before, err := s.Clock(ctx)
	require.NoError(t, err)
	_, err = s.Delete(ctx, keys[0])
	require.NoError(t, err)
	_, err = s.Put(ctx, keys[1], []byte("changed"))
	require.NoError(t, err)

	r := keyspace.Range{Start: 1 << 62, End: keyspace.At(3 << 62)}
	var got []Item
	require.NoError(t, errOf(s.Scan(ctx, r, before, func(it Item) error { got = append(got, it); return nil })))
	var want []Item
	for i, k := range keys {
		if h := keyspace.Hash(k); r.Contains(h) {
			it := Item{Key: k, Hash: h, Value: fmt.Appendf(nil, "v%d", i), Exists: true}
			if i == 7 {
				it.Fragments = []Fragment{{ID: "msg/1", Value: []byte("m1")}, {ID: "msg/2", Value: []byte("m2")}}
			}
			want = append(want, it)
		}
	}
	slices.SortFunc(want, func(a, b Item) int { return compare(a.Hash, b.Hash) })
	require.NotEmpty(t, want)
	assert.Equal(t, want, got, "the state before the later changes")

	var all []Item
	now, err := s.Clock(ctx)
	require.NoError(t, err)
	at, err := s.Scan(ctx, keyspace.Full(), now, func(it Item) error { all = append(all, it); return nil })
	require.NoError(t, err)
	assert.Equal(t, now, at, "etcd scans the past at the clock asked")
	assert.Len(t, all, 39, "the deleted item is gone")
	assert.True(t, slices.IsSortedFunc(all, func(a, b Item) int { return compare(a.Hash, b.Hash) }))

	stop := errors.New("stop")
	assert.ErrorIs(t, errOf(s.Scan(ctx, keyspace.Full(), now, func(Item) error { return stop })), stop)

	it, ok, err := s.Get(ctx, keys[7])
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Len(t, it.Fragments, 2)
	_, ok, err = s.Get(ctx, keys[0])
	require.NoError(t, err)
	assert.False(t, ok)
}

func TestCompactedClocksAreReportedAsSuch(t *testing.T) {
	c := etcdtest.New(t)
	s := NewEtcd(c, "/data/")
	ctx := ctx(t)
	first, err := s.Put(ctx, []byte("a"), []byte("1"))
	require.NoError(t, err)
	last, err := s.Put(ctx, []byte("a"), []byte("2"))
	require.NoError(t, err)
	_, err = c.Compact(ctx, int64(last))
	require.NoError(t, err)

	_, err = s.Scan(ctx, keyspace.Full(), first, func(Item) error { return nil })
	assert.ErrorIs(t, err, ErrCompacted)
	b := next(t, s.Watch(ctx, first-1))
	assert.ErrorIs(t, b.Err, ErrCompacted)
}

func compare(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestEmptyKeysAndFragmentIDsAreRejected(t *testing.T) {
	c := etcdtest.New(t)
	s := NewEtcd(c, "/data/")
	ctx := ctx(t)
	before, err := s.Clock(ctx)
	require.NoError(t, err)

	for name, op := range map[string]func() error{
		"put empty key":                func() error { _, err := s.Put(ctx, nil, []byte("v")); return err },
		"put fragment of empty key":    func() error { _, err := s.PutFragment(ctx, []byte{}, "f", []byte("v")); return err },
		"put empty fragment ID":        func() error { _, err := s.PutFragment(ctx, []byte("k"), "", []byte("v")); return err },
		"delete empty key":             func() error { _, err := s.Delete(ctx, nil); return err },
		"delete empty fragment ID":     func() error { _, err := s.DeleteFragment(ctx, []byte("k"), ""); return err },
		"delete fragment of empty key": func() error { _, err := s.DeleteFragment(ctx, nil, "f"); return err },
		"get empty key":                func() error { _, _, err := s.Get(ctx, nil); return err },
	} {
		err := op()
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "empty", name)
	}
	after, err := s.Clock(ctx)
	require.NoError(t, err)
	assert.Equal(t, before, after, "nothing was written")
}

func TestFragmentIDsWithSlashesKeepTheirItemIntact(t *testing.T) {
	c := etcdtest.New(t)
	s := NewEtcd(c, "/data/")
	ctx := ctx(t)
	key := []byte("user:1")
	_, err := s.Put(ctx, key, []byte("v"))
	require.NoError(t, err)
	for _, id := range []string{"msg", "msg/1", "msg/1/", "/"} {
		_, err := s.PutFragment(ctx, key, id, []byte(id))
		require.NoError(t, err, id)
	}
	_, err = s.DeleteFragment(ctx, key, "msg")
	require.NoError(t, err)

	it, ok, err := s.Get(ctx, key)
	require.NoError(t, err)
	require.True(t, ok)
	want := Item{Key: key, Hash: keyspace.Hash(key), Value: []byte("v"), Exists: true, Fragments: []Fragment{
		{ID: "/", Value: []byte("/")}, {ID: "msg/1", Value: []byte("msg/1")}, {ID: "msg/1/", Value: []byte("msg/1/")},
	}}
	assert.Equal(t, want, it, "deleting fragment msg leaves msg/1 alone")

	now, err := s.Clock(ctx)
	require.NoError(t, err)
	var scanned []Item
	require.NoError(t, errOf(s.Scan(ctx, keyspace.Full(), now, func(it Item) error { scanned = append(scanned, it); return nil })))
	assert.Equal(t, []Item{want}, scanned)
}

// rejections records what a source reports of the keys it skips.
type rejections struct {
	mu      sync.Mutex
	counted map[RejectReason]int
	logged  []string
}

func (r *rejections) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "reason" {
			r.logged = append(r.logged, a.Value.String())
		}
		return true
	})
	return nil
}
func (r *rejections) Enabled(context.Context, slog.Level) bool { return true }
func (r *rejections) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *rejections) WithGroup(string) slog.Handler            { return r }

func (r *rejections) observe(s *Etcd) {
	r.counted = map[RejectReason]int{}
	s.Logger = slog.New(r)
	s.Rejected = func(reason RejectReason) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.counted[reason]++
	}
}

func (r *rejections) snapshot() (map[RejectReason]int, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.counted), slices.Clone(r.logged)
}

// TestStrayKeysNeverTouchAnItem writes, next to an item, keys under the prefix that are not
// item keys, among them the item's key with an empty fragment ID after it, which was read as
// the item itself: its delete deleted the item on every node that held it.
func TestStrayKeysNeverTouchAnItem(t *testing.T) {
	c := etcdtest.New(t)
	s := NewEtcd(c, "/data/")
	var rej rejections
	rej.observe(s)
	ctx := ctx(t)
	key := []byte("user:1")
	item := s.ItemKey(key)
	start, err := s.Put(ctx, key, []byte("v"))
	require.NoError(t, err)
	w := s.Watch(ctx, start)
	stray := []string{
		item + "/", // an empty fragment ID
		"/data/" + strings.ToUpper(item[6:22]) + item[22:], // an upper-case hash
		"/data/0000000000000000" + item[22:],               // another hash
		"/data/not-an-item",
	}
	for range 2 {
		for _, k := range stray {
			_, err := c.Put(ctx, k, "stray")
			require.NoError(t, err)
		}
	}
	for _, k := range stray {
		_, err := c.Delete(ctx, k)
		require.NoError(t, err)
	}
	last, err := s.PutFragment(ctx, key, "f", []byte("x"))
	require.NoError(t, err)

	b := next(t, w)
	assert.Equal(t, []Change{{Clock: last, Hash: keyspace.Hash(key), Key: key, Fragment: "f", Value: []byte("x")}}, b.Changes,
		"the stray keys' puts and deletes are not changes")
	var scanned []Item
	require.NoError(t, errOf(s.Scan(ctx, keyspace.Full(), last, func(it Item) error { scanned = append(scanned, it); return nil })))
	assert.Equal(t, []Item{{Key: key, Hash: keyspace.Hash(key), Value: []byte("v"), Exists: true,
		Fragments: []Fragment{{ID: "f", Value: []byte("x")}}}}, scanned)

	// The scan at a clock when the stray keys were there reads the item as it was.
	mid := last - 1 - uint64(len(stray))
	scanned = nil
	require.NoError(t, errOf(s.Scan(ctx, keyspace.Full(), mid, func(it Item) error { scanned = append(scanned, it); return nil })))
	assert.Equal(t, []Item{{Key: key, Hash: keyspace.Hash(key), Value: []byte("v"), Exists: true}}, scanned)

	counted, logged := rej.snapshot()
	// The watch saw 3 events of each stray key, the scan at mid one key of each.
	assert.Equal(t, map[RejectReason]int{RejectEmptyFragment: 4, RejectHash: 4, RejectHashMismatch: 4, RejectShape: 4}, counted)
	assert.ElementsMatch(t, []string{"empty_fragment", "hash", "hash_mismatch", "shape"}, logged, "logged once per reason")
}

func TestScanPagesAdaptToTheSizeOfValues(t *testing.T) {
	assert.Equal(t, int64(1000), nextPage(nil, 10, 1000, 1<<20), "no keys: as many as allowed")
	big := []*mvccpb.KeyValue{{Key: []byte("k"), Value: make([]byte, 1<<20)}}
	assert.Equal(t, int64(1), nextPage(big, 1000, 1000, 1<<20), "a value of a page's size: one key per read")
	small := make([]*mvccpb.KeyValue, 10)
	for i := range small {
		small[i] = &mvccpb.KeyValue{Key: []byte("k"), Value: make([]byte, 99)}
	}
	assert.Equal(t, int64(20), nextPage(small, 10, 1000, 1<<20), "small values: twice the keys")
	assert.Equal(t, int64(10), nextPage(small, 10, 1000, 1000), "ten of them make a page")

	c := etcdtest.New(t)
	s := NewEtcd(c, "/data/")
	s.pageBytes = 3000 // two or three items a read
	ctx := ctx(t)
	for i := range 50 {
		_, err := s.Put(ctx, fmt.Appendf(nil, "k%d", i), make([]byte, 1000+i))
		require.NoError(t, err)
	}
	now, err := s.Clock(ctx)
	require.NoError(t, err)
	n := 0
	require.NoError(t, errOf(s.Scan(ctx, keyspace.Full(), now, func(it Item) error { n++; return nil })))
	assert.Equal(t, 50, n)
}

// errOf returns the error of a Scan, whose clock the test does not look at.
func errOf(_ uint64, err error) error { return err }
