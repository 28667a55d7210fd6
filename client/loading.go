package client

import (
	"context"
	"fmt"
	"slices"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// LoadingStore is a Store that keeps, with its cursor, the ranges the node is still loading
// (see Node.Loading), so that a node that restarts remembers which of its slices it may not
// serve yet. Its batches implement LoadingBatch. Implementing it is optional: a node whose
// store does not commits the zero cursor while it loads a range, so that if it restarts
// meanwhile it starts over with a snapshot rather than take a part of a slice for all of it.
type LoadingStore interface {
	Store
	// Loading returns the ranges committed with the last cursor; none if no batch set them
	// (a store written before it kept them holds none).
	Loading(ctx context.Context) ([]Range, error)
}

// LoadingBatch is the Batch of a LoadingStore.
type LoadingBatch interface {
	Batch
	// SetLoading replaces the ranges Commit stores with the cursor. A batch that does not
	// call it keeps those committed before.
	SetLoading(rs []Range) error
}

// loadingState is what a node knows of the slices it is loading, replaced whole on every
// change so that readers take it without a lock.
type loadingState struct {
	set keyspace.Set // the points the node holds whose data has not all arrived yet
	// held is the points of the slices the node added and did not drop. A slice list can
	// name a slice before the delta that adds it (they may come in two deltas): such a slice
	// is not served until it is held and loaded.
	held keyspace.Set
	// gen is the map generation of the last delta applied: the node has seen every slice
	// that generation of the map gives it (0: none yet).
	gen uint64
	// primaries is the ranges a member's application holds as primary, with their tokens
	// (none for a node, which acts on no role): the assigner promotes a successor once they
	// no longer cover a slice whose primary hands the role over.
	primaries []primaryRange
}

// nextLoading returns the loading and held sets after ops, and whether any range finished
// loading.
func nextLoading(set, held keyspace.Set, ops []Op) (next, nextHeld keyspace.Set, loaded bool) {
	for _, op := range ops {
		switch op.Kind {
		case OpReset:
			set, held = keyspace.Set{}, keyspace.Set{}
		case OpAddSlice:
			set = set.Union(keyspace.NewSet(op.Range.keyspace()))
			held = held.Union(keyspace.NewSet(op.Range.keyspace()))
		case OpDropSlice:
			set = set.Minus(keyspace.NewSet(op.Range.keyspace()))
			held = held.Minus(keyspace.NewSet(op.Range.keyspace()))
		case OpSliceLoaded:
			before := set
			set = set.Minus(keyspace.NewSet(op.Range.keyspace()))
			loaded = loaded || !set.Equal(before)
		}
	}
	return set, held, loaded
}

// dropping returns the points whose data ops drop, if any: every point for a reset, a
// dropped slice's range.
func dropping(ops []Op) (keyspace.Set, bool) {
	var gone keyspace.Set
	dropped := false
	for _, op := range ops {
		switch op.Kind {
		case OpReset:
			return keyspace.NewSet(keyspace.Full()), true
		case OpDropSlice:
			gone, dropped = gone.Union(keyspace.NewSet(op.Range.keyspace())), true
		}
	}
	return gone, dropped
}

// rangesOf returns the ranges of s in the client's type.
func rangesOf(s keyspace.Set) []Range {
	out := make([]Range, len(s.Ranges()))
	for i, r := range s.Ranges() {
		out[i] = rangeOf(r)
	}
	return out
}

// setOf returns the set of points of rs.
func setOf(rs []Range) keyspace.Set {
	ks := make([]keyspace.Range, len(rs))
	for i, r := range rs {
		ks[i] = r.keyspace()
	}
	return keyspace.NewSet(ks...)
}

// commitDelta applies a delta to the node's store as Apply does, and commits with the cursor
// the loading ranges the node has after it, if they changed. A store that cannot keep them
// gets the zero cursor while the node loads anything: restarted then, the node takes a
// snapshot (see LoadingStore).
func commitDelta(ctx context.Context, s Store, d Delta, loading keyspace.Set, changed bool) error {
	return applyDelta(ctx, s, d, func(b Batch, c Cursor) (Cursor, error) {
		lb, ok := b.(LoadingBatch)
		switch {
		case ok && changed:
			if err := lb.SetLoading(rangesOf(loading)); err != nil {
				return c, fmt.Errorf("client: storing the loading ranges of delta %d..%d: %w", d.From, d.To, err)
			}
		case !ok && !loading.Empty():
			return Cursor{}, nil
		}
		return c, nil
	})
}

// storedLoading returns the loading ranges s keeps, if it keeps them.
func storedLoading(ctx context.Context, s Store) (keyspace.Set, error) {
	ls, ok := s.(LoadingStore)
	if !ok {
		return keyspace.Set{}, nil
	}
	rs, err := ls.Loading(ctx)
	if err != nil {
		return keyspace.Set{}, fmt.Errorf("client: reading the stored loading ranges: %w", err)
	}
	return setOf(slices.Clone(rs)), nil
}
