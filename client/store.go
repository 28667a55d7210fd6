// Package client is the Go client of Sliceplane, embedded in the processes of a sharded
// service (members and storage nodes) and in those that call them (routers).
//
// A member runs a Member: a process of a service that keeps its own state per key (a cache,
// a rate limiter, a session host). It registers with the assigners, is told which ranges of
// the key space it owns through its Application (Acquire, Release, ChangeRole), runs each
// request under its key's grant (Member.Write, Read, UnaryServerInterceptor), and reports
// the load it serves. docs/MEMBERS.md takes a service from go get to sharded.
//
// A storage node runs a Node: it registers with the assigner, pulls from its distributor the
// deltas that bring its data up to date, applies them to the application through a Store,
// counts the load it serves per slice and reports it.
//
// A caller runs a Router to find which members or nodes hold a key, and routes through it:
// GRPCDialOptions inside grpc-go, Transport for net/http, or Pick and Primary by hand.
//
// The data a node holds is made of items: an item has a key, a value and optional fragments
// (an ad group and its keywords, a user and their messages), each with an ID. Items are placed
// by the xxhash64 of their key; a node holds the items whose hash lies in its slices.
package client

import (
	"context"
	"fmt"
)

// Cursor says how far a node has applied the stream of deltas from its distributor: the
// delta stream's epoch (a new one starts with every snapshot) and the number of operations
// applied in it. The zero Cursor asks for a snapshot.
type Cursor struct {
	Epoch uint64
	Index uint64
}

// String formats the cursor as epoch/index, as logs and slicectl print it.
func (c Cursor) String() string { return fmt.Sprintf("%d/%d", c.Epoch, c.Index) }

// OpKind says what an Op does.
type OpKind uint8

// The kinds of Op.
const (
	// OpReset drops every slice and item: the start of a snapshot.
	OpReset OpKind = iota + 1
	// OpAddSlice starts holding a slice; its items follow.
	OpAddSlice
	// OpDropSlice stops holding a slice, and drops its items.
	OpDropSlice
	// OpPut sets an item's value.
	OpPut
	// OpDelete removes an item and its fragments.
	OpDelete
	// OpPutFragment sets one fragment of an item.
	OpPutFragment
	// OpDeleteFragment removes one fragment of an item.
	OpDeleteFragment
	// OpSetSlices lists the slices of the map the node holds from here on, as the assigner
	// cut them. It changes no data, and Apply does not pass it to the store: the Node keeps
	// the list, to report load per slice.
	OpSetSlices
	// OpSliceLoaded says that the node holds every item of Range, a range it added (the
	// scan's items and the changes since): it may serve it from here on. It changes no
	// data, and Apply does not pass it to the store: the Node keeps what it loads (see
	// Node.Loading).
	OpSliceLoaded
)

var opNames = [...]string{OpReset: "reset", OpAddSlice: "add_slice", OpDropSlice: "drop_slice", OpPut: "put",
	OpDelete: "delete", OpPutFragment: "put_fragment", OpDeleteFragment: "delete_fragment", OpSetSlices: "set_slices",
	OpSliceLoaded: "slice_loaded"}

// String names the kind as the wire and the logs do ("add_slice").
func (k OpKind) String() string {
	if int(k) < len(opNames) && opNames[k] != "" {
		return opNames[k]
	}
	return fmt.Sprintf("op(%d)", uint8(k))
}

// Op is one operation of a delta.
type Op struct {
	Kind OpKind
	// Range is the slice of OpAddSlice, OpDropSlice and OpSliceLoaded.
	Range Range
	// Key, Fragment and Value are those of the item operations.
	Key      []byte
	Fragment string
	Value    []byte
	// Slices is the list of OpSetSlices.
	Slices []Range
}

// Delta is a batch of operations, to be applied in order and atomically.
type Delta struct {
	// Epoch and From..To locate the delta in the stream: it holds operations From to To-1.
	Epoch, From, To uint64
	// Clock is the source clock the node's data reflects once the delta is applied; 0 when
	// the delta leaves it in no state of the source yet (a snapshot not whole, a stream
	// catching up behind the end of its queue), and the node keeps the clock it had.
	Clock uint64
	// Generation is the map generation of the distributor when the delta's last operation
	// was queued: once the delta is applied, the node has seen every slice that generation
	// gives it. 0 from a distributor that does not say, and for a snapshot under way.
	Generation uint64
	Ops        []Op
	// Slices, when not nil, is the slice list in effect before Ops: the first delta of a
	// stream that resumes mid-epoch carries it (an OpSetSlices would too).
	Slices []Range
}

// Store is what a node's application implements to hold its data. Sliceplane calls it from
// one goroutine at a time.
type Store interface {
	// Begin starts a batch; every delta is applied in one batch.
	Begin(ctx context.Context) (Batch, error)
	// Cursor returns the cursor of the last committed batch (zero if none): a node that
	// restarts resumes from there.
	Cursor(ctx context.Context) (Cursor, error)
}

// Batch applies the operations of one delta. Nothing it does may be visible to the
// application's readers, nor survive a crash, before Commit returns: a node that dies
// mid-batch resumes from the previous cursor and gets the delta again.
type Batch interface {
	// Reset drops every slice and item.
	Reset() error
	// AddSlice starts holding slice r.
	AddSlice(r Range) error
	// DropSlice stops holding slice r and drops every item whose hash lies in it.
	DropSlice(r Range) error
	// Put sets the value of item key.
	Put(key, value []byte) error
	// Delete removes item key and its fragments.
	Delete(key []byte) error
	// PutFragment sets fragment id of item key.
	PutFragment(key []byte, id string, value []byte) error
	// DeleteFragment removes fragment id of item key.
	DeleteFragment(key []byte, id string) error
	// Commit makes the batch durable and visible, together with cursor c.
	Commit(c Cursor) error
	// Abort drops the batch. It is called after an error, and may be called after Commit.
	Abort()
}

// Fragment is a part of an item.
type Fragment struct {
	ID    string
	Value []byte
}

// Item is a data item as a node holds it.
type Item struct {
	Key   []byte
	Value []byte
	// HasValue is false for an item that only has fragments.
	HasValue  bool
	Fragments []Fragment
}

// Reader is implemented by stores that can list what they hold: the stores of this module
// do, and Sliceplane's convergence checker uses it.
type Reader interface {
	// Slices returns the slices held, in key order.
	Slices(ctx context.Context) ([]Range, error)
	// Items calls fn for every item held, in no particular order, until fn fails.
	Items(ctx context.Context, fn func(Item) error) error
	// Get returns an item, and whether it is held.
	Get(ctx context.Context, key []byte) (Item, bool, error)
}

// apply runs the operations of a delta on a batch, in order.
func apply(b Batch, ops []Op) error {
	for i, op := range ops {
		var err error
		switch op.Kind {
		case OpReset:
			err = b.Reset()
		case OpAddSlice:
			err = b.AddSlice(op.Range)
		case OpDropSlice:
			err = b.DropSlice(op.Range)
		case OpPut:
			err = b.Put(op.Key, op.Value)
		case OpDelete:
			err = b.Delete(op.Key)
		case OpPutFragment:
			err = b.PutFragment(op.Key, op.Fragment, op.Value)
		case OpDeleteFragment:
			err = b.DeleteFragment(op.Key, op.Fragment)
		case OpSetSlices, OpSliceLoaded:
			// not the store's business
		default:
			err = fmt.Errorf("unknown operation kind %d", op.Kind)
		}
		if err != nil {
			return fmt.Errorf("client: op %d (%s): %w", i, op.Kind, err)
		}
	}
	return nil
}

// Apply applies a delta to a store in one batch: the operations, then the commit with the
// cursor the delta leads to. On any error the batch is aborted and nothing changes.
func Apply(ctx context.Context, s Store, d Delta) error { return applyDelta(ctx, s, d, nil) }

// applyDelta applies d to s as Apply says; settle, if set, may write more to the batch before
// the commit and choose the cursor it commits with.
func applyDelta(ctx context.Context, s Store, d Delta, settle func(Batch, Cursor) (Cursor, error)) error {
	b, err := s.Begin(ctx)
	if err != nil {
		return fmt.Errorf("client: beginning a batch: %w", err)
	}
	defer b.Abort()
	if err := apply(b, d.Ops); err != nil {
		return err
	}
	c := Cursor{Epoch: d.Epoch, Index: d.To}
	if settle != nil {
		if c, err = settle(b, c); err != nil {
			return err
		}
	}
	if err := b.Commit(c); err != nil {
		return fmt.Errorf("client: committing delta %d..%d: %w", d.From, d.To, err)
	}
	return nil
}
