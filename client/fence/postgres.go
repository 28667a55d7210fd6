package fence

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sliceplane/sliceplane/client"
)

// PGSchema creates the fence table and the functions that claim and check it. It is
// idempotent: apply it at every start, with an Exec without arguments (so that pgx sends
// it as one simple query, statements and all), or with psql. Two sessions that apply it
// at the same moment may see one fail (PostgreSQL's DDL does not wait for itself): retry.
//
// sliceplane_fences holds one row per claimed range: its points in the order-keeping
// bigint form of PGPoint, both inclusive (so that the last point of the space, whose
// exclusive end 2^64 fits no column, has a range too), and the highest token claimed for
// it. Claims keep the rows disjoint; the primary key on (lo, hi) is the index both
// functions search, and gives the table the replica identity that logical replication
// needs to publish its updates.
//
// sliceplane_claim(lo, hi, token) is PGClaim's statement and sliceplane_fence(point,
// token) the check PGExec runs before a write; the package's documentation says why each
// locks what it does. Both raise SQLSTATE SPFEN when the token is stale.
const PGSchema = `
CREATE TABLE IF NOT EXISTS sliceplane_fences (
	lo    bigint NOT NULL,
	hi    bigint NOT NULL,
	token bigint NOT NULL,
	PRIMARY KEY (lo, hi),
	CHECK (lo <= hi)
);

-- The point a PGPoint bigint stands for, as client.Bound prints it: 0x and 16 hex digits.
CREATE OR REPLACE FUNCTION sliceplane_point_text(p bigint) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
	SELECT '0x' || lpad(to_hex(p # (-9223372036854775807 - 1)), 16, '0')
$$;

CREATE OR REPLACE FUNCTION sliceplane_fence(fence_point bigint, fence_token bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	highest bigint;
BEGIN
	FOR attempt IN 1..2 LOOP
		-- FOR SHARE holds the covering row until this transaction ends, so that a claim of
		-- the point waits for the write to commit; and this waits for a claim under way.
		-- A claim that commits meanwhile has updated or deleted the row, which then no
		-- longer matches; the second attempt, a new statement, has a new snapshot, which
		-- sees the rows that claim inserted (a remainder of a split range included).
		SELECT max(f.token) INTO highest FROM (
			SELECT s.token FROM sliceplane_fences s
			WHERE s.lo <= fence_point AND fence_point <= s.hi FOR SHARE
		) f;
		EXIT WHEN highest IS NOT NULL;
	END LOOP;
	IF highest IS NULL THEN
		RAISE EXCEPTION 'no fence covers point %: its range was never claimed',
			sliceplane_point_text(fence_point) USING ERRCODE = 'SPFEN';
	END IF;
	IF highest > fence_token THEN
		RAISE EXCEPTION 'point % is fenced by token %, above %',
			sliceplane_point_text(fence_point), highest, fence_token USING ERRCODE = 'SPFEN';
	END IF;
END
$$;

CREATE OR REPLACE FUNCTION sliceplane_claim(claim_lo bigint, claim_hi bigint, claim_token bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	highest bigint;
	f record;
BEGIN
	-- Claims take turns (this mode conflicts with itself, not with the writers' FOR
	-- SHARE), and each statement below has a snapshot taken after the lock: a claim sees
	-- every claim committed before it, so the rows stay disjoint and a claim that lost a
	-- race to a higher one is refused rather than added beside it.
	LOCK TABLE sliceplane_fences IN SHARE ROW EXCLUSIVE MODE;
	SELECT max(o.token) INTO highest FROM (
		SELECT s.token FROM sliceplane_fences s
		WHERE s.lo <= claim_hi AND s.hi >= claim_lo ORDER BY s.lo FOR UPDATE
	) o;
	IF highest > claim_token THEN
		RAISE EXCEPTION 'range [%, %] is fenced by token %, above %',
			sliceplane_point_text(claim_lo), sliceplane_point_text(claim_hi), highest, claim_token
			USING ERRCODE = 'SPFEN';
	END IF;
	-- Each overlapping row shrinks to its part outside the claim. Updating it, not only
	-- locking it, is what refuses a writer blocked on it: when this commits, the writer
	-- re-reads the row's new version, which no longer covers its point.
	FOR f IN SELECT s.lo, s.hi, s.token FROM sliceplane_fences s
		WHERE s.lo <= claim_hi AND s.hi >= claim_lo LOOP
		IF f.lo < claim_lo THEN
			UPDATE sliceplane_fences SET hi = claim_lo - 1 WHERE lo = f.lo AND hi = f.hi;
			IF f.hi > claim_hi THEN
				INSERT INTO sliceplane_fences (lo, hi, token) VALUES (claim_hi + 1, f.hi, f.token);
			END IF;
		ELSIF f.hi > claim_hi THEN
			UPDATE sliceplane_fences SET lo = claim_hi + 1 WHERE lo = f.lo AND hi = f.hi;
		ELSE
			DELETE FROM sliceplane_fences WHERE lo = f.lo AND hi = f.hi;
		END IF;
	END LOOP;
	INSERT INTO sliceplane_fences (lo, hi, token) VALUES (claim_lo, claim_hi, claim_token);
END
$$;
`

// staleCode is the SQLSTATE that PGSchema's functions raise for a stale token.
const staleCode = "SPFEN"

// PGDB is what the PostgreSQL helpers need of a connection; *pgxpool.Pool, *pgx.Conn and
// pgx.Tx have it.
type PGDB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// PGPoint returns the bigint that stands for point p in PostgreSQL: p with its top bit
// flipped, so that bigints order as the points do.
func PGPoint(p uint64) int64 { return int64(p ^ 1<<63) }

// PGClaim records that token now holds r, and refuses, with an error wrapping ErrStale,
// if any part of r holds a higher token already. A new primary calls it when it takes the
// role, before it reads the range's state: once it returns, every write of an older token
// in r has either committed (and the read sees it) or will be refused. A claim with the
// token r holds already changes nothing.
//
// It is one statement, so one transaction unless db is a pgx.Tx; in one, its locks last
// until that transaction ends, a refusal aborts it, and its isolation should be READ
// COMMITTED (under REPEATABLE READ a concurrent claim or write makes it fail with a
// serialization error).
func PGClaim(ctx context.Context, db PGDB, r client.Range, token uint64) error {
	lo, hi, err := pgBounds(r)
	if err != nil {
		return err
	}
	t, err := pgToken(token)
	if err != nil {
		return err
	}
	if _, err := db.Exec(ctx, "SELECT sliceplane_claim($1, $2, $3)", lo, hi, t); err != nil {
		return pgError(fmt.Sprintf("claiming %s with token %d", r, token), err)
	}
	return nil
}

// PGExec runs sql, a statement that changes the data at point (the Hash of the key it
// writes), if token is still the highest claimed for the point, and refuses it with an
// error wrapping ErrStale otherwise (a point never claimed included). The check and the
// statement go in one pgx.Batch: one round trip (two the first time pgx sees a statement
// on a connection, to prepare it), and, outside a transaction, one implicit transaction,
// so that the check's lock lasts until the write commits and a refused check aborts the
// write. Inside a pgx.Tx, the lock lasts until that transaction ends, and a refusal
// aborts it. (A transaction that writes in several ranges may then deadlock with a claim
// of them; PostgreSQL aborts one of the two after deadlock_timeout, and it can retry.)
func PGExec(ctx context.Context, db PGDB, point, token uint64, sql string, args ...any) (pgconn.CommandTag, error) {
	br, err := sendFenced(ctx, db, point, token, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		// The implicit transaction commits at the batch's end: an error there, a deferred
		// constraint's, say, comes with Close.
		err = cerr
	}
	if err != nil {
		return pgconn.CommandTag{}, fmt.Errorf("fence: writing at point %s: %w", client.BoundAt(point), err)
	}
	return tag, nil
}

// PGQueryRow is PGExec for a statement that returns a row, an INSERT ... RETURNING say:
// the row's Scan returns the fence's refusal, or scans the row. Call Scan, as with pgx's
// QueryRow: until then the statement's connection stays taken.
func PGQueryRow(ctx context.Context, db PGDB, point, token uint64, sql string, args ...any) pgx.Row {
	br, err := sendFenced(ctx, db, point, token, sql, args)
	return fencedRow{br: br, err: err, point: point}
}

type fencedRow struct {
	br    pgx.BatchResults
	err   error
	point uint64
}

func (r fencedRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	err := r.br.QueryRow().Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fence: writing at point %s: %w", client.BoundAt(r.point), err)
	}
	return nil
}

// sendFenced sends the fence check and sql in one batch and reads the check's result; on
// success the caller reads sql's and closes the batch.
func sendFenced(ctx context.Context, db PGDB, point, token uint64, sql string, args []any) (pgx.BatchResults, error) {
	t, err := pgToken(token)
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	b.Queue("SELECT sliceplane_fence($1, $2)", PGPoint(point), t)
	b.Queue(sql, args...)
	br := db.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		// The batch's later statement fails too, aborted; Close reports the same error.
		_ = br.Close()
		return nil, pgError(fmt.Sprintf("writing at point %s with token %d", client.BoundAt(point), token), err)
	}
	return br, nil
}

// pgBounds returns r's first and last points as PGPoint bigints.
func pgBounds(r client.Range) (lo, hi int64, err error) {
	if !r.Valid() {
		return 0, 0, fmt.Errorf("fence: range %s holds no point", r)
	}
	last := uint64(math.MaxUint64)
	if !r.End.IsEnd() {
		last = r.End.Point() - 1
	}
	return PGPoint(r.Start), PGPoint(last), nil
}

// pgToken returns token as a bigint, which holds tokens up to 2^63-1 only.
func pgToken(token uint64) (int64, error) {
	if token > math.MaxInt64 {
		return 0, fmt.Errorf("fence: token %d is above %d, the largest a PostgreSQL bigint holds", token, int64(math.MaxInt64))
	}
	return int64(token), nil
}

// pgError names what failed and turns the fence functions' SQLSTATE into ErrStale.
func pgError(what string, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == staleCode {
		return fmt.Errorf("fence: %s: %w: %s", what, ErrStale, pe.Message)
	}
	return fmt.Errorf("fence: %s: %w", what, err)
}
