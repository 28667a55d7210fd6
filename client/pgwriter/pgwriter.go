// Package pgwriter writes data items into a PostgreSQL table that Sliceplane shards onto
// nodes (the assigner and distributors run with --source postgres): every row carries the
// placement column, the xxhash64 of its key with the top bit flipped (Hash), so that a
// slice is one range of that column's index.
//
// An application that writes the table with its own SQL fills the column with Hash; this
// package does it for Go code: one row per item (its own value, fragment "") and one per
// fragment, written in one transaction per call. Every write returns a clock (a WAL
// position) at or after its change's: a node whose clock reached it has applied the write.
package pgwriter

import (
	"context"
	"fmt"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/source/postgres"
)

// Hash returns the placement column's value for key: xxhash64(key) with its top bit
// flipped, as a BIGINT, so that ordering by the column orders by hash. In SQL, the column
// must be filled with it on every insert, and on an update that changes the key.
func Hash(key []byte) int64 { return postgres.HashColumn(client.Hash(key)) }

// Config says where the table is: the DSN, the table and its columns, as the assigner's and
// distributors' --pg-* flags do. Empty fields take the defaults of slicectl pg init.
type Config struct {
	DSN   string
	Table string
	// Key, Fragment, Value and Hash name the columns; Fragment "" with the others set means
	// a table without fragments.
	Key, Fragment, Value, Hash string
}

// Row is one row: an item's own value (Fragment "") or one of its fragments.
type Row = postgres.Row

// Writer writes rows. It is safe for concurrent use.
type Writer struct{ s *postgres.Source }

// Open connects and checks the table (see slicectl pg status for what it needs); Close the
// writer when done.
func Open(ctx context.Context, cfg Config) (*Writer, error) {
	pc := postgres.Config{DSN: cfg.DSN, Table: cfg.Table}
	if cfg.Key != "" || cfg.Value != "" || cfg.Hash != "" {
		pc.Columns = postgres.Columns{Key: cfg.Key, Fragment: cfg.Fragment, Value: cfg.Value, Hash: cfg.Hash}
	}
	s, err := postgres.Open(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("pgwriter: %w", err)
	}
	return &Writer{s: s}, nil
}

// Close closes the writer's connections.
func (w *Writer) Close() { w.s.Close() }

// Put sets an item's own value.
func (w *Writer) Put(ctx context.Context, key, value []byte) (uint64, error) {
	return w.s.Put(ctx, key, value)
}

// PutFragment sets one fragment of an item.
func (w *Writer) PutFragment(ctx context.Context, key []byte, id string, value []byte) (uint64, error) {
	return w.s.PutFragment(ctx, key, id, value)
}

// Delete deletes an item: its own row and every fragment's, in one transaction.
func (w *Writer) Delete(ctx context.Context, key []byte) (uint64, error) { return w.s.Delete(ctx, key) }

// DeleteFragment deletes one fragment of an item.
func (w *Writer) DeleteFragment(ctx context.Context, key []byte, id string) (uint64, error) {
	return w.s.DeleteFragment(ctx, key, id)
}

// PutRows writes rows (inserted, or updated if they exist) in one transaction.
func (w *Writer) PutRows(ctx context.Context, rows []Row) (uint64, error) {
	return w.s.PutRows(ctx, rows)
}

// PutMany writes items, each as its own row and one per fragment, in one transaction, as
// client/writer's PutMany does for etcd.
func (w *Writer) PutMany(ctx context.Context, items []client.Item) (uint64, error) {
	var rows []Row
	for _, it := range items {
		if it.HasValue {
			rows = append(rows, Row{Key: it.Key, Value: it.Value})
		}
		for _, f := range it.Fragments {
			rows = append(rows, Row{Key: it.Key, Fragment: f.ID, Value: f.Value})
		}
	}
	return w.s.PutRows(ctx, rows)
}

// Copy writes new rows by COPY, the fastest way to fill a table.
func (w *Writer) Copy(ctx context.Context, rows []Row) (uint64, error) { return w.s.Copy(ctx, rows) }
