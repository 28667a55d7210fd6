package memstore_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/memstore"
	"github.com/sliceplane/sliceplane/client/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	storetest.Run(t, false, func(*testing.T) (client.Store, func() client.Store) {
		return memstore.New(), nil
	})
}

func TestLen(t *testing.T) {
	s := memstore.New()
	ctx := t.Context()
	ops := []client.Op{{Kind: client.OpAddSlice, Range: client.FullRange()}}
	for i := range 1000 {
		ops = append(ops, client.Op{Kind: client.OpPut, Key: fmt.Appendf(nil, "k%d", i)})
	}
	require.NoError(t, client.Apply(ctx, s, client.Delta{Epoch: 1, To: 1, Ops: ops}))
	assert.Equal(t, 1000, s.Len())

	// Drop a range whose bounds cut through buckets, then one that reaches the end.
	half := client.Range{Start: 1<<63 + 12345, End: client.EndOfSpace()}
	quarter := client.Range{Start: 1<<62 + 777, End: client.BoundAt(1<<63 + 12345)}
	want := 0
	for i := range 1000 {
		if !half.Contains(client.Hash(fmt.Appendf(nil, "k%d", i))) && !quarter.Contains(client.Hash(fmt.Appendf(nil, "k%d", i))) {
			want++
		}
	}
	require.NoError(t, client.Apply(ctx, s, client.Delta{Epoch: 1, To: 2, Ops: []client.Op{
		{Kind: client.OpDropSlice, Range: quarter},
		{Kind: client.OpDropSlice, Range: half},
		{Kind: client.OpDelete, Key: []byte("absent")},
	}}))
	assert.Equal(t, want, s.Len())
	n := 0
	require.NoError(t, s.Items(ctx, func(client.Item) error { n++; return nil }))
	assert.Equal(t, want, n)
}

// TestReadersSeeWholeBatches checks, through Len, that no reader sees part of a batch: every
// batch adds ten items.
func TestReadersSeeWholeBatches(t *testing.T) {
	s := memstore.New()
	ctx := t.Context()
	var done atomic.Bool
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for !done.Load() {
				if n := s.Len(); n%10 != 0 {
					assert.Fail(t, "reader saw part of a batch", "%d items", n)
					return
				}
			}
		})
	}
	for i := range 200 {
		var ops []client.Op
		for j := range 10 {
			ops = append(ops, client.Op{Kind: client.OpPut, Key: fmt.Appendf(nil, "k%d-%d", i, j)})
		}
		require.NoError(t, client.Apply(ctx, s, client.Delta{Epoch: 1, From: uint64(i), To: uint64(i + 1), Ops: ops}))
	}
	done.Store(true)
	wg.Wait()
	assert.Equal(t, 2000, s.Len())
}

func TestItemsMayCallStore(t *testing.T) {
	s := memstore.New()
	ctx := t.Context()
	require.NoError(t, client.Apply(ctx, s, client.Delta{Epoch: 1, To: 1, Ops: []client.Op{
		{Kind: client.OpPut, Key: []byte("a"), Value: []byte("1")},
	}}))
	require.NoError(t, s.Items(ctx, func(it client.Item) error {
		// Committing from inside the walk would deadlock if Items held the lock.
		if err := client.Apply(ctx, s, client.Delta{Epoch: 1, To: 2, Ops: []client.Op{{Kind: client.OpDelete, Key: it.Key}}}); err != nil {
			return err
		}
		_, ok, err := s.Get(ctx, it.Key)
		assert.False(t, ok)
		return err
	}))
	assert.Equal(t, 0, s.Len())
}

func TestOverlappingBatches(t *testing.T) {
	s := memstore.New()
	ctx := t.Context()
	b1, err := s.Begin(ctx)
	require.NoError(t, err)
	b2, err := s.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, b1.AddSlice(client.FullRange()))
	require.NoError(t, b2.AddSlice(client.FullRange()))
	require.NoError(t, b1.Commit(client.Cursor{Epoch: 1, Index: 1}))
	require.Error(t, b2.Commit(client.Cursor{Epoch: 1, Index: 2}), "b2 began before b1 committed")
	c, err := s.Cursor(ctx)
	require.NoError(t, err)
	assert.Equal(t, client.Cursor{Epoch: 1, Index: 1}, c)
}
