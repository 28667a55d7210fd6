package slicectl

import (
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/source/postgres"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgtest"
)

// An existing table is prepared as an operator would: the placement column added by hand,
// backfilled by slicectl, then read back as a source; status tells the rows without a
// placement before and none after.
func TestPGBackfillsAnExistingTable(t *testing.T) {
	pg := pgtest.Start(t)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, pg.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE TABLE users (name text PRIMARY KEY, profile jsonb);
		INSERT INTO users SELECT 'user' || i, ('{"n": ' || i || '}')::jsonb FROM generate_series(1, 250) i;
		ALTER TABLE users ADD COLUMN sp_hash bigint; CREATE INDEX ON users (sp_hash)`)
	require.NoError(t, err)
	flags := []string{"--pg-dsn", pg.DSN, "--pg-table", "users", "--pg-key-column", "name", "--pg-value-column", "profile", "--pg-fragment-column", ""}

	out, _, err := run(t, append([]string{"pg", "status", "-o", "json"}, flags...)...)
	require.NoError(t, err)
	var st postgres.Status
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	assert.Equal(t, int64(250), st.Rows)
	assert.Equal(t, int64(250), st.Unplaced)

	out, _, err = run(t, append([]string{"pg", "backfill", "--batch", "100"}, flags...)...)
	require.NoError(t, err)
	assert.Equal(t, "filled 250 rows\n", out)
	out, _, err = run(t, append([]string{"pg", "status"}, flags...)...)
	require.NoError(t, err)
	assert.Contains(t, out, "250 rows, 0 without a placement value")

	s, err := postgres.Open(ctx, postgres.Config{DSN: pg.DSN, Table: "users",
		Columns: postgres.Columns{Key: "name", Value: "profile", Hash: "sp_hash"}})
	require.NoError(t, err)
	defer s.Close()
	n := 0
	_, err = s.Scan(ctx, keyspace.Full(), 0, func(it source.Item) error {
		assert.Equal(t, keyspace.Hash(it.Key), it.Hash)
		n++
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, 250, n, "every row is found by its placement")
}

func TestPGInitAndItsErrors(t *testing.T) {
	_, _, err := run(t, "pg", "init")
	require.ErrorContains(t, err, "--pg-dsn is required")
	_, _, err = run(t, "pg", "init", "--pg-dsn", "host=x", "--pg-table", "bad name")
	require.ErrorContains(t, err, "plain identifiers")

	pg := pgtest.Start(t)
	out, _, err := run(t, "pg", "init", "--pg-dsn", pg.DSN)
	require.NoError(t, err)
	assert.Equal(t, "table sliceplane_items and publication sliceplane ready\n", out)
	out, _, err = run(t, "pg", "init", "--pg-dsn", pg.DSN)
	require.NoError(t, err, "init again changes nothing")
	assert.Contains(t, out, "ready")
	out, _, err = run(t, "pg", "status", "--pg-dsn", pg.DSN)
	require.NoError(t, err)
	assert.Contains(t, out, "0 rows, 0 without a placement value")
	assert.Contains(t, out, "publication  true")
}
