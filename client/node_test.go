package client_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/memstore"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/testchild"
	"github.com/sliceplane/sliceplane/internal/wire"
)

func TestMain(m *testing.M) {
	var spec watcherSpec
	testchild.Main(watcherChildEnv, &spec, watcherJob(&spec))
	goleak.VerifyTestMain(m)
}

// waitFor polls cond until it holds, and fails the test if it does not within the deadline.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// deadAddress returns a loopback address where nothing listens.
func deadAddress(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	return addr
}

// quiet is a logger that drops everything.
func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestNewNodeRejectsBadConfig(t *testing.T) {
	good := func() client.NodeConfig {
		return client.NodeConfig{ID: "n1", Assigners: []string{"127.0.0.1:1"}, Store: memstore.New(), Address: "127.0.0.1:2"}
	}
	cases := []struct {
		name   string
		change func(*client.NodeConfig)
		want   string
		is     error
	}{
		{"no ID", func(c *client.NodeConfig) { c.ID = "" }, "must be 1 to 128 characters", assignment.ErrBadNodeID},
		{"ID too long", func(c *client.NodeConfig) { c.ID = strings.Repeat("a", 129) }, "must be 1 to 128 characters", assignment.ErrBadNodeID},
		{"ID with a space", func(c *client.NodeConfig) { c.ID = "node 1" }, `has ' '`, assignment.ErrBadNodeID},
		{"ID with a slash", func(c *client.NodeConfig) { c.ID = "a/b" }, `has '/'`, assignment.ErrBadNodeID},
		{"no store", func(c *client.NodeConfig) { c.Store = nil }, "a node needs a Store", nil},
		{"no assigners", func(c *client.NodeConfig) { c.Assigners = nil }, "a node needs the assigners' addresses", nil},
		{"no address", func(c *client.NodeConfig) { c.Address = "" }, "a node needs its Address", nil},
		{"negative report interval", func(c *client.NodeConfig) { c.ReportInterval = -time.Second }, "negative report interval -1s", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good()
			tc.change(&cfg)
			n, err := client.NewNode(cfg)
			require.Error(t, err)
			assert.Nil(t, n)
			assert.ErrorContains(t, err, tc.want)
			assert.True(t, strings.HasPrefix(err.Error(), "client: "), "the error says where it comes from: %v", err)
			if tc.is != nil {
				assert.ErrorIs(t, err, tc.is)
			}
		})
	}

	// The longest ID, every allowed character and the defaults are fine.
	for _, id := range []string{strings.Repeat("x", 128), "aZ09._-:"} {
		cfg := good()
		cfg.ID = id
		n, err := client.NewNode(cfg)
		require.NoError(t, err, "ID %q", id)
		assert.Zero(t, n.Cursor())
		assert.Zero(t, n.Clock())
		assert.Empty(t, n.Slices())
		_, _, ok := n.Distributor()
		assert.False(t, ok, "no distributor before the assigner names one")
	}
}

// runNode runs n in the background; the returned channel gets what Run returned.
func runNode(ctx context.Context, n *client.Node) <-chan error {
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	return done
}

func TestNodeRunTwice(t *testing.T) {
	n, err := client.NewNode(client.NodeConfig{ID: "n1", Assigners: []string{deadAddress(t)}, Address: "127.0.0.1:2", Store: memstore.New(), Logger: quiet()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// Two Runs at once: one runs, the other fails at once.
	first, second := runNode(ctx, n), runNode(ctx, n)
	var still <-chan error
	select {
	case err := <-first:
		require.ErrorContains(t, err, "Run called twice")
		still = second
	case err := <-second:
		require.ErrorContains(t, err, "Run called twice")
		still = first
	case <-time.After(10 * time.Second):
		t.Fatal("neither Run returned: a second Run must fail at once")
	}
	cancel()
	select {
	case err := <-still:
		require.NoError(t, err, "Run returns nil when its context ends")
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	// Once it has run, it does not run again.
	err = n.Run(t.Context())
	require.ErrorContains(t, err, "Run called twice")
}

// logCapture is a slog.Handler that keeps the messages it gets.
type logCapture struct {
	mu   *sync.Mutex
	msgs *[]string
}

func newLogCapture() logCapture { return logCapture{mu: new(sync.Mutex), msgs: new([]string)} }

func (h logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (h logCapture) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h logCapture) WithGroup(string) slog.Handler            { return h }
func (h logCapture) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.msgs = append(*h.msgs, r.Level.String()+" "+r.Message)
	return nil
}

func (h logCapture) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range *h.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

func TestNodeKeepsRetryingAnAssignerThatIsNotThere(t *testing.T) {
	logs := newLogCapture()
	n, err := client.NewNode(client.NodeConfig{ID: "n1", Assigners: []string{deadAddress(t)}, Address: "127.0.0.1:2", Store: memstore.New(),
		ReportInterval: 10 * time.Millisecond, Logger: slog.New(logs)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := runNode(ctx, n)
	// A registration attempt times out after 5 s; the node logs it and tries again.
	waitFor(t, 20*time.Second, "a failed registration is logged", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run returned %v while its context is alive: it must keep retrying", err)
		default:
		}
		return logs.count("WARN registering") > 0
	})
	_, _, ok := n.Distributor()
	assert.False(t, ok)
	assert.Zero(t, n.Cursor())

	start := time.Now()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err, "Run returns nil when its context ends")
		assert.Less(t, time.Since(start), 2*time.Second, "Run returns promptly")
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	// goleak, in TestMain, checks that nothing Run started is left.
}

func TestNodeLeaveWithoutAnAssignerFails(t *testing.T) {
	n, err := client.NewNode(client.NodeConfig{ID: "n1", Assigners: []string{deadAddress(t)}, Address: "127.0.0.1:2", Store: memstore.New(), Logger: quiet()})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	err = n.Leave(ctx)
	require.Error(t, err)
	assert.ErrorContains(t, err, "deregistering n1")
}

// admin lists the assigner's view of the cluster over one connection.
type admin struct {
	pb.AdminServiceClient
	assignments pb.AssignmentServiceClient
}

func newAdmin(c *clustertest.Cluster) admin {
	conn := c.Conn()
	return admin{pb.NewAdminServiceClient(conn), pb.NewAssignmentServiceClient(conn)}
}

// nodes returns the nodes the assigner lists, by ID; nil if it cannot say.
func (a admin) nodes(ctx context.Context) map[string]*pb.NodeInfo {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := a.ListNodes(ctx, &pb.ListNodesRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return nil
	}
	out := map[string]*pb.NodeInfo{}
	for _, n := range resp.GetNodes() {
		out[n.GetNode().GetId()] = n
	}
	return out
}

// assignment returns the assigner's map.
func (a admin) assignment(t *testing.T, ctx context.Context) *assignment.Assignment {
	t.Helper()
	resp, err := a.assignments.GetAssignment(ctx, &pb.GetAssignmentRequest{}, grpc.WaitForReady(true))
	require.NoError(t, err)
	m, err := wire.AssignmentFromProto(resp.GetAssignment())
	require.NoError(t, err)
	return m
}

// slicesOf returns the slices of a map that node id holds, in key order.
func slicesOf(a *assignment.Assignment, id string) []client.Range {
	var out []client.Range
	for _, s := range a.All() {
		for _, r := range s.Replicas {
			if string(r) == id {
				out = append(out, fromKeyspace(s.Range))
			}
		}
	}
	return out
}

// fromKeyspace returns the client's form of a range of the map.
func fromKeyspace(r keyspace.Range) client.Range {
	out := client.Range{Start: r.Start, End: client.EndOfSpace()}
	if !r.End.IsEnd() {
		out.End = client.BoundAt(r.End.Point())
	}
	return out
}

// setOf returns the points of the client's ranges rs.
func setOf(rs ...client.Range) keyspace.Set {
	ks := make([]keyspace.Range, len(rs))
	for i, r := range rs {
		ks[i] = keyspace.Range{Start: r.Start, End: keyspace.End}
		if !r.End.IsEnd() {
			ks[i].End = keyspace.At(r.End.Point())
		}
	}
	return keyspace.NewSet(ks...)
}

// keysIn returns up to n keys whose hash lies in the slices given.
func keysIn(slices []client.Range, prefix string, n int) [][]byte {
	set := setOf(slices...)
	var out [][]byte
	for i := 0; len(out) < n && i < 100*n; i++ {
		if k := fmt.Appendf(nil, "%s-%d", prefix, i); set.Contains(client.Hash(k)) {
			out = append(out, k)
		}
	}
	return out
}

func TestNodeInCluster(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{})
	d1 := c.StartDistributor("d1")
	n1 := c.StartNode("n1", nil)
	n2 := c.StartNode("n2", nil)
	adm := newAdmin(c)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// Wait for a map that gives both nodes slices, and freeze it so that the nodes can
	// converge on it.
	waitFor(t, 30*time.Second, "both nodes hold slices in the map", func() bool {
		nodes := adm.nodes(ctx)
		return nodes["n1"].GetSlices() > 0 && nodes["n2"].GetSlices() > 0
	})
	_, err := adm.Freeze(ctx, &pb.FreezeRequest{Reason: "client test"}, grpc.WaitForReady(true))
	require.NoError(t, err)

	const items = 200
	var last uint64
	for i := range items {
		last = putItem(ctx, t, c, i)
	}
	waitFor(t, 30*time.Second, "the nodes reach the clock of the last write", func() bool {
		return n1.Clock() >= last && n2.Clock() >= last
	})
	report, err := c.WaitConverged(ctx)
	require.NoError(t, err, "%s", report)
	assert.GreaterOrEqual(t, report.Items, items)

	t.Run("slices", func(t *testing.T) {
		s1, s2 := n1.Slices(), n2.Slices()
		require.NotEmpty(t, s1)
		require.NotEmpty(t, s2)
		set1, set2 := setOf(s1...), setOf(s2...)
		assert.True(t, set1.Union(set2).Equal(setOf(client.FullRange())), "together the nodes hold the whole space: %s and %s", set1, set2)
		assert.True(t, set1.Intersect(set2).Empty(), "no slice has two replicas, so the nodes share nothing: %s and %s", set1, set2)
		// Each node lists its slices of the map, as the assigner cut them.
		a := adm.assignment(t, ctx)
		assert.Equal(t, slicesOf(a, "n1"), s1)
		assert.Equal(t, slicesOf(a, "n2"), s2)
	})

	t.Run("distributor", func(t *testing.T) {
		for _, n := range []*clustertest.Node{n1, n2} {
			id, addr, ok := n.Distributor()
			assert.True(t, ok, n.ID)
			assert.Equal(t, "d1", id, n.ID)
			assert.Equal(t, d1.Addr, addr, n.ID)
		}
	})

	t.Run("cursor", func(t *testing.T) {
		for _, n := range []*clustertest.Node{n1, n2} {
			cur := n.Cursor()
			assert.NotZero(t, cur.Epoch, "%s applied a snapshot", n.ID)
			stored, err := n.Store.Cursor(ctx)
			require.NoError(t, err)
			assert.Equal(t, stored, cur, "%s's cursor is its store's", n.ID)
		}
	})
	if t.Failed() {
		return
	}

	restarted := checkNodeResumes(t, ctx, c, adm, n1)
	checkLoadReachesAssigner(t, ctx, adm, restarted)
}

// checkNodeResumes stops n1 and starts it again on its store: it resumes its stream, without
// a snapshot, and learns its slices back from the distributor.
func checkNodeResumes(t *testing.T, ctx context.Context, c *clustertest.Cluster, adm admin, n1 *clustertest.Node) *clustertest.Node {
	n1.Stop()
	before := n1.Cursor()
	stored, err := n1.Store.Cursor(ctx)
	require.NoError(t, err)
	require.Equal(t, stored, before, "a stopped node's cursor is its store's")
	restarted := c.StartNode("n1", n1.Store)
	mine := keysIn(slicesOf(adm.assignment(t, ctx), "n1"), "after-restart", 5)
	require.NotEmpty(t, mine)
	var last uint64
	for _, k := range mine {
		last, err = c.Source.Put(ctx, k, []byte("new"))
		require.NoError(t, err)
	}
	report, err := c.WaitConverged(ctx)
	require.NoError(t, err, "%s", report)
	assert.GreaterOrEqual(t, restarted.Clock(), last)
	after := restarted.Cursor()
	assert.Equal(t, before.Epoch, after.Epoch, "n1 resumed in its epoch, without a snapshot")
	assert.Greater(t, after.Index, before.Index, "n1 applied the writes to its slices")
	assert.Equal(t, slicesOf(adm.assignment(t, ctx), "n1"), restarted.Slices(), "n1 learned its slices when it resumed")
	for _, k := range mine {
		it, ok, err := restarted.Store.Get(ctx, k)
		require.NoError(t, err)
		assert.True(t, ok, "%s", k)
		assert.Equal(t, "new", string(it.Value))
	}
	return restarted
}

// checkLoadReachesAssigner records load on the restarted n1's keys, and waits for the
// assigner to see it.
func checkLoadReachesAssigner(t *testing.T, ctx context.Context, adm admin, restarted *clustertest.Node) {
	// Load recorded on n1's keys reaches the assigner. Balancing runs again, for the assigner
	// estimates load in its passes.
	_, err := adm.Unfreeze(ctx, &pb.UnfreezeRequest{}, grpc.WaitForReady(true))
	require.NoError(t, err)
	assert.Zero(t, adm.nodes(ctx)["n1"].GetLoad(), "no load before any is recorded")
	waitFor(t, 30*time.Second, "the assigner sees n1's load", func() bool {
		for _, k := range keysIn(restarted.Slices(), "load", 20) {
			restarted.RecordLoad(k, 10)
		}
		if adm.nodes(ctx)["n1"].GetLoad() <= 0 {
			return false
		}
		resp, err := adm.ListSlices(ctx, &pb.ListSlicesRequest{Node: "n1", ByLoad: true, Limit: 1}, grpc.WaitForReady(true))
		return err == nil && len(resp.GetSlices()) == 1 && resp.GetSlices()[0].GetLoad() > 0
	})
}

func TestNodeLeaveDeregisters(t *testing.T) {
	// A lease far longer than the test, so that only Leave can take the node out.
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) { cfg.Core.NodeTTL = time.Minute }})
	n := c.StartNode("n1", nil)
	adm := newAdmin(c)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	waitFor(t, 30*time.Second, "n1 registers", func() bool { return adm.nodes(ctx)["n1"] != nil })

	n.Stop()
	nodes := adm.nodes(ctx)
	require.NotNil(t, nodes, "the assigner answers")
	require.Contains(t, nodes, "n1", "a node that stopped keeps its lease")

	require.NoError(t, n.Leave(ctx))
	waitFor(t, 10*time.Second, "the assigner forgets n1", func() bool {
		nodes := adm.nodes(ctx)
		return nodes != nil && nodes["n1"] == nil
	})
	// It is gone: leaving again fails.
	err := n.Leave(ctx)
	require.Error(t, err)
	assert.ErrorContains(t, err, "not registered")
}

// failingStore is a memstore whose batches fail the put of one key.
type failingStore struct {
	*memstore.Store
	badKey string
}

func (s failingStore) Begin(ctx context.Context) (client.Batch, error) {
	b, err := s.Store.Begin(ctx)
	return failingBatch{b, s.badKey}, err
}

type failingBatch struct {
	client.Batch
	badKey string
}

var errBadKey = errors.New("bad key")

func (b failingBatch) Put(key, value []byte) error {
	if string(key) == b.badKey {
		return errBadKey
	}
	return b.Batch.Put(key, value)
}

// contents returns what a store holds: its cursor, slices and items.
func contents(t *testing.T, s *memstore.Store) (client.Cursor, []client.Range, map[string]client.Item) {
	t.Helper()
	cur, err := s.Cursor(t.Context())
	require.NoError(t, err)
	list, err := s.Slices(t.Context())
	require.NoError(t, err)
	items := map[string]client.Item{}
	require.NoError(t, s.Items(t.Context(), func(it client.Item) error { items[string(it.Key)] = it; return nil }))
	return cur, list, items
}

func TestApplyOnMemstore(t *testing.T) {
	s := memstore.New()
	half := client.Range{Start: 0, End: client.BoundAt(1 << 63)}
	require.NoError(t, client.Apply(t.Context(), s, client.Delta{Epoch: 5, From: 0, To: 7, Ops: []client.Op{
		{Kind: client.OpReset},
		{Kind: client.OpAddSlice, Range: client.FullRange()},
		{Kind: client.OpSetSlices, Slices: []client.Range{client.FullRange()}},
		// In order: the last put wins, a delete after a put removes the item.
		{Kind: client.OpPut, Key: []byte("a"), Value: []byte("1")},
		{Kind: client.OpPut, Key: []byte("a"), Value: []byte("2")},
		{Kind: client.OpPut, Key: []byte("b"), Value: []byte("1")},
		{Kind: client.OpDelete, Key: []byte("b")},
		{Kind: client.OpPutFragment, Key: []byte("c"), Fragment: "f", Value: []byte("x")},
	}}))
	cur, list, items := contents(t, s)
	assert.Equal(t, client.Cursor{Epoch: 5, Index: 7}, cur)
	assert.Equal(t, []client.Range{client.FullRange()}, list)
	assert.Equal(t, map[string]client.Item{
		"a": {Key: []byte("a"), Value: []byte("2"), HasValue: true},
		"c": {Key: []byte("c"), Fragments: []client.Fragment{{ID: "f", Value: []byte("x")}}},
	}, items)

	// A delta that fails midway changes nothing: not the ops before the failure, nor the cursor.
	bad := failingStore{Store: s, badKey: "bad"}
	err := client.Apply(t.Context(), bad, client.Delta{Epoch: 5, From: 7, To: 12, Ops: []client.Op{
		{Kind: client.OpDropSlice, Range: half},
		{Kind: client.OpPut, Key: []byte("a"), Value: []byte("3")},
		{Kind: client.OpDeleteFragment, Key: []byte("c"), Fragment: "f"},
		{Kind: client.OpPut, Key: []byte("bad"), Value: []byte("?")},
		{Kind: client.OpPut, Key: []byte("d"), Value: []byte("4")},
	}})
	require.ErrorIs(t, err, errBadKey)
	assert.ErrorContains(t, err, "op 3 (put)")
	cur2, list2, items2 := contents(t, s)
	assert.Equal(t, cur, cur2, "the cursor did not move")
	assert.Equal(t, list, list2, "the slices did not change")
	assert.Equal(t, items, items2, "the items did not change")

	// The store is still usable, from where it was.
	require.NoError(t, client.Apply(t.Context(), s, client.Delta{Epoch: 5, From: 7, To: 8, Ops: []client.Op{
		{Kind: client.OpPut, Key: []byte("d"), Value: []byte("4")},
	}}))
	cur3, _, items3 := contents(t, s)
	assert.Equal(t, client.Cursor{Epoch: 5, Index: 8}, cur3)
	assert.Len(t, items3, 3)
}

// A load report the assigner refuses does not cost the node its lease: the heartbeat that
// carried it is sent again without it. The node reports every 100 ms, more often than it
// heartbeats (every TTL/3), so every heartbeat it sends carries a report.
func TestARefusedLoadReportDoesNotCostTheLease(t *testing.T) {
	const ttl = 3 * time.Second
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) { cfg.Core.NodeTTL = ttl }})
	c.StartDistributor("d1")
	n := c.StartNode("n1", nil)
	adm := newAdmin(c)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	waitFor(t, 30*time.Second, "n1 holds slices", func() bool { return len(n.Slices()) > 0 })
	keys := keysIn(n.Slices(), "absurd", 5)
	// Far above any cap: every report is refused whole (the unit is the application's).
	for end := time.Now().Add(3 * ttl); time.Now().Before(end); {
		for _, k := range keys {
			n.RecordLoad(k, 1e300)
		}
		info := adm.nodes(ctx)["n1"]
		require.NotNil(t, info, "n1 lost its lease while its load reports were refused")
		require.Zero(t, info.GetLoad(), "a refused report was counted")
		waitFor(t, time.Second, "the assigner answers again", func() bool { return adm.nodes(ctx) != nil })
	}
}
