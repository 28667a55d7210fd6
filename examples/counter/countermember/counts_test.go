package countermember

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/fence"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgtest"
)

// TestAPausedPrimaryIsFenced pauses a primary in the middle of an increment, past its lease:
// meanwhile the range goes to another member with a higher token, which claims it, loads the
// count and increments it. When the paused one resumes, PostgreSQL refuses its write, and it
// answers ErrFenced (409), not a count the new primary also answers. Without the fence the
// same history acknowledges one count twice.
func TestAPausedPrimaryIsFenced(t *testing.T) {
	pg := pgtest.Start(t)
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, pg.DSN)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, Schema+fence.PGSchema)
	require.NoError(t, err)
	for _, fenced := range []bool{true, false} {
		_, err := pool.Exec(ctx, "TRUNCATE counters; TRUNCATE sliceplane_fences")
		require.NoError(t, err)
		old, fresh := NewCounts(pool, 0, fenced, slog.New(slog.DiscardHandler)), NewCounts(pool, 0, fenced, slog.New(slog.DiscardHandler))
		all := client.FullRange()
		require.NoError(t, old.Acquire(ctx, all, client.Grant{Role: client.RolePrimary, Token: 2}))
		n, err := old.Incr(ctx, "k", client.Grant{Role: client.RolePrimary, Token: 2})
		require.NoError(t, err)
		require.Equal(t, int64(1), n)

		paused, resume := make(chan struct{}), make(chan struct{})
		old.beforeWrite = func() { close(paused); <-resume }
		type answer struct {
			n   int64
			err error
		}
		stale := make(chan answer, 1)
		go func() {
			n, err := old.Incr(context.Background(), "k", client.Grant{Role: client.RolePrimary, Token: 2})
			stale <- answer{n, err}
		}()
		select {
		case <-paused:
		case <-time.After(30 * time.Second):
			t.Fatal("the old primary's increment did not start")
		}
		// The old primary's lease ran out while it was paused: the range is the new one's.
		require.NoError(t, fresh.Acquire(ctx, all, client.Grant{Role: client.RolePrimary, Token: 7}))
		n, err = fresh.Incr(ctx, "k", client.Grant{Role: client.RolePrimary, Token: 7})
		require.NoError(t, err)
		assert.Equal(t, int64(2), n, "the new primary loaded the count the old one left")
		close(resume)
		got := <-stale
		if fenced {
			require.ErrorIs(t, got.err, ErrFenced, "PostgreSQL refuses the paused primary's write")
			require.ErrorIs(t, got.err, fence.ErrStale)
		} else {
			require.NoError(t, got.err)
			assert.Equal(t, int64(2), got.n, "without the fence, count 2 is answered twice")
		}
		stored, err := Stored(ctx, pool)
		require.NoError(t, err)
		assert.Equal(t, int64(2), stored["k"], "fenced %t", fenced)
	}
}
