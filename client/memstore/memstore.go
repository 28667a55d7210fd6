// Package memstore is a client.Store that keeps everything in memory: for tests, simulations
// and applications whose data is cheap to fetch again, since nothing survives a restart and a
// node that restarts asks for a snapshot.
//
// Readers may run on any goroutine while one goroutine applies batches. A batch only buffers
// its operations; Commit applies them under the write lock, so readers see every batch whole
// or not at all.
//
// Items are spread over buckets by the top bits of their hash. Dropping a slice empties the
// buckets that lie inside it wholesale and scans only the (at most two) buckets its bounds cut
// through, so it costs about the items it drops rather than the items held.
package memstore

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// ErrBatchDone is returned by a batch used after Commit or Abort.
var ErrBatchDone = errors.New("memstore: batch already committed or aborted")

const (
	bucketBits  = 12
	bucketShift = 64 - bucketBits
	numBuckets  = 1 << bucketBits
)

// record is an item as held. Readers copy it out under the read lock; only Commit, under the
// write lock, changes it.
type record struct {
	value    []byte
	hasValue bool
	frags    map[string][]byte
}

// Store is an in-memory client.Store and client.Reader. The zero value is not usable; call New.
type Store struct {
	mu      sync.RWMutex
	buckets []map[string]*record // by hash >> bucketShift; nil until an item lands there
	n       int
	held    []client.Range // disjoint, by Start
	cursor  client.Cursor
	loading []client.Range // see client.LoadingStore
	// gen counts commits, so that a batch can tell that another one committed since it began
	// (its copy of the held slices would be stale).
	gen uint64
}

var (
	_ client.Store        = (*Store)(nil)
	_ client.Reader       = (*Store)(nil)
	_ client.LoadingStore = (*Store)(nil)
)

// New returns an empty store.
func New() *Store { return &Store{buckets: make([]map[string]*record, numBuckets)} }

// Len returns the number of items held.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.n
}

// Begin starts a batch. Batches must not overlap: Commit fails if another batch committed
// since this one began.
func (s *Store) Begin(ctx context.Context) (client.Batch, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memstore: begin: %w", err)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return &batch{s: s, gen: s.gen, held: slices.Clone(s.held)}, nil
}

// Cursor returns the cursor of the last committed batch.
func (s *Store) Cursor(context.Context) (client.Cursor, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cursor, nil
}

// Loading returns the ranges the node is loading, as the last batch that set them left them.
func (s *Store) Loading(context.Context) ([]client.Range, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.loading), nil
}

// Slices returns the slices held, by start.
func (s *Store) Slices(context.Context) ([]client.Range, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.held), nil
}

// Get returns a copy of an item, with its fragments in ID order.
func (s *Store) Get(_ context.Context, key []byte) (client.Item, bool, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r := s.buckets[client.Hash(key)>>bucketShift][string(key)]
	if r == nil {
		return client.Item{}, false, nil
	}
	return r.item(string(key)), true, nil
}

// Items calls fn with a copy of every item. It holds the read lock while it copies one bucket,
// never while fn runs, so fn may call the store; an item changed during the walk may be seen
// before or after the change, but every item held throughout is seen exactly once.
func (s *Store) Items(ctx context.Context, fn func(client.Item) error) error {
	var chunk []client.Item
	for i := range numBuckets {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("memstore: listing items: %w", err)
		}
		s.mu.RLock()
		chunk = chunk[:0]
		for k, r := range s.buckets[i] {
			chunk = append(chunk, r.item(k))
		}
		s.mu.RUnlock()
		for _, it := range chunk {
			if err := fn(it); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *record) item(key string) client.Item {
	it := client.Item{Key: []byte(key), HasValue: r.hasValue}
	if r.hasValue {
		it.Value = bytes.Clone(r.value)
	}
	if len(r.frags) > 0 {
		it.Fragments = make([]client.Fragment, 0, len(r.frags))
		for id, v := range r.frags {
			it.Fragments = append(it.Fragments, client.Fragment{ID: id, Value: bytes.Clone(v)})
		}
		slices.SortFunc(it.Fragments, func(a, b client.Fragment) int { return cmp.Compare(a.ID, b.ID) })
	}
	return it
}

// apply runs one buffered operation. The caller holds the write lock.
func (s *Store) apply(op client.Op) {
	switch op.Kind {
	case client.OpReset:
		clear(s.buckets)
		s.n = 0
	case client.OpDropSlice:
		s.dropItems(op.Range)
	case client.OpPut:
		r := s.record(op.Key)
		r.value, r.hasValue = op.Value, true
	case client.OpDelete:
		s.remove(op.Key)
	case client.OpPutFragment:
		r := s.record(op.Key)
		if r.frags == nil {
			r.frags = make(map[string][]byte)
		}
		r.frags[op.Fragment] = op.Value
	case client.OpDeleteFragment:
		b := s.buckets[client.Hash(op.Key)>>bucketShift]
		if r := b[string(op.Key)]; r != nil {
			delete(r.frags, op.Fragment)
			// An item with neither value nor fragments is not an item.
			if !r.hasValue && len(r.frags) == 0 {
				s.remove(op.Key)
			}
		}
	}
}

// record returns the record of key, creating it if absent.
func (s *Store) record(key []byte) *record {
	i := client.Hash(key) >> bucketShift
	if r := s.buckets[i][string(key)]; r != nil {
		return r
	}
	if s.buckets[i] == nil {
		s.buckets[i] = make(map[string]*record)
	}
	r := &record{}
	s.buckets[i][string(key)] = r
	s.n++
	return r
}

func (s *Store) remove(key []byte) {
	b := s.buckets[client.Hash(key)>>bucketShift]
	if _, ok := b[string(key)]; ok {
		delete(b, string(key))
		s.n--
	}
}

// dropItems removes every item whose hash lies in rg.
func (s *Store) dropItems(rg client.Range) {
	last := uint64(numBuckets - 1)
	if !rg.End.IsEnd() {
		last = (rg.End.Point() - 1) >> bucketShift
	}
	for i := rg.Start >> bucketShift; i <= last; i++ {
		if in, _ := bucketRange(i).Intersect(rg); in == bucketRange(i) {
			s.n -= len(s.buckets[i])
			s.buckets[i] = nil
			continue
		}
		for k := range s.buckets[i] {
			if rg.Contains(keyspace.HashString(k)) {
				delete(s.buckets[i], k)
				s.n--
			}
		}
	}
}

// bucketRange returns the part of the space whose items go to bucket i.
func bucketRange(i uint64) client.Range {
	if i == numBuckets-1 {
		return client.Range{Start: i << bucketShift, End: client.EndOfSpace()}
	}
	return client.Range{Start: i << bucketShift, End: client.BoundAt((i + 1) << bucketShift)}
}

// batch buffers item operations for Commit, and applies slice operations at once to its own
// copy of the held slices, so that an overlapping AddSlice fails at the operation.
type batch struct {
	s    *Store
	gen  uint64
	held []client.Range
	ops  []client.Op
	done bool
	// loading, if set, replaces the store's loading ranges at Commit.
	loading    []client.Range
	setLoading bool
}

// SetLoading makes Commit store rs as the ranges the node is loading.
func (b *batch) SetLoading(rs []client.Range) error {
	if b.done {
		return ErrBatchDone
	}
	b.loading, b.setLoading = slices.Clone(rs), true
	return nil
}

func (b *batch) Reset() error {
	if b.done {
		return ErrBatchDone
	}
	// Nothing buffered before a reset can matter.
	b.ops = append(b.ops[:0], client.Op{Kind: client.OpReset})
	b.held = nil
	return nil
}

func (b *batch) AddSlice(r client.Range) error {
	if b.done {
		return ErrBatchDone
	}
	if !r.Valid() {
		return fmt.Errorf("memstore: adding slice %s: range is empty", r)
	}
	i, _ := slices.BinarySearchFunc(b.held, r.Start, func(h client.Range, start uint64) int {
		return cmp.Compare(h.Start, start)
	})
	// Held slices are disjoint, so only the neighbours of r's place can overlap it.
	for _, h := range b.held[max(i-1, 0):min(i+1, len(b.held))] {
		if h.Overlaps(r) {
			return fmt.Errorf("memstore: adding slice %s: overlaps held slice %s", r, h)
		}
	}
	b.held = slices.Insert(b.held, i, r)
	return nil
}

func (b *batch) DropSlice(r client.Range) error {
	if b.done {
		return ErrBatchDone
	}
	if !r.Valid() {
		return fmt.Errorf("memstore: dropping slice %s: range is empty", r)
	}
	var kept []client.Range
	for _, h := range b.held {
		kept = append(kept, h.Minus(r)...)
	}
	b.held = kept
	b.ops = append(b.ops, client.Op{Kind: client.OpDropSlice, Range: r})
	return nil
}

// The item operations copy key and value, since the caller may reuse its buffers once the
// call returns.

func (b *batch) Put(key, value []byte) error {
	return b.buffer(client.Op{Kind: client.OpPut, Key: bytes.Clone(key), Value: bytes.Clone(value)})
}

func (b *batch) Delete(key []byte) error {
	return b.buffer(client.Op{Kind: client.OpDelete, Key: bytes.Clone(key)})
}

func (b *batch) PutFragment(key []byte, id string, value []byte) error {
	return b.buffer(client.Op{Kind: client.OpPutFragment, Key: bytes.Clone(key), Fragment: id, Value: bytes.Clone(value)})
}

func (b *batch) DeleteFragment(key []byte, id string) error {
	return b.buffer(client.Op{Kind: client.OpDeleteFragment, Key: bytes.Clone(key), Fragment: id})
}

func (b *batch) buffer(op client.Op) error {
	if b.done {
		return ErrBatchDone
	}
	b.ops = append(b.ops, op)
	return nil
}

// Commit applies the buffered operations, none of which can fail, and the slices the batch
// ended with.
func (b *batch) Commit(c client.Cursor) error {
	if b.done {
		return ErrBatchDone
	}
	b.done = true
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen != b.gen {
		return errors.New("memstore: commit: another batch committed since this one began")
	}
	for _, op := range b.ops {
		s.apply(op)
	}
	s.held, s.cursor = b.held, c
	if b.setLoading {
		s.loading = b.loading
	}
	s.gen++
	b.ops, b.held = nil, nil
	return nil
}

func (b *batch) Abort() {
	b.done = true
	b.ops, b.held = nil, nil
}
