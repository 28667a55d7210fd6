package source

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	require.NoError(t, s.Scan(ctx, r, before, func(it Item) error { got = append(got, it); return nil }))
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
	require.NoError(t, s.Scan(ctx, keyspace.Full(), now, func(it Item) error { all = append(all, it); return nil }))
	assert.Len(t, all, 39, "the deleted item is gone")
	assert.True(t, slices.IsSortedFunc(all, func(a, b Item) int { return compare(a.Hash, b.Hash) }))

	stop := errors.New("stop")
	assert.ErrorIs(t, s.Scan(ctx, keyspace.Full(), now, func(Item) error { return stop }), stop)

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

	err = s.Scan(ctx, keyspace.Full(), first, func(Item) error { return nil })
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
	require.NoError(t, s.Scan(ctx, keyspace.Full(), now, func(it Item) error { scanned = append(scanned, it); return nil }))
	assert.Equal(t, []Item{want}, scanned)
}
