package client_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/wire"
)

func TestNewRouterRejectsBadConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  client.RouterConfig
		want string
	}{
		{"no assigners", client.RouterConfig{}, "client: a router needs the assigners' addresses"},
		{"blank assigners", client.RouterConfig{Assigners: []string{"", "  "}}, "client: a router needs the assigners' addresses"},
		{"unknown policy", client.RouterConfig{Assigners: []string{"a:1"}, Policy: client.Policy(9)},
			"client: unknown replica policy policy(9); use one of round-robin, capacity, least-outstanding, power-of-two"},
		{"negative refresh interval", client.RouterConfig{Assigners: []string{"a:1"}, RefreshInterval: -time.Second},
			"client: negative refresh interval -1s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := client.NewRouter(tc.cfg)
			assert.Nil(t, r)
			assert.EqualError(t, err, tc.want)
		})
	}
}

func TestRouterWithoutAnAssigner(t *testing.T) {
	r, err := client.NewRouter(client.RouterConfig{Assigners: []string{deadAddress(t)}, Logger: quiet()})
	require.NoError(t, err)
	assertNotReady := func() {
		t.Helper()
		_, err := r.Lookup([]byte("k"))
		assert.ErrorIs(t, err, client.ErrNotReady)
		_, err = r.LookupHash(1)
		assert.ErrorIs(t, err, client.ErrNotReady)
		_, err = r.Pick([]byte("k"))
		assert.ErrorIs(t, err, client.ErrNotReady)
		assert.Zero(t, r.Generation())
		assert.Zero(t, r.Clock())
		term, seq := r.Position()
		assert.Zero(t, term)
		assert.Zero(t, seq)
	}
	assertNotReady()

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer wcancel()
	err = r.WaitReady(wctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "waiting for the router's first map")
	assertNotReady()
	require.ErrorContains(t, r.Run(ctx), "Run called twice", "while it runs")

	start := time.Now()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err, "Run returns nil when its context ends")
		assert.Less(t, time.Since(start), 2*time.Second, "Run returns promptly")
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	require.ErrorContains(t, r.Run(t.Context()), "Run called twice", "once it has run")
	// goleak, in TestMain, checks that nothing Run started is left.
}

// runRouter runs r until the test ends, and checks that Run then returns nil.
func runRouter(t *testing.T, r *client.Router) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err, "Router.Run")
		case <-time.After(10 * time.Second):
			t.Error("Router.Run did not return after its context ended")
		}
	})
}

// replicaIDs returns the IDs of replicas.
func replicaIDs(reps []client.Replica) []string {
	out := make([]string, len(reps))
	for i, r := range reps {
		out[i] = r.ID
	}
	return out
}

func idStrings(ids []assignment.NodeID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = string(id)
	}
	return out
}

// caughtUp waits until the router applied the leader's map, and returns that map.
func caughtUp(t *testing.T, ctx context.Context, c *clustertest.Cluster, r *client.Router) *assignment.Assignment {
	t.Helper()
	var a *assignment.Assignment
	waitFor(t, 30*time.Second, "the router applies the leader's map", func() bool {
		var err error
		a, _, err = c.Assignment(ctx)
		return err == nil && r.Generation() == a.Generation()
	})
	return a
}

// checkAgrees checks that the router answers as the leader does: slice by slice against its
// map, and key by key against its Lookup RPC. The map must be still (balancing frozen).
func checkAgrees(t *testing.T, ctx context.Context, c *clustertest.Cluster, r *client.Router, keys int) {
	t.Helper()
	a := caughtUp(t, ctx, c, r)
	for _, s := range a.All() {
		// The first point and the middle one (for the last slice, End.Point() is 0, and the
		// arithmetic modulo 2^64 still finds the middle).
		for _, h := range []uint64{s.Range.Start, s.Range.Start + (s.Range.End.Point()-1-s.Range.Start)/2} {
			rt, err := r.LookupHash(h)
			require.NoError(t, err)
			require.Equal(t, fromKeyspace(s.Range), rt.Slice, "the slice holding %x", h)
			require.Equal(t, idStrings(s.Serving()), replicaIDs(rt.Replicas), "the replicas serving %s", s.Range)
			require.Equal(t, a.Generation(), rt.Generation)
		}
	}
	lookups := pb.NewAssignmentServiceClient(c.Conn())
	for i := range keys {
		key := fmt.Appendf(nil, "key-%d", i)
		want, err := lookups.Lookup(ctx, &pb.LookupRequest{Target: &pb.LookupRequest_Key{Key: key}}, grpc.WaitForReady(true))
		require.NoError(t, err)
		slice, err := wire.RangeFromProto(want.GetSlice())
		require.NoError(t, err)
		got, err := r.Lookup(key)
		require.NoError(t, err)
		require.Equal(t, want.GetHash(), got.Hash, "%s", key)
		require.Equal(t, fromKeyspace(slice), got.Slice, "%s", key)
		require.Equal(t, want.GetReplicas(), replicaIDs(got.Replicas), "%s", key)
		require.Equal(t, want.GetGeneration(), got.Generation, "%s", key)
	}
}

// withAddresses waits until every replica of the router's map has the address clustertest
// nodes register with.
func withAddresses(t *testing.T, ctx context.Context, c *clustertest.Cluster, r *client.Router, within time.Duration) {
	t.Helper()
	a := caughtUp(t, ctx, c, r)
	var missing []string
	waitFor(t, within, "every replica has its address", func() bool {
		missing = nil
		for _, s := range a.All() {
			rt, err := r.LookupHash(s.Range.Start)
			require.NoError(t, err)
			for _, rep := range rt.Replicas {
				if rep.Address != "127.0.0.1:1" || rep.Capacity != 1 {
					missing = append(missing, fmt.Sprintf("%+v", rep))
				}
			}
		}
		return len(missing) == 0
	})
}

// TestRouterInCluster follows a router through the life of a cluster: it agrees with the
// assigner, learns the nodes' addresses, follows admin changes, and survives the leader
// losing etcd (a standby takes over) and the next leader being stopped and replaced by a
// new assigner at the same address.
func TestRouterInCluster(t *testing.T) {
	s := startRouterCluster(t)
	t.Run("move", func(t *testing.T) { routerFollowsAMove(t, s) })
	t.Run("split", func(t *testing.T) { routerFollowsASplit(t, s) })
	t.Run("replicas and a new node", func(t *testing.T) { routerFollowsReplicasAndANewNode(t, s) })
	if t.Failed() {
		return
	}
	routerFollowsFailover(t, s)
}

// routerCluster is a cluster with a leading assigner, a standby, two nodes and a router, with
// balancing frozen so that the map changes only as the test changes it.
type routerCluster struct {
	c       *clustertest.Cluster
	r       *client.Router
	adm     admin
	ctx     context.Context
	standby *clustertest.Part
	// firstClient is the first assigner's etcd client, so that the test can cut it off.
	firstClient *clientv3.Client
	clock0      uint64
	term0       uint64
}

func startRouterCluster(t *testing.T) *routerCluster {
	s := &routerCluster{}
	// Later assigners listen where the test says.
	var listen string
	s.c = clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) {
		if s.firstClient == nil {
			s.firstClient = cfg.Client
		}
		if listen != "" {
			cfg.Listen = listen
		}
	}})
	c := s.c
	// The first assigner must lead before the standby starts, or the standby may win the
	// election. (c.Conn would only know the first assigner: dial on the side.)
	first, err := dial.Leader(c.Assigners())
	require.NoError(t, err)
	sctx, scancel := context.WithTimeout(t.Context(), 30*time.Second)
	st, err := pb.NewAdminServiceClient(first).Status(sctx, &pb.StatusRequest{}, grpc.WaitForReady(true))
	scancel()
	require.NoError(t, first.Close())
	require.NoError(t, err)
	require.True(t, st.GetLeader())
	listen = clustertest.StandbyAddress(t, c.Assigners()...)
	s.standby = c.StartAssigner() // before the nodes and the connection, which then know it
	require.Equal(t, listen, s.standby.Addr)
	c.StartDistributor("d1") // nodes load the slices they gain, so that moves end
	c.StartNode("n1", nil)
	c.StartNode("n2", nil)
	s.adm = newAdmin(c)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	s.ctx = ctx
	waitFor(t, 30*time.Second, "both nodes hold slices in the map", func() bool {
		nodes := s.adm.nodes(ctx)
		return nodes["n1"].GetSlices() > 0 && nodes["n2"].GetSlices() > 0
	})
	// A still map, so that the router and the assigner can be compared; admin changes go on.
	_, err = s.adm.Freeze(ctx, &pb.FreezeRequest{Reason: "router test"}, grpc.WaitForReady(true))
	require.NoError(t, err)
	// Handoffs a pass began end on their own, each a new generation: the map is still only
	// once they have.
	waitFor(t, 30*time.Second, "the passes' handoffs end", func() bool {
		st, err := s.adm.Status(ctx, &pb.StatusRequest{})
		return err == nil && st.GetHandoffs() == 0
	})

	// A refresh interval longer than the test: addresses come from the first read of the
	// node list, and from the read that a map naming an unknown node triggers.
	s.r, err = client.NewRouter(client.RouterConfig{Assigners: c.Assigners(), RefreshInterval: time.Hour, Logger: quiet()})
	require.NoError(t, err)
	runRouter(t, s.r)
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	require.NoError(t, s.r.WaitReady(rctx))

	checkAgrees(t, ctx, c, s.r, 300)
	withAddresses(t, ctx, c, s.r, 10*time.Second)
	s.clock0 = s.r.Clock()
	assert.NotZero(t, s.clock0, "the map carries the source's clock")
	s.term0, _ = s.r.Position()
	assert.NotZero(t, s.term0)
	return s
}

// followChange waits for the router to apply an admin change, and checks where it stands.
// A move is a handoff that a later quantum ends (make-before-break): the router may have
// applied that one too by the time it is looked at.
func (s *routerCluster) followChange(t *testing.T, ch *pb.Change) {
	t.Helper()
	r := s.r
	waitFor(t, 10*time.Second, "the router applies the change", func() bool { return r.Generation() >= ch.GetGeneration() })
	term, seq := r.Position()
	assert.GreaterOrEqual(t, term, ch.GetPosition().GetTerm())
	if term == ch.GetPosition().GetTerm() {
		assert.GreaterOrEqual(t, seq, ch.GetPosition().GetSeq())
	}
}

// serves waits until the router sends key's reads to replicas, which happens once their
// handoff ends: they have loaded the slice.
func (s *routerCluster) serves(t *testing.T, key []byte, replicas ...string) client.Route {
	t.Helper()
	var rt client.Route
	waitFor(t, 30*time.Second, fmt.Sprintf("the router sends %s's reads to %v", key, replicas), func() bool {
		var err error
		rt, err = s.r.Lookup(key)
		return err == nil && slices.Equal(replicaIDs(rt.Replicas), replicas)
	})
	return rt
}

// moveAway moves the slice holding key to whichever of n1 and n2 does not hold it alone,
// so that the move is a change (a move to where the slice is makes no quantum).
func (s *routerCluster) moveAway(t *testing.T, key []byte) (before client.Route, to string) {
	t.Helper()
	before, err := s.r.Lookup(key)
	require.NoError(t, err)
	to = "n1"
	if slices.Equal(replicaIDs(before.Replicas), []string{"n1"}) {
		to = "n2"
	}
	resp, err := s.adm.Move(s.ctx, &pb.MoveRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: key}}, To: []string{to}}, grpc.WaitForReady(true))
	require.NoError(t, err)
	require.NotEmpty(t, resp.GetChange().GetOps(), "the move changes the map: %s", resp.GetChange().GetSummary())
	s.followChange(t, resp.GetChange())
	s.serves(t, key, to)
	return before, to
}

func routerFollowsAMove(t *testing.T, s *routerCluster) {
	key := []byte("moved-key")
	before, to := s.moveAway(t, key)
	after, err := s.r.Lookup(key)
	require.NoError(t, err)
	assert.Equal(t, []client.Replica{{ID: to, Address: "127.0.0.1:1", Capacity: 1, Role: client.RoleReplica}}, after.Replicas)
	assert.Equal(t, before.Generation+3, after.Generation, "one generation starts the handoff, one makes the new holder serve, one drops the old")
	assert.GreaterOrEqual(t, s.r.Clock(), s.clock0)
	checkAgrees(t, s.ctx, s.c, s.r, 100)
}

func routerFollowsASplit(t *testing.T, s *routerCluster) {
	key := []byte("split-key")
	before, err := s.r.Lookup(key)
	require.NoError(t, err)
	resp, err := s.adm.Split(s.ctx, &pb.SplitRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: key}}}, grpc.WaitForReady(true))
	require.NoError(t, err)
	s.followChange(t, resp.GetChange())
	after, err := s.r.Lookup(key)
	require.NoError(t, err)
	assert.Equal(t, before.Slice.Start < after.Slice.Start, after.Slice.End == before.Slice.End, "the key is in one half: %s of %s", after.Slice, before.Slice)
	assert.Less(t, after.Slice.Fraction(), before.Slice.Fraction())
	assert.Equal(t, replicaIDs(before.Replicas), replicaIDs(after.Replicas), "a split moves nothing")
	checkAgrees(t, s.ctx, s.c, s.r, 100)
}

func routerFollowsReplicasAndANewNode(t *testing.T, s *routerCluster) {
	ctx, r := s.ctx, s.r
	// n3 joins after the router read the node list; the map naming it makes the router
	// read it again at once (the interval is an hour).
	s.c.StartNode("n3", nil)
	waitFor(t, 30*time.Second, "n3 registers", func() bool { return s.adm.nodes(ctx)["n3"] != nil })
	key := []byte("replicated-key")
	resp, err := s.adm.Move(ctx, &pb.MoveRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: key}}, To: []string{"n3", "n1"}}, grpc.WaitForReady(true))
	require.NoError(t, err)
	s.followChange(t, resp.GetChange())
	withAddresses(t, ctx, s.c, r, 5*time.Second)
	s.serves(t, []byte(key), "n1", "n3")
	// A new node is stale until it hears from its distributor; reads avoid it till then.
	waitFor(t, 30*time.Second, "the router learns n3 is fresh", func() bool {
		rt, err := r.Lookup(key)
		return err == nil && !slices.ContainsFunc(rt.Replicas, func(rep client.Replica) bool { return rep.Stale })
	})
	// The default policy, round-robin, takes them in turn.
	var got []string
	for range 4 {
		rep, err := r.Pick(key)
		require.NoError(t, err)
		got = append(got, rep.ID)
	}
	assert.ElementsMatch(t, []string{"n1", "n1", "n3", "n3"}, got)
	assert.NotEqual(t, got[0], got[1])
	checkAgrees(t, ctx, s.c, r, 100)
}

// routerFollowsFailover checks that the router resumes from a new leader, after the leader
// loses etcd and after it stops.
func routerFollowsFailover(t *testing.T, s *routerCluster) {
	c, r, ctx, standby := s.c, s.r, s.ctx, s.standby
	// The leader loses etcd: its lease lapses and the standby leads, under a new term. The
	// router resumes from the new leader.
	require.NoError(t, s.firstClient.Close())
	waitFor(t, 30*time.Second, "the standby leads", func() bool {
		st, err := pb.NewAdminServiceClient(c.Conn()).Status(ctx, &pb.StatusRequest{})
		return err == nil && st.GetLeader() && st.GetLeaderAddress() == standby.Addr && st.GetPosition().GetTerm() > s.term0
	})
	s.moveAway(t, []byte("after-failover"))
	term1, _ := r.Position()
	assert.Greater(t, term1, s.term0, "the router follows the new term")
	checkAgrees(t, ctx, c, r, 100)

	// The leader stops, and a new assigner starts at its address: the router reconnects.
	standby.Stop()
	replacement := c.StartAssigner()
	require.Equal(t, standby.Addr, replacement.Addr)
	s.moveAway(t, []byte("after-restart"))
	term2, _ := r.Position()
	assert.Greater(t, term2, term1, "the router follows the new term")
	checkAgrees(t, ctx, c, r, 100)
	withAddresses(t, ctx, c, r, 10*time.Second)
}
