package fence_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/fence"
)

// items is the application's table in these tests: one value per point.
const items = `CREATE TABLE items (point bigint PRIMARY KEY, value text NOT NULL)`

const upsert = `INSERT INTO items (point, value) VALUES ($1, $2)
	ON CONFLICT (point) DO UPDATE SET value = EXCLUDED.value`

func newItems(t *testing.T) *pgxpool.Pool {
	t.Helper()
	db := newDB(t)
	_, err := db.Exec(t.Context(), items)
	require.NoError(t, err)
	return db
}

// write sets the value at point p through the fence, with token.
func write(ctx context.Context, db fence.PGDB, p, token uint64, value string) error {
	_, err := fence.PGExec(ctx, db, p, token, upsert, fence.PGPoint(p), value)
	return err
}

// read returns the value at point p, "" if there is none.
func read(t *testing.T, db *pgxpool.Pool, p uint64) string {
	t.Helper()
	var v string
	err := db.QueryRow(t.Context(), "SELECT value FROM items WHERE point = $1", fence.PGPoint(p)).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	require.NoError(t, err)
	return v
}

// fenceRow is a row of sliceplane_fences, its bounds as points.
type fenceRow struct{ lo, hi, token uint64 }

func fences(t *testing.T, db *pgxpool.Pool) []fenceRow {
	t.Helper()
	rows, err := db.Query(t.Context(), "SELECT lo, hi, token FROM sliceplane_fences ORDER BY lo")
	require.NoError(t, err)
	var out []fenceRow
	var lo, hi, token int64
	_, err = pgx.ForEachRow(rows, []any{&lo, &hi, &token}, func() error {
		out = append(out, fenceRow{uint64(lo) ^ 1<<63, uint64(hi) ^ 1<<63, uint64(token)})
		return nil
	})
	require.NoError(t, err)
	return out
}

func span(start, end uint64) client.Range {
	return client.Range{Start: start, End: client.BoundAt(end)}
}

const (
	quarter = uint64(1) << 62
	half    = uint64(1) << 63
	last    = uint64(math.MaxUint64)
)

func TestAClaimLetsItsTokenWrite(t *testing.T) {
	db := newItems(t)
	ctx := t.Context()
	require.NoError(t, fence.PGClaim(ctx, db, client.FullRange(), 1))
	for _, p := range []uint64{0, half - 1, half, last} {
		require.NoError(t, write(ctx, db, p, 1, "v"))
		assert.Equal(t, "v", read(t, db, p))
	}
	assert.Equal(t, []fenceRow{{0, last, 1}}, fences(t, db))
}

func TestAHigherClaimFencesTheOlderToken(t *testing.T) {
	db := newItems(t)
	ctx := t.Context()
	require.NoError(t, fence.PGClaim(ctx, db, client.FullRange(), 1))
	require.NoError(t, write(ctx, db, 7, 1, "old"))
	require.NoError(t, fence.PGClaim(ctx, db, client.FullRange(), 2))

	err := write(ctx, db, 7, 1, "stale")
	require.ErrorIs(t, err, fence.ErrStale)
	assert.ErrorContains(t, err, "fenced by token 2, above 1")
	assert.Equal(t, "old", read(t, db, 7), "a refused write changes nothing")

	require.NoError(t, write(ctx, db, 7, 2, "new"))
	assert.Equal(t, "new", read(t, db, 7))
}

func TestALowerClaimIsRefused(t *testing.T) {
	db := newItems(t)
	ctx := t.Context()
	require.NoError(t, fence.PGClaim(ctx, db, client.FullRange(), 5))
	before := fences(t, db)

	for _, r := range []client.Range{client.FullRange(), span(quarter, half)} {
		err := fence.PGClaim(ctx, db, r, 4)
		require.ErrorIs(t, err, fence.ErrStale, "claiming %s", r)
		assert.ErrorContains(t, err, "fenced by token 5, above 4")
	}
	assert.Equal(t, before, fences(t, db), "a refused claim changes nothing")
	require.NoError(t, write(ctx, db, 1, 5, "v"), "the holder still writes")

	require.NoError(t, fence.PGClaim(ctx, db, client.FullRange(), 5), "claiming again with the same token")
	assert.Equal(t, before, fences(t, db))
}

// A claim of part of a range leaves the old holder the rest of it.
func TestASplit(t *testing.T) {
	db := newItems(t)
	ctx := t.Context()
	require.NoError(t, fence.PGClaim(ctx, db, client.FullRange(), 1))
	require.NoError(t, fence.PGClaim(ctx, db, span(quarter, half), 2))
	assert.Equal(t, []fenceRow{{0, quarter - 1, 1}, {quarter, half - 1, 2}, {half, last, 1}}, fences(t, db))

	for _, p := range []uint64{0, quarter - 1, half, last} {
		assert.NoError(t, write(ctx, db, p, 1, "old"), "outside the claim, at %#x", p)
	}
	for _, p := range []uint64{quarter, half - 1} {
		assert.ErrorIs(t, write(ctx, db, p, 1, "old"), fence.ErrStale, "inside the claim, at %#x", p)
		assert.NoError(t, write(ctx, db, p, 2, "new"), "the new holder, at %#x", p)
	}

	// Its end, claimed anew, shrinks the left part in place.
	require.NoError(t, fence.PGClaim(ctx, db, span(quarter/2, quarter+1), 3))
	assert.Equal(t, []fenceRow{{0, quarter/2 - 1, 1}, {quarter / 2, quarter, 3}, {quarter + 1, half - 1, 2}, {half, last, 1}}, fences(t, db))
}

// A claim over several ranges replaces them all.
func TestAMerge(t *testing.T) {
	db := newItems(t)
	ctx := t.Context()
	require.NoError(t, fence.PGClaim(ctx, db, span(0, half), 1))
	require.NoError(t, fence.PGClaim(ctx, db, client.Range{Start: half, End: client.EndOfSpace()}, 2))

	require.NoError(t, fence.PGClaim(ctx, db, client.FullRange(), 2), "a token at least every part's")
	assert.Equal(t, []fenceRow{{0, last, 2}}, fences(t, db))
	assert.ErrorIs(t, write(ctx, db, 0, 1, "v"), fence.ErrStale)

	require.NoError(t, fence.PGClaim(ctx, db, client.FullRange(), 3))
	for _, p := range []uint64{0, last} {
		assert.ErrorIs(t, write(ctx, db, p, 2, "v"), fence.ErrStale)
		assert.NoError(t, write(ctx, db, p, 3, "v"))
	}
}

func TestTheEndsOfTheSpace(t *testing.T) {
	db := newItems(t)
	ctx := t.Context()
	require.NoError(t, fence.PGClaim(ctx, db, client.Range{Start: last - 9, End: client.EndOfSpace()}, 7))
	require.NoError(t, fence.PGClaim(ctx, db, span(0, 1), 7))
	assert.Equal(t, []fenceRow{{0, 0, 7}, {last - 9, last, 7}}, fences(t, db))

	for _, p := range []uint64{0, last - 9, last} {
		assert.NoError(t, write(ctx, db, p, 7, "v"), "at %#x", p)
	}
	for _, p := range []uint64{1, last - 10} {
		err := write(ctx, db, p, 7, "v")
		assert.ErrorIs(t, err, fence.ErrStale, "at %#x", p)
		assert.ErrorContains(t, err, "never claimed")
	}
}

func TestAPointNeverClaimedIsRefused(t *testing.T) {
	db := newItems(t)
	err := write(t.Context(), db, half, 1, "v")
	require.ErrorIs(t, err, fence.ErrStale)
	assert.ErrorContains(t, err, "no fence covers point 0x8000000000000000: its range was never claimed")
	assert.Empty(t, read(t, db, half))
}

func TestBadArguments(t *testing.T) {
	ctx := t.Context()
	err := fence.PGClaim(ctx, nil, client.FullRange(), 1<<63)
	assert.ErrorContains(t, err, "token 9223372036854775808 is above 9223372036854775807")
	assert.NotErrorIs(t, err, fence.ErrStale)
	_, err = fence.PGExec(ctx, nil, 0, 1<<63, upsert)
	assert.ErrorContains(t, err, "is above")
	err = fence.PGClaim(ctx, nil, span(5, 5), 1)
	assert.ErrorContains(t, err, "holds no point")
}

// A refused check aborts the write that came with it, and leaves the session outside any
// transaction: pgx ran the batch as one implicit transaction.
func TestARefusedCheckLeavesTheWriteUndone(t *testing.T) {
	db := newItems(t)
	ctx := t.Context()
	conn, err := pgx.ConnectConfig(ctx, db.Config().ConnConfig)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, fence.PGClaim(ctx, conn, client.FullRange(), 2))

	require.ErrorIs(t, write(ctx, conn, 3, 1, "stale"), fence.ErrStale)
	assert.Empty(t, read(t, db, 3))
	assert.Equal(t, byte('I'), conn.PgConn().TxStatus(), "idle, in no transaction")

	require.NoError(t, write(ctx, conn, 3, 2, "v"), "the session serves the next write")
	assert.Equal(t, "v", read(t, db, 3))

	// A write that fails after the check passed is the caller's error, not the fence's.
	_, err = fence.PGExec(ctx, conn, 3, 2, "INSERT INTO items (point, value) VALUES ($1, NULL)", fence.PGPoint(3))
	require.Error(t, err)
	assert.NotErrorIs(t, err, fence.ErrStale)
}

// An error when the batch's implicit transaction commits, a deferred constraint's, is the
// write's error.
func TestAnErrorAtCommitIsReturned(t *testing.T) {
	db := newItems(t)
	ctx := t.Context()
	require.NoError(t, fence.PGClaim(ctx, db, client.FullRange(), 1))
	_, err := db.Exec(ctx, "CREATE TABLE once (x int UNIQUE DEFERRABLE INITIALLY DEFERRED)")
	require.NoError(t, err)
	_, err = fence.PGExec(ctx, db, 0, 1, "INSERT INTO once VALUES (1)")
	require.NoError(t, err)
	_, err = fence.PGExec(ctx, db, 0, 1, "INSERT INTO once VALUES (1)")
	assert.ErrorContains(t, err, "duplicate key")
	var rows int
	require.NoError(t, db.QueryRow(ctx, "SELECT count(*) FROM once").Scan(&rows))
	assert.Equal(t, 1, rows)
}

// The check's lock lasts until the write commits, though the batch has no explicit
// transaction: a claim that comes while the write waits waits too.
func TestTheBatchHoldsTheFenceUntilTheWriteCommits(t *testing.T) {
	db := newItems(t)
	ctx := t.Context()
	require.NoError(t, fence.PGClaim(ctx, db, client.FullRange(), 1))
	require.NoError(t, write(ctx, db, 3, 1, "before"))

	// Lock the item's row, so that the fenced write passes its check and then waits.
	blocker, err := db.Begin(ctx)
	require.NoError(t, err)
	defer blocker.Rollback(ctx)
	_, err = blocker.Exec(ctx, "SELECT 1 FROM items WHERE point = $1 FOR UPDATE", fence.PGPoint(3))
	require.NoError(t, err)

	written := goErr(func() error { return write(ctx, db, 3, 1, "after") })
	waitBlocked(t, db, "INSERT INTO items", 1)
	claimed := goErr(func() error { return fence.PGClaim(ctx, db, client.FullRange(), 2) })
	waitBlocked(t, db, "sliceplane_claim", 1)
	assertPending(t, claimed, "the claim, while the write it must wait for is under way")

	require.NoError(t, blocker.Commit(ctx))
	require.NoError(t, recv(t, written))
	require.NoError(t, recv(t, claimed))
	assert.Equal(t, "after", read(t, db, 3))
}

// A write under way when a claim comes, in an explicit transaction between its check and
// its commit, holds the claim until it commits; the claim's holder then reads the write.
func TestAClaimWaitsForAWriteUnderWay(t *testing.T) {
	db := newItems(t)
	ctx := t.Context()
	require.NoError(t, fence.PGClaim(ctx, db, client.FullRange(), 1))

	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	require.NoError(t, write(ctx, tx, 3, 1, "v"))

	claimed := goErr(func() error { return fence.PGClaim(ctx, db, span(0, half), 2) })
	waitBlocked(t, db, "sliceplane_claim", 1)
	assertPending(t, claimed, "the claim, while a write is under way")

	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, recv(t, claimed))
	assert.Equal(t, "v", read(t, db, 3), "the new holder reads the write")
	assert.ErrorIs(t, write(ctx, db, 3, 1, "w"), fence.ErrStale)
}

// Writes that come while a claim is under way wait for it; when it commits, those it
// covers are refused, those outside it go ahead.
func TestWritesWaitForAClaimUnderWay(t *testing.T) {
	db := newItems(t)
	ctx := t.Context()
	require.NoError(t, fence.PGClaim(ctx, db, client.FullRange(), 1))

	claim, err := db.Begin(ctx)
	require.NoError(t, err)
	defer claim.Rollback(ctx)
	// The middle of the space: the old row shrinks to its left part in place, and its
	// right part is a new row.
	require.NoError(t, fence.PGClaim(ctx, claim, span(quarter, half), 2))

	cases := []struct {
		name      string
		p, token  uint64
		wantStale string // what the refusal says; "" for a write that goes ahead
	}{
		{"the old holder inside the claim", quarter, 1, "fenced by token 2, above 1"},
		{"the old holder on the left", quarter - 1, 1, ""},
		{"the old holder on the right", half, 1, ""},
		{"the new holder", half - 1, 2, ""},
	}
	results := make([]chan error, len(cases))
	for i, c := range cases {
		results[i] = goErr(func() error { return write(ctx, db, c.p, c.token, c.name) })
	}
	waitBlocked(t, db, "sliceplane_fence", len(cases))
	require.NoError(t, claim.Commit(ctx))

	for i, c := range cases {
		err := recv(t, results[i])
		if c.wantStale == "" {
			assert.NoError(t, err, c.name)
			assert.Equal(t, c.name, read(t, db, c.p), c.name)
			continue
		}
		assert.ErrorIs(t, err, fence.ErrStale, c.name)
		assert.ErrorContains(t, err, c.wantStale, c.name)
		assert.Empty(t, read(t, db, c.p), c.name)
	}
}

// A claim that comes while a higher one is under way waits for it, and is refused when it
// commits: it does not add its row beside the higher one's.
func TestClaimsTakeTurns(t *testing.T) {
	db := newItems(t)
	ctx := t.Context()
	require.NoError(t, fence.PGClaim(ctx, db, client.FullRange(), 1))

	higher, err := db.Begin(ctx)
	require.NoError(t, err)
	defer higher.Rollback(ctx)
	require.NoError(t, fence.PGClaim(ctx, higher, client.FullRange(), 3))

	lower := goErr(func() error { return fence.PGClaim(ctx, db, client.FullRange(), 2) })
	waitBlocked(t, db, "sliceplane_claim", 1)
	require.NoError(t, higher.Commit(ctx))

	err = recv(t, lower)
	require.ErrorIs(t, err, fence.ErrStale)
	assert.ErrorContains(t, err, "fenced by token 3, above 2")
	assert.Equal(t, []fenceRow{{0, last, 3}}, fences(t, db))
}

func TestPGQueryRow(t *testing.T) {
	db := newItems(t)
	ctx := t.Context()
	require.NoError(t, fence.PGClaim(ctx, db, client.FullRange(), 2))
	insert := upsert + " RETURNING value"

	var v string
	require.NoError(t, fence.PGQueryRow(ctx, db, 9, 2, insert, fence.PGPoint(9), "v").Scan(&v))
	assert.Equal(t, "v", v)

	err := fence.PGQueryRow(ctx, db, 9, 1, insert, fence.PGPoint(9), "stale").Scan(&v)
	assert.ErrorIs(t, err, fence.ErrStale)
	assert.Equal(t, "v", read(t, db, 9))

	err = fence.PGQueryRow(ctx, db, 9, 2, "SELECT value FROM items WHERE point = 10").Scan(&v)
	assert.ErrorIs(t, err, pgx.ErrNoRows)
}

// goErr runs f in a goroutine and returns the channel its error comes on.
func goErr(f func() error) chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// recv waits for the error on ch, for a minute at most.
func recv(t *testing.T, ch chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(time.Minute):
		t.Fatal("timed out")
		return nil
	}
}

// assertPending checks that nothing came on ch yet.
func assertPending(t *testing.T, ch chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s returned (%v): it should wait", what, err)
	default:
	}
}

// waitBlocked waits until n sessions whose statement contains query wait for a lock.
func waitBlocked(t *testing.T, db *pgxpool.Pool, query string, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiting int
		err := db.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND datname = current_database()
			AND strpos(query, $1) > 0`, query).Scan(&waiting)
		require.NoError(t, err)
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions of %q wait for a lock after a minute, not %d", waiting, query, n)
		}
		<-tick.C
	}
}
