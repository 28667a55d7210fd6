package boltstore_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/boltstore"
	"github.com/sliceplane/sliceplane/client/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T, path string) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(path)
	require.NoError(t, err)
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, true, func(t *testing.T) (client.Store, func() client.Store) {
		path := filepath.Join(t.TempDir(), "store.db")
		s := open(t, path)
		t.Cleanup(func() { assert.NoError(t, s.Close()) })
		return s, func() client.Store {
			require.NoError(t, s.Close())
			s = open(t, path)
			return s
		}
	})
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()

	_, err := boltstore.Open(filepath.Join(dir, "missing", "store.db"))
	require.ErrorIs(t, err, fs.ErrNotExist)
	assert.Contains(t, err.Error(), filepath.Join(dir, "missing", "store.db"))

	corrupt := filepath.Join(dir, "corrupt.db")
	require.NoError(t, os.WriteFile(corrupt, make([]byte, 64<<10), 0o600))
	_, err = boltstore.Open(corrupt)
	require.Error(t, err)
	assert.True(t, errors.Is(err, bolterrors.ErrInvalid) || errors.Is(err, bolterrors.ErrChecksum), "%v", err)
	assert.Contains(t, err.Error(), corrupt)

	// A valid bbolt file that some other program wrote is left alone.
	foreign := filepath.Join(dir, "foreign.db")
	db, err := bolt.Open(foreign, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucket([]byte("theirs"))
		return err
	}))
	require.NoError(t, db.Close())
	_, err = boltstore.Open(foreign)
	require.ErrorIs(t, err, boltstore.ErrNotStore)
	assert.Contains(t, err.Error(), "theirs")
}

func TestClosed(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "store.db"))
	require.NoError(t, s.Close())
	_, err := s.Begin(t.Context())
	require.ErrorIs(t, err, bolterrors.ErrDatabaseNotOpen)
	_, err = s.Cursor(t.Context())
	require.ErrorIs(t, err, bolterrors.ErrDatabaseNotOpen)
}

// TestLargeDrop drops slices of many items, more than fit in one bbolt page, where deleting
// while iterating is easiest to get wrong.
func TestLargeDrop(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "store.db"))
	defer func() { require.NoError(t, s.Close()) }()
	ctx := t.Context()
	const n = 5000
	ops := []client.Op{{Kind: client.OpAddSlice, Range: client.FullRange()}}
	for i := range n {
		k := []byte{byte(i >> 16), byte(i >> 8), byte(i)}
		ops = append(ops,
			client.Op{Kind: client.OpPut, Key: k, Value: []byte("v")},
			client.Op{Kind: client.OpPutFragment, Key: k, Fragment: "f", Value: []byte("x")})
	}
	require.NoError(t, client.Apply(ctx, s, client.Delta{Epoch: 1, To: 1, Ops: ops}))

	drop := client.Range{Start: 1 << 62, End: client.EndOfSpace()}
	want := 0
	for i := range n {
		if !drop.Contains(client.Hash([]byte{byte(i >> 16), byte(i >> 8), byte(i)})) {
			want++
		}
	}
	require.NoError(t, client.Apply(ctx, s, client.Delta{Epoch: 1, To: 2, Ops: []client.Op{{Kind: client.OpDropSlice, Range: drop}}}))
	got := 0
	require.NoError(t, s.Items(ctx, func(it client.Item) error {
		got++
		if drop.Contains(client.Hash(it.Key)) {
			return errors.New("dropped item still held")
		}
		if len(it.Fragments) != 1 {
			return errors.New("fragment lost")
		}
		return nil
	}))
	assert.Equal(t, want, got)

	slices, err := s.Slices(ctx)
	require.NoError(t, err)
	assert.Equal(t, []client.Range{{Start: 0, End: client.BoundAt(1 << 62)}}, slices)
}

func TestItemsMayCallStore(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "store.db"))
	defer func() { require.NoError(t, s.Close()) }()
	ctx := t.Context()
	var ops []client.Op
	for i := range 600 {
		ops = append(ops, client.Op{Kind: client.OpPut, Key: []byte{byte(i >> 8), byte(i)}, Value: []byte("v")})
	}
	require.NoError(t, client.Apply(ctx, s, client.Delta{Epoch: 1, To: 1, Ops: ops}))
	seen := 0
	require.NoError(t, s.Items(ctx, func(it client.Item) error {
		seen++
		// bbolt would deadlock on a write here if Items held its read transaction.
		return client.Apply(ctx, s, client.Delta{Epoch: 1, To: 2, Ops: []client.Op{{Kind: client.OpDelete, Key: it.Key}}})
	}))
	assert.Equal(t, 600, seen)
	n := 0
	require.NoError(t, s.Items(ctx, func(client.Item) error { n++; return nil }))
	assert.Zero(t, n)
}
