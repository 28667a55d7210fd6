// Package memsource is a Source in memory, with every version kept: deterministic for tests
// of the data path, and fast enough to measure a distributor without etcd in the way.
package memsource

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
)

// Source is an in-memory source. Every write is one change with its own clock, from 1.
type Source struct {
	mu        sync.Mutex
	log       []source.Change // log[i] has clock i+1
	compacted uint64          // changes up to it are gone from the log
	wake      chan struct{}
	progress  chan struct{} // closed and replaced by Progress
}

// New returns an empty source at clock 0.
func New() *Source { return &Source{wake: make(chan struct{}), progress: make(chan struct{})} }

func (s *Source) append(c source.Change) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.Clock = uint64(len(s.log)) + 1
	c.Hash = keyspace.Hash(c.Key)
	s.log = append(s.log, c)
	close(s.wake)
	s.wake = make(chan struct{})
	return c.Clock
}

// Put sets an item's value and returns the change's clock.
func (s *Source) Put(key, value []byte) uint64 {
	return s.append(source.Change{Key: bytes.Clone(key), Value: bytes.Clone(value)})
}

// Delete removes an item with its fragments.
func (s *Source) Delete(key []byte) uint64 {
	return s.append(source.Change{Key: bytes.Clone(key), Delete: true})
}

// PutFragment sets a fragment.
func (s *Source) PutFragment(key []byte, id string, value []byte) uint64 {
	return s.append(source.Change{Key: bytes.Clone(key), Fragment: id, Value: bytes.Clone(value)})
}

// DeleteFragment removes a fragment.
func (s *Source) DeleteFragment(key []byte, id string) uint64 {
	return s.append(source.Change{Key: bytes.Clone(key), Fragment: id, Delete: true})
}

// Compact forgets the changes up to clock: watches and scans from before it fail with
// source.ErrCompacted.
func (s *Source) Compact(clock uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.compacted = max(s.compacted, min(clock, uint64(len(s.log))))
}

// Clock implements source.Source.
func (s *Source) Clock(context.Context) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return uint64(len(s.log)), nil
}

// Progress implements source.Source: every watch sends a progress mark.
func (s *Source) Progress(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.progress)
	s.progress = make(chan struct{})
	return nil
}

// Watch implements source.Source.
func (s *Source) Watch(ctx context.Context, from uint64) <-chan source.Batch {
	out := make(chan source.Batch)
	go func() {
		defer close(out)
		next := from + 1
		for {
			s.mu.Lock()
			var b source.Batch
			switch {
			case next <= s.compacted:
				b.Err = fmt.Errorf("%w: watching from %d, the source keeps only from %d", source.ErrCompacted, from, s.compacted+1)
			case next <= uint64(len(s.log)):
				c := s.log[next-1]
				b = source.Batch{Clock: c.Clock, Changes: []source.Change{c}}
				next++
			}
			wake, progress := s.wake, s.progress
			s.mu.Unlock()
			if b.Clock == 0 && b.Err == nil {
				select {
				case <-wake:
					continue
				case <-progress:
					b.Clock = next - 1 // everything up to it was delivered
				case <-ctx.Done():
					return
				}
			}
			select {
			case out <- b:
			case <-ctx.Done():
				return
			}
			if b.Err != nil {
				return
			}
		}
	}()
	return out
}

// Scan implements source.Source.
func (s *Source) Scan(ctx context.Context, r keyspace.Range, at uint64, fn func(source.Item) error) (uint64, error) {
	items, err := s.Items(r, at)
	if err != nil {
		return 0, err
	}
	for _, it := range items {
		if err := fn(it); err != nil {
			return 0, err
		}
	}
	return at, ctx.Err()
}

// Items returns the items in r as of clock at, in hash order (then key order).
func (s *Source) Items(r keyspace.Range, at uint64) ([]source.Item, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if at < s.compacted {
		return nil, fmt.Errorf("%w: scanning %s at %d, the source keeps only from %d", source.ErrCompacted, r, at, s.compacted)
	}
	if at > uint64(len(s.log)) {
		return nil, fmt.Errorf("memsource: scanning at %d, past the clock %d", at, len(s.log))
	}
	type state struct {
		item  source.Item
		frags map[string][]byte
	}
	byKey := map[string]*state{}
	for _, c := range s.log[:at] {
		if !r.Contains(c.Hash) {
			continue
		}
		st := byKey[string(c.Key)]
		if st == nil {
			st = &state{item: source.Item{Key: c.Key, Hash: c.Hash}, frags: map[string][]byte{}}
			byKey[string(c.Key)] = st
		}
		switch {
		case c.Fragment == "" && c.Delete:
			st.item.Exists, st.item.Value = false, nil
			clear(st.frags)
		case c.Fragment == "":
			st.item.Exists, st.item.Value = true, c.Value
		case c.Delete:
			delete(st.frags, c.Fragment)
		default:
			st.frags[c.Fragment] = c.Value
		}
	}
	var out []source.Item
	for _, st := range byKey {
		if !st.item.Exists && len(st.frags) == 0 {
			continue
		}
		it := st.item
		for _, id := range slices.Sorted(maps.Keys(st.frags)) {
			it.Fragments = append(it.Fragments, source.Fragment{ID: id, Value: st.frags[id]})
		}
		out = append(out, it)
	}
	slices.SortFunc(out, func(a, b source.Item) int {
		if a.Hash != b.Hash {
			if a.Hash < b.Hash {
				return -1
			}
			return 1
		}
		return bytes.Compare(a.Key, b.Key)
	})
	return out, nil
}

var _ source.Source = (*Source)(nil)
