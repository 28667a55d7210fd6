// Package writer writes data items into Sliceplane's built-in backend, an etcd key prefix, the
// way a backend change tracker would: every write is a change with a clock (the etcd
// revision), which the assigner and distributors pick up and deliver to the nodes that hold
// the item's slice.
//
// It is meant for examples, tests, bulk fills and applications whose system of record is
// the built-in backend. An item has a key, an optional value of its own and optional
// fragments (an ad group and its keywords, a user and their messages), each with an ID; it
// is placed by the xxhash64 of its key.
package writer

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/source"
)

// DefaultPrefix is where the assigner reads the data source unless told otherwise: its
// default key prefix "/sliceplane/" plus "data/". A Writer and the assigner must agree on
// the prefix, or the assigner never sees what is written.
const DefaultPrefix = "/sliceplane/data/"

// MaxTxnOps is the most writes PutMany puts in one etcd transaction: etcd's default
// --max-txn-ops, above which the server rejects the whole transaction.
const MaxTxnOps = 128

// maxTxnBytes bounds the keys and values of one PutMany transaction, leaving room under
// etcd's default --max-request-bytes (1.5 MiB) for the request's framing.
const maxTxnBytes = 1 << 20

// ErrInvalid is wrapped by the errors about input that cannot be written (an empty key, an
// empty fragment ID, an item with nothing to write); nothing is written then.
var ErrInvalid = errors.New("writer: invalid item")

// Fragment is a part of an item. Its ID must not be empty; it may hold any other bytes, "/"
// included.
type Fragment = client.Fragment

// Item is a data item: the same type the nodes' stores hold. Value is meaningful only if
// HasValue (an item may consist of fragments alone, and an empty value is still a value);
// Get returns the fragments in byte order of their IDs.
type Item = client.Item

// Writer writes items under one etcd key prefix. It is safe for concurrent use.
type Writer struct {
	cli *clientv3.Client
	src *source.Etcd
}

// New returns a writer of the items under prefix (usually DefaultPrefix) of the etcd cluster
// that cli reaches. The writer does not own cli: closing cli is up to the caller.
func New(cli *clientv3.Client, prefix string) *Writer {
	return &Writer{cli: cli, src: source.NewEtcd(cli, prefix)}
}

// Dial connects to the etcd cluster at endpoints for a Writer, over mutual TLS when t names
// files (endpoints are then https://; t's certificate must chain to the CA etcd trusts, and
// etcd's certificate must name a Sliceplane identity and chain to t.CA). The zero TLS dials
// plaintext. The caller closes the client.
func Dial(endpoints []string, t client.TLS) (*clientv3.Client, error) {
	conf, err := t.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("writer: %w", err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, TLS: conf, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("writer: connecting to etcd %v: %w", endpoints, err)
	}
	return cli, nil
}

func checkKey(key []byte) error {
	if len(key) == 0 {
		return fmt.Errorf("%w: empty key", ErrInvalid)
	}
	return nil
}

// checkFragment rejects an empty fragment ID, which the key layout would read back as the
// item's own value.
func checkFragment(key []byte, id string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if id == "" {
		return fmt.Errorf("%w: item %q: empty fragment ID", ErrInvalid, key)
	}
	return nil
}

// Put sets an item's value and returns the clock of the change. Its fragments, if any, stay.
func (w *Writer) Put(ctx context.Context, key, value []byte) (clock uint64, err error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	return w.src.Put(ctx, key, value)
}

// PutFragment sets fragment id of item key and returns the clock of the change. The item
// need not have a value of its own.
func (w *Writer) PutFragment(ctx context.Context, key []byte, id string, value []byte) (uint64, error) {
	if err := checkFragment(key, id); err != nil {
		return 0, err
	}
	return w.src.PutFragment(ctx, key, id, value)
}

// Delete removes an item, its value and all its fragments, in one change, and returns its
// clock. Deleting an item that does not exist is not an error.
func (w *Writer) Delete(ctx context.Context, key []byte) (uint64, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	return w.src.Delete(ctx, key)
}

// DeleteFragment removes fragment id of item key and returns the clock of the change; the
// item's value and other fragments stay. Deleting a fragment that does not exist is not an
// error.
func (w *Writer) DeleteFragment(ctx context.Context, key []byte, id string) (uint64, error) {
	if err := checkFragment(key, id); err != nil {
		return 0, err
	}
	return w.src.DeleteFragment(ctx, key, id)
}

// Get reads an item as of now. ok is false if the item has neither a value nor fragments.
func (w *Writer) Get(ctx context.Context, key []byte) (item Item, ok bool, err error) {
	if err := checkKey(key); err != nil {
		return Item{}, false, err
	}
	it, ok, err := w.src.Get(ctx, key)
	if err != nil || !ok {
		return Item{}, false, err
	}
	item = Item{Key: it.Key, Value: it.Value, HasValue: it.Exists}
	for _, f := range it.Fragments {
		item.Fragments = append(item.Fragments, Fragment{ID: f.ID, Value: f.Value})
	}
	return item, true, nil
}

// PutMany writes many items in few etcd transactions, for bulk fills, and returns the clock
// of the last one. Each item's value (if HasValue) and fragments are set; values and
// fragments that an item already has and that it does not mention stay.
//
// A transaction holds at most MaxTxnOps writes (a value or a fragment each) and about 1 MiB
// of etcd keys and values, and an item's writes share a transaction whenever they fit in one.
// So the n items of one call, if each has a value and no fragments, and each value with its
// etcd key (the prefix, 17 bytes of hash, the key in base64) takes at most 8 KiB, get at most
// ceil(n/MaxTxnOps) distinct clocks. Larger items are spread over more transactions, and an
// item given twice starts a new one, so that the later one wins.
//
// The call is not atomic: if a transaction fails, the ones before it stay written and the
// error says which items they hold. Items are checked before anything is written, so an
// invalid one writes nothing. An empty items writes nothing and returns 0.
func (w *Writer) PutMany(ctx context.Context, items []Item) (uint64, error) {
	for i, it := range items {
		if err := checkItem(it); err != nil {
			return 0, fmt.Errorf("item %d: %w", i, err)
		}
	}
	var (
		clock uint64
		ops   []clientv3.Op
		size  int
		keys  = make(map[string]bool) // etcd refuses a transaction that writes a key twice
		first int                     // the first item with a write in ops
	)
	// commit writes ops, which hold the writes of items first..last; item next is the first
	// with writes still to come.
	commit := func(last, next int) error {
		if len(ops) == 0 {
			return nil
		}
		resp, err := w.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("writer: putting items %d..%d of %d (those before %d are written): %w",
				first, last, len(items), first, err)
		}
		clock, first = uint64(resp.Header.Revision), next
		ops, size = ops[:0], 0
		clear(keys)
		return nil
	}
	fits := func(n, bytes int) bool { return len(ops)+n <= MaxTxnOps && size+bytes <= maxTxnBytes }
	for i, it := range items {
		writes, total := w.writes(it)
		repeated := false
		for _, wr := range writes {
			repeated = repeated || keys[wr.key]
		}
		if repeated || !fits(len(writes), total) {
			if err := commit(i-1, i); err != nil {
				return 0, err
			}
		}
		for _, wr := range writes {
			// Only an item too big for one transaction gets here with a full one.
			if len(ops) > 0 && !fits(1, wr.size) {
				if err := commit(i, i); err != nil {
					return 0, err
				}
			}
			ops, size, keys[wr.key] = append(ops, wr.op), size+wr.size, true
		}
	}
	if err := commit(len(items)-1, len(items)); err != nil {
		return 0, err
	}
	return clock, nil
}

func checkItem(it Item) error {
	if err := checkKey(it.Key); err != nil {
		return err
	}
	if !it.HasValue && len(it.Fragments) == 0 {
		return fmt.Errorf("%w: item %q: no value (HasValue is false) and no fragments to write", ErrInvalid, it.Key)
	}
	ids := make(map[string]bool, len(it.Fragments))
	for _, f := range it.Fragments {
		if err := checkFragment(it.Key, f.ID); err != nil {
			return err
		}
		if ids[f.ID] {
			return fmt.Errorf("%w: item %q: fragment %q given twice", ErrInvalid, it.Key, f.ID)
		}
		ids[f.ID] = true
	}
	return nil
}

type write struct {
	key  string
	op   clientv3.Op
	size int
}

// writes returns the etcd writes of an item and their total size in bytes.
func (w *Writer) writes(it Item) (writes []write, size int) {
	add := func(k string, v []byte) {
		writes = append(writes, write{key: k, op: clientv3.OpPut(k, string(v)), size: len(k) + len(v)})
		size += len(k) + len(v)
	}
	if it.HasValue {
		add(w.src.ItemKey(it.Key), it.Value)
	}
	for _, f := range it.Fragments {
		add(w.src.FragmentKey(it.Key, f.ID), f.Value)
	}
	return writes, size
}
