package assigner_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/balance"
	"github.com/sliceplane/sliceplane/internal/grpcserver/grpcservertest"
	"github.com/sliceplane/sliceplane/internal/keyspace"
	"github.com/sliceplane/sliceplane/internal/load"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/wire"
)

// hot puts half of all load in the first 1/2^10 of the space: the node holding the first
// slice starts far hotter than the rest.
var hot = density{hotEnd: 1 << 54, hotShare: 0.5, total: 1000}

func small(c *assigner.Config) {
	c.Core.Params = map[string]string{"min_slices_per_node": "2", "initial_slices_per_node": "4", "max_slices_per_node": "16"}
}

func TestPassesReduceImbalance(t *testing.T) {
	a, watch, m, ids := unbalancedStart(t, 4)
	ctx := ctxT(t, 30*time.Second)
	before := hot.imbalance(m, ids)
	require.Greater(t, before, 1.5, "the fixture must start unbalanced")

	startFleet(t, hot, 4, a)
	_, err := a.admin.Unfreeze(ctx, &pb.UnfreezeRequest{})
	require.NoError(t, err)

	// Follow the stream: the quanta apply in order to the map the watcher holds, and the
	// true imbalance of that map falls.
	for hot.imbalance(m, ids) > 1.15 {
		q, err := recv(watch)
		require.NoError(t, err, "imbalance still %.3f", hot.imbalance(m, ids))
		ops, err := wire.OpsFromProto(q.GetQuantum().GetOps())
		require.NoError(t, err)
		require.False(t, q.GetQuantum().GetReinitializing())
		require.NotEmpty(t, ops, "the assignment stream carries no clock-only quanta")
		m, err = m.Apply(ops)
		require.NoError(t, err)
		require.Equal(t, q.GetQuantum().GetGeneration(), m.Generation())
	}

	// The assigner's estimate is a decayed average of the reports, which describe the map of
	// a moment ago: it follows within a few report intervals.
	eventually(t, 10*time.Second, "the assigner's own estimate agrees", func() bool {
		st, err := a.admin.Status(ctx, &pb.StatusRequest{})
		require.NoError(t, err)
		return st.GetImbalance() < 1.3
	})
	x, err := a.admin.Explain(ctx, &pb.ExplainRequest{})
	require.NoError(t, err)
	assert.True(t, x.GetPassed())
	assert.Equal(t, "weighted-move", x.GetAlgorithm())
}

// unbalancedStart starts an assigner whose first map spreads the space evenly over n nodes
// (the hot band makes that unbalanced), frozen, and returns it with a watch of its map from
// that first map on.
func unbalancedStart(t *testing.T, n int) (*node, pb.AssignmentService_WatchAssignmentClient, *assignment.Assignment, []assignment.NodeID) {
	t.Helper()
	ids := fleetIDs(n)
	c := newCluster(t)
	c.preRegister(t, ids, "set up")
	a := c.start(small)
	a.leading(t)
	eventually(t, 10*time.Second, "the first map", a.hasMap)
	watch, err := a.assign.WatchAssignment(ctxT(t, 30*time.Second), &pb.WatchAssignmentRequest{})
	require.NoError(t, err)
	first, err := recv(watch)
	require.NoError(t, err)
	require.True(t, first.GetQuantum().GetReinitializing(), "a fresh watcher starts with the whole map")
	m, err := wire.AssignmentFromProto(first.GetQuantum().GetAssignment())
	require.NoError(t, err)
	require.Equal(t, n, holders(m), "the first map is made over every node registered")
	return a, watch, m, ids
}

// holders counts the nodes that hold slices of m.
func holders(m *assignment.Assignment) int {
	held := map[assignment.NodeID]bool{}
	for _, s := range m.All() {
		for _, id := range s.Replicas {
			held[id] = true
		}
	}
	return len(held)
}

func (n *node) nodesList(t *testing.T) []*pb.NodeInfo {
	t.Helper()
	resp, err := n.admin.ListNodes(context.Background(), &pb.ListNodesRequest{})
	if err != nil {
		return nil
	}
	return resp.GetNodes()
}

func TestWatchersResumeOrStartOver(t *testing.T) {
	c := newCluster(t)
	a := c.start(small)
	a.leading(t)
	startFleet(t, hot, 3, a)
	eventually(t, 10*time.Second, "a map exists", a.hasMap)

	// Two admin changes give the stream known positions.
	m := a.assignment(t)
	split, err := a.admin.Split(context.Background(), &pb.SplitRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Start{Start: m.Slice(1).Range.Start}}})
	require.NoError(t, err)
	pos := split.GetChange().GetPosition()

	ctx := ctxT(t, 10*time.Second)
	resumed, err := a.quanta.WatchQuanta(ctx, &pb.WatchQuantaRequest{From: pos})
	require.NoError(t, err)
	_, err = a.source(c).Put(ctx, []byte("k"), []byte("v")) // moves the clock
	require.NoError(t, err)
	q, err := recv(resumed)
	require.NoError(t, err)
	assert.False(t, q.GetQuantum().GetReinitializing(), "resuming from a kept position replays what followed")
	assert.Equal(t, pos.GetSeq()+1, q.GetQuantum().GetPosition().GetSeq())

	for _, from := range []*pb.Position{nil, {Term: pos.GetTerm() - 1, Seq: 1}, {Term: pos.GetTerm(), Seq: pos.GetSeq() + 1000}} {
		w, err := a.quanta.WatchQuanta(ctx, &pb.WatchQuantaRequest{From: from})
		require.NoError(t, err)
		q, err := recv(w)
		require.NoError(t, err)
		assert.True(t, q.GetQuantum().GetReinitializing(), "from %v", from)
		got, err := wire.AssignmentFromProto(q.GetQuantum().GetAssignment())
		require.NoError(t, err)
		assert.Equal(t, q.GetQuantum().GetGeneration(), got.Generation())
	}
}

func (n *node) source(c *cluster) *source.Etcd { return source.NewEtcd(c.cli, "/sliceplane/data/") }

func TestQuantaCarryTheSourceClock(t *testing.T) {
	c := newCluster(t)
	a := c.start(small)
	a.leading(t)
	startFleet(t, hot, 2, a)
	eventually(t, 10*time.Second, "a map exists", a.hasMap)
	ctx := ctxT(t, 10*time.Second)
	w, err := a.quanta.WatchQuanta(ctx, &pb.WatchQuantaRequest{})
	require.NoError(t, err)
	clock, err := a.source(c).Put(ctx, []byte("user:1"), []byte("x"))
	require.NoError(t, err)
	var last uint64
	for last < clock {
		q, err := recv(w)
		require.NoError(t, err)
		require.GreaterOrEqual(t, q.GetQuantum().GetClock(), last, "clocks never go back")
		last = q.GetQuantum().GetClock()
	}
	assert.GreaterOrEqual(t, last, clock, "a quantum covers the write")
}

func TestFailoverContinuesTheMap(t *testing.T) {
	c := newCluster(t)
	c.preRegister(t, fleetIDs(4), "")
	a := c.start(small)
	a.leading(t)
	b := c.start(small)
	f := startFleet(t, hot, 4, a, b)
	eventually(t, 20*time.Second, "balanced", func() bool {
		_, err := a.assign.GetAssignment(context.Background(), &pb.GetAssignmentRequest{})
		return err == nil && hot.imbalance(a.assignment(t), f.ids) < 1.2
	})
	// The standby redirects.
	_, err := b.assign.GetAssignment(context.Background(), &pb.GetAssignmentRequest{})
	require.Equal(t, codes.Unavailable, code(err))
	assert.Contains(t, err.Error(), "the leader is at "+a.srv.Addr())

	// Freeze, so that the map we compare is the last one A wrote.
	_, err = a.admin.Freeze(context.Background(), &pb.FreezeRequest{Reason: "failover test"})
	require.NoError(t, err)
	before := a.assignment(t)
	stA, err := a.admin.Status(context.Background(), &pb.StatusRequest{})
	require.NoError(t, err)
	a.stop()

	stB := b.leading(t)
	assert.Greater(t, stB.GetPosition().GetTerm(), stA.GetPosition().GetTerm(), "a new term")
	assert.True(t, stB.GetFrozen(), "settings survive the failover")
	after := b.assignment(t)
	assert.True(t, before.Equal(after), "the new leader continues the same map")
	assert.Equal(t, before.Generation(), after.Generation())

	// The first pass of the new leader obeys the normal budget: no reshuffle. Passes come
	// every 50 ms, so the map read after it may hold the next ones too: the watch tells the
	// first change apart.
	ctx := ctxT(t, 30*time.Second)
	watch, err := b.assign.WatchAssignment(ctx, &pb.WatchAssignmentRequest{})
	require.NoError(t, err)
	current, err := recv(watch)
	require.NoError(t, err)
	require.Equal(t, before.Generation(), current.GetQuantum().GetGeneration(), "the watch starts from the map taken over")
	_, err = b.admin.Unfreeze(ctx, &pb.UnfreezeRequest{})
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the new leader runs a pass", func() bool {
		x, err := b.admin.Explain(ctx, &pb.ExplainRequest{})
		return err == nil && x.GetPassed()
	})
	next := before
	if b.assignment(t).Generation() > before.Generation() {
		q, err := recv(watch)
		require.NoError(t, err)
		ops, err := wire.OpsFromProto(q.GetQuantum().GetOps())
		require.NoError(t, err)
		next, err = before.Apply(ops)
		require.NoError(t, err)
	}
	keys := make([]float64, before.Len())
	for i, s := range before.All() {
		keys[i] = s.Range.Fraction()
	}
	live := assignment.MustNodeSet(nodes(f.ids)...)
	churn := balance.PlacementsAdded(before, next, keys, live)
	assert.LessOrEqual(t, churn, 0.09+1e-9, "the takeover churned %.4f of the key space", churn)
}

// A leader that goes before its first map (no pass ran yet: passes are a second apart by
// default) has stored its term, settings and registered nodes, but no map. Its successor
// leads from there, keeping the settings and the nodes; before, it failed to load the state
// ("the snapshot record is missing") and campaigned again for ever.
func TestFailoverBeforeTheFirstMap(t *testing.T) {
	c := newCluster(t)
	a := c.start(small, func(c *assigner.Config) { c.PassInterval = time.Hour })
	stA := a.leading(t)
	ctx := ctxT(t, 30*time.Second)
	_, err := a.admin.Freeze(ctx, &pb.FreezeRequest{Reason: "before the first map"})
	require.NoError(t, err)
	_, err = a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: "node-0"}, Address: "127.0.0.1:1"})
	require.NoError(t, err)
	require.False(t, a.hasMap())
	a.stop()

	b := c.start(small)
	stB := b.leading(t)
	assert.Greater(t, stB.GetPosition().GetTerm(), stA.GetPosition().GetTerm(), "a new term")
	assert.True(t, stB.GetFrozen(), "settings survive the failover")
	eventually(t, 10*time.Second, "the first map", b.hasMap)
	m := b.assignment(t)
	assert.Equal(t, 1, holders(m), "the node registered with the old leader holds the map")
	assert.True(t, m.Slice(0).Holds("node-0"))
}

func nodes(ids []assignment.NodeID) []assignment.Node {
	out := make([]assignment.Node, len(ids))
	for i, id := range ids {
		out[i] = assignment.Node{ID: id}
	}
	return out
}

func TestLeaderStepsDownWhenItsLeaseIsLost(t *testing.T) {
	c := newCluster(t)
	a := c.start(small)
	a.leading(t)
	startFleet(t, hot, 2, a)
	ctx := ctxT(t, 20*time.Second)
	w, err := a.quanta.WatchQuanta(ctx, &pb.WatchQuantaRequest{})
	require.NoError(t, err)
	_, err = recv(w)
	require.NoError(t, err)

	// Take the lease away, as a partition from etcd would.
	leases, err := c.cli.Leases(ctx)
	require.NoError(t, err)
	for _, l := range leases.Leases {
		// The assigner revokes its lease among the live assigners itself once it sees it lost.
		if _, err := c.cli.Revoke(ctx, l.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			require.NoError(t, err)
		}
	}
	// The stream ends: the old leadership emits nothing more under its term.
	for {
		_, err := recv(w)
		if err != nil {
			assert.Equal(t, codes.Unavailable, code(err))
			break
		}
	}
	st := a.leading(t) // it campaigns again and, alone, wins a new term
	assert.Greater(t, st.GetPosition().GetTerm(), uint64(0))
}

func TestAdminOverrides(t *testing.T) {
	c := newCluster(t)
	a := c.start(small)
	a.leading(t)
	f := startFleet(t, hot, 3, a)
	eventually(t, 10*time.Second, "three nodes and a map", func() bool { return len(a.nodesList(t)) == 3 && a.hasMap() })
	ctx := ctxT(t, 30*time.Second)
	_, err := a.admin.Freeze(ctx, &pb.FreezeRequest{Reason: "test"})
	require.NoError(t, err)

	m := a.assignment(t)
	s0 := m.Slice(0)
	to := f.ids[0]
	if s0.Holds(to) {
		to = f.ids[1]
	}
	ref := startRef

	// Move: applied as one quantum, visible in the map.
	mv, err := a.admin.Move(ctx, &pb.MoveRequest{Slice: ref(s0.Range.Start), To: []string{string(to)}})
	require.NoError(t, err)
	assert.Len(t, mv.GetChange().GetOps(), 1)
	assert.Contains(t, mv.GetChange().GetSummary(), "move")
	_, got := a.assignment(t).Lookup(s0.Range.Start)
	assert.Equal(t, []assignment.NodeID{to}, got.Replicas)

	checkAdminRefusals(t, ctx, a, m, to)
	checkPinIsIdempotent(t, ctx, a, s0.Range.Start)
	checkAdminSplitAndMerge(t, ctx, a)
	checkPinnedSliceStays(t, ctx, a)
	checkDrainAndLists(t, ctx, a, f.ids[2])
}

// startRef refers to the slice that starts at start.
func startRef(start uint64) *pb.SliceRef { return &pb.SliceRef{Ref: &pb.SliceRef_Start{Start: start}} }

// checkAdminRefusals checks that refused overrides change nothing and say why. Slice 0 of m
// has moved to node to.
func checkAdminRefusals(t *testing.T, ctx context.Context, a *node, m *assignment.Assignment, to assignment.NodeID) {
	ref, s0 := startRef, m.Slice(0)
	gen := a.assignment(t).Generation()
	refusals := []struct {
		call func() error
		code codes.Code
		text string
	}{
		{func() error {
			_, err := a.admin.Move(ctx, &pb.MoveRequest{Slice: ref(s0.Range.Start), To: []string{"ghost"}})
			return err
		}, codes.NotFound, "ghost is not registered"},
		{func() error {
			_, err := a.admin.Move(ctx, &pb.MoveRequest{Slice: ref(s0.Range.Start + 1), To: []string{string(to)}})
			return err
		}, codes.InvalidArgument, "no slice starts at"},
		{func() error {
			_, err := a.admin.Move(ctx, &pb.MoveRequest{Slice: ref(s0.Range.Start)})
			return err
		}, codes.InvalidArgument, "to no node"},
		{func() error {
			_, err := a.admin.Split(ctx, &pb.SplitRequest{Slice: ref(s0.Range.Start), At: &pb.SplitRequest_AtHash{AtHash: s0.Range.Start}})
			return err
		}, codes.InvalidArgument, "not strictly inside"},
		{func() error {
			_, err := a.admin.Merge(ctx, &pb.MergeRequest{Left: ref(m.Slice(0).Range.Start), Right: ref(m.Slice(2).Range.Start)})
			return err
		}, codes.FailedPrecondition, "not adjacent"},
		{func() error {
			_, err := a.admin.SetAlgorithm(ctx, &pb.SetAlgorithmRequest{Name: "magic"})
			return err
		}, codes.InvalidArgument, "unknown algorithm"},
		{func() error {
			_, err := a.admin.SetAlgorithm(ctx, &pb.SetAlgorithmRequest{Name: "weighted-move", Params: map[string]string{"hold_passes": "99"}})
			return err
		}, codes.InvalidArgument, "at most 32"},
		{func() error {
			_, err := a.admin.Drain(ctx, &pb.DrainRequest{NodeId: "ghost"})
			return err
		}, codes.NotFound, "not registered"},
	}
	for i, r := range refusals {
		err := r.call()
		require.Error(t, err, "refusal %d", i)
		assert.Equal(t, r.code, code(err), "refusal %d: %v", i, err)
		assert.Contains(t, err.Error(), r.text, "refusal %d", i)
	}
	assert.Equal(t, gen, a.assignment(t).Generation(), "refusals change nothing")
}

// checkPinIsIdempotent checks that pin and unpin are idempotent: asking for what holds
// already succeeds and says so.
func checkPinIsIdempotent(t *testing.T, ctx context.Context, a *node, start uint64) {
	up, err := a.admin.Unpin(ctx, &pb.UnpinRequest{Slice: startRef(start)})
	require.NoError(t, err)
	assert.True(t, up.GetAlready(), "it was not pinned")
	for i, already := range []bool{false, true} {
		pin, err := a.admin.Pin(ctx, &pb.PinRequest{Slice: startRef(start)})
		require.NoError(t, err, "pin %d", i)
		assert.Equal(t, already, pin.GetAlready(), "pin %d", i)
	}
	pinned, err := a.admin.Status(ctx, &pb.StatusRequest{})
	require.NoError(t, err)
	assert.Len(t, pinned.GetPinned(), 1, "pinned twice, held once")
	for i, already := range []bool{false, true} {
		up, err := a.admin.Unpin(ctx, &pb.UnpinRequest{Slice: startRef(start)})
		require.NoError(t, err, "unpin %d", i)
		assert.Equal(t, already, up.GetAlready(), "unpin %d", i)
	}
}

// checkAdminSplitAndMerge splits at a key, merges the halves back (they share a replica set),
// then merges slices held by different nodes.
func checkAdminSplitAndMerge(t *testing.T, ctx context.Context, a *node) {
	ref := startRef
	// Split at a key, then merge the halves back (they share a replica set).
	key := []byte("user:42")
	sp, err := a.admin.Split(ctx, &pb.SplitRequest{At: &pb.SplitRequest_AtKey{AtKey: key}})
	require.NoError(t, err)
	require.Len(t, sp.GetChange().GetOps(), 1)
	i, half := a.assignment(t).Lookup(keyspace.Hash(key))
	assert.Equal(t, keyspace.Hash(key), half.Range.Start)
	left := a.assignment(t).Slice(i - 1)
	mg, err := a.admin.Merge(ctx, &pb.MergeRequest{Left: ref(left.Range.Start), Right: ref(half.Range.Start)})
	require.NoError(t, err)
	assert.Len(t, mg.GetChange().GetOps(), 1)

	// Merging slices held by different nodes first moves the right one.
	m := a.assignment(t)
	for j := 0; j+1 < m.Len(); j++ {
		if !assert.ObjectsAreEqual(m.Slice(j).Replicas, m.Slice(j+1).Replicas) {
			mg, err := a.admin.Merge(ctx, &pb.MergeRequest{Left: ref(m.Slice(j).Range.Start), Right: ref(m.Slice(j + 1).Range.Start)})
			require.NoError(t, err)
			assert.Len(t, mg.GetChange().GetOps(), 2)
			break
		}
	}
}

// checkPinnedSliceStays pins the hot slice and unfreezes: passes run but do not move it.
func checkPinnedSliceStays(t *testing.T, ctx context.Context, a *node) {
	m := a.assignment(t)
	_, hotSlice := m.Lookup(0)
	_, err := a.admin.Pin(ctx, &pb.PinRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Hash{Hash: 0}}})
	require.NoError(t, err)
	unfrozen := time.Now()
	_, err = a.admin.Unfreeze(ctx, &pb.UnfreezeRequest{})
	require.NoError(t, err)
	// Passes run for a while: the last one is at least three pass intervals after the
	// unfreeze. (Whether they change the map depends on how far balancing got before the
	// freeze, which depends on the machine's speed.)
	eventually(t, 10*time.Second, "passes run", func() bool {
		st, err := a.admin.Status(ctx, &pb.StatusRequest{})
		require.NoError(t, err)
		return st.GetLastPass().AsTime().After(unfrozen.Add(3 * 50 * time.Millisecond))
	})
	_, nowHot := a.assignment(t).Lookup(0)
	assert.Equal(t, hotSlice.Replicas, nowHot.Replicas, "the pinned slice stayed")
	st, err := a.admin.Status(ctx, &pb.StatusRequest{})
	require.NoError(t, err)
	require.Len(t, st.GetPinned(), 1)
}

// checkDrainAndLists drains a node, which passes then empty, and lists slices and quanta.
func checkDrainAndLists(t *testing.T, ctx context.Context, a *node, drained assignment.NodeID) {
	_, err := a.admin.Drain(ctx, &pb.DrainRequest{NodeId: string(drained)})
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the drained node holds nothing", func() bool {
		resp, err := a.admin.Drain(ctx, &pb.DrainRequest{NodeId: string(drained)})
		return err == nil && resp.GetSlices() == 0
	})
	hb, err := a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: string(drained)})
	require.NoError(t, err)
	assert.True(t, hb.GetDraining(), "the node is told it is draining")

	// Slices and quanta are listed.
	ls, err := a.admin.ListSlices(ctx, &pb.ListSlicesRequest{ByLoad: true, Limit: 3})
	require.NoError(t, err)
	// Passes go on, and may have merged the map down to fewer slices than the limit.
	require.GreaterOrEqual(t, ls.GetTotal(), uint32(2), "slices in the map")
	assert.Len(t, ls.GetSlices(), min(3, int(ls.GetTotal())))
	assert.GreaterOrEqual(t, ls.GetSlices()[0].GetLoad(), ls.GetSlices()[1].GetLoad())
	lq, err := a.admin.ListQuanta(ctx, &pb.ListQuantaRequest{Limit: 5})
	require.NoError(t, err)
	assert.NotEmpty(t, lq.GetQuanta())
}

// fullReport reports load l on the whole space, from n1.
func fullReport(l float64) *pb.ReportLoadRequest {
	return wire.ReportToProto(load.Report{Node: "n1", Window: time.Second, Samples: []load.Sample{{Range: keyspace.Full(), Load: l}}})
}

// bigReport is well over the 64 KiB that TestBadInputIsRefusedAndChangesNothing allows.
var bigReport = wire.ReportToProto(load.Report{Node: "n1", Window: time.Second, Samples: make([]load.Sample, 5000)})

type badInputCase struct {
	name string
	call func(ctx context.Context, a *node) error
	code codes.Code
	text string
}

// badInputCases are refused by an assigner where n1 alone is registered.
var badInputCases = []badInputCase{
	{"unregistered node", func(ctx context.Context, a *node) error {
		r := fullReport(1)
		r.NodeId = "ghost"
		_, err := a.nodes.ReportLoad(ctx, r)
		return err
	}, codes.NotFound, "ghost is not registered"},
	{"negative load", func(ctx context.Context, a *node) error {
		_, err := a.nodes.ReportLoad(ctx, fullReport(-1))
		return err
	}, codes.InvalidArgument, "loads[0] = -1"},
	{"NaN load", func(ctx context.Context, a *node) error {
		_, err := a.nodes.ReportLoad(ctx, fullReport(math.NaN()))
		return err
	}, codes.InvalidArgument, "loads[0] = NaN"},
	{"no window", func(ctx context.Context, a *node) error {
		r := fullReport(1)
		r.Window = nil
		_, err := a.nodes.ReportLoad(ctx, r)
		return err
	}, codes.InvalidArgument, "no window"},
	{"empty range", func(ctx context.Context, a *node) error {
		r := fullReport(1)
		r.Starts, r.Ends = []uint64{5}, []uint64{5}
		_, err := a.nodes.ReportLoad(ctx, r)
		return err
	}, codes.InvalidArgument, "is empty"},
	{"oversized request", func(ctx context.Context, a *node) error {
		_, err := a.nodes.ReportLoad(ctx, bigReport)
		return err
	}, codes.ResourceExhausted, "larger than max"},
	{"ragged columns", func(ctx context.Context, a *node) error {
		r := fullReport(1)
		r.Loads = append(r.Loads, 2)
		_, err := a.nodes.ReportLoad(ctx, r)
		return err
	}, codes.InvalidArgument, "columns differ"},
	{"bad node id", func(ctx context.Context, a *node) error {
		_, err := a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: "no spaces"}})
		return err
	}, codes.InvalidArgument, "bad node ID"},
	{"bad capacity", func(ctx context.Context, a *node) error {
		_, err := a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: "n2", Capacity: -2}})
		return err
	}, codes.InvalidArgument, "capacity -2"},
	{"heartbeat of a stranger", func(ctx context.Context, a *node) error {
		_, err := a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "ghost"})
		return err
	}, codes.NotFound, "register again"},
	{"a heartbeat loading an empty range", func(ctx context.Context, a *node) error {
		_, err := a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "ghost", Generation: 3,
			Loading: []*pb.Range{{Start: 0, End: 1 << 62}, {Start: 7, End: 7}}})
		return err
	}, codes.InvalidArgument, "loading range 1: wire: invalid message: range [0x0000000000000007, 0x0000000000000007) is empty"},
	{"a heartbeat loading a range ending before it starts", func(ctx context.Context, a *node) error {
		_, err := a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "ghost", Loading: []*pb.Range{{Start: 9, End: 3}}})
		return err
	}, codes.InvalidArgument, "loading range 0"},
	{"a heartbeat carrying another node's load", func(ctx context.Context, a *node) error {
		r := fullReport(1)
		r.NodeId = "n2"
		_, err := a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "n1", Load: r})
		return err
	}, codes.InvalidArgument, `its load names node "n2"`},
	{"a heartbeat carrying a NaN load", func(ctx context.Context, a *node) error {
		_, err := a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "n1", Load: fullReport(math.NaN())})
		return err
	}, codes.InvalidArgument, "loads[0] = NaN"},
	{"a heartbeat carrying ragged columns", func(ctx context.Context, a *node) error {
		r := fullReport(1)
		r.Loads = append(r.Loads, 2)
		_, err := a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "n1", Load: r})
		return err
	}, codes.InvalidArgument, "columns differ"},
	{"a huge load", func(ctx context.Context, a *node) error {
		_, err := a.nodes.ReportLoad(ctx, fullReport(1e308))
		return err
	}, codes.InvalidArgument, "loads[0] = 1e+308, above the cap"},
	{"no address", func(ctx context.Context, a *node) error {
		_, err := a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: "n2"}})
		return err
	}, codes.InvalidArgument, "no address"},
	{"a 10 KB node id", func(ctx context.Context, a *node) error {
		_, err := a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: strings.Repeat("x", 10<<10)})
		return err
	}, codes.InvalidArgument, "10240 bytes; at most 128"},
	{"a 10 KB node id registering", func(ctx context.Context, a *node) error {
		_, err := a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: strings.Repeat("x", 10<<10)}, Address: "x:1"})
		return err
	}, codes.InvalidArgument, "10240 bytes; at most 128"},
	{"a 10 KB node id draining", func(ctx context.Context, a *node) error {
		_, err := a.admin.Drain(ctx, &pb.DrainRequest{NodeId: strings.Repeat("x", 10<<10)})
		return err
	}, codes.InvalidArgument, "10240 bytes; at most 128"},
	{"a dead band that never moves", func(ctx context.Context, a *node) error {
		_, err := a.admin.SetAlgorithm(ctx, &pb.SetAlgorithmRequest{Name: "weighted-move", Params: map[string]string{"dead_band": "1e308"}})
		return err
	}, codes.InvalidArgument, "dead_band=1e+308"},
	{"a 10 KB param", func(ctx context.Context, a *node) error {
		_, err := a.admin.SetAlgorithm(ctx, &pb.SetAlgorithmRequest{Name: "weighted-move", Params: map[string]string{strings.Repeat("x", 10<<10): "1"}})
		return err
	}, codes.InvalidArgument, "10240 bytes; at most 64"},
	{"lookup of nothing", func(ctx context.Context, a *node) error {
		_, err := a.assign.Lookup(ctx, &pb.LookupRequest{})
		return err
	}, codes.InvalidArgument, "key or a hash"},
}

func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	c := newCluster(t)
	a := c.start(small, func(cfg *assigner.Config) { cfg.MaxRequestBytes = 64 << 10 })
	a.leading(t)
	ctx := ctxT(t, 20*time.Second)
	_, err := a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: "n1"}, Address: "127.0.0.1:1"})
	require.NoError(t, err)
	eventually(t, 10*time.Second, "a map exists", a.hasMap)
	before := a.assignment(t)
	for _, tc := range badInputCases {
		err := tc.call(ctx, a)
		require.Error(t, err, tc.name)
		assert.Equal(t, tc.code, code(err), "%s: %v", tc.name, err)
		assert.Contains(t, err.Error(), tc.text, tc.name)
		assert.Less(t, len(err.Error()), 512, "%s: the error does not echo the input whole", tc.name)
	}
	assert.Equal(t, before.Generation(), a.assignment(t).Generation())
	assert.Len(t, a.nodesList(t), 1, "no node was added")
	rejected, err := metric(a, "sliceplane_assigner_load_reports_total", "rejected")
	require.NoError(t, err)
	assert.GreaterOrEqual(t, rejected, 5.0)
	overCap, err := metric(a, "sliceplane_assigner_reports_rejected_total", "over_cap")
	require.NoError(t, err)
	assert.Equal(t, 1.0, overCap)
	notFinite, err := metric(a, "sliceplane_assigner_reports_rejected_total", "not_finite")
	require.NoError(t, err)
	assert.Equal(t, 2.0, notFinite, "a NaN report, and a heartbeat carrying one")
}

// TestAMemberThatFloodsItsLeaderIsHeldToItsRate: past its reports a second (and the burst),
// a member's reports are dropped before the core, ResourceExhausted and counted; its
// heartbeats go on, and another member's reports are not held back.
func TestAMemberThatFloodsItsLeaderIsHeldToItsRate(t *testing.T) {
	c := newCluster(t)
	// One report a quarter of an hour, a burst of one: whatever the machine's pace, the
	// first report passes and the rest of the test's are over the rate.
	a := c.start(small, func(cfg *assigner.Config) { cfg.MaxReportsPerSecond = 1.0 / 900 })
	a.leading(t)
	ctx := ctxT(t, 20*time.Second)
	for _, id := range []string{"n1", "n2"} {
		_, err := a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: id}, Address: "127.0.0.1:1"})
		require.NoError(t, err)
	}
	var dropped int
	for range 20 {
		_, err := a.nodes.ReportLoad(ctx, fullReport(1))
		if code(err) == codes.ResourceExhausted {
			dropped++
			assert.ErrorContains(t, err, "node n1 reports more than 0.00111 times a second; this report was dropped")
			continue
		}
		require.NoError(t, err)
	}
	assert.Equal(t, 19, dropped, "past the burst of 1, n1's reports are dropped")
	_, err := a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "n1", Load: fullReport(1)})
	require.NoError(t, err, "a heartbeat whose report is over the rate goes on without it")
	r := fullReport(1)
	r.NodeId = "n2"
	_, err = a.nodes.ReportLoad(ctx, r)
	require.NoError(t, err, "n2 has a rate of its own")
	rate, err := metric(a, "sliceplane_assigner_reports_rejected_total", "rate")
	require.NoError(t, err)
	assert.Equal(t, float64(dropped+1), rate, "every report dropped, the heartbeat's too")
}

func TestNodesThatStopReportingLeave(t *testing.T) {
	c := newCluster(t)
	a := c.start(small, func(cfg *assigner.Config) { cfg.Core.NodeTTL = 500 * time.Millisecond })
	a.leading(t)
	f := startFleet(t, hot, 3, a)
	eventually(t, 10*time.Second, "three nodes and a map", func() bool { return len(a.nodesList(t)) == 3 && a.hasMap() })
	f.stop()
	// Keep two of them alive by hand.
	ctx := ctxT(t, 20*time.Second)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				for _, id := range f.ids[:2] {
					a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: string(id)})
				}
			}
		}
	}()
	defer func() { close(stop); <-done }()
	eventually(t, 10*time.Second, "the silent node leaves and its slices move", func() bool {
		m := a.assignment(t)
		for _, s := range m.All() {
			if s.Holds(f.ids[2]) {
				return false
			}
		}
		return len(a.nodesList(t)) == 2
	})
}

func TestHealthReflectionAndMetrics(t *testing.T) {
	c := newCluster(t)
	a := c.start(small)
	a.leading(t)
	startFleet(t, hot, 2, a)
	eventually(t, 10*time.Second, "nodes counted", func() bool {
		g, err := metric(a, "sliceplane_assigner_nodes", "")
		return err == nil && g == 2
	})
	problems, err := testutil.GatherAndLint(a.registry)
	require.NoError(t, err)
	assert.Empty(t, problems, "metric names follow the Prometheus conventions")
	leader, err := metric(a, "sliceplane_assigner_leader", "")
	require.NoError(t, err)
	assert.Equal(t, 1.0, leader)

	conn, err := grpc.NewClient(a.srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	assertHealth(t, conn, assigner.LeaderHealthService)
	assertReflection(t, conn)
}

func assertReflection(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	services := grpcservertest.ListServices(ctxT(t, 5*time.Second), t, conn)
	for _, want := range []string{"sliceplane.v1.AdminService", "sliceplane.v1.QuantaService", "grpc.health.v1.Health"} {
		assert.Contains(t, services, want)
	}
}
