package postgres

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"

	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
)

// relation is what the stream keeps of a table it heard of: whether it is the items table,
// and where its columns are in a row.
type relation struct {
	ours                   bool
	key, frag, value, hash int // -1: absent
}

// txn is the transaction being read.
type txn struct {
	xid     uint32
	clock   uint64 // just past the start of its commit record (see decode)
	skip    bool   // committed at or before the watch's from: sent before
	changes []source.Change
}

// decode handles one pgoutput message.
func (st *stream) decode(ctx context.Context, data []byte) error {
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("postgres: decoding the replication stream: %w", err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		st.relations[m.RelationID] = st.relation(m)
	case *pglogrepl.BeginMessage:
		// The clock of a transaction is just past the start of its commit record: a clock the
		// server's progress (the end of the last record it read) reaches only once it has
		// sent the transaction. The start itself is the end of the record before, which the
		// server may report before it sends this transaction.
		clock := uint64(m.FinalLSN) + 1
		st.txn = &txn{xid: m.Xid, clock: clock, skip: clock <= st.from}
	case *pglogrepl.CommitMessage:
		t := st.txn
		st.txn = nil
		if t == nil || t.skip || t.clock <= st.read {
			return nil
		}
		st.s.remember(t.xid, t.clock)
		return st.send(ctx, source.Batch{Clock: t.clock, Changes: t.changes})
	case *pglogrepl.InsertMessage:
		return st.change(ctx, m.RelationID, nil, m.Tuple)
	case *pglogrepl.UpdateMessage:
		return st.change(ctx, m.RelationID, m.OldTuple, m.NewTuple)
	case *pglogrepl.DeleteMessage:
		return st.change(ctx, m.RelationID, m.OldTuple, nil)
	case *pglogrepl.TruncateMessage:
		for _, id := range m.RelationIDs {
			if r := st.relations[id]; r != nil && r.ours {
				return fmt.Errorf("%w: table %s truncated: its rows are gone without a change each", source.ErrCompacted, st.s.cfg.Table)
			}
		}
	}
	return nil
}

// relation reads a relation message.
func (st *stream) relation(m *pglogrepl.RelationMessage) *relation {
	r := &relation{ours: m.Namespace == st.s.schema && m.RelationName == st.s.table, key: -1, frag: -1, value: -1, hash: -1}
	c := st.s.cfg.Columns
	for i, col := range m.Columns {
		switch col.Name {
		case c.Key:
			r.key = i
		case c.Value:
			r.value = i
		case c.Hash:
			r.hash = i
		}
		if c.Fragment != "" && col.Name == c.Fragment {
			r.frag = i
		}
	}
	return r
}

// change adds the changes of one row to the transaction: a delete of the old row when its
// key changed or it was deleted, a put of the new one. Rows of other tables are not ours.
func (st *stream) change(ctx context.Context, rel uint32, old, new *pglogrepl.TupleData) error {
	r := st.relations[rel]
	if r == nil || !r.ours || st.txn == nil || st.txn.skip {
		return nil
	}
	var gone, put *source.Change
	var err error
	if old != nil {
		if gone, err = st.item(r, old, true); err != nil {
			return err
		}
	}
	if new != nil {
		if put, err = st.item(r, new, false); err != nil {
			return err
		}
	}
	switch {
	case gone != nil && put != nil && string(gone.Key) == string(put.Key) && gone.Fragment == put.Fragment:
		gone = nil // an update that kept its key: the put says it all
	case put != nil && put.Value == nil:
		// The value is a TOASTed one the update left as it was, which the stream does not
		// send: with the key unchanged the nodes hold it already.
		if gone != nil {
			return fmt.Errorf("%w: an update moved key %q to %q without sending its value (an unchanged TOASTed value)",
				source.ErrCompacted, gone.Key, put.Key)
		}
		put = nil
	}
	for _, c := range []*source.Change{gone, put} {
		if c != nil {
			c.Clock = st.txn.clock
			st.txn.changes = append(st.txn.changes, *c)
		}
	}
	if len(st.txn.changes) >= maxBatchChanges {
		b := source.Batch{Clock: st.txn.clock, Changes: st.txn.changes, More: true}
		st.txn.changes = nil
		return st.send(ctx, b)
	}
	return nil
}

// item reads a row as a change: a delete, or a put whose Value is nil when the row's value
// is an unchanged TOASTed one. A row that names no item is reported and gives nil.
func (st *stream) item(r *relation, t *pglogrepl.TupleData, deleted bool) (*source.Change, error) {
	col := func(i int) *pglogrepl.TupleDataColumn {
		if i < 0 || i >= len(t.Columns) {
			return nil
		}
		return t.Columns[i]
	}
	key, ok, err := bytesOf(col(r.key), st.s.cols.keyBytea)
	if err != nil || !ok {
		st.s.reject(source.RejectKey, fmt.Sprintf("a row of %s without a readable key (%v)", st.s.cfg.Table, err))
		return nil, nil
	}
	c := &source.Change{Key: key, Hash: keyspace.Hash(key), Delete: deleted}
	if f := col(r.frag); f != nil && (f.DataType == pglogrepl.TupleDataTypeText || f.DataType == pglogrepl.TupleDataTypeBinary) {
		c.Fragment = string(f.Data)
	}
	if deleted {
		return c, nil // the old row holds only the replica identity
	}
	if !st.hashMatches(c, col(r.hash)) {
		return nil, nil
	}
	v := col(r.value)
	switch {
	case v == nil || v.DataType == pglogrepl.TupleDataTypeNull:
		c.Value = []byte{}
	case v.DataType == pglogrepl.TupleDataTypeToast:
		c.Value = nil
	default:
		if c.Value, _, err = bytesOf(v, st.s.cols.valueBytea); err != nil {
			return nil, fmt.Errorf("postgres: the value of key %q: %w", key, err)
		}
	}
	return c, nil
}

// hashMatches checks a new row's placement column against its key: a row placed at another
// hash than its key's would be scanned in one slice and sent to another.
func (st *stream) hashMatches(c *source.Change, h *pglogrepl.TupleDataColumn) bool {
	var v int64
	var err error
	switch {
	case h != nil && h.DataType == pglogrepl.TupleDataTypeBinary && len(h.Data) == 8:
		v = int64(binary.BigEndian.Uint64(h.Data))
	case h != nil && h.DataType == pglogrepl.TupleDataTypeText:
		v, err = strconv.ParseInt(string(h.Data), 10, 64)
	default:
		st.s.reject(source.RejectHash, fmt.Sprintf("key %q has no %s (slicectl pg backfill fills it)", c.Key, st.s.cfg.Columns.Hash))
		return false
	}
	if err != nil || HashOf(v) != c.Hash {
		st.s.reject(source.RejectHashMismatch, fmt.Sprintf("key %q: %s is %s, want %d", c.Key, st.s.cfg.Columns.Hash, h.Data, HashColumn(c.Hash)))
		return false
	}
	return true
}

// bytesOf returns a column's bytes: a bytea's, any other type's text; a binary-format
// column (a bytea or a text) is its bytes as they come. ok is false for a NULL.
func bytesOf(c *pglogrepl.TupleDataColumn, bytea bool) ([]byte, bool, error) {
	if c != nil && c.DataType == pglogrepl.TupleDataTypeBinary {
		return c.Data, true, nil
	}
	if c == nil || c.DataType != pglogrepl.TupleDataTypeText {
		return nil, false, nil
	}
	if !bytea {
		return append([]byte(nil), c.Data...), true, nil
	}
	if len(c.Data) < 2 || c.Data[0] != '\\' || c.Data[1] != 'x' {
		return nil, false, fmt.Errorf("postgres: a bytea not in hex form: %.20q", c.Data)
	}
	out := make([]byte, hex.DecodedLen(len(c.Data)-2))
	if _, err := hex.Decode(out, c.Data[2:]); err != nil {
		return nil, false, fmt.Errorf("postgres: a bytea: %w", err)
	}
	return out, true, nil
}
