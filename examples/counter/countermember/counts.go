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

// ErrNotPrimary is returned by Incr for a key whose range the member does not hold as
// primary now; ErrNotHeld by Get for a key whose range it does not hold at all. Neither
// changed anything: the caller may send the request elsewhere. ErrFenced is returned by
// Incr when PostgreSQL refused the write: another member was granted the key's range with a
// higher token since this one was (it lost the role without knowing yet); nothing changed.
var (
	ErrNotPrimary = errors.New("countermember: not the key's primary now")
	ErrNotHeld    = errors.New("countermember: the key's range is not held here")
	ErrFenced     = errors.New("countermember: the key's range was granted to another primary since")
)

// sqlPoint maps a point of the hash space to a bigint with the same order.
func sqlPoint(p uint64) int64 { return int64(p ^ 1<<63) }

// held is a range the application holds, in a grant.
type held struct {
	r     client.Range
	grant client.Grant
}

// Counts is the member's application (client.Application): the counts of the keys of the
// ranges it holds, in memory, loaded from PostgreSQL when it acquires a range or becomes
// its primary, and each increment written through before it is answered. Only the primary
// of a key's range increments it; a secondary answers reads from the table. One lock
// orders increments and role changes: a demotion waits for the increment in flight, so that
// the new primary, which loads the range after the old one demoted, sees every
// increment the old one answered.
//
// Fenced, a primary claims its range with its grant's token before it loads it, and every
// increment is written through the fence (client/fence): a member that lost the role without
// knowing it (paused, cut off from the assigners) finds its write refused, once the new
// primary claimed the range, instead of answering a count the new primary answers too.
type Counts struct {
	pool   *pgxpool.Pool
	fenced bool
	// leased says whether the member's lease on primary roles is valid (client.Member.Leased):
	// an increment is refused past it, even before the demotion's call comes.
	leased func() bool
	// delay is added to every write: a slower database, for demos and tests that want
	// increments in flight when a primary moves. beforeWrite, for tests, runs then too:
	// a process paused mid-increment.
	delay       time.Duration
	beforeWrite func()
	log         *slog.Logger

	mu     sync.Mutex
	ranges []held
	counts map[string]int64 // of the keys in the ranges held as primary
}

// NewCounts returns the application over the counters table of pool, each write delayed by
// delay, and fenced or not.
func NewCounts(pool *pgxpool.Pool, delay time.Duration, fenced bool, log *slog.Logger) *Counts {
	return &Counts{pool: pool, fenced: fenced, delay: delay, log: log, counts: map[string]int64{}, leased: func() bool { return true }}
}

// The messages that say when the application held a range as primary, which the ownership
// check reads (countercheck.Ownership): from the start of the call that makes it primary
// (it may act as one before the call returns) to the return of the call that demotes or
// releases it, or the end of the member's lease, whichever is first.
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

// primaryIn reports whether c holds any point of r as primary. c.mu held.
func (c *Counts) primaryIn(r client.Range) bool {
	for _, x := range c.ranges {
		if x.grant.Role == client.RolePrimary && x.r.Overlaps(r) {
			return true
		}
	}
	return false
}

// grant returns the grant in which the range of point h is held, the zero one for none.
// c.mu held.
func (c *Counts) grant(h uint64) client.Grant {
	for _, x := range c.ranges {
		if x.r.Contains(h) {
			return x.grant
		}
	}
	return client.Grant{}
}

// Acquire loads r's counts when it is acquired as primary; a secondary reads the table.
func (c *Counts) Acquire(ctx context.Context, r client.Range, g client.Grant) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log.Info("acquire", "range", r, "grant", g)
	if g.Role == client.RolePrimary {
		if err := c.take(ctx, r, g.Token); err != nil {
			return err
		}
	}
	c.ranges = append(c.ranges, held{r: r, grant: g})
	return nil
}

// take makes c r's primary with token: it claims r (fenced) and loads its counts; not
// without a valid lease (the member tries again). It logs when c held r as primary. c.mu
// held.
func (c *Counts) take(ctx context.Context, r client.Range, token uint64) error {
	if !c.leased() {
		return fmt.Errorf("countermember: taking %s: %w", r, ErrNotPrimary)
	}
	c.logRange(LogPrimaryFrom, r, "token", token)
	var err error
	if c.fenced { // claimed before the counts are read: a write of an older grant now fails
		err = fence.PGClaim(ctx, c.pool, r, token)
	}
	if err == nil {
		err = c.load(ctx, r)
	}
	if err != nil {
		c.logRange(LogPrimaryUntil, r)
		return fmt.Errorf("countermember: taking %s: %w", r, err)
	}
	return nil
}

// Release forgets r.
func (c *Counts) Release(_ context.Context, r client.Range) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log.Info("release", "range", r)
	if c.primaryIn(r) {
		defer c.logRange(LogPrimaryUntil, r)
	}
	c.forget(r)
	return nil
}

// ChangeRole makes r's grant g: a promotion (or a new token) claims r and loads its counts
// as the old primary left them; a demotion, once the increment in flight is answered (the
// lock), drops them. A promotion that fails holds r as secondary: the member takes the role
// as changed, and the increments it then refuses are sent elsewhere.
func (c *Counts) ChangeRole(ctx context.Context, r client.Range, g client.Grant) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log.Info("change role", "range", r, "grant", g)
	if g.Role != client.RolePrimary && c.primaryIn(r) {
		defer c.logRange(LogPrimaryUntil, r)
	}
	c.forget(r)
	if g.Role == client.RolePrimary {
		if err := c.take(ctx, r, g.Token); err != nil {
			c.ranges = append(c.ranges, held{r: r, grant: client.Grant{Role: client.RoleSecondary}})
			return err
		}
	}
	c.ranges = append(c.ranges, held{r: r, grant: g})
	return nil
}

// forget drops what c holds of r: the points of r leave the ranges held, and the counts of
// r's keys. c.mu held.
func (c *Counts) forget(r client.Range) {
	var keep []held
	for _, x := range c.ranges {
		for _, rest := range minus(x.r, r) {
			keep = append(keep, held{r: rest, grant: x.grant})
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
	g := c.grant(h)
	if g.Role != client.RolePrimary || !c.leased() {
		return 0, ErrNotPrimary
	}
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

// Get returns key's count: from memory on its primary, from the table on a secondary.
func (c *Counts) Get(ctx context.Context, key string) (int64, error) {
	c.mu.Lock()
	h := client.Hash([]byte(key))
	role, n := c.grant(h).Role, c.counts[key]
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
