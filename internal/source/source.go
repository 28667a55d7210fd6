// Package source is the backend's data as Sliceplane sees it: an ordered log of changes to
// data items, each stamped with a monotonic clock (an etcd revision, a Kafka offset, a
// Postgres LSN), that can also be scanned by hash range as of a clock.
//
// A data item is identified by its key and placed by the key's hash; it may hold fragments
// (an ad group and its keywords, a user and their messages), each with an ID.
package source

import (
	"context"
	"errors"
	"log/slog"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// ErrCompacted is returned by Watch and Scan when the clock asked for is older than the
// source retains. Callers recover by scanning again at a newer clock.
var ErrCompacted = errors.New("source: clock compacted")

// Change is one change to an item or to one of its fragments.
type Change struct {
	Clock uint64
	Hash  uint64
	Key   []byte
	// Fragment is the fragment changed, or "" for the item itself.
	Fragment string
	// Value is the new value; nil for a delete.
	Value  []byte
	Delete bool
}

// Batch is what Watch delivers: the changes with one clock, in order. A batch without
// changes is a progress mark: every change up to its clock has been delivered. A batch with
// an error is the last one.
type Batch struct {
	Clock   uint64
	Changes []Change
	// More says that the changes of Clock go on in the next batch (a transaction too large
	// for one): until the last, Clock is not delivered whole.
	More bool
	Err  error
}

// Fragment is a part of an item.
type Fragment struct {
	ID    string
	Value []byte
}

// Item is a data item as of some clock.
type Item struct {
	Key       []byte
	Hash      uint64
	Value     []byte
	Fragments []Fragment
	// Exists is false for an item that has fragments but no value of its own.
	Exists bool
}

// Writer is a source that can be written to as a backend's application would: the etcd
// prefix (Etcd) and a PostgreSQL table both are. Each method returns a clock at or after
// its change's.
type Writer interface {
	Source
	Put(ctx context.Context, key, value []byte) (uint64, error)
	PutFragment(ctx context.Context, key []byte, id string, value []byte) (uint64, error)
	Delete(ctx context.Context, key []byte) (uint64, error)
	DeleteFragment(ctx context.Context, key []byte, id string) (uint64, error)
}

// ClockWatcher is a source that can follow its clock alone, more cheaply than its changes:
// what an assigner needs, to stamp its quanta. WatchClock delivers clocks past from, each
// a batch without changes, as the source moves, until ctx ends or an error (the last
// batch); then it closes the channel.
type ClockWatcher interface {
	WatchClock(ctx context.Context, from uint64) <-chan Batch
}

// Fencer is a source that can give a fence without writing an item: a clock that every
// change committed so far precedes, and that its watches will reach. A convergence check
// then leaves the data as it is (an application's table, say).
type Fencer interface {
	Fence(ctx context.Context) (uint64, error)
}

// Observed is a source that skips entries that are no items (a stray key, a row placed at
// the wrong hash): Observe has it tell rejected of each, and log through log, unless
// whoever made it chose otherwise. Call it before the source is used.
type Observed interface {
	Observe(log *slog.Logger, rejected func(RejectReason))
}

// Source is the backend's ordered log of changes.
type Source interface {
	// Clock returns the current clock: every change so far has a clock <= it.
	Clock(ctx context.Context) (uint64, error)
	// Watch delivers every change with a clock > from, in clock order, until ctx ends or an
	// error (the last batch) occurs; then it closes the channel.
	Watch(ctx context.Context, from uint64) <-chan Batch
	// Scan calls fn for every item whose hash lies in r, in hash order, as of a clock at or
	// after at, which it returns: a source that can read the past (etcd) scans at at; one
	// that cannot (PostgreSQL) reads the present, and returns a clock every change it saw
	// precedes. Items of a change after at may then come twice, in the scan and in the
	// change; a caller that applies the changes after at over the scan, in order, holds the
	// range as of the returned clock once it has applied the changes up to it.
	Scan(ctx context.Context, r keyspace.Range, at uint64, fn func(Item) error) (uint64, error)
	// Progress asks the watches started with ctx to say how far they have delivered: each
	// sends, in order with its changes, a batch without changes whose clock is the clock it
	// has reached. A source may answer late or not at all; callers ask again. Progress does
	// not wait for the source (a caller's loop calls it): it returns within a moment.
	Progress(ctx context.Context) error
}
