package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
)

// row is one row of the table as a scan reads it.
type row struct {
	key, value []byte
	frag       string
	hash       int64
}

// exprs returns the select expressions of the key, the fragment and the value: a bytea
// column as it is, any other as its text form.
func (s *Source) exprs() (key, frag, value string) {
	c := s.cfg.Columns
	key, value, frag = quote(c.Key), quote(c.Value), "''::text"
	if !s.cols.keyBytea {
		key += "::text"
	}
	if !s.cols.valueBytea {
		value += "::text"
	}
	if c.Fragment != "" {
		frag = quote(c.Fragment) + "::text"
	}
	return key, frag, value
}

// chunkQueries returns the query of a scan's first chunk and of the chunks after a row:
// rows of a hash range ($1 to $2, both in) in (hash, key, fragment) order, ChunkRows at a
// time, the next chunk starting after the last row read (keyset pagination on the hash
// index).
func (s *Source) chunkQueries() (first, next string) {
	key, frag, value := s.exprs()
	h := quote(s.cfg.Columns.Hash)
	sel := fmt.Sprintf("SELECT %s, %s, %s, %s FROM %s WHERE %s BETWEEN $1 AND $2", key, frag, value, h, s.qualified(), h)
	order := fmt.Sprintf(" ORDER BY %s, %s, %s LIMIT %d", h, key, frag, s.cfg.ChunkRows)
	after := fmt.Sprintf(" AND (%s > $3 OR (%s = $3 AND (%s, %s) > ($4, $5)))", h, h, key, frag)
	return sel + order, sel + after + order
}

// Scan implements source.Source. It reads the present in one snapshot, a chunk of rows per
// query, once every transaction its watches delivered up to at is visible in it (see
// visible.go), and is positioned at the WAL insert position read in that snapshot: every
// change it saw precedes it.
func (s *Source) Scan(ctx context.Context, r keyspace.Range, at uint64, fn func(source.Item) error) (uint64, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		var h uint64
		err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			// Each statement is bounded, not the transaction: a scan lasts as long as its
			// caller takes its items.
			qctx, cancel := s.bounded(ctx)
			defer cancel()
			if err := s.checkVisible(qctx, tx, at); err != nil {
				return err
			}
			var err error
			if h, err = s.insertLSN(qctx, tx); err != nil {
				return err
			}
			return s.scan(ctx, tx, r, fn)
		})
		switch {
		case errors.Is(err, errNotVisible):
			select {
			case <-time.After(wait):
				continue
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		case err != nil:
			return 0, s.failed(err)
		}
		return max(h, at), nil
	}
}

// scan reads r in chunks in tx, calling fn for each item.
func (s *Source) scan(ctx context.Context, tx pgx.Tx, r keyspace.Range, fn func(source.Item) error) error {
	first, next := s.chunkQueries()
	hi := int64(math.MaxInt64)
	if !r.End.IsEnd() {
		hi = HashColumn(r.End.Point() - 1)
	}
	bounds := []any{HashColumn(r.Start), hi}
	var cur *source.Item
	emit := func() error {
		if cur == nil {
			return nil
		}
		it := *cur
		cur = nil
		return fn(it)
	}
	q, args := first, bounds
	for {
		n, last, err := s.chunk(ctx, tx, q, args, &cur, emit)
		if err != nil {
			return err
		}
		if n < s.cfg.ChunkRows {
			return emit()
		}
		q, args = next, append(bounds[:2:2], last.hash, s.keyValue(last.key), last.frag)
	}
}

// chunk reads one chunk into items, calling emit for each item it completes; it returns
// the rows read and the last one. An error of emit (fn's) comes back as it is.
func (s *Source) chunk(ctx context.Context, tx pgx.Tx, q string, args []any, cur **source.Item, emit func() error) (int, *row, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*s.cfg.Timeout) // a stalled link resets nothing
	defer cancel()
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return 0, nil, fmt.Errorf("postgres: scanning: %w", err)
	}
	defer rows.Close()
	n := 0
	var last row
	for rows.Next() {
		var rw row
		var key, value []byte
		if err := rows.Scan(&key, &rw.frag, &value, &rw.hash); err != nil {
			return n, nil, fmt.Errorf("postgres: scanning: %w", err)
		}
		n++
		rw.key, rw.value = key, value
		last = rw
		if err := s.add(rw, cur, emit); err != nil {
			return n, nil, err
		}
	}
	if err := rows.Err(); err != nil {
		return n, nil, fmt.Errorf("postgres: scanning: %w", err)
	}
	return n, &last, nil
}

// add adds a row to the item being read, emitting the previous one when the key changes.
func (s *Source) add(rw row, cur **source.Item, emit func() error) error {
	hash := keyspace.Hash(rw.key)
	if HashOf(rw.hash) != hash {
		s.reject(source.RejectHashMismatch, fmt.Sprintf("key %q: column %d, want %d", rw.key, rw.hash, HashColumn(hash)))
		return nil
	}
	if *cur == nil || !bytes.Equal((*cur).Key, rw.key) {
		if err := emit(); err != nil {
			return err
		}
		*cur = &source.Item{Key: rw.key, Hash: hash}
	}
	value := rw.value
	if value == nil {
		value = []byte{}
	}
	if rw.frag == "" {
		(*cur).Value, (*cur).Exists = value, true
	} else {
		(*cur).Fragments = append((*cur).Fragments, source.Fragment{ID: rw.frag, Value: value})
	}
	return nil
}
