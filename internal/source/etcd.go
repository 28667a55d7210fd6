package source

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// progressWait bounds how long Progress waits for the watch stream to take its request.
const progressWait = 100 * time.Millisecond

// Etcd is a Source kept under a key prefix of an etcd cluster; the clock is the etcd revision.
//
// An item lives at prefix + 16 hex digits of its key's hash + "/" + the key in unpadded
// base64url, and its fragments at that + "/" + fragment ID. Items are thus sorted by hash, a
// hash range is one etcd range read, and neither keys nor fragment IDs need escaping. Keys of
// any other form under the prefix (see ParseKey) are skipped by Watch and Scan, never read
// as an item.
type Etcd struct {
	client *clientv3.Client
	prefix string
	// page is the number of keys the next range read of a Scan asks for; pageBytes is what
	// a read should bring back at most, which page adapts to (values differ in size).
	page, pageBytes int64

	// Logger reports the first key skipped for each reason; default slog.Default().
	Logger *slog.Logger
	// Rejected, if set, is told of every key skipped, with the reason. Set it before use.
	Rejected func(RejectReason)

	mu     sync.Mutex
	logged map[RejectReason]bool
}

// NewEtcd returns the source under prefix.
func NewEtcd(client *clientv3.Client, prefix string) *Etcd {
	return &Etcd{client: client, prefix: prefix, page: 1000, pageBytes: 1 << 20, logged: map[RejectReason]bool{}}
}

// ItemKey returns the etcd key of the item with key key.
func (s *Etcd) ItemKey(key []byte) string { return FormatKey(s.prefix, key, "") }

// FragmentKey returns the etcd key of fragment id of item key.
func (s *Etcd) FragmentKey(key []byte, id string) string { return FormatKey(s.prefix, key, id) }

// parse splits an etcd key of the source into hash, item key and fragment ID. A key that is
// none is reported (logged the first time for its reason, counted every time) and ok is false.
func (s *Etcd) parse(k []byte) (hash uint64, key []byte, frag string, ok bool) {
	hash, key, frag, err := ParseKey(s.prefix, k)
	if err == nil {
		return hash, key, frag, true
	}
	var ke *KeyError
	if !errors.As(err, &ke) {
		return 0, nil, "", false
	}
	if s.Rejected != nil {
		s.Rejected(ke.Reason)
	}
	s.mu.Lock()
	first := !s.logged[ke.Reason]
	s.logged[ke.Reason] = true
	s.mu.Unlock()
	if first {
		log := s.Logger
		if log == nil {
			log = slog.Default()
		}
		// Once per reason: a bad writer repeats itself, and the count tells how often.
		log.Warn("source: skipping a key under the prefix that is not an item key; later ones for this reason are only counted",
			"reason", string(ke.Reason), "err", err)
	}
	return 0, nil, "", false
}

// Observe implements Observed.
func (s *Etcd) Observe(log *slog.Logger, rejected func(RejectReason)) {
	if s.Rejected == nil {
		s.Rejected = rejected
	}
	if s.Logger == nil {
		s.Logger = log
	}
}

// Clock implements Source.
func (s *Etcd) Clock(ctx context.Context) (uint64, error) {
	resp, err := s.client.Get(ctx, s.prefix, clientv3.WithCountOnly())
	if err != nil {
		return 0, classifyEtcd(fmt.Errorf("source: reading the clock: %w", err))
	}
	return uint64(resp.Header.Revision), nil
}

// Watch implements Source. Changes within one etcd transaction share a clock and arrive in
// one batch.
func (s *Etcd) Watch(ctx context.Context, from uint64) <-chan Batch {
	out := make(chan Batch)
	go func() {
		defer close(out)
		send := func(b Batch) bool {
			select {
			case out <- b:
				return true
			case <-ctx.Done():
				return false
			}
		}
		wctx := clientv3.WithRequireLeader(ctx)
		for resp := range s.client.Watch(wctx, s.prefix, clientv3.WithPrefix(), clientv3.WithRev(int64(from)+1)) {
			if resp.CompactRevision != 0 {
				send(Batch{Err: fmt.Errorf("%w: watching from %d, the source keeps only from %d", ErrCompacted, from, resp.CompactRevision)})
				return
			}
			if err := resp.Err(); err != nil {
				send(Batch{Err: classifyEtcd(fmt.Errorf("source: watch: %w", err))})
				return
			}
			if resp.IsProgressNotify() {
				if !send(Batch{Clock: uint64(resp.Header.Revision)}) {
					return
				}
				continue
			}
			var b Batch
			for _, ev := range resp.Events {
				clock := uint64(ev.Kv.ModRevision)
				if b.Clock != 0 && clock != b.Clock {
					if !send(b) {
						return
					}
					b = Batch{}
				}
				hash, key, frag, ok := s.parse(ev.Kv.Key)
				if !ok {
					continue
				}
				c := Change{Clock: clock, Hash: hash, Key: key, Fragment: frag}
				if ev.Type == clientv3.EventTypeDelete {
					c.Delete = true
				} else {
					c.Value = ev.Kv.Value
				}
				b.Clock, b.Changes = clock, append(b.Changes, c)
			}
			if b.Clock != 0 && !send(b) {
				return
			}
		}
		if ctx.Err() == nil {
			send(Batch{Err: MarkUnavailable(errors.New("source: watch ended"))})
		}
	}()
	return out
}

// Progress implements Source. etcd answers only while every watch of the stream has caught
// up with the store; until then the request is dropped, and the caller asks again. It waits
// at most progressWait: while the client reconnects its watch stream (etcd out of reach),
// the request would wait with it.
func (s *Etcd) Progress(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, progressWait)
	defer cancel()
	// The watches' stream is found by ctx's metadata, which Watch set with WithRequireLeader.
	if err := s.client.RequestProgress(clientv3.WithRequireLeader(ctx)); err != nil {
		return classifyEtcd(fmt.Errorf("source: requesting progress: %w", err))
	}
	return nil
}

// Scan implements Source. It reads in pages at the same revision, so the result is one
// consistent snapshot, and holds one page at a time: a page asks for as many keys as make
// about pageBytes at the sizes of the values read so far, so that neither many keys nor
// large values make a read that does not fit in memory.
func (s *Etcd) Scan(ctx context.Context, r keyspace.Range, at uint64, fn func(Item) error) (uint64, error) {
	return at, s.scan(ctx, r, at, fn)
}

func (s *Etcd) scan(ctx context.Context, r keyspace.Range, at uint64, fn func(Item) error) error {
	start := s.prefix + fmt.Sprintf("%016x", r.Start)
	end := clientv3.GetPrefixRangeEnd(s.prefix)
	if !r.End.IsEnd() {
		end = s.prefix + fmt.Sprintf("%016x", r.End.Point())
	}
	var cur *Item
	flush := func() error {
		if cur == nil {
			return nil
		}
		it := *cur
		cur = nil
		return fn(it)
	}
	limit := s.page
	for {
		resp, err := s.client.Get(ctx, start, clientv3.WithRange(end), clientv3.WithRev(int64(at)),
			clientv3.WithLimit(limit), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		if errors.Is(err, rpctypes.ErrCompacted) {
			return fmt.Errorf("%w: scanning %s at %d: %w", ErrCompacted, r, at, err)
		}
		if err != nil {
			return classifyEtcd(fmt.Errorf("source: scanning %s at %d: %w", r, at, err))
		}
		for _, kv := range resp.Kvs {
			hash, key, frag, ok := s.parse(kv.Key)
			if !ok {
				continue
			}
			if cur == nil || !bytes.Equal(cur.Key, key) {
				if err := flush(); err != nil {
					return err
				}
				cur = &Item{Key: key, Hash: hash}
			}
			if frag == "" {
				cur.Value, cur.Exists = kv.Value, true
			} else {
				cur.Fragments = append(cur.Fragments, Fragment{ID: frag, Value: kv.Value})
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return flush()
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		limit = nextPage(resp.Kvs, limit, s.page, s.pageBytes)
	}
}

// nextPage returns how many keys the next read of a scan asks for, after a read of kvs with
// limit: as many as make pageBytes at their average size, between 1 and most.
func nextPage(kvs []*mvccpb.KeyValue, limit, most, pageBytes int64) int64 {
	var size int64
	for _, kv := range kvs {
		size += int64(len(kv.Key) + len(kv.Value))
	}
	if size == 0 {
		return most
	}
	// Grow at most twofold per read: one page of small values says little of the next.
	return max(1, min(most, 2*limit, pageBytes*int64(len(kvs))/size))
}

// checkKey rejects an empty item key: its etcd key would end right after the hash, which
// parse cannot tell from a stray key, so Scan and Watch would skip the item without a word.
func checkKey(op string, key []byte) error {
	if len(key) == 0 {
		return fmt.Errorf("source: %s: empty item key (Scan and Watch could not read the item back)", op)
	}
	return nil
}

// checkFragment rejects an empty fragment ID: its etcd key would be the item's key plus "/",
// which parse reads back as the item's own value, so the fragment would overwrite it.
// A "/" inside an ID is fine: parse splits at the first "/" after the base64url key, which
// never holds one.
func checkFragment(op string, key []byte, id string) error {
	if err := checkKey(op, key); err != nil {
		return err
	}
	if id == "" {
		return fmt.Errorf("source: %s %q: empty fragment ID (it would read back as the item's own value)", op, key)
	}
	return nil
}

// Put sets an item's value, as a backend change tracker would. It returns the change's clock.
func (s *Etcd) Put(ctx context.Context, key, value []byte) (uint64, error) {
	if err := checkKey("put", key); err != nil {
		return 0, err
	}
	resp, err := s.client.Put(ctx, s.ItemKey(key), string(value))
	if err != nil {
		return 0, fmt.Errorf("source: put %q: %w", key, err)
	}
	return uint64(resp.Header.Revision), nil
}

// PutFragment sets one fragment of an item.
func (s *Etcd) PutFragment(ctx context.Context, key []byte, id string, value []byte) (uint64, error) {
	if err := checkFragment("put", key, id); err != nil {
		return 0, err
	}
	resp, err := s.client.Put(ctx, s.FragmentKey(key, id), string(value))
	if err != nil {
		return 0, fmt.Errorf("source: put %q fragment %q: %w", key, id, err)
	}
	return uint64(resp.Header.Revision), nil
}

// Delete removes an item and all its fragments in one change.
func (s *Etcd) Delete(ctx context.Context, key []byte) (uint64, error) {
	if err := checkKey("delete", key); err != nil {
		return 0, err
	}
	k := s.ItemKey(key)
	resp, err := s.client.Txn(ctx).Then(
		clientv3.OpDelete(k),
		clientv3.OpDelete(k+"/", clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return 0, fmt.Errorf("source: delete %q: %w", key, err)
	}
	return uint64(resp.Header.Revision), nil
}

// DeleteFragment removes one fragment of an item.
func (s *Etcd) DeleteFragment(ctx context.Context, key []byte, id string) (uint64, error) {
	if err := checkFragment("delete", key, id); err != nil {
		return 0, err
	}
	resp, err := s.client.Delete(ctx, s.FragmentKey(key, id))
	if err != nil {
		return 0, fmt.Errorf("source: delete %q fragment %q: %w", key, id, err)
	}
	return uint64(resp.Header.Revision), nil
}

// Get reads an item as of now; ok is false if it has neither value nor fragments.
func (s *Etcd) Get(ctx context.Context, key []byte) (item Item, ok bool, err error) {
	if err := checkKey("get", key); err != nil {
		return Item{}, false, err
	}
	k := s.ItemKey(key)
	resp, err := s.client.Txn(ctx).Then(
		clientv3.OpGet(k),
		clientv3.OpGet(k+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)),
	).Commit()
	if err != nil {
		return Item{}, false, fmt.Errorf("source: get %q: %w", key, err)
	}
	item = Item{Key: key, Hash: keyspace.Hash(key)}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		item.Value, item.Exists = kvs[0].Value, true
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if _, _, frag, ok := s.parse(kv.Key); ok && frag != "" {
			item.Fragments = append(item.Fragments, Fragment{ID: frag, Value: kv.Value})
		}
	}
	return item, item.Exists || len(item.Fragments) > 0, nil
}

var _ Writer = (*Etcd)(nil)

// classifyEtcd marks an error of etcd with its class (see Class): credentials or permissions
// refused are Misconfigured, no retry mends them; anything else is Unavailable (no leader, a
// member lost, a timeout: etcd's client retries what it can, and the caller the rest).
func classifyEtcd(err error) error {
	if err == nil || errors.Is(err, ErrCompacted) {
		return err
	}
	c := status.Code(err)
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		c = ee.Code()
	}
	refused := errors.Is(err, rpctypes.ErrUserEmpty) || errors.Is(err, rpctypes.ErrAuthFailed) || errors.Is(err, rpctypes.ErrInvalidAuthToken)
	if c == codes.PermissionDenied || c == codes.Unauthenticated || refused {
		return MarkMisconfigured(err)
	}
	return MarkUnavailable(err)
}
