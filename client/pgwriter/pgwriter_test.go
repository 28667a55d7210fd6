package pgwriter_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/pgwriter"
	"github.com/sliceplane/sliceplane/internal/source/postgres"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgtest"
)

func TestHashOrdersAsTheKeysHash(t *testing.T) {
	a, b := []byte("alpha"), []byte("beta")
	ha, hb := client.Hash(a), client.Hash(b)
	assert.Equal(t, ha < hb, pgwriter.Hash(a) < pgwriter.Hash(b), "the column orders as the hash")
}

// An application's own SQL and the writer fill the same placement column.
func TestTheWriterAndSQLAgree(t *testing.T) {
	pg := pgtest.Start(t)
	ctx := t.Context()
	require.NoError(t, postgres.Init(ctx, postgres.Config{DSN: pg.DSN}))
	w, err := pgwriter.Open(ctx, pgwriter.Config{DSN: pg.DSN})
	require.NoError(t, err)
	defer w.Close()
	_, err = w.Put(ctx, []byte("k1"), []byte("v1"))
	require.NoError(t, err)
	_, err = w.PutFragment(ctx, []byte("k1"), "f", []byte("x"))
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, pg.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var h int64
	require.NoError(t, conn.QueryRow(ctx, "SELECT sp_hash FROM sliceplane_items WHERE key = 'k1' AND fragment = ''").Scan(&h))
	assert.Equal(t, pgwriter.Hash([]byte("k1")), h)
	_, err = w.Delete(ctx, []byte("k1"))
	require.NoError(t, err)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM sliceplane_items").Scan(&n))
	assert.Zero(t, n, "Delete takes the fragments too")
}
