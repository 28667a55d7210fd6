package postgres_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/faultproxy"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/source/postgres"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgcluster"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgtest"
)

// waitErr waits for the watch to end with an error, and returns it.
func (c *collector) waitErr(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(within):
		t.Fatalf("the watch did not end within %s", within)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Error(t, c.err, "the watch ended without an error")
	return c.err
}

// seen returns the highest clock the watch delivered whole.
func (c *collector) seen() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var seen uint64
	for _, b := range c.batches {
		if !b.More {
			seen = max(seen, b.Clock)
		}
	}
	return seen
}

// behindProxy starts a server with the default table, and a fault proxy in front of it; it
// returns the server and the DSN that reaches it through the proxy.
func behindProxy(t *testing.T) (*pgcluster.Cluster, *faultproxy.Proxy, string) {
	t.Helper()
	pg := pgtest.Start(t)
	require.NoError(t, postgres.Init(t.Context(), postgres.Config{DSN: pg.DSN}))
	u, err := url.Parse(pg.DSN)
	require.NoError(t, err)
	proxy, err := faultproxy.New(u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	u.Host = proxy.Addr()
	return pg, proxy, u.String()
}

// TestAFastRestartEndsTheStreamInOrder restarts the server as a minor-version upgrade does:
// the watch ends with source.ErrEnded (Unavailable, no failure), and a watch from the clock
// it reached resumes without a rescan (no ErrCompacted): nothing is rebuilt.
func TestAFastRestartEndsTheStreamInOrder(t *testing.T) {
	pg := pgtest.Start(t)
	ctx := t.Context()
	require.NoError(t, postgres.Init(ctx, postgres.Config{DSN: pg.DSN}))
	s, err := postgres.Open(ctx, postgres.Config{DSN: pg.DSN, Slot: "test"})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	from, err := s.Clock(ctx)
	require.NoError(t, err)
	w := watch(t, s, from)
	before, err := s.Put(ctx, []byte("before"), []byte("1"))
	require.NoError(t, err)
	w.until(t, s, before)

	require.NoError(t, pg.Restart(ctx, "fast"))
	err = w.waitErr(t, 30*time.Second)
	assert.ErrorIs(t, err, source.ErrEnded, "a fast shutdown ends the stream in order")
	assert.Equal(t, source.Unavailable, source.ClassOf(err))

	// A pooled connection the restart cut fails once: the error a caller retries.
	var after uint64
	require.Eventually(t, func() bool { after, err = s.Put(ctx, []byte("after"), []byte("2")); return err == nil },
		30*time.Second, 20*time.Millisecond, "%v", err)
	w2 := watch(t, s, w.seen())
	changes := w2.until(t, s, after)
	require.Len(t, changes, 1, "the watch resumes where it was: %v", changes)
	assert.Equal(t, "after", string(changes[0].Key))
}

// TestAStalledLinkIsUnavailableWithinTheTimeout puts the server behind a proxy that stops
// forwarding without resetting anything: the watch ends, the clock read fails, both within
// about Timeout and Unavailable, and Progress does not wait for the server. Once the link
// flows again, a watch resumes from where the first stopped.
func TestAStalledLinkIsUnavailableWithinTheTimeout(t *testing.T) {
	pg, proxy, dsn := behindProxy(t)
	ctx := t.Context()
	const timeout = 500 * time.Millisecond
	s, err := postgres.Open(ctx, postgres.Config{DSN: dsn, Slot: "test", Timeout: timeout})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	from, err := s.Clock(ctx)
	require.NoError(t, err)
	w := watch(t, s, from)
	w.until(t, s, from)

	proxy.Stall()
	start := time.Now()
	err = w.waitErr(t, 20*timeout)
	assert.Equal(t, source.Unavailable, source.ClassOf(err), "%v", err)
	_, err = s.Clock(ctx)
	assert.Equal(t, source.Unavailable, source.ClassOf(err), "%v", err)
	progressed := time.Now()
	require.NoError(t, s.Progress(ctx))
	assert.Less(t, time.Since(progressed), timeout/2, "Progress waited for a stalled server")
	t.Logf("the stall was noticed in %s (timeout %s)", time.Since(start).Round(time.Millisecond), timeout)

	proxy.Resume()
	direct, err := pgx.Connect(ctx, pg.DSN)
	require.NoError(t, err)
	defer direct.Close(ctx)
	_, err = direct.Exec(ctx, `INSERT INTO sliceplane_items (key, value, sp_hash) VALUES ('k', 'v', $1)`, postgres.HashColumn(keyspace.Hash([]byte("k"))))
	require.NoError(t, err)
	var last uint64
	require.Eventually(t, func() bool { last, err = s.Clock(ctx); return err == nil }, 30*time.Second, 50*time.Millisecond)
	w2 := watch(t, s, w.seen())
	changes := w2.until(t, s, last)
	require.Len(t, changes, 1)
	assert.Equal(t, "k", string(changes[0].Key))
}

// TestADroppedPublicationIsMisconfigured drops the publication under a watch: the watch
// ends Misconfigured, naming the publication, and never as ErrCompacted (which would
// rescan every node, to no avail, again and again).
func TestADroppedPublicationIsMisconfigured(t *testing.T) {
	s, dsn := open(t, postgres.Config{})
	ctx := t.Context()
	from, err := s.Clock(ctx)
	require.NoError(t, err)
	w := watch(t, s, from)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP PUBLICATION sliceplane")
	require.NoError(t, err)
	_, err = s.Put(ctx, []byte("a"), []byte("1"))
	require.NoError(t, err)
	err = w.waitErr(t, 30*time.Second)
	assert.Equal(t, source.Misconfigured, source.ClassOf(err), "%v", err)
	assert.False(t, errors.Is(err, source.ErrCompacted))
	assert.Contains(t, err.Error(), "sliceplane")
}

// TestASourceStartsWithoutItsServer makes a source while the server is down: New needs no
// server, Check says Unavailable, and the first read after the server is back checks and
// works.
func TestASourceStartsWithoutItsServer(t *testing.T) {
	_, proxy, dsn := behindProxy(t)
	ctx := t.Context()
	proxy.Stall()
	s, err := postgres.New(postgres.Config{DSN: dsn, Slot: "test", Timeout: 300 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	err = s.Check(ctx)
	assert.Equal(t, source.Unavailable, source.ClassOf(err), "%v", err)
	proxy.Resume()
	var items int
	require.Eventually(t, func() bool {
		_, err = s.Scan(ctx, keyspace.Full(), 0, func(source.Item) error { items++; return nil })
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "%v", err)
}

// TestAnIdleStreamSaysItLives checks that a watch with nothing to deliver still delivers
// a mark every Status or so: a reader tells an idle source from one it cannot reach.
func TestAnIdleStreamSaysItLives(t *testing.T) {
	s, _ := open(t, postgres.Config{Status: 50 * time.Millisecond})
	ctx := t.Context()
	from, err := s.Clock(ctx)
	require.NoError(t, err)
	w := watch(t, s, from)
	w.until(t, s, from)
	w.mu.Lock()
	n := len(w.batches)
	w.mu.Unlock()
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.batches) >= n+5
	}, 10*time.Second, 10*time.Millisecond, "an idle watch delivered no marks")
}

func TestCheckClassifiesWhatCannotWork(t *testing.T) {
	pg := pgtest.Start(t)
	ctx := t.Context()
	_, err := postgres.Open(ctx, postgres.Config{DSN: pg.DSN, Table: "nope"})
	assert.Equal(t, source.Misconfigured, source.ClassOf(err), "%v", err)
	u, err := url.Parse(pg.DSN)
	require.NoError(t, err)
	u.Path = "/nodb"
	_, err = postgres.Open(ctx, postgres.Config{DSN: u.String()})
	assert.Equal(t, source.Misconfigured, source.ClassOf(err), "no such database: %v", err)
	_, err = postgres.New(postgres.Config{DSN: "postgres://x:y@[::1"})
	assert.Equal(t, source.Misconfigured, source.ClassOf(err), "a DSN that does not parse: %v", err)
	u.Path, u.Host = "/sliceplane", "127.0.0.1:1"
	_, err = postgres.Open(ctx, postgres.Config{DSN: u.String()})
	assert.Equal(t, source.Unavailable, source.ClassOf(err), "nothing listens: %v", err)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = postgres.Open(cctx, postgres.Config{DSN: pg.DSN})
	assert.Equal(t, source.Unavailable, source.ClassOf(err), "a context that ended: %v", err)
}
