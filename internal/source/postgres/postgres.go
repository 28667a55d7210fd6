// Package postgres is a source.Source over a PostgreSQL table: changes from logical
// replication (pgoutput, through a replication slot of the reader's own), the clock is the
// WAL position (LSN), and a slice is one index range of a BIGINT placement column that holds
// each key's xxhash64 with its top bit flipped, so that the column's order is hash order.
//
// PostgreSQL cannot read the past, so a Scan reads the present, in one snapshot: it is
// positioned at a clock after everything it saw (the WAL insert position, read in that
// snapshot), and the caller applies the changes after the clock it asked for over the scan
// (see source.Source.Scan). That is the watermark idea of Netflix's DBLog with the high
// watermark read rather than written: changes that race a scan win over it because they are
// applied after it, and the slice counts as loaded once they have been. The low side needs
// care of its own: a transaction reaches the WAL, and the replication stream, a moment
// before it is visible to new snapshots, so a scan waits until every transaction delivered
// up to the clock asked for is visible in its snapshot (visible.go).
package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sliceplane/sliceplane/internal/source"
)

// HashColumn returns what the placement column holds for a key's hash: the hash with its
// top bit flipped, as a signed BIGINT, so that ordering by the column orders by hash.
func HashColumn(hash uint64) int64 { return int64(hash ^ 1<<63) }

// HashOf returns the hash a placement column value stands for.
func HashOf(column int64) uint64 { return uint64(column) ^ 1<<63 }

// Source is the table's items as a source.Source.
type Source struct {
	cfg    Config
	pool   *pgxpool.Pool
	schema string
	table  string
	cols   columns

	// progress asks the running watches for the server's progress (see Progress).
	mu        sync.Mutex
	watches   map[chan struct{}]bool
	lastFlush time.Time
	logged    map[source.RejectReason]bool
	// recent are the transactions the watches delivered lately (see visible.go).
	recent []delivered

	// checkMu serializes Check, which sets cols; checked says one passed.
	checkMu sync.Mutex
	checked atomic.Bool
	// flushing says a flush of Progress runs; flushes are the source's goroutines, which
	// Close waits for.
	flushing atomic.Bool
	flushes  sync.WaitGroup
}

// columns is what Open learned of the table's columns.
type columns struct {
	keyBytea, valueBytea bool
	// binary says that every column the stream reads has a binary form that is its bytes
	// (bytea, text): the stream then asks for rows in binary, which costs the server
	// and the source less than text (a bytea's hex, in particular).
	binary bool
}

// New returns the source of cfg without reaching the server: Check does, and every read
// that needs what it learns (Watch, Scan, the writes) checks first until a Check passed.
// An error is source.Misconfigured (cfg itself is wrong). Close the source when done.
func New(cfg Config) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, source.MarkMisconfigured(err)
	}
	pcfg, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, source.MarkMisconfigured(fmt.Errorf("postgres: the DSN: %w", err))
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg) // it connects when used
	if err != nil {
		return nil, classify(fmt.Errorf("postgres: connecting: %w", err))
	}
	s := &Source{cfg: cfg, pool: pool, watches: map[chan struct{}]bool{}, logged: map[source.RejectReason]bool{}}
	s.schema, s.table, _ = splitTable(cfg.Table)
	return s, nil
}

// Open returns the source once Check has passed; Close it when done.
func Open(ctx context.Context, cfg Config) (*Source, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Check(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Check connects, checks the table (its columns, and that its replica identity lets
// deletes name the key), creates the publication if missing, and, with a Slot, the slot.
// Its errors are classified (source.ClassOf): a Misconfigured one names what to fix, an
// Unavailable one passes with the server's return. Once one Check passed, later ones do
// nothing.
func (s *Source) Check(ctx context.Context) error {
	s.checkMu.Lock()
	defer s.checkMu.Unlock()
	if s.checked.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*s.cfg.Timeout)
	defer cancel()
	if err := s.open(ctx); err != nil {
		return classify(err)
	}
	s.checked.Store(true)
	return nil
}

// ready runs Check unless one passed.
func (s *Source) ready(ctx context.Context) error {
	if s.checked.Load() {
		return nil
	}
	return s.Check(ctx)
}

func (s *Source) open(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres: connecting: %w", err)
	}
	if err := s.checkTable(ctx); err != nil {
		return err
	}
	if err := s.ensurePublication(ctx); err != nil {
		return err
	}
	if s.cfg.Slot == "" {
		return nil
	}
	_, err := s.ensureSlot(ctx)
	return err
}

// bounded returns ctx bounded by the source's Timeout, for one request of its own.
func (s *Source) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.Timeout)
}

// Observe implements source.Observed.
func (s *Source) Observe(log *slog.Logger, rejected func(source.RejectReason)) {
	if s.cfg.Rejected == nil {
		s.cfg.Rejected = rejected
	}
	if s.cfg.Logger == slog.Default() {
		s.cfg.Logger = log
	}
}

// Close ends the source's connections once its flushes are done; watches end with their
// contexts.
func (s *Source) Close() {
	s.flushes.Wait()
	s.pool.Close()
}

// Pool returns the source's connection pool, for the writer and the tools.
func (s *Source) Pool() *pgxpool.Pool { return s.pool }

// qualified returns the table's quoted name.
func (s *Source) qualified() string { return pgx.Identifier{s.schema, s.table}.Sanitize() }

// quote returns a column's quoted name.
func quote(name string) string { return pgx.Identifier{name}.Sanitize() }

// checkTable checks the table's columns and replica identity.
func (s *Source) checkTable(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `SELECT a.attname, format_type(a.atttypid, a.atttypmod)
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped`, s.schema, s.table)
	if err != nil {
		return fmt.Errorf("postgres: reading table %s: %w", s.cfg.Table, err)
	}
	types := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return fmt.Errorf("postgres: reading table %s: %w", s.cfg.Table, err)
		}
		types[name] = typ
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("postgres: reading table %s: %w", s.cfg.Table, err)
	}
	if len(types) == 0 {
		return source.MarkMisconfigured(fmt.Errorf("postgres: table %s does not exist (slicectl pg init creates it; see docs/POSTGRES.md)", s.cfg.Table))
	}
	c := s.cfg.Columns
	want := map[string]string{"key": c.Key, "value": c.Value, "hash": c.Hash}
	if c.Fragment != "" {
		want["fragment"] = c.Fragment
	}
	for what, name := range want {
		if _, ok := types[name]; !ok {
			return source.MarkMisconfigured(fmt.Errorf("postgres: table %s has no %s column %q", s.cfg.Table, what, name))
		}
	}
	if t := types[c.Hash]; t != "bigint" {
		return source.MarkMisconfigured(fmt.Errorf("postgres: the hash column %q is %s; want bigint", c.Hash, t))
	}
	s.cols = columns{keyBytea: types[c.Key] == "bytea", valueBytea: types[c.Value] == "bytea",
		binary: raw(types[c.Key]) && raw(types[c.Value]) && (c.Fragment == "" || raw(types[c.Fragment]))}
	return s.checkIdentity(ctx)
}

// raw reports whether a type's binary form is its bytes, as its value is read.
func raw(typ string) bool { return typ == "bytea" || typ == "text" }

// checkIdentity checks that a delete's old row, as logical replication sends it, names the
// item: the replica identity is FULL, or its columns hold the key (and fragment) columns.
func (s *Source) checkIdentity(ctx context.Context) error {
	var ident string
	var cols []string
	err := s.pool.QueryRow(ctx, `SELECT c.relreplident::text, coalesce((SELECT array_agg(a.attname::text)
		FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
		WHERE i.indrelid = c.oid AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident))), '{}')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
		s.schema, s.table).Scan(&ident, &cols)
	if err != nil {
		return fmt.Errorf("postgres: reading the replica identity of %s: %w", s.cfg.Table, err)
	}
	if ident == "f" {
		return nil
	}
	need := []string{s.cfg.Columns.Key}
	if s.cfg.Columns.Fragment != "" {
		need = append(need, s.cfg.Columns.Fragment)
	}
	for _, n := range need {
		found := false
		for _, c := range cols {
			found = found || c == n
		}
		if !found {
			return source.MarkMisconfigured(fmt.Errorf("postgres: table %s: a delete would not name its item: the replica identity (%s) lacks column %q; "+
				"make the key (and fragment) columns the primary key, or ALTER TABLE ... REPLICA IDENTITY FULL",
				s.cfg.Table, strings.Join(cols, ", "), n))
		}
	}
	return nil
}

// ensurePublication creates the publication of the table if there is none by its name.
func (s *Source) ensurePublication(ctx context.Context) error {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_publication WHERE pubname = $1`, s.cfg.Publication).Scan(&n); err != nil {
		return fmt.Errorf("postgres: reading publications: %w", err)
	}
	if n > 0 {
		return nil
	}
	_, err := s.pool.Exec(ctx, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s", quote(s.cfg.Publication), s.qualified()))
	if err != nil && !isDuplicate(err) {
		return fmt.Errorf("postgres: creating publication %s: %w", s.cfg.Publication, err)
	}
	return nil
}

// Clock implements source.Source: the WAL insert position, which every change committed so
// far precedes.
func (s *Source) Clock(ctx context.Context) (uint64, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	lsn, err := s.insertLSN(ctx, s.pool)
	if err != nil {
		return 0, s.failed(fmt.Errorf("postgres: reading the clock: %w", err))
	}
	return lsn, nil
}

// querier is a pool or a connection.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// insertLSN reads the WAL insert position.
func (s *Source) insertLSN(ctx context.Context, q querier) (uint64, error) {
	var text string
	if err := q.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&text); err != nil {
		return 0, err
	}
	lsn, err := pglogrepl.ParseLSN(text)
	return uint64(lsn), err
}

// Fence implements source.Fencer: the WAL insert position, once an empty logical message
// has flushed the WAL up to it (so that the watches reach it); nothing is written to the
// table.
func (s *Source) Fence(ctx context.Context) (uint64, error) {
	fctx, cancel := s.bounded(ctx)
	err := s.flush(fctx)
	cancel()
	if err != nil {
		return 0, err
	}
	return s.Clock(ctx)
}

// flushEvery bounds how often Progress writes to the WAL.
const flushEvery = 50 * time.Millisecond

// Progress implements source.Source: every watch asks the server at once how far it has
// read. A clock from Clock may lie past the WAL the server has flushed (the end of a record
// no commit has flushed yet), which a watch would not reach until something else commits:
// Progress therefore also commits an empty logical message (at most every flushEvery), which
// flushes the WAL up to it. It never waits for the server: the flush runs on a goroutine of
// the source's (Close waits for it), bounded by Timeout and ctx, and the caller asks again.
func (s *Source) Progress(ctx context.Context) error {
	s.mu.Lock()
	for w := range s.watches {
		select {
		case w <- struct{}{}:
		default:
		}
	}
	flush := time.Since(s.lastFlush) >= flushEvery && s.flushing.CompareAndSwap(false, true)
	if flush {
		s.lastFlush = time.Now()
		s.flushes.Add(1)
	}
	s.mu.Unlock()
	if !flush {
		return nil
	}
	go func() {
		defer s.flushes.Done()
		defer s.flushing.Store(false)
		fctx, cancel := s.bounded(ctx)
		defer cancel()
		if err := s.flush(fctx); err != nil && ctx.Err() == nil {
			s.logger().Debug("postgres: flushing the WAL for progress", "err", err)
		}
	}()
	return nil
}

// flush commits a logical message, synchronously, so that the WAL is flushed up to it.
func (s *Source) flush(ctx context.Context) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = on"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(true, 'sliceplane', '')")
		return err
	})
	if err != nil {
		return s.failed(fmt.Errorf("postgres: flushing the WAL: %w", err))
	}
	return nil
}

// reject reports a row that is no item, logging the first of each reason.
func (s *Source) reject(reason source.RejectReason, what string) {
	if s.cfg.Rejected != nil {
		s.cfg.Rejected(reason)
	}
	s.mu.Lock()
	first := !s.logged[reason]
	s.logged[reason] = true
	s.mu.Unlock()
	if first {
		s.cfg.Logger.Warn("postgres: skipping a row that is no item; later ones for this reason are only counted",
			"reason", string(reason), "row", what)
	}
}

// isDuplicate reports whether err is PostgreSQL's "already exists".
func isDuplicate(err error) bool {
	var pe interface{ SQLState() string }
	return errors.As(err, &pe) && pe.SQLState() == "42710"
}

var _ source.Writer = (*Source)(nil)

// logger is for the parts that log.
func (s *Source) logger() *slog.Logger { return s.cfg.Logger }
