// Package etcdstate keeps the assigner's state in etcd: the slice map, the log of the quanta that
// changed it, the registered nodes, and the settings beside them (the meta record).
//
// Every write is fenced by the leader's election key: it happens only if that key still
// exists with the revision the leader created it at, so a deposed leader cannot write.
//
// Every write may run again after an attempt whose outcome is unknown (a request that timed
// out in an etcd election may have been applied): each puts whole values at keys fixed by
// what is written (a log entry at its index, a snapshot at its entry's) or deletes, so a
// second run leaves the state as the first did, and its fence, which its own writes never
// touch, still holds.
//
// The map is kept as a snapshot plus the log of changes since. A change appends one log entry
// and rewrites the meta record in one transaction, which commits it; values too large for one
// etcd request are written in parts first. A new leader loads the meta record, the snapshot
// and the entries after it, and continues from the same map.
package etcdstate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	storev1 "github.com/sliceplane/sliceplane/api/sliceplane/store/v1"
	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner/core"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// ErrFenced is returned by writes of a process that is no longer the leader.
var ErrFenced = errors.New("etcdstate: fenced off: no longer the leader")

// ErrCorrupt is wrapped by errors about stored state that cannot be read back.
var ErrCorrupt = errors.New("etcdstate: stored state is unreadable")

const (
	inlineMax = 128 << 10 // values up to this size are stored inline
	partSize  = 256 << 10
	txnBytes  = 1 << 20 // bytes of parts per transaction, well under etcd's 1.5 MiB
)

// Fence identifies the leadership every write is conditioned on.
type Fence struct {
	Key string
	Rev int64
}

// Store reads and writes the state under a key prefix.
type Store struct {
	c      *clientv3.Client
	prefix string
	// Observe, if set, is told how long each write took.
	Observe func(op string, d time.Duration)
}

// New returns the store under prefix (for example "/sliceplane/assigner/").
func New(c *clientv3.Client, prefix string) *Store { return &Store{c: c, prefix: prefix} }

func (s *Store) metaKey() string                     { return s.prefix + "meta" }
func (s *Store) snapRefKey() string                  { return s.prefix + "snapshot" }
func (s *Store) logKey(i uint64) string              { return s.prefix + fmt.Sprintf("log/%020d", i) }
func (s *Store) snapKey(i uint64) string             { return s.prefix + fmt.Sprintf("snap/%020d", i) }
func (s *Store) nodeKey(id assignment.NodeID) string { return s.prefix + "nodes/" + string(id) }

// Load reads the state. found is false when nothing was ever stored; a state found may have
// no map yet (Assignment nil), if its leader went before making the first.
func (s *Store) Load(ctx context.Context) (st core.State, found bool, err error) {
	resp, err := s.c.Txn(ctx).Then(clientv3.OpGet(s.metaKey()), clientv3.OpGet(s.snapRefKey())).Commit()
	if err != nil {
		return core.State{}, false, fmt.Errorf("etcdstate: reading the meta record: %w", err)
	}
	metaKVs, refKVs := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	if len(metaKVs) == 0 {
		return core.State{}, false, nil
	}
	rev := resp.Header.Revision // read everything at one revision: one consistent state
	var m storev1.Meta
	if err := proto.Unmarshal(metaKVs[0].Value, &m); err != nil {
		return core.State{}, false, fmt.Errorf("%w: meta record: %w", ErrCorrupt, err)
	}
	if st.Meta, err = metaFromProto(&m); err != nil {
		return core.State{}, false, err
	}
	var ref storev1.SnapshotRef
	if len(refKVs) == 0 {
		if m.LastIndex != 0 || m.Generation != 0 {
			return core.State{}, false, fmt.Errorf("%w: the snapshot record is missing", ErrCorrupt)
		}
		// A term that ended before the first map was made stored its meta record (and
		// perhaps nodes) alone.
		st.Nodes, err = s.readNodes(ctx, rev)
		return st, err == nil, err
	}
	if err := proto.Unmarshal(refKVs[0].Value, &ref); err != nil {
		return core.State{}, false, fmt.Errorf("%w: snapshot record: %w", ErrCorrupt, err)
	}
	st.SnapshotIndex = ref.Index
	if st.SnapshotIndex > m.LastIndex {
		return core.State{}, false, fmt.Errorf("%w: snapshot %d is beyond the last log entry %d", ErrCorrupt, st.SnapshotIndex, m.LastIndex)
	}

	snap, err := s.readValue(ctx, s.snapKey(st.SnapshotIndex), rev)
	if err != nil {
		return core.State{}, false, fmt.Errorf("etcdstate: snapshot %d: %w", st.SnapshotIndex, err)
	}
	var pa pb.Assignment
	if err := proto.Unmarshal(snap, &pa); err != nil {
		return core.State{}, false, fmt.Errorf("%w: snapshot %d: %w", ErrCorrupt, st.SnapshotIndex, err)
	}
	if st.Assignment, err = wire.AssignmentFromProto(&pa); err != nil {
		return core.State{}, false, fmt.Errorf("%w: snapshot %d: %w", ErrCorrupt, st.SnapshotIndex, err)
	}

	if err := s.replay(ctx, &st, m.LastIndex, rev); err != nil {
		return core.State{}, false, err
	}
	if g := st.Assignment.Generation(); g != m.Generation {
		return core.State{}, false, fmt.Errorf("%w: the map is at generation %d, the meta record says %d", ErrCorrupt, g, m.Generation)
	}

	if st.Nodes, err = s.readNodes(ctx, rev); err != nil {
		return core.State{}, false, err
	}
	return st, true, nil
}

// replay brings st.Assignment, read from the snapshot, up to lastIndex by applying the log
// entries after the snapshot, all read at rev. The entries kept behind the snapshot are read
// too: they no longer change the map but their moves belong in st.History.
func (s *Store) replay(ctx context.Context, st *core.State, lastIndex uint64, rev int64) error {
	from := uint64(1)
	if st.SnapshotIndex > core.Keep {
		from = st.SnapshotIndex - core.Keep + 1
	}
	entries, err := s.readLog(ctx, from, lastIndex, rev)
	if err != nil {
		return err
	}
	want := st.SnapshotIndex + 1 // entries behind the snapshot only matter for their moves
	for _, e := range entries {
		st.History = append(st.History, e.Moves...)
		if e.Index <= st.SnapshotIndex {
			continue
		}
		if e.Index != want {
			return fmt.Errorf("%w: log entry %d is missing", ErrCorrupt, want)
		}
		want++
		next, err := st.Assignment.Apply(e.Ops)
		if err != nil {
			return fmt.Errorf("%w: log entry %d does not apply: %w", ErrCorrupt, e.Index, err)
		}
		st.Assignment = next.WithGeneration(e.Generation)
	}
	if want != lastIndex+1 {
		return fmt.Errorf("%w: log entry %d is missing", ErrCorrupt, want)
	}
	return nil
}

// readNodes reads the registered nodes at rev.
func (s *Store) readNodes(ctx context.Context, rev int64) ([]core.Node, error) {
	resp, err := s.c.Get(ctx, s.prefix+"nodes/", clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		return nil, fmt.Errorf("etcdstate: reading nodes: %w", err)
	}
	var nodes []core.Node
	for _, kv := range resp.Kvs {
		var r storev1.NodeRecord
		if err := proto.Unmarshal(kv.Value, &r); err != nil {
			return nil, fmt.Errorf("%w: node %s: %w", ErrCorrupt, kv.Key, err)
		}
		n, err := wire.NodeFromProto(r.GetNode())
		if err != nil {
			return nil, fmt.Errorf("%w: node %s: %w", ErrCorrupt, kv.Key, err)
		}
		nodes = append(nodes, core.Node{Node: n, Address: r.GetAddress(), Labels: r.GetLabels(), Roles: r.GetRoles(),
			Incarnation: r.GetIncarnation()})
	}
	return nodes, nil
}

// readLog reads the entries from..to, in order.
func (s *Store) readLog(ctx context.Context, from, to uint64, rev int64) ([]core.Entry, error) {
	if to < from {
		return nil, nil
	}
	resp, err := s.c.Get(ctx, s.logKey(from), clientv3.WithRange(s.logKey(to+1)), clientv3.WithRev(rev),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("etcdstate: reading log entries %d..%d: %w", from, to, err)
	}
	var out []core.Entry
	kvs := resp.Kvs
	for i := 0; i < len(kvs); {
		key := string(kvs[i].Key)
		if strings.Contains(strings.TrimPrefix(key, s.prefix+"log/"), "/") {
			i++ // a part without its head: left by a write that never committed
			continue
		}
		var parts [][]byte
		j := i + 1
		for ; j < len(kvs) && strings.HasPrefix(string(kvs[j].Key), key+"/"); j++ {
			parts = append(parts, kvs[j].Value)
		}
		data, err := assemble(key, kvs[i].Value, parts)
		if err != nil {
			return nil, err
		}
		var pe storev1.LogEntry
		if err := proto.Unmarshal(data, &pe); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrCorrupt, key, err)
		}
		e, err := entryFromProto(&pe)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrCorrupt, key, err)
		}
		out = append(out, e)
		i = j
	}
	return out, nil
}

// readValue reads a value written by writeValue.
func (s *Store) readValue(ctx context.Context, key string, rev int64) ([]byte, error) {
	resp, err := s.c.Get(ctx, key, clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("etcdstate: reading %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 || string(resp.Kvs[0].Key) != key {
		return nil, fmt.Errorf("%w: %s is missing", ErrCorrupt, key)
	}
	var parts [][]byte
	for _, kv := range resp.Kvs[1:] {
		if strings.HasPrefix(string(kv.Key), key+"/") {
			parts = append(parts, kv.Value)
		}
	}
	return assemble(key, resp.Kvs[0].Value, parts)
}

// assemble rebuilds a value from its head and its parts (in order; extra ones, left by a
// write that never committed, are ignored).
func assemble(key string, head []byte, parts [][]byte) ([]byte, error) {
	var v storev1.Value
	if err := proto.Unmarshal(head, &v); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrCorrupt, key, err)
	}
	if v.GetParts() == 0 {
		return v.GetInline(), nil
	}
	if len(parts) < int(v.GetParts()) {
		return nil, fmt.Errorf("%w: %s has %d of its %d parts", ErrCorrupt, key, len(parts), v.GetParts())
	}
	data := bytes.Join(parts[:v.GetParts()], nil)
	if uint64(len(data)) != v.GetSize() {
		return nil, fmt.Errorf("%w: %s is %d bytes, its head says %d", ErrCorrupt, key, len(data), v.GetSize())
	}
	return data, nil
}

// writeValue writes the parts of a large value, each transaction fenced, and returns the
// head to write, with the commit, at key.
func (s *Store) writeValue(ctx context.Context, f Fence, key string, data []byte) ([]byte, error) {
	if len(data) <= inlineMax {
		return proto.Marshal(&storev1.Value{Inline: data})
	}
	var ops []clientv3.Op
	n, batch := 0, 0
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		err := s.txn(ctx, f, "write_parts", ops...)
		ops, batch = nil, 0
		return err
	}
	for off := 0; off < len(data); off += partSize {
		part := data[off:min(off+partSize, len(data))]
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s/%04d", key, n), string(part)))
		n, batch = n+1, batch+len(part)
		if batch+partSize > txnBytes {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return proto.Marshal(&storev1.Value{Parts: uint32(n), Size: uint64(len(data))})
}

// txn runs ops if f still holds.
func (s *Store) txn(ctx context.Context, f Fence, op string, ops ...clientv3.Op) error {
	start := time.Now()
	resp, err := s.c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(f.Key), "=", f.Rev)).Then(ops...).Commit()
	if s.Observe != nil {
		s.Observe(op, time.Since(start))
	}
	if err != nil {
		return fmt.Errorf("etcdstate: %s: %w", op, err)
	}
	if !resp.Succeeded {
		return ErrFenced
	}
	return nil
}

// Init stores a first state: the map as snapshot 0, and the meta record.
func (s *Store) Init(ctx context.Context, f Fence, m core.Meta, a *assignment.Assignment) error {
	m.LastIndex = 0
	meta, err := proto.Marshal(metaToProto(m))
	if err != nil {
		return fmt.Errorf("etcdstate: encoding meta: %w", err)
	}
	return s.snapshot(ctx, f, 0, a, "init", clientv3.OpPut(s.metaKey(), string(meta)))
}

// Append logs one change of the map and commits meta with it. e.Index must be m.LastIndex.
func (s *Store) Append(ctx context.Context, f Fence, m core.Meta, e core.Entry) error {
	if e.Index != m.LastIndex {
		return fmt.Errorf("etcdstate: entry %d with meta at %d", e.Index, m.LastIndex)
	}
	data, err := proto.Marshal(entryToProto(e))
	if err != nil {
		return fmt.Errorf("etcdstate: encoding entry %d: %w", e.Index, err)
	}
	key := s.logKey(e.Index)
	head, err := s.writeValue(ctx, f, key, data)
	if err != nil {
		return err
	}
	meta, err := proto.Marshal(metaToProto(m))
	if err != nil {
		return fmt.Errorf("etcdstate: encoding meta: %w", err)
	}
	return s.txn(ctx, f, "append", clientv3.OpPut(key, string(head)), clientv3.OpPut(s.metaKey(), string(meta)))
}

// Snapshot stores a as the map of log entry index (which must be stored already), and drops
// the log entries and snapshots it makes unnecessary, keeping core.Keep entries for their moves.
// It never writes the meta record, so it may run while entries are appended.
func (s *Store) Snapshot(ctx context.Context, f Fence, index uint64, a *assignment.Assignment) error {
	return s.snapshot(ctx, f, index, a, "snapshot")
}

func (s *Store) snapshot(ctx context.Context, f Fence, index uint64, a *assignment.Assignment, op string, more ...clientv3.Op) error {
	data, err := proto.Marshal(wire.AssignmentToProto(a))
	if err != nil {
		return fmt.Errorf("etcdstate: encoding the snapshot: %w", err)
	}
	key := s.snapKey(index)
	head, err := s.writeValue(ctx, f, key, data)
	if err != nil {
		return err
	}
	ref, err := proto.Marshal(&storev1.SnapshotRef{Index: index})
	if err != nil {
		return fmt.Errorf("etcdstate: encoding the snapshot record: %w", err)
	}
	ops := append([]clientv3.Op{
		clientv3.OpPut(key, string(head)),
		clientv3.OpPut(s.snapRefKey(), string(ref)),
		clientv3.OpDelete(s.prefix+"snap/", clientv3.WithRange(key)), // older snapshots
	}, more...)
	if index > core.Keep {
		ops = append(ops, clientv3.OpDelete(s.prefix+"log/", clientv3.WithRange(s.logKey(index-core.Keep+1))))
	}
	return s.txn(ctx, f, op, ops...)
}

// SaveMeta commits a change of the settings alone.
func (s *Store) SaveMeta(ctx context.Context, f Fence, m core.Meta) error {
	meta, err := proto.Marshal(metaToProto(m))
	if err != nil {
		return fmt.Errorf("etcdstate: encoding meta: %w", err)
	}
	return s.txn(ctx, f, "meta", clientv3.OpPut(s.metaKey(), string(meta)))
}

// PutNode records a registered node.
func (s *Store) PutNode(ctx context.Context, f Fence, n core.Node) error {
	data, err := proto.Marshal(&storev1.NodeRecord{Node: wire.NodeToProto(n.Node), Address: n.Address, Labels: n.Labels, Roles: n.Roles,
		Incarnation: n.Incarnation})
	if err != nil {
		return fmt.Errorf("etcdstate: encoding node %s: %w", n.ID, err)
	}
	return s.txn(ctx, f, "put_node", clientv3.OpPut(s.nodeKey(n.ID), string(data)))
}

// DeleteNode forgets a node.
func (s *Store) DeleteNode(ctx context.Context, f Fence, id assignment.NodeID) error {
	return s.txn(ctx, f, "delete_node", clientv3.OpDelete(s.nodeKey(id)))
}

func metaToProto(m core.Meta) *storev1.Meta {
	out := &storev1.Meta{
		Term: m.Term, Seq: m.Seq, Clock: m.Clock, Generation: m.Generation,
		LastIndex: m.LastIndex, Pass: m.Pass,
		Algorithm: m.Algorithm, Params: m.Params, Frozen: m.Frozen, FreezeReason: m.FreezeReason,
		Configured: m.Configured,
	}
	for _, r := range m.Pins {
		out.Pins = append(out.Pins, wire.RangeToProto(r))
	}
	for _, id := range m.Draining {
		out.Draining = append(out.Draining, string(id))
	}
	for _, q := range m.Quarantined {
		pq := &storev1.Quarantine{Range: wire.RangeToProto(q.Range), Since: timestamppb.New(q.Since)}
		for _, id := range q.Nodes {
			pq.Nodes = append(pq.Nodes, string(id))
		}
		out.Quarantined = append(out.Quarantined, pq)
	}
	return out
}

func metaFromProto(p *storev1.Meta) (core.Meta, error) {
	m := core.Meta{
		Term: p.Term, Seq: p.Seq, Clock: p.Clock, Generation: p.Generation,
		LastIndex: p.LastIndex, Pass: p.Pass,
		Algorithm: p.Algorithm, Params: p.Params, Frozen: p.Frozen, FreezeReason: p.FreezeReason,
		Configured: p.Configured,
	}
	for _, r := range p.Pins {
		rr, err := wire.RangeFromProto(r)
		if err != nil {
			return core.Meta{}, fmt.Errorf("%w: meta record: pin: %w", ErrCorrupt, err)
		}
		m.Pins = append(m.Pins, rr)
	}
	for _, id := range p.Draining {
		m.Draining = append(m.Draining, assignment.NodeID(id))
	}
	for _, q := range p.Quarantined {
		rr, err := wire.RangeFromProto(q.Range)
		if err != nil {
			return core.Meta{}, fmt.Errorf("%w: meta record: quarantine: %w", ErrCorrupt, err)
		}
		mq := core.Quarantine{Range: rr, Since: q.Since.AsTime()}
		for _, id := range q.Nodes {
			mq.Nodes = append(mq.Nodes, assignment.NodeID(id))
		}
		m.Quarantined = append(m.Quarantined, mq)
	}
	return m, nil
}

func entryToProto(e core.Entry) *storev1.LogEntry {
	out := &storev1.LogEntry{
		Index: e.Index, Term: e.Term, Seq: e.Seq, Clock: e.Clock, Generation: e.Generation,
		Cause: e.Cause, By: e.By, Time: timestamppb.New(e.Time), Ops: wire.OpsToProto(e.Ops),
	}
	for _, m := range e.Moves {
		out.Moves = append(out.Moves, &storev1.Move{Range: wire.RangeToProto(m.Range), From: string(m.From), To: string(m.To), Pass: m.Pass})
	}
	return out
}

func entryFromProto(p *storev1.LogEntry) (core.Entry, error) {
	ops, err := wire.OpsFromProto(p.Ops)
	if err != nil {
		return core.Entry{}, err
	}
	e := core.Entry{
		Index: p.Index, Term: p.Term, Seq: p.Seq, Clock: p.Clock, Generation: p.Generation,
		Cause: p.Cause, By: p.By, Time: p.Time.AsTime(), Ops: ops,
	}
	for _, m := range p.Moves {
		r, err := wire.RangeFromProto(m.Range)
		if err != nil {
			return core.Entry{}, err
		}
		e.Moves = append(e.Moves, balance.Move{Range: r, From: assignment.NodeID(m.From), To: assignment.NodeID(m.To), Pass: m.Pass})
	}
	return e, nil
}

// historyKey is where chunk k of the web view's history is kept (package heatmap).
func (s *Store) historyKey(k uint64) string { return s.prefix + fmt.Sprintf("history/%020d", k) }

// PutHistory writes chunk k of the history, replacing what it held, if f still holds.
func (s *Store) PutHistory(ctx context.Context, f Fence, k uint64, data []byte) error {
	key := s.historyKey(k)
	head, err := s.writeValue(ctx, f, key, data)
	if err != nil {
		return err
	}
	return s.txn(ctx, f, "put_history", clientv3.OpPut(key, string(head)))
}

// DeleteHistory deletes the chunks of the history before chunk k, if f still holds.
func (s *Store) DeleteHistory(ctx context.Context, f Fence, k uint64) error {
	return s.txn(ctx, f, "delete_history", clientv3.OpDelete(s.historyKey(0), clientv3.WithRange(s.historyKey(k))))
}

// LoadHistory reads the chunks of the history, oldest first.
func (s *Store) LoadHistory(ctx context.Context) ([][]byte, error) {
	resp, err := s.c.Get(ctx, s.prefix+"history/", clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("etcdstate: listing the history: %w", err)
	}
	var out [][]byte
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		if strings.Count(strings.TrimPrefix(key, s.prefix+"history/"), "/") > 0 {
			continue // a part of a chunk
		}
		data, err := s.readValue(ctx, key, resp.Header.Revision)
		if err != nil {
			return nil, err
		}
		out = append(out, data)
	}
	return out, nil
}
