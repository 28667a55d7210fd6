package etcdstate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sliceplane/sliceplane/internal/assigner/core"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testCtx bounds a test's calls, to catch a hang only: a test of 150k-slice maps takes over
// a minute under the race detector on a busy 2-core machine.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// lead wins an election on c and returns its fence and a function that gives it up.
func lead(t *testing.T, c *clientv3.Client) (Fence, func()) {
	t.Helper()
	s, err := concurrency.NewSession(c, concurrency.WithTTL(5))
	require.NoError(t, err)
	e := concurrency.NewElection(s, "/test/election")
	require.NoError(t, e.Campaign(testCtx(t), "me"))
	return Fence{Key: e.Key(), Rev: e.Rev()}, func() { s.Close() }
}

func nodes(n int) []assignment.NodeID {
	out := make([]assignment.NodeID, n)
	for i := range out {
		out[i] = assignment.NodeID(fmt.Sprintf("node-%04d", i))
	}
	return out
}

func uniform(t *testing.T, slices, n int) *assignment.Assignment {
	t.Helper()
	ids := nodes(n)
	a, err := assignment.Uniform(slices, func(i int) []assignment.NodeID { return ids[i%n : i%n+1] })
	require.NoError(t, err)
	return a
}

// step applies ops to a, logs them as the next entry and returns the new map and meta.
func step(t *testing.T, s *Store, f Fence, m core.Meta, a *assignment.Assignment, ops []assignment.Op, moves []balance.Move) (*assignment.Assignment, core.Meta) {
	t.Helper()
	next, err := a.Apply(ops)
	require.NoError(t, err)
	m.LastIndex++
	m.Seq++
	m.Generation = next.Generation()
	e := core.Entry{Index: m.LastIndex, Term: m.Term, Seq: m.Seq, Generation: m.Generation, Cause: "test", Time: time.Now(), Ops: ops, Moves: moves}
	require.NoError(t, s.Append(testCtx(t), f, m, e))
	return next, m
}

func TestStateRoundTrips(t *testing.T) {
	c := etcdtest.New(t)
	s := New(c, "/sp/")
	ctx := testCtx(t)
	_, found, err := s.Load(ctx)
	require.NoError(t, err)
	assert.False(t, found, "a fresh etcd holds no state")

	f, _ := lead(t, c)
	a := uniform(t, 8, 3)
	m := core.Meta{Term: 5, Algorithm: "weighted-move", Params: map[string]string{"max_churn": "0.05"},
		Frozen: true, FreezeReason: "maintenance", Pins: []keyspace.Range{a.Slice(2).Range}, Draining: []assignment.NodeID{"node-0001"}, Pass: 12,
		Quarantined: []core.Quarantine{{Range: a.Slice(5).Range, Since: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC), Nodes: []assignment.NodeID{"node-0002", "node-0000"}}}}
	require.NoError(t, s.Init(ctx, f, m, a))
	a, m = step(t, s, f, m, a, []assignment.Op{assignment.Split{Slice: 0, At: 7}}, nil)
	move := balance.Move{Range: a.Slice(3).Range, From: "node-0002", To: "node-0000", Pass: 12}
	a, m = step(t, s, f, m, a, []assignment.Op{assignment.Assign{Slice: a.Slice(3).Range.Start, Replicas: []assignment.NodeID{"node-0000"}}}, []balance.Move{move})
	require.NoError(t, s.PutNode(ctx, f, core.Node{Node: assignment.Node{ID: "node-0000", Capacity: 2}, Address: "127.0.0.1:9000", Labels: map[string]string{"zone": "a"}}))
	require.NoError(t, s.PutNode(ctx, f, core.Node{Node: assignment.Node{ID: "node-0001"}}))
	require.NoError(t, s.DeleteNode(ctx, f, "node-0001"))

	st, found, err := s.Load(ctx)
	require.NoError(t, err)
	require.True(t, found)
	assert.True(t, st.Assignment.Equal(a))
	assert.Equal(t, a.Generation(), st.Assignment.Generation())
	assert.Equal(t, m, st.Meta)
	assert.Equal(t, []balance.Move{move}, st.History)
	assert.Equal(t, []core.Node{{Node: assignment.Node{ID: "node-0000", Capacity: 2}, Address: "127.0.0.1:9000", Labels: map[string]string{"zone": "a"}}}, st.Nodes)
}

func TestLargeMapsAndEntriesAreStoredInParts(t *testing.T) {
	c := etcdtest.New(t)
	s := New(c, "/sp/")
	ctx := testCtx(t)
	f, _ := lead(t, c)
	writes := 0
	s.Observe = func(string, time.Duration) { writes++ }

	a := uniform(t, 150_000, 1000) // about 4 MB encoded: several parts, several transactions
	m := core.Meta{Term: 1}
	require.NoError(t, s.Init(ctx, f, m, a))
	assert.Greater(t, writes, 2, "the snapshot needed several transactions")

	// An entry moving 20k slices is too large to write inline.
	var ops []assignment.Op
	for i := range 20_000 {
		ops = append(ops, assignment.Assign{Slice: a.Slice(i * 7).Range.Start, Replicas: []assignment.NodeID{"node-0999", "node-0998"}})
	}
	a, m = step(t, s, f, m, a, ops, nil)
	st, _, err := s.Load(ctx)
	require.NoError(t, err)
	assert.True(t, st.Assignment.Equal(a))

	// A snapshot folds the log, dropping entries older than Keep behind it.
	for range core.Keep + 5 {
		last := a.Slice(a.Len() - 1).Range
		mid, _ := last.Midpoint()
		a, m = step(t, s, f, m, a, []assignment.Op{assignment.Split{Slice: last.Start, At: mid}}, []balance.Move{{Range: last, To: "x", Pass: m.LastIndex}})
	}
	require.NoError(t, s.Snapshot(ctx, f, m.LastIndex, a))
	snapshotAt := m.LastIndex
	a, m = step(t, s, f, m, a, []assignment.Op{assignment.Assign{Slice: 0, Replicas: []assignment.NodeID{"node-0001"}}}, nil)
	st, _, err = s.Load(ctx)
	require.NoError(t, err)
	assert.True(t, st.Assignment.Equal(a))
	assert.Len(t, st.History, core.Keep, "the moves of the last Keep entries before the snapshot")
	assert.Equal(t, snapshotAt, st.SnapshotIndex)
	logs, err := c.Get(ctx, "/sp/log/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	heads := 0
	for _, kv := range logs.Kvs {
		if len(kv.Key) == len("/sp/log/00000000000000000000") {
			heads++
		}
	}
	assert.Equal(t, core.Keep+1, heads)
}

func TestAFormerLeaderIsFencedOff(t *testing.T) {
	c := etcdtest.New(t)
	s := New(c, "/sp/")
	ctx := testCtx(t)
	old, resign := lead(t, c)
	a := uniform(t, 4, 2)
	require.NoError(t, s.Init(ctx, old, core.Meta{Term: 1}, a))
	resign()
	now, _ := lead(t, c)
	require.NotEqual(t, old, now)

	m := core.Meta{Term: 1, LastIndex: 1, Seq: 1, Generation: 1}
	e := core.Entry{Index: 1, Term: 1, Seq: 1, Generation: 1, Ops: []assignment.Op{assignment.Merge{Left: 0}}}
	assert.ErrorIs(t, s.Append(ctx, old, m, e), ErrFenced)
	assert.ErrorIs(t, s.SaveMeta(ctx, old, m), ErrFenced)
	assert.ErrorIs(t, s.PutNode(ctx, old, core.Node{Node: assignment.Node{ID: "x"}}), ErrFenced)
	big := uniform(t, 100_000, 10)
	assert.ErrorIs(t, s.Snapshot(ctx, old, 1, big), ErrFenced, "even the parts of a large value are fenced")

	st, _, err := s.Load(ctx)
	require.NoError(t, err)
	assert.True(t, st.Assignment.Equal(a), "the deposed leader changed nothing")
	require.NoError(t, s.SaveMeta(ctx, now, core.Meta{Term: 2}))
}

func TestUncommittedPartsAreIgnoredAndMissingEntriesDetected(t *testing.T) {
	c := etcdtest.New(t)
	s := New(c, "/sp/")
	ctx := testCtx(t)
	f, _ := lead(t, c)
	a := uniform(t, 4, 2)
	require.NoError(t, s.Init(ctx, f, core.Meta{Term: 1}, a))
	// A leader died after writing the parts of entry 1 but before its commit.
	_, err := s.writeValue(ctx, f, s.logKey(1), make([]byte, 3*partSize))
	require.NoError(t, err)
	st, _, err := s.Load(ctx)
	require.NoError(t, err)
	assert.True(t, st.Assignment.Equal(a))
	// The next leader writes entry 1 afresh, smaller: the stale parts do not matter.
	a2, _ := step(t, s, f, core.Meta{Term: 2}, a, []assignment.Op{assignment.Assign{Slice: 0, Replicas: []assignment.NodeID{"node-0001"}}}, nil)
	st, _, err = s.Load(ctx)
	require.NoError(t, err)
	assert.True(t, st.Assignment.Equal(a2))

	_, err = c.Delete(ctx, s.logKey(1))
	require.NoError(t, err)
	_, _, err = s.Load(ctx)
	assert.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), "log entry 1 is missing")
}

func TestSnapshotsMayLagBehindAppends(t *testing.T) {
	c := etcdtest.New(t)
	s := New(c, "/sp/")
	ctx := testCtx(t)
	f, _ := lead(t, c)
	a := uniform(t, 8, 2)
	m := core.Meta{Term: 1}
	require.NoError(t, s.Init(ctx, f, m, a))
	var maps []*assignment.Assignment
	for range 5 {
		last := a.Slice(a.Len() - 1).Range
		mid, _ := last.Midpoint()
		a, m = step(t, s, f, m, a, []assignment.Op{assignment.Split{Slice: last.Start, At: mid}}, nil)
		maps = append(maps, a)
	}
	// The snapshot of entry 3 is written while entries 4 and 5 are already stored.
	require.NoError(t, s.Snapshot(ctx, f, 3, maps[2]))
	st, _, err := s.Load(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), st.SnapshotIndex)
	assert.True(t, st.Assignment.Equal(a), "entries 4 and 5 replay onto the snapshot")
	assert.Equal(t, uint64(5), st.Meta.LastIndex)
}

// A leader retries a write whose outcome it does not know (the request timed out in an etcd
// election, but may have been applied): every write, run twice, succeeds the second time and
// leaves the state as once, with no entry logged twice.
func TestWritesMayRunTwice(t *testing.T) {
	c := etcdtest.New(t)
	s := New(c, "/sp/")
	ctx := testCtx(t)
	f, _ := lead(t, c)
	a := uniform(t, 8000, 3) // large enough to be written in parts
	m := core.Meta{Term: 5, Algorithm: "weighted-move"}
	for range 2 {
		require.NoError(t, s.Init(ctx, f, m, a))
	}
	n := core.Node{Node: assignment.Node{ID: "node-0000", Capacity: 1}, Address: "127.0.0.1:1"}
	for range 2 {
		require.NoError(t, s.PutNode(ctx, f, n))
		require.NoError(t, s.PutNode(ctx, f, core.Node{Node: assignment.Node{ID: "gone", Capacity: 1}}))
		require.NoError(t, s.DeleteNode(ctx, f, "gone"))
	}
	next, err := a.Apply([]assignment.Op{assignment.Split{Slice: 0, At: 1}})
	require.NoError(t, err)
	m.LastIndex, m.Seq, m.Generation = 1, 1, next.Generation()
	e := core.Entry{Index: 1, Term: 5, Seq: 1, Generation: m.Generation, Cause: "test", Time: time.Now(),
		Ops: []assignment.Op{assignment.Split{Slice: 0, At: 1}}}
	for range 2 {
		require.NoError(t, s.Append(ctx, f, m, e))
		require.NoError(t, s.SaveMeta(ctx, f, m))
	}
	st, found, err := s.Load(ctx)
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, m.LastIndex, st.Meta.LastIndex)
	assert.True(t, next.Equal(st.Assignment), "the map as after one of each")
	assert.Len(t, st.Nodes, 1)
	logs, err := c.Get(ctx, "/sp/log/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	assert.Len(t, logs.Kvs, 1, "one log entry")
	snaps, err := c.Get(ctx, "/sp/snap/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	assert.Greater(t, len(snaps.Kvs), 1, "the snapshot was written in parts")
}

// A term that ends before the first map is made leaves a meta record without a snapshot; the
// next leader starts from it, with the nodes registered meanwhile.
func TestStateWithoutAMapLoads(t *testing.T) {
	c := etcdtest.New(t)
	s := New(c, "/sp/")
	ctx := testCtx(t)
	f, _ := lead(t, c)
	require.NoError(t, s.SaveMeta(ctx, f, core.Meta{Term: 3, Algorithm: "weighted-move"}))
	require.NoError(t, s.PutNode(ctx, f, core.Node{Node: assignment.Node{ID: "a", Capacity: 1}, Address: "127.0.0.1:1"}))
	st, found, err := s.Load(ctx)
	require.NoError(t, err)
	assert.True(t, found)
	assert.Nil(t, st.Assignment)
	assert.Equal(t, uint64(3), st.Meta.Term)
	assert.Len(t, st.Nodes, 1)
}
