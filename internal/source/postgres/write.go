package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// Init creates the items table with the configured names if it does not exist (key bytea,
// fragment text, value bytea, the placement column bigint and its index), and the
// publication: what a new deployment needs. An existing table is left as it is; see
// docs/POSTGRES.md to shard one.
func Init(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		return fmt.Errorf("postgres: connecting: %w", err)
	}
	defer pool.Close()
	schema, table, _ := splitTable(cfg.Table)
	name := pgx.Identifier{schema, table}.Sanitize()
	c := cfg.Columns
	cols := fmt.Sprintf("%s bytea NOT NULL, %s bytea, %s bigint NOT NULL", quote(c.Key), quote(c.Value), quote(c.Hash))
	pk := quote(c.Key)
	if c.Fragment != "" {
		cols += fmt.Sprintf(", %s text NOT NULL DEFAULT ''", quote(c.Fragment))
		pk += ", " + quote(c.Fragment)
	}
	ddl := []string{
		fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (%s, PRIMARY KEY (%s))", name, cols, pk),
		fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (%s)", quote(table+"_"+c.Hash), name, quote(c.Hash)),
	}
	for _, q := range ddl {
		if _, err := pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("postgres: %s: %w", q, err)
		}
	}
	cfg.Slot = "" // Init makes no slot: each reader makes its own
	s, err := Open(ctx, cfg)
	if err != nil {
		return err
	}
	s.Close()
	return nil
}

// keyValue and valueArg pass a key and a value to a query as their columns take them: bytes
// for a bytea column, text otherwise.
func (s *Source) keyValue(key []byte) any { return asColumn(key, s.cols.keyBytea) }

func (s *Source) valueArg(v []byte) any { return asColumn(v, s.cols.valueBytea) }

func asColumn(b []byte, bytea bool) any {
	if bytea {
		return b
	}
	return string(b)
}

// upsert returns the statement that writes one row, and its arguments' order: key, value,
// hash, then the fragment if the table has them.
func (s *Source) upsert() string {
	c := s.cfg.Columns
	cols, vals, conflict := []string{quote(c.Key), quote(c.Value), quote(c.Hash)}, "$1, $2, $3", quote(c.Key)
	if c.Fragment != "" {
		cols, vals, conflict = append(cols, quote(c.Fragment)), vals+", $4", conflict+", "+quote(c.Fragment)
	}
	return fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s) ON CONFLICT (%s) DO UPDATE SET %s = EXCLUDED.%s, %s = EXCLUDED.%s",
		s.qualified(), strings.Join(cols, ", "), vals, conflict, quote(c.Value), quote(c.Value), quote(c.Hash), quote(c.Hash))
}

// rowArgs returns a row's arguments for upsert and Copy.
func (s *Source) rowArgs(r Row) []any {
	args := []any{s.keyValue(r.Key), s.valueArg(r.Value), HashColumn(keyspace.Hash(r.Key))}
	if s.cfg.Columns.Fragment != "" {
		args = append(args, r.Fragment)
	}
	return args
}

// Row is one row to write: an item's own value (Fragment "") or one of its fragments.
type Row struct {
	Key      []byte
	Fragment string
	Value    []byte
}

// PutRows writes rows in one transaction, with their placement column, and returns a clock
// at or after the commit.
func (s *Source) PutRows(ctx context.Context, rows []Row) (uint64, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	q := s.upsert()
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for _, r := range rows {
			if err := s.checkRow(r); err != nil {
				return err
			}
			b.Queue(q, s.rowArgs(r)...)
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return 0, classify(fmt.Errorf("postgres: writing %d rows: %w", len(rows), err))
	}
	return s.Clock(ctx)
}

// checkRow refuses what the table cannot hold as the source reads it back.
func (s *Source) checkRow(r Row) error {
	switch {
	case len(r.Key) == 0:
		return fmt.Errorf("postgres: an empty item key")
	case r.Fragment != "" && s.cfg.Columns.Fragment == "":
		return fmt.Errorf("postgres: table %s has no fragment column, for fragment %q of %q", s.cfg.Table, r.Fragment, r.Key)
	}
	return nil
}

// Put sets an item's own value. It returns a clock at or after the change's.
func (s *Source) Put(ctx context.Context, key, value []byte) (uint64, error) {
	return s.PutRows(ctx, []Row{{Key: key, Value: value}})
}

// PutFragment sets one fragment of an item.
func (s *Source) PutFragment(ctx context.Context, key []byte, id string, value []byte) (uint64, error) {
	if id == "" {
		return 0, fmt.Errorf("postgres: put %q: empty fragment ID (it would read back as the item's own value)", key)
	}
	return s.PutRows(ctx, []Row{{Key: key, Fragment: id, Value: value}})
}

// Delete removes an item, every fragment with it.
func (s *Source) Delete(ctx context.Context, key []byte) (uint64, error) {
	return s.exec(ctx, fmt.Sprintf("DELETE FROM %s WHERE %s = $1", s.qualified(), quote(s.cfg.Columns.Key)), s.keyValue(key))
}

// DeleteFragment removes one fragment of an item.
func (s *Source) DeleteFragment(ctx context.Context, key []byte, id string) (uint64, error) {
	c := s.cfg.Columns
	if c.Fragment == "" || id == "" {
		return 0, fmt.Errorf("postgres: deleting fragment %q of %q: no such fragment column or ID", id, key)
	}
	return s.exec(ctx, fmt.Sprintf("DELETE FROM %s WHERE %s = $1 AND %s = $2", s.qualified(), quote(c.Key), quote(c.Fragment)),
		s.keyValue(key), id)
}

// exec runs one statement and returns a clock at or after it.
func (s *Source) exec(ctx context.Context, q string, args ...any) (uint64, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	if _, err := s.pool.Exec(ctx, q, args...); err != nil {
		return 0, classify(fmt.Errorf("postgres: %w", err))
	}
	return s.Clock(ctx)
}

// Copy writes rows with COPY, the fastest way in, in one transaction; it returns a clock at
// or after the commit. The rows must be new (COPY does not update).
func (s *Source) Copy(ctx context.Context, rows []Row) (uint64, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	c := s.cfg.Columns
	names := []string{c.Key, c.Value, c.Hash}
	if c.Fragment != "" {
		names = append(names, c.Fragment)
	}
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i == len(rows) {
			return nil, nil
		}
		r := rows[i]
		i++
		if err := s.checkRow(r); err != nil {
			return nil, err
		}
		return s.rowArgs(r), nil
	})
	if _, err := s.pool.CopyFrom(ctx, pgx.Identifier{s.schema, s.table}, names, src); err != nil {
		return 0, classify(fmt.Errorf("postgres: copying %d rows: %w", len(rows), err))
	}
	return s.Clock(ctx)
}

// Backfill fills the placement column of every row that has none, batch rows per
// transaction, and returns how many it filled: for a table that had no such column.
func (s *Source) Backfill(ctx context.Context, batch int) (int, error) {
	c := s.cfg.Columns
	key, _, _ := s.exprs()
	sel := fmt.Sprintf("SELECT %s FROM %s WHERE %s IS NULL LIMIT %d", key, s.qualified(), quote(c.Hash), max(1, batch))
	upd := fmt.Sprintf("UPDATE %s SET %s = $2 WHERE %s = $1 AND %s IS NULL", s.qualified(), quote(c.Hash), key, quote(c.Hash))
	total := 0
	for {
		var keys [][]byte
		rows, err := s.pool.Query(ctx, sel)
		if err != nil {
			return total, fmt.Errorf("postgres: backfill: %w", err)
		}
		for rows.Next() {
			var k []byte
			if err := rows.Scan(&k); err != nil {
				rows.Close()
				return total, fmt.Errorf("postgres: backfill: %w", err)
			}
			keys = append(keys, k)
		}
		if err := rows.Err(); err != nil {
			return total, fmt.Errorf("postgres: backfill: %w", err)
		}
		if len(keys) == 0 {
			return total, nil
		}
		err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			for _, k := range keys {
				b.Queue(upd, s.keyValue(k), HashColumn(keyspace.Hash(k)))
			}
			return tx.SendBatch(ctx, b).Close()
		})
		if err != nil {
			return total, fmt.Errorf("postgres: backfill: %w", err)
		}
		total += len(keys)
	}
}

// Status is what an operator checks of the source: the table and the replication slots.
type Status struct {
	Table string
	// Rows counts the table's rows; Unplaced those without a placement column value, which
	// no scan finds (slicectl pg backfill fills them).
	Rows, Unplaced int64
	Publication    bool // the publication exists
	Slots          []Slot
	// Clock is the WAL insert position.
	Clock uint64
}

// Slot is a replication slot of Sliceplane's (its name starts with "sliceplane").
type Slot struct {
	Name   string
	Active bool
	// Confirmed is how far its reader confirmed; Behind, how many bytes of WAL the server
	// keeps for it beyond that.
	Confirmed, Behind uint64
	// WALStatus is PostgreSQL's: reserved, extended, unreserved or lost.
	WALStatus string
}

// Status reads the source's status.
func (s *Source) Status(ctx context.Context) (Status, error) {
	st := Status{Table: s.cfg.Table}
	q := fmt.Sprintf("SELECT count(*), count(*) FILTER (WHERE %s IS NULL) FROM %s", quote(s.cfg.Columns.Hash), s.qualified())
	if err := s.pool.QueryRow(ctx, q).Scan(&st.Rows, &st.Unplaced); err != nil {
		return st, fmt.Errorf("postgres: counting rows: %w", err)
	}
	if err := s.pool.QueryRow(ctx, "SELECT count(*) > 0 FROM pg_publication WHERE pubname = $1", s.cfg.Publication).Scan(&st.Publication); err != nil {
		return st, fmt.Errorf("postgres: reading publications: %w", err)
	}
	var err error
	if st.Clock, err = s.Clock(ctx); err != nil {
		return st, err
	}
	rows, err := s.pool.Query(ctx, `SELECT slot_name::text, active, coalesce(confirmed_flush_lsn::text, '0/0'),
		coalesce(pg_current_wal_lsn() - confirmed_flush_lsn, 0)::bigint, coalesce(wal_status, '')
		FROM pg_replication_slots WHERE slot_name LIKE 'sliceplane%' ORDER BY slot_name`)
	if err != nil {
		return st, fmt.Errorf("postgres: reading slots: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var sl Slot
		var confirmed string
		var behind int64
		if err := rows.Scan(&sl.Name, &sl.Active, &confirmed, &behind, &sl.WALStatus); err != nil {
			return st, fmt.Errorf("postgres: reading slots: %w", err)
		}
		lsn, err := pglogrepl.ParseLSN(confirmed)
		if err != nil {
			return st, fmt.Errorf("postgres: slot %s: %w", sl.Name, err)
		}
		sl.Confirmed, sl.Behind = uint64(lsn), uint64(max(behind, 0))
		st.Slots = append(st.Slots, sl)
	}
	return st, rows.Err()
}
