package countermember

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sliceplane/sliceplane/client"
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

// ErrNotPrimary is returned by Incr for a key whose range the member does not hold as
// primary now; ErrNotHeld by Get for a key whose range it does not hold at all. Neither
// changed anything: the caller may send the request elsewhere.
var (
	ErrNotPrimary = errors.New("countermember: not the key's primary now")
	ErrNotHeld    = errors.New("countermember: the key's range is not held here")
)

// sqlPoint maps a point of the hash space to a bigint with the same order.
func sqlPoint(p uint64) int64 { return int64(p ^ 1<<63) }

// held is a range the application holds, in a role.
type held struct {
	r    client.Range
	role client.Role
}

// Counts is the member's application (client.Application): the counts of the keys of the
// ranges it holds, in memory, loaded from PostgreSQL when it acquires a range or becomes
// its primary, and each increment written through before it is answered. Only the primary
// of a key's range increments it; a secondary answers reads from the table. One lock
// orders increments and role changes: a demotion waits for the increment in flight, so that
// the new primary, which loads the range after the old one demoted, sees every
// increment the old one answered.
type Counts struct {
	pool *pgxpool.Pool
	// delay is added to every write: a slower database, for demos and tests that want
	// increments in flight when a primary moves.
	delay time.Duration
	log   *slog.Logger

	mu     sync.Mutex
	ranges []held
	counts map[string]int64 // of the keys in the ranges held as primary
}

// NewCounts returns the application over the counters table of pool, each write delayed by
// delay.
func NewCounts(pool *pgxpool.Pool, delay time.Duration, log *slog.Logger) *Counts {
	return &Counts{pool: pool, delay: delay, log: log, counts: map[string]int64{}}
}

// role returns the role in which the range of point h is held, 0 for none. c.mu held.
func (c *Counts) role(h uint64) client.Role {
	for _, x := range c.ranges {
		if x.r.Contains(h) {
			return x.role
		}
	}
	return 0
}

// Acquire loads r's counts when it is acquired as primary; a secondary reads the table.
func (c *Counts) Acquire(ctx context.Context, r client.Range, role client.Role) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log.Debug("acquire", "range", r, "role", role)
	if role == client.RolePrimary {
		if err := c.load(ctx, r); err != nil {
			return err
		}
	}
	c.ranges = append(c.ranges, held{r: r, role: role})
	return nil
}

// Release forgets r.
func (c *Counts) Release(_ context.Context, r client.Range) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log.Debug("release", "range", r)
	c.forget(r)
	return nil
}

// ChangeRole makes r's role role: a promotion loads r's counts as the old primary left
// them; a demotion, once the increment in flight is answered (the lock), drops them.
func (c *Counts) ChangeRole(ctx context.Context, r client.Range, role client.Role) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log.Debug("change role", "range", r, "role", role)
	c.forget(r)
	if role == client.RolePrimary {
		if err := c.load(ctx, r); err != nil {
			return err
		}
	}
	c.ranges = append(c.ranges, held{r: r, role: role})
	return nil
}

// forget drops what c holds of r: the points of r leave the ranges held, and the counts of
// r's keys. c.mu held.
func (c *Counts) forget(r client.Range) {
	var keep []held
	for _, x := range c.ranges {
		for _, rest := range minus(x.r, r) {
			keep = append(keep, held{r: rest, role: x.role})
		}
	}
	c.ranges = keep
	for k := range c.counts {
		if r.Contains(client.Hash([]byte(k))) {
			delete(c.counts, k)
		}
	}
}

// load reads r's counts from the table. c.mu held.
func (c *Counts) load(ctx context.Context, r client.Range) error {
	q, args := "SELECT key, count FROM counters WHERE point >= $1", []any{sqlPoint(r.Start)}
	if !r.End.IsEnd() {
		q, args = q+" AND point < $2", append(args, sqlPoint(r.End.Point()))
	}
	rows, err := c.pool.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("countermember: loading %s: %w", r, err)
	}
	var key string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&key, &n}, func() error {
		c.counts[key] = n
		return nil
	})
	if err != nil {
		return fmt.Errorf("countermember: loading %s: %w", r, err)
	}
	return nil
}

// Incr adds one to key's count, written to the table before it returns the new count; only
// the primary of key's range does. A failed write leaves the count as it was in memory (the
// row may or may not have changed: the caller counts the increment as failed).
func (c *Counts) Incr(ctx context.Context, key string) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := client.Hash([]byte(key))
	if c.role(h) != client.RolePrimary {
		return 0, ErrNotPrimary
	}
	next := c.counts[key] + 1
	if c.delay > 0 {
		select {
		case <-time.After(c.delay):
		case <-ctx.Done():
			return 0, fmt.Errorf("countermember: writing %q: %w", key, ctx.Err())
		}
	}
	_, err := c.pool.Exec(ctx, `INSERT INTO counters (key, point, count) VALUES ($1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET count = EXCLUDED.count`, key, sqlPoint(h), next)
	if err != nil {
		return 0, fmt.Errorf("countermember: writing %q: %w", key, err)
	}
	c.counts[key] = next
	return next, nil
}

// Get returns key's count: from memory on its primary, from the table on a secondary.
func (c *Counts) Get(ctx context.Context, key string) (int64, error) {
	c.mu.Lock()
	h := client.Hash([]byte(key))
	role, n := c.role(h), c.counts[key]
	c.mu.Unlock()
	switch role {
	case client.RolePrimary:
		return n, nil
	case 0:
		return 0, ErrNotHeld
	}
	err := c.pool.QueryRow(ctx, "SELECT count FROM counters WHERE key = $1", key).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("countermember: reading %q: %w", key, err)
	}
	return n, nil
}

// minus returns the points of a outside b, as up to two ranges.
func minus(a, b client.Range) []client.Range {
	if !a.Overlaps(b) {
		return []client.Range{a}
	}
	var out []client.Range
	if a.Start < b.Start {
		out = append(out, client.Range{Start: a.Start, End: client.BoundAt(b.Start)})
	}
	if !b.End.IsEnd() && a.End.After(b.End.Point()) {
		out = append(out, client.Range{Start: b.End.Point(), End: a.End})
	}
	return out
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
