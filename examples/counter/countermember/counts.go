package countermember

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/fence"
)

// Schema is the counters' table: a key's count, and the key's point of the hash space
// (client.Hash, shifted into a signed bigint with its order kept) so that a member loads a
// range by an index scan.
const Schema = `CREATE TABLE IF NOT EXISTS counters (
	key text PRIMARY KEY,
	point bigint NOT NULL,
	count bigint NOT NULL CHECK (count >= 0)
);
CREATE INDEX IF NOT EXISTS counters_point ON counters (point);`

// ErrFenced is returned by Incr when PostgreSQL refused the write: another member was
// granted the key's range with a higher token since this one was (it lost the role without
// knowing yet); nothing changed.
var ErrFenced = errors.New("countermember: the key's range was granted to another primary since")

// sqlPoint maps a point of the hash space to a bigint with the same order.
func sqlPoint(p uint64) int64 { return int64(p ^ 1<<63) }

// Counts is the member's application (client.Application): the counts of the keys of the
// ranges it holds as primary, in memory, loaded from PostgreSQL when it acquires a range as
// primary or becomes its primary, and each increment written through before it is answered.
// It keeps no account of which ranges it holds: the member does (client.Member.Write and
// Read run each request under its key's grant, and the member calls ChangeRole or Release
// for a range only once the increments of its keys in flight have been answered, so the new
// primary, which loads the range after this one demoted, sees every increment this one
// answered). One lock orders the increments.
//
// Fenced, a primary claims its range with its grant's token before it loads it, and every
// increment is written through the fence (client/fence): a member that lost the role without
// knowing it (paused, cut off from the assigners) finds its write refused, once the new
// primary claimed the range, instead of answering a count the new primary answers too.
type Counts struct {
	pool   *pgxpool.Pool
	fenced bool
	// delay is added to every write: a slower database, for demos and tests that want
	// increments in flight when a primary moves. beforeWrite, for tests, runs then too:
	// a process paused mid-increment.
	delay       time.Duration
	beforeWrite func()
	log         *slog.Logger

	mu     sync.Mutex
	counts map[string]int64 // of the keys in the ranges held as primary
}

// NewCounts returns the application over the counters table of pool, each write delayed by
// delay, and fenced or not.
func NewCounts(pool *pgxpool.Pool, delay time.Duration, fenced bool, log *slog.Logger) *Counts {
	return &Counts{pool: pool, fenced: fenced, delay: delay, log: log, counts: map[string]int64{}}
}

// The messages that say when the application held a range as primary, which the ownership
// check reads (countercheck.Ownership): from the start of the call that makes it primary
// (it may act as one before the call returns) to the return of the call that demotes or
// releases it, or the end of the member's lease, whichever is first. A "primary until" of a
// range held as secondary closes nothing.
const (
	LogPrimaryFrom  = "primary from"
	LogPrimaryUntil = "primary until"
)

// logRange logs msg about r, its bounds as hexadecimal points (end "" for the end of the
// space).
func (c *Counts) logRange(msg string, r client.Range, attrs ...any) {
	end := ""
	if !r.End.IsEnd() {
		end = fmt.Sprintf("%016x", r.End.Point())
	}
	c.log.Info(msg, append([]any{"start", fmt.Sprintf("%016x", r.Start), "end", end}, attrs...)...)
}

// Acquire loads r's counts when it is acquired as primary; a secondary reads the table.
func (c *Counts) Acquire(ctx context.Context, r client.Range, g client.Grant) error {
	c.log.Info("acquire", "range", r, "grant", g)
	if g.Role == client.RolePrimary {
		return c.take(ctx, r, g.Token)
	}
	return nil
}

// take makes c r's primary with token: it claims r (fenced) and loads its counts. It logs
// when c held r as primary.
func (c *Counts) take(ctx context.Context, r client.Range, token uint64) error {
	c.logRange(LogPrimaryFrom, r, "token", token)
	var err error
	if c.fenced { // claimed before the counts are read: a write of an older grant now fails
		err = fence.PGClaim(ctx, c.pool, r, token)
	}
	var counts map[string]int64
	if err == nil {
		counts, err = c.load(ctx, r)
	}
	if err != nil {
		c.logRange(LogPrimaryUntil, r)
		return fmt.Errorf("countermember: taking %s: %w", r, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	maps.Copy(c.counts, counts)
	return nil
}

// Release forgets r.
func (c *Counts) Release(_ context.Context, r client.Range) error {
	c.log.Info("release", "range", r)
	c.forget(r)
	c.logRange(LogPrimaryUntil, r)
	return nil
}

// ChangeRole makes r's grant g: a promotion (or a new token) claims r and loads its counts
// as the old primary left them; a demotion drops them (the member calls it once the
// increments in flight were answered).
func (c *Counts) ChangeRole(ctx context.Context, r client.Range, g client.Grant) error {
	c.log.Info("change role", "range", r, "grant", g)
	c.forget(r)
	if g.Role == client.RolePrimary {
		return c.take(ctx, r, g.Token)
	}
	c.logRange(LogPrimaryUntil, r)
	return nil
}

// forget drops the counts of r's keys.
func (c *Counts) forget(r client.Range) {
	c.mu.Lock()
	defer c.mu.Unlock()
	maps.DeleteFunc(c.counts, func(k string, _ int64) bool { return r.ContainsKey([]byte(k)) })
}

// load reads r's counts from the table.
func (c *Counts) load(ctx context.Context, r client.Range) (map[string]int64, error) {
	q, args := "SELECT key, count FROM counters WHERE point >= $1", []any{sqlPoint(r.Start)}
	if !r.End.IsEnd() {
		q, args = q+" AND point < $2", append(args, sqlPoint(r.End.Point()))
	}
	rows, err := c.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("countermember: loading %s: %w", r, err)
	}
	out := map[string]int64{}
	var key string
	var n int64
	if _, err = pgx.ForEachRow(rows, []any{&key, &n}, func() error { out[key] = n; return nil }); err != nil {
		return nil, fmt.Errorf("countermember: loading %s: %w", r, err)
	}
	return out, nil
}

// Incr adds one to key's count, written to the table before it returns the new count. The
// caller runs it under the key's grant g, as its primary (client.Member.Write). A failed
// write leaves the count as it was in memory (the row may or may not have changed: the
// caller counts the increment as failed).
func (c *Counts) Incr(ctx context.Context, key string, g client.Grant) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := client.Hash([]byte(key))
	next := c.counts[key] + 1
	if c.beforeWrite != nil {
		c.beforeWrite()
	}
	if c.delay > 0 {
		select {
		case <-time.After(c.delay):
		case <-ctx.Done():
			return 0, fmt.Errorf("countermember: writing %q: %w", key, ctx.Err())
		}
	}
	const upsert = `INSERT INTO counters (key, point, count) VALUES ($1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET count = EXCLUDED.count`
	var err error
	if c.fenced {
		_, err = fence.PGExec(ctx, c.pool, h, g.Token, upsert, key, sqlPoint(h), next)
	} else {
		_, err = c.pool.Exec(ctx, upsert, key, sqlPoint(h), next)
	}
	if errors.Is(err, fence.ErrStale) {
		return 0, fmt.Errorf("%w: %w", ErrFenced, err)
	}
	if err != nil {
		return 0, fmt.Errorf("countermember: writing %q: %w", key, err)
	}
	c.counts[key] = next
	return next, nil
}

// Get returns key's count, read in grant g (client.Member.Read): from memory on its
// primary, from the table on a secondary.
func (c *Counts) Get(ctx context.Context, key string, g client.Grant) (int64, error) {
	if g.Role == client.RolePrimary {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.counts[key], nil
	}
	var n int64
	err := c.pool.QueryRow(ctx, "SELECT count FROM counters WHERE key = $1", key).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("countermember: reading %q: %w", key, err)
	}
	return n, nil
}

// Stored returns every count the counters table of pool holds, by key.
func Stored(ctx context.Context, pool *pgxpool.Pool) (map[string]int64, error) {
	rows, err := pool.Query(ctx, "SELECT key, count FROM counters")
	if err != nil {
		return nil, fmt.Errorf("countermember: reading the counts: %w", err)
	}
	out := map[string]int64{}
	var key string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&key, &n}, func() error { out[key] = n; return nil }); err != nil {
		return nil, fmt.Errorf("countermember: reading the counts: %w", err)
	}
	return out, nil
}
