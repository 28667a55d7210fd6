// Package boltstore is a client.Store kept in a bbolt file, for nodes that should resume from
// their cursor after a restart instead of fetching a whole snapshot again.
//
// A batch is one bbolt read-write transaction, begun by Begin and committed (with fsync) by
// Commit, so a crash mid-batch leaves the file at the previous commit. Readers use read-only
// transactions and never wait for a batch in progress.
//
// Items are keyed by the big-endian hash of their key followed by the key, so the items of a
// slice are one contiguous run of keys and DropSlice is a range delete. Fragments live in a
// bucket of their own, keyed the same way followed by the fragment ID, so that setting one
// fragment of an item with many does not rewrite the others. bbolt limits keys to 32 KiB, which
// bounds an item key plus a fragment ID to a little less.
package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sliceplane/sliceplane/client"
)

// ErrBatchDone is returned by a batch used after Commit or Abort.
var ErrBatchDone = errors.New("boltstore: batch already committed or aborted")

// ErrNotStore is returned by Open for a bbolt file that another program wrote, or that a later
// version of this package wrote in a layout this one does not know.
var ErrNotStore = errors.New("not a boltstore file")

// lockTimeout bounds how long Open waits for another process to release the file, so that a
// second node started on the same file fails instead of hanging.
const lockTimeout = 10 * time.Second

var (
	bucketItems  = []byte("items")  // hash+key → flags byte (1: has a value), then the value
	bucketFrags  = []byte("frags")  // hash+uvarint(len(key))+key+id → fragment value
	bucketSlices = []byte("slices") // start → end (see encodeEnd)
	bucketMeta   = []byte("meta")

	metaFormat = []byte("format")
	metaCursor = []byte("cursor") // epoch, index: 8 bytes big-endian each
	// metaLoading holds the ranges the node is loading, each as 17 bytes: start and end
	// big-endian, then 1 if the end is the end of the space. Files written before it was
	// kept have none, which reads as nothing loading.
	metaLoading = []byte("loading")

	formatV1 = []byte("1")
)

const hasValue = 1

// Store is a client.Store and client.Reader over one bbolt file.
type Store struct {
	db *bolt.DB
}

var (
	_ client.Store        = (*Store)(nil)
	_ client.Reader       = (*Store)(nil)
	_ client.LoadingStore = (*Store)(nil)
)

// Open opens the store in the file at path, creating the file if it does not exist. Only one
// Store may have a file open at a time, across processes.
func Open(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
	if err != nil {
		return nil, fmt.Errorf("boltstore: opening %s: %w", path, err)
	}
	if err := db.Update(initLayout); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("boltstore: opening %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// initLayout creates the buckets of a new file and checks those of an existing one.
func initLayout(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		// A file without our meta bucket is new, unless it holds anything at all.
		if err := tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			return fmt.Errorf("%w: it holds bucket %q", ErrNotStore, name)
		}); err != nil {
			return err
		}
		for _, name := range [][]byte{bucketItems, bucketFrags, bucketSlices, bucketMeta} {
			if _, err := tx.CreateBucket(name); err != nil {
				return fmt.Errorf("creating bucket %s: %w", name, err)
			}
		}
		return tx.Bucket(bucketMeta).Put(metaFormat, formatV1)
	}
	if f := meta.Get(metaFormat); !bytes.Equal(f, formatV1) {
		return fmt.Errorf("%w: layout format %q, want %q", ErrNotStore, f, formatV1)
	}
	for _, name := range [][]byte{bucketItems, bucketFrags, bucketSlices} {
		if tx.Bucket(name) == nil {
			return fmt.Errorf("%w: bucket %s is missing", ErrNotStore, name)
		}
	}
	return nil
}

// Close closes the file. It waits for a batch in progress to end, so the goroutine that
// applies batches must commit or abort first.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("boltstore: closing %s: %w", s.db.Path(), err)
	}
	return nil
}

// Begin starts a batch: a read-write transaction, which bbolt allows one at a time, so Begin
// waits for a batch in progress to end (and deadlocks if the same goroutine holds it).
func (s *Store) Begin(ctx context.Context) (client.Batch, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("boltstore: begin: %w", err)
	}
	tx, err := s.db.Begin(true)
	if err != nil {
		return nil, fmt.Errorf("boltstore: begin: %w", err)
	}
	return &batch{tx: tx}, nil
}

// Cursor returns the cursor of the last committed batch.
func (s *Store) Cursor(context.Context) (client.Cursor, error) {
	var c client.Cursor
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketMeta).Get(metaCursor)
		switch len(v) {
		case 0:
		case 16:
			c = client.Cursor{Epoch: binary.BigEndian.Uint64(v), Index: binary.BigEndian.Uint64(v[8:])}
		default:
			return fmt.Errorf("cursor record has %d bytes, want 16", len(v))
		}
		return nil
	})
	if err != nil {
		return client.Cursor{}, fmt.Errorf("boltstore: reading cursor: %w", err)
	}
	return c, nil
}

// Slices returns the slices held, by start.
func (s *Store) Slices(context.Context) ([]client.Range, error) {
	var out []client.Range
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = readSlices(tx.Bucket(bucketSlices))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("boltstore: reading slices: %w", err)
	}
	return out, nil
}

// Get returns an item, with its fragments in ID order.
func (s *Store) Get(_ context.Context, key []byte) (client.Item, bool, error) {
	var (
		it client.Item
		ok bool
	)
	err := s.db.View(func(tx *bolt.Tx) error {
		ik := itemKey(key)
		v := tx.Bucket(bucketItems).Get(ik)
		if v == nil {
			return nil
		}
		var err error
		it, err = readItem(tx, ik, v)
		ok = err == nil
		return err
	})
	if err != nil {
		return client.Item{}, false, fmt.Errorf("boltstore: reading item %q: %w", key, err)
	}
	return it, ok, nil
}

// itemsPerView is how many items Items reads in one read-only transaction before it calls fn.
const itemsPerView = 256

// Items calls fn for every item, in hash order. It reads the items in chunks and calls fn
// outside any transaction, so fn may call the store (bbolt deadlocks on a transaction opened
// inside another in one goroutine); an item changed during the walk may be seen before or
// after the change, but every item held throughout is seen exactly once.
func (s *Store) Items(ctx context.Context, fn func(client.Item) error) error {
	var after []byte // the last item key seen; the next chunk starts past it
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("boltstore: listing items: %w", err)
		}
		var chunk []client.Item
		err := s.db.View(func(tx *bolt.Tx) error {
			c := tx.Bucket(bucketItems).Cursor()
			k, v := c.First()
			if after != nil {
				if k, v = c.Seek(after); bytes.Equal(k, after) {
					k, v = c.Next()
				}
			}
			for ; k != nil && len(chunk) < itemsPerView; k, v = c.Next() {
				it, err := readItem(tx, k, v)
				if err != nil {
					return err
				}
				chunk = append(chunk, it)
				after = bytes.Clone(k)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("boltstore: listing items: %w", err)
		}
		for _, it := range chunk {
			if err := fn(it); err != nil {
				return err
			}
		}
		if len(chunk) < itemsPerView {
			return nil
		}
	}
}

// readItem decodes the item at item key ik, whose record is v, with its fragments.
func readItem(tx *bolt.Tx, ik, v []byte) (client.Item, error) {
	if len(ik) < 8 || len(v) < 1 {
		return client.Item{}, fmt.Errorf("corrupt item record: key of %d bytes, value of %d", len(ik), len(v))
	}
	key := ik[8:]
	it := client.Item{Key: bytes.Clone(key), HasValue: v[0]&hasValue != 0}
	if it.HasValue {
		it.Value = bytes.Clone(v[1:])
	}
	prefix := fragPrefix(ik[:8], key)
	c := tx.Bucket(bucketFrags).Cursor()
	for k, fv := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, fv = c.Next() {
		it.Fragments = append(it.Fragments, client.Fragment{ID: string(k[len(prefix):]), Value: bytes.Clone(fv)})
	}
	return it, nil
}

// itemKey returns the key of an item in the items bucket.
func itemKey(key []byte) []byte {
	return append(binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(key)), client.Hash(key)), key...)
}

// fragPrefix returns the prefix of the keys of an item's fragments, given the item's hash as 8
// bytes. The key's length makes the prefix of one item never a prefix of another's, whatever
// bytes the keys hold.
func fragPrefix(hash, key []byte) []byte {
	p := make([]byte, 0, 8+binary.MaxVarintLen64+len(key))
	p = append(p, hash...)
	p = binary.AppendUvarint(p, uint64(len(key)))
	return append(p, key...)
}

// readSlices returns the slices of the slices bucket, by start.
func readSlices(b *bolt.Bucket) ([]client.Range, error) {
	var out []client.Range
	err := b.ForEach(func(k, v []byte) error {
		end, ok := decodeEnd(v)
		if len(k) != 8 || !ok {
			return fmt.Errorf("corrupt slice record %x → %x", k, v)
		}
		out = append(out, client.Range{Start: binary.BigEndian.Uint64(k), End: end})
		return nil
	})
	return out, err
}

// encodeEnd encodes a slice's end: a point as 8 bytes big-endian, the end of the space as one
// byte, since 2^64 has no 8-byte form.
func encodeEnd(e client.Bound) []byte {
	if e.IsEnd() {
		return []byte{1}
	}
	return binary.BigEndian.AppendUint64(nil, e.Point())
}

func decodeEnd(v []byte) (client.Bound, bool) {
	switch {
	case len(v) == 8:
		return client.BoundAt(binary.BigEndian.Uint64(v)), true
	case len(v) == 1 && v[0] == 1:
		return client.EndOfSpace(), true
	}
	return client.Bound{}, false
}

// Loading returns the ranges the node is loading, as the last batch that set them left them.
func (s *Store) Loading(context.Context) ([]client.Range, error) {
	var out []client.Range
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketMeta).Get(metaLoading)
		if len(v)%17 != 0 {
			return fmt.Errorf("loading record has %d bytes, not a multiple of 17", len(v))
		}
		for ; len(v) > 0; v = v[17:] {
			r := client.Range{Start: binary.BigEndian.Uint64(v), End: client.BoundAt(binary.BigEndian.Uint64(v[8:]))}
			if v[16] == 1 {
				r.End = client.EndOfSpace()
			}
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("boltstore: reading loading ranges: %w", err)
	}
	return out, nil
}

// SetLoading stores rs as the ranges the node is loading, with the batch.
func (b *batch) SetLoading(rs []client.Range) error {
	if b.tx == nil {
		return ErrBatchDone
	}
	v := make([]byte, 0, 17*len(rs))
	for _, r := range rs {
		v = binary.BigEndian.AppendUint64(v, r.Start)
		v = binary.BigEndian.AppendUint64(v, r.End.Point())
		if r.End.IsEnd() {
			v = append(v, 1)
		} else {
			v = append(v, 0)
		}
	}
	if err := b.tx.Bucket(bucketMeta).Put(metaLoading, v); err != nil {
		return fmt.Errorf("boltstore: storing loading ranges: %w", err)
	}
	return nil
}

// batch is a read-write transaction; tx is nil once committed or aborted.
type batch struct {
	tx *bolt.Tx
}

func (b *batch) Reset() error {
	if b.tx == nil {
		return ErrBatchDone
	}
	for _, name := range [][]byte{bucketItems, bucketFrags, bucketSlices} {
		if err := b.tx.DeleteBucket(name); err != nil {
			return fmt.Errorf("boltstore: reset: deleting bucket %s: %w", name, err)
		}
		if _, err := b.tx.CreateBucket(name); err != nil {
			return fmt.Errorf("boltstore: reset: creating bucket %s: %w", name, err)
		}
	}
	return nil
}

func (b *batch) AddSlice(r client.Range) error {
	if b.tx == nil {
		return ErrBatchDone
	}
	if !r.Valid() {
		return fmt.Errorf("boltstore: adding slice %s: range is empty", r)
	}
	sb := b.tx.Bucket(bucketSlices)
	held, err := readSlices(sb)
	if err != nil {
		return fmt.Errorf("boltstore: adding slice %s: %w", r, err)
	}
	for _, h := range held {
		if h.Overlaps(r) {
			return fmt.Errorf("boltstore: adding slice %s: overlaps held slice %s", r, h)
		}
	}
	if err := putSlice(sb, r); err != nil {
		return fmt.Errorf("boltstore: adding slice %s: %w", r, err)
	}
	return nil
}

func putSlice(b *bolt.Bucket, r client.Range) error {
	return b.Put(binary.BigEndian.AppendUint64(nil, r.Start), encodeEnd(r.End))
}

func (b *batch) DropSlice(r client.Range) error {
	if b.tx == nil {
		return ErrBatchDone
	}
	if !r.Valid() {
		return fmt.Errorf("boltstore: dropping slice %s: range is empty", r)
	}
	if err := b.trimSlices(r); err != nil {
		return fmt.Errorf("boltstore: dropping slice %s: %w", r, err)
	}
	for _, name := range [][]byte{bucketItems, bucketFrags} {
		if err := deleteHashes(b.tx.Bucket(name), r); err != nil {
			return fmt.Errorf("boltstore: dropping slice %s: %s: %w", r, name, err)
		}
	}
	return nil
}

// trimSlices removes r from the held slices, keeping the parts of each outside r.
func (b *batch) trimSlices(r client.Range) error {
	sb := b.tx.Bucket(bucketSlices)
	held, err := readSlices(sb)
	if err != nil {
		return err
	}
	for _, h := range held {
		if !h.Overlaps(r) {
			continue
		}
		if err := sb.Delete(binary.BigEndian.AppendUint64(nil, h.Start)); err != nil {
			return err
		}
		if h.Start < r.Start {
			if err := putSlice(sb, client.Range{Start: h.Start, End: client.BoundAt(r.Start)}); err != nil {
				return err
			}
		}
		if !r.End.IsEnd() && h.End.After(r.End.Point()) {
			if err := putSlice(sb, client.Range{Start: r.End.Point(), End: h.End}); err != nil {
				return err
			}
		}
	}
	return nil
}

// deleteHashes deletes the keys of b whose first 8 bytes, a hash, lie in r. It seeks afresh
// after each delete, since a bbolt cursor's Next can skip a key after Delete.
func deleteHashes(b *bolt.Bucket, r client.Range) error {
	start := binary.BigEndian.AppendUint64(nil, r.Start)
	c := b.Cursor()
	for k, _ := c.Seek(start); k != nil && r.Contains(binary.BigEndian.Uint64(k)); k, _ = c.Seek(start) {
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}

func (b *batch) Put(key, value []byte) error {
	if b.tx == nil {
		return ErrBatchDone
	}
	v := append([]byte{hasValue}, value...)
	if err := b.tx.Bucket(bucketItems).Put(itemKey(key), v); err != nil {
		return fmt.Errorf("boltstore: put %q: %w", key, err)
	}
	return nil
}

func (b *batch) Delete(key []byte) error {
	if b.tx == nil {
		return ErrBatchDone
	}
	ik := itemKey(key)
	if err := b.tx.Bucket(bucketItems).Delete(ik); err != nil {
		return fmt.Errorf("boltstore: delete %q: %w", key, err)
	}
	prefix := fragPrefix(ik[:8], key)
	c := b.tx.Bucket(bucketFrags).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
		if err := c.Delete(); err != nil {
			return fmt.Errorf("boltstore: delete %q: fragment %q: %w", key, k[len(prefix):], err)
		}
	}
	return nil
}

func (b *batch) PutFragment(key []byte, id string, value []byte) error {
	if b.tx == nil {
		return ErrBatchDone
	}
	ik := itemKey(key)
	items := b.tx.Bucket(bucketItems)
	if items.Get(ik) == nil {
		// A new item made of fragments only.
		if err := items.Put(ik, []byte{0}); err != nil {
			return fmt.Errorf("boltstore: put fragment %q of %q: %w", id, key, err)
		}
	}
	// bbolt keeps the value until the transaction ends; the caller may reuse it sooner.
	fk := append(fragPrefix(ik[:8], key), id...)
	if err := b.tx.Bucket(bucketFrags).Put(fk, bytes.Clone(value)); err != nil {
		return fmt.Errorf("boltstore: put fragment %q of %q: %w", id, key, err)
	}
	return nil
}

func (b *batch) DeleteFragment(key []byte, id string) error {
	if b.tx == nil {
		return ErrBatchDone
	}
	ik := itemKey(key)
	prefix := fragPrefix(ik[:8], key)
	frags := b.tx.Bucket(bucketFrags)
	if err := frags.Delete(append(prefix, id...)); err != nil {
		return fmt.Errorf("boltstore: delete fragment %q of %q: %w", id, key, err)
	}
	// An item with neither value nor fragments is not an item.
	items := b.tx.Bucket(bucketItems)
	if v := items.Get(ik); len(v) > 0 && v[0]&hasValue == 0 {
		if k, _ := frags.Cursor().Seek(prefix); k == nil || !bytes.HasPrefix(k, prefix) {
			if err := items.Delete(ik); err != nil {
				return fmt.Errorf("boltstore: delete fragment %q of %q: %w", id, key, err)
			}
		}
	}
	return nil
}

func (b *batch) Commit(c client.Cursor) error {
	if b.tx == nil {
		return ErrBatchDone
	}
	tx := b.tx
	b.tx = nil
	v := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, c.Epoch), c.Index)
	if err := tx.Bucket(bucketMeta).Put(metaCursor, v); err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("boltstore: commit at %s: %w", c, err)
	}
	// bbolt rolls the transaction back if its commit fails.
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("boltstore: commit at %s: %w", c, err)
	}
	return nil
}

func (b *batch) Abort() {
	if b.tx != nil {
		_ = b.tx.Rollback()
		b.tx = nil
	}
}
