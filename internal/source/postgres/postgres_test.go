package postgres_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/source/postgres"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgcluster"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// open starts a server, creates the default table and opens a source with a slot.
func open(t *testing.T, cfg postgres.Config) (*postgres.Source, string) {
	t.Helper()
	pg := pgtest.Start(t)
	cfg.DSN = pg.DSN
	require.NoError(t, postgres.Init(t.Context(), cfg))
	if cfg.Slot == "" {
		cfg.Slot = "test"
	}
	s, err := postgres.Open(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s, pg.DSN
}

// collector gathers what a watch delivers.
type collector struct {
	mu      sync.Mutex
	batches []source.Batch
	err     error
	done    chan struct{}
}

func watch(t *testing.T, s *postgres.Source, from uint64) *collector {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &collector{done: make(chan struct{})}
	ch := s.Watch(ctx, from)
	go func() {
		defer close(c.done)
		for b := range ch {
			c.mu.Lock()
			if b.Err != nil {
				c.err = b.Err
			} else {
				c.batches = append(c.batches, b)
			}
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-c.done })
	return c
}

// until waits for the watch to have delivered everything up to clock, asking for progress.
func (c *collector) until(t *testing.T, s *postgres.Source, clock uint64) []source.Change {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.mu.Lock()
		var seen uint64
		var changes []source.Change
		for _, b := range c.batches {
			if !b.More {
				seen = max(seen, b.Clock)
			}
			changes = append(changes, b.Changes...)
		}
		err := c.err
		c.mu.Unlock()
		require.NoError(t, err)
		if seen >= clock {
			return changes
		}
		require.True(t, time.Now().Before(deadline), "the watch reached %d of %d", seen, clock)
		require.NoError(t, s.Progress(t.Context()))
		time.Sleep(10 * time.Millisecond) // a poll with a deadline, not a wait for luck
	}
}

func scanAll(t *testing.T, s *postgres.Source, r keyspace.Range, at uint64) ([]source.Item, uint64) {
	t.Helper()
	var items []source.Item
	clock, err := s.Scan(t.Context(), r, at, func(it source.Item) error { items = append(items, it); return nil })
	require.NoError(t, err)
	return items, clock
}

func TestWatchDeliversCommittedChangesInOrder(t *testing.T) {
	s, _ := open(t, postgres.Config{})
	ctx := t.Context()
	from, err := s.Clock(ctx)
	require.NoError(t, err)
	w := watch(t, s, from)

	_, err = s.PutRows(ctx, []postgres.Row{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("a"), Fragment: "f1", Value: []byte("x")}})
	require.NoError(t, err)
	_, err = s.Put(ctx, []byte("b"), []byte("2"))
	require.NoError(t, err)
	_, err = s.Put(ctx, []byte("a"), []byte("3"))
	require.NoError(t, err)
	_, err = s.DeleteFragment(ctx, []byte("a"), "f1")
	require.NoError(t, err)
	last, err := s.Delete(ctx, []byte("b"))
	require.NoError(t, err)

	changes := w.until(t, s, last)
	var got []string
	var clocks []uint64
	for _, c := range changes {
		switch {
		case c.Delete:
			got = append(got, fmt.Sprintf("delete %s/%s", c.Key, c.Fragment))
		default:
			got = append(got, fmt.Sprintf("put %s/%s=%s", c.Key, c.Fragment, c.Value))
		}
		assert.Equal(t, keyspace.Hash(c.Key), c.Hash, "the hash of %q", c.Key)
		clocks = append(clocks, c.Clock)
	}
	assert.Equal(t, []string{"put a/=1", "put a/f1=x", "put b/=2", "put a/=3", "delete a/f1", "delete b/"}, got)
	assert.True(t, slices.IsSorted(clocks), "clocks in order: %v", clocks)
	assert.Equal(t, clocks[0], clocks[1], "one transaction, one clock")
	assert.Greater(t, clocks[2], clocks[1])
	for _, c := range clocks {
		assert.Greater(t, c, from)
		assert.LessOrEqual(t, c, last, "a write's clock is at or after its change's")
	}

	items, at := scanAll(t, s, keyspace.Full(), last)
	assert.GreaterOrEqual(t, at, last)
	require.Len(t, items, 1)
	assert.Equal(t, "a", string(items[0].Key))
	assert.Equal(t, "3", string(items[0].Value))
	assert.Empty(t, items[0].Fragments)
}

func TestScanReadsRangesInHashOrderAcrossChunks(t *testing.T) {
	s, _ := open(t, postgres.Config{ChunkRows: 3})
	ctx := t.Context()
	var rows []postgres.Row
	for i := range 40 {
		rows = append(rows, postgres.Row{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d", i)})
		if i%5 == 0 {
			rows = append(rows, postgres.Row{Key: fmt.Appendf(nil, "k%d", i), Fragment: "f", Value: []byte("frag")})
		}
	}
	last, err := s.Copy(ctx, rows)
	require.NoError(t, err)

	whole, _ := scanAll(t, s, keyspace.Full(), last)
	require.Len(t, whole, 40)
	assert.True(t, slices.IsSortedFunc(whole, func(a, b source.Item) int { return cmp.Compare(a.Hash, b.Hash) }))
	frags := 0
	for _, it := range whole {
		assert.True(t, it.Exists)
		frags += len(it.Fragments)
	}
	assert.Equal(t, 8, frags)

	// Four ranges cover the space: together they read every item once.
	cuts := []uint64{0, 1 << 62, 1 << 63, 3 << 62}
	var parts []source.Item
	for i, c := range cuts {
		r := keyspace.Range{Start: c, End: keyspace.End}
		if i+1 < len(cuts) {
			r.End = keyspace.At(cuts[i+1])
		}
		items, _ := scanAll(t, s, r, last)
		for _, it := range items {
			assert.True(t, r.Contains(it.Hash), "%q (%x) in %s", it.Key, it.Hash, r)
		}
		parts = append(parts, items...)
	}
	assert.Equal(t, whole, parts)
}

func TestALargeTransactionComesInParts(t *testing.T) {
	s, _ := open(t, postgres.Config{})
	ctx := t.Context()
	from, err := s.Clock(ctx)
	require.NoError(t, err)
	w := watch(t, s, from)
	var rows []postgres.Row
	for i := range 10_000 {
		rows = append(rows, postgres.Row{Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")})
	}
	last, err := s.Copy(ctx, rows)
	require.NoError(t, err)
	changes := w.until(t, s, last)
	require.Len(t, changes, 10_000)
	w.mu.Lock()
	defer w.mu.Unlock()
	parts := 0
	for _, b := range w.batches {
		if len(b.Changes) > 0 {
			parts++
			assert.Equal(t, changes[0].Clock, b.Clock, "one transaction, one clock")
		}
	}
	assert.Greater(t, parts, 1, "a COPY of 10,000 rows comes in several batches")
}

func TestProgressReachesTheClockOfAnIdleServer(t *testing.T) {
	s, _ := open(t, postgres.Config{})
	ctx := t.Context()
	from, err := s.Clock(ctx)
	require.NoError(t, err)
	w := watch(t, s, from)
	_, err = s.Put(ctx, []byte("a"), []byte("1"))
	require.NoError(t, err)
	clock, err := s.Clock(ctx)
	require.NoError(t, err)
	w.until(t, s, clock)
}

func TestAWatchFromBeforeTheSlotIsCompacted(t *testing.T) {
	s, dsn := open(t, postgres.Config{})
	ctx := t.Context()
	before, err := s.Clock(ctx)
	require.NoError(t, err)
	_, err = s.Put(ctx, []byte("a"), []byte("1"))
	require.NoError(t, err)

	// The slot goes (an operator dropped it, or it lost its WAL): the next watch makes a
	// new one, which cannot give the changes before it.
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SELECT pg_drop_replication_slot('test')")
	require.NoError(t, err)
	w := watch(t, s, before)
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.err != nil
	}, 30*time.Second, 10*time.Millisecond)
	assert.ErrorIs(t, w.err, source.ErrCompacted)

	// From a clock after the new slot's start, it watches again.
	now, err := s.Clock(ctx)
	require.NoError(t, err)
	w2 := watch(t, s, now)
	last, err := s.Put(ctx, []byte("b"), []byte("2"))
	require.NoError(t, err)
	changes := w2.until(t, s, last)
	require.Len(t, changes, 1)
	assert.Equal(t, "b", string(changes[0].Key))
}

func TestRowsPlacedAtTheWrongHashAreSkipped(t *testing.T) {
	var mu sync.Mutex
	rejected := map[source.RejectReason]int{}
	s, dsn := open(t, postgres.Config{Rejected: func(r source.RejectReason) { mu.Lock(); rejected[r]++; mu.Unlock() }})
	ctx := t.Context()
	from, err := s.Clock(ctx)
	require.NoError(t, err)
	w := watch(t, s, from)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "INSERT INTO sliceplane_items (key, value, sp_hash) VALUES ('bad', 'x', 42)")
	require.NoError(t, err)
	last, err := s.Put(ctx, []byte("good"), []byte("y"))
	require.NoError(t, err)
	changes := w.until(t, s, last)
	require.Len(t, changes, 1)
	assert.Equal(t, "good", string(changes[0].Key))
	items, _ := scanAll(t, s, keyspace.Full(), last)
	require.Len(t, items, 1)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 2, rejected[source.RejectHashMismatch], "once by the watch, once by the scan")
}

func TestOpenRefusesWhatCannotWork(t *testing.T) {
	pg := pgtest.Start(t)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, pg.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE TABLE users (id serial PRIMARY KEY, name text UNIQUE, profile jsonb, sp_hash bigint);
		CREATE TABLE wrong (key text PRIMARY KEY, value text, sp_hash integer)`)
	require.NoError(t, err)
	for _, tc := range []struct {
		cfg  postgres.Config
		want string
	}{
		{postgres.Config{Table: "nope"}, "table nope does not exist"},
		{postgres.Config{Table: "users", Columns: postgres.Columns{Key: "name", Value: "profile", Hash: "sp_hash"}}, `lacks column "name"`},
		{postgres.Config{Table: "users", Columns: postgres.Columns{Key: "id", Value: "nope", Hash: "sp_hash"}}, `no value column "nope"`},
		{postgres.Config{Table: "wrong", Columns: postgres.Columns{Key: "key", Value: "value", Hash: "sp_hash"}}, "want bigint"},
		{postgres.Config{Table: "a;b"}, "plain identifiers"},
		{postgres.Config{Table: "users", Slot: "Bad-Slot"}, `slot "Bad-Slot"`},
	} {
		tc.cfg.DSN = pg.DSN
		_, err := postgres.Open(ctx, tc.cfg)
		if assert.Error(t, err, "%+v", tc.cfg) {
			assert.Contains(t, err.Error(), tc.want)
		}
	}
	// A table keyed by another column works with REPLICA IDENTITY FULL, text keys and a
	// jsonb value read as text.
	_, err = conn.Exec(ctx, "ALTER TABLE users REPLICA IDENTITY FULL")
	require.NoError(t, err)
	s, err := postgres.Open(ctx, postgres.Config{DSN: pg.DSN, Table: "users", Columns: postgres.Columns{Key: "name", Value: "profile", Hash: "sp_hash"}})
	require.NoError(t, err)
	defer s.Close()
	_, err = conn.Exec(ctx, `INSERT INTO users (name, profile) VALUES ('ann', '{"age": 3}'), ('bob', '{}')`)
	require.NoError(t, err)
	n, err := s.Backfill(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	items, _ := scanAll(t, s, keyspace.Full(), 0)
	require.Len(t, items, 2)
	byKey := map[string]string{}
	for _, it := range items {
		byKey[string(it.Key)] = string(it.Value)
	}
	assert.Equal(t, map[string]string{"ann": `{"age": 3}`, "bob": `{}`}, byKey)
}

func TestSlotNames(t *testing.T) {
	assert.Equal(t, "sliceplane_d1", postgres.SlotName("d1"))
	a, b := postgres.SlotName("d-1"), postgres.SlotName("d_1")
	assert.NotEqual(t, a, b, "IDs that differ get different slots")
	assert.Regexp(t, `^[a-z0-9_]{1,63}$`, a)
	assert.Regexp(t, `^[a-z0-9_]{1,63}$`, postgres.SlotName(string(make([]byte, 200))))
	assert.Equal(t, uint64(0), postgres.HashOf(postgres.HashColumn(0)))
	assert.Less(t, postgres.HashColumn(1<<63-1), postgres.HashColumn(1<<63), "the column orders as the hash")
	assert.True(t, errors.Is(fmt.Errorf("x: %w", source.ErrCompacted), source.ErrCompacted))
}

// The source talks TLS to the server when the DSN asks for it, for queries and for
// replication alike, and refuses a server its CA did not sign.
func TestTheSourceSpeaksTLS(t *testing.T) {
	dir := t.TempDir()
	pki, err := launch.NewPKI(filepath.Join(dir, "pki"), 0)
	require.NoError(t, err)
	server, err := pki.Issue("distributor", "postgres")
	require.NoError(t, err)
	ctx := t.Context()
	pg, err := pgcluster.Start(ctx, filepath.Join(dir, "pg"), pgcluster.Options{CertFile: server.Cert, KeyFile: server.Key})
	if errors.Is(err, pgcluster.ErrNoServer) {
		t.Skip(err)
	}
	require.NoError(t, err)
	defer pg.Stop()
	dsn := fmt.Sprintf("postgres://sliceplane@127.0.0.1:%d/sliceplane?sslmode=verify-full&sslrootcert=%s", pg.Port, server.CA)
	require.NoError(t, postgres.Init(ctx, postgres.Config{DSN: dsn}))
	s, err := postgres.Open(ctx, postgres.Config{DSN: dsn, Slot: "tls"})
	require.NoError(t, err)
	defer s.Close()
	from, err := s.Clock(ctx)
	require.NoError(t, err)
	w := watch(t, s, from)
	last, err := s.Put(ctx, []byte("k"), []byte("v"))
	require.NoError(t, err)
	require.Len(t, w.until(t, s, last), 1, "the change came over a TLS replication connection")
	var ssl bool
	require.NoError(t, s.Pool().QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl))
	assert.True(t, ssl)

	other, err := launch.NewPKI(filepath.Join(dir, "other"), 0)
	require.NoError(t, err)
	stranger, err := other.Issue("admin", "x")
	require.NoError(t, err)
	bad := fmt.Sprintf("postgres://sliceplane@127.0.0.1:%d/sliceplane?sslmode=verify-full&sslrootcert=%s", pg.Port, stranger.CA)
	_, err = postgres.Open(ctx, postgres.Config{DSN: bad})
	require.Error(t, err, "a server certificate of another CA is refused")
}
