package client_test

import (
	"context"
	"fmt"
	"net"
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

// A proxy embeds a Router to send each request to a node that holds its key.
func ExampleRouter() {
	r, err := client.NewRouter(client.RouterConfig{Assigners: []string{"10.0.0.1:7070", "10.0.0.2:7070"},
		Policy: client.LeastOutstanding})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx) //nolint:errcheck // Run returns nil once ctx ends
	if err := r.WaitReady(ctx); err != nil {
		panic(err)
	}

	// For each request:
	replica, err := r.Pick([]byte("user:42"))
	if err != nil {
		panic(err)
	}
	done := r.Begin(replica.ID)
	defer done()
	fmt.Println("send to", replica.Address)
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
			require.Equal(t, s.Range, rt.Slice, "the slice holding %x", h)
			require.Equal(t, idStrings(s.Replicas), replicaIDs(rt.Replicas), "the replicas of %s", s.Range)
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
		require.Equal(t, slice, got.Slice, "%s", key)
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

// freeAddress returns a loopback address nothing listens on, to start an assigner at.
func freeAddress(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer lis.Close()
	return lis.Addr().String()
}

// TestRouterInCluster follows a router through the life of a cluster: it agrees with the
// assigner, learns the nodes' addresses, follows admin changes, and survives the leader
// losing etcd (a standby takes over) and the next leader being stopped and replaced by a
// new assigner at the same address.
func TestRouterInCluster(t *testing.T) {
	// The first assigner, which clustertest starts, keeps its etcd client here, so that the
	// test can cut it off; later ones listen where the test says.
	var (
		firstClient *clientv3.Client
		listen      string
	)
	c := clustertest.New(t, clustertest.Options{Assigner: func(cfg *assigner.Config) {
		if firstClient == nil {
			firstClient = cfg.Client
		}
		if listen != "" {
			cfg.Listen = listen
		}
	}})
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
	listen = freeAddress(t)
	standby := c.StartAssigner() // before the nodes and the connection, which then know it
	require.Equal(t, listen, standby.Addr)
	c.StartNode("n1", nil)
	c.StartNode("n2", nil)
	adm := newAdmin(c)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	waitFor(t, 30*time.Second, "both nodes hold slices in the map", func() bool {
		nodes := adm.nodes(ctx)
		return nodes["n1"].GetSlices() > 0 && nodes["n2"].GetSlices() > 0
	})
	// A still map, so that the router and the assigner can be compared; admin changes go on.
	_, err = adm.Freeze(ctx, &pb.FreezeRequest{Reason: "router test"}, grpc.WaitForReady(true))
	require.NoError(t, err)

	// A refresh interval longer than the test: addresses come from the first read of the
	// node list, and from the read that a map naming an unknown node triggers.
	r, err := client.NewRouter(client.RouterConfig{Assigners: c.Assigners(), RefreshInterval: time.Hour, Logger: quiet()})
	require.NoError(t, err)
	runRouter(t, r)
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	require.NoError(t, r.WaitReady(rctx))

	checkAgrees(t, ctx, c, r, 300)
	withAddresses(t, ctx, c, r, 10*time.Second)
	clock0 := r.Clock()
	assert.NotZero(t, clock0, "the map carries the source's clock")
	term0, _ := r.Position()
	assert.NotZero(t, term0)

	// followChange waits for the router to apply an admin change, and checks where it stands.
	followChange := func(t *testing.T, ch *pb.Change) {
		t.Helper()
		waitFor(t, 10*time.Second, "the router applies the change", func() bool { return r.Generation() >= ch.GetGeneration() })
		require.Equal(t, ch.GetGeneration(), r.Generation())
		term, seq := r.Position()
		assert.Equal(t, [2]uint64{ch.GetPosition().GetTerm(), ch.GetPosition().GetSeq()}, [2]uint64{term, seq})
	}

	// moveAway moves the slice holding key to whichever of n1 and n2 does not hold it alone,
	// so that the move is a change (a move to where the slice is makes no quantum).
	moveAway := func(t *testing.T, key []byte) (before client.Route, to string) {
		t.Helper()
		before, err := r.Lookup(key)
		require.NoError(t, err)
		to = "n1"
		if slices.Equal(replicaIDs(before.Replicas), []string{"n1"}) {
			to = "n2"
		}
		resp, err := adm.Move(ctx, &pb.MoveRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: key}}, To: []string{to}}, grpc.WaitForReady(true))
		require.NoError(t, err)
		require.NotEmpty(t, resp.GetChange().GetOps(), "the move changes the map: %s", resp.GetChange().GetSummary())
		followChange(t, resp.GetChange())
		return before, to
	}

	t.Run("move", func(t *testing.T) {
		key := []byte("moved-key")
		before, to := moveAway(t, key)
		after, err := r.Lookup(key)
		require.NoError(t, err)
		assert.Equal(t, []client.Replica{{ID: to, Address: "127.0.0.1:1", Capacity: 1}}, after.Replicas)
		assert.Equal(t, before.Generation+1, after.Generation)
		assert.GreaterOrEqual(t, r.Clock(), clock0)
		checkAgrees(t, ctx, c, r, 100)
	})

	t.Run("split", func(t *testing.T) {
		key := []byte("split-key")
		before, err := r.Lookup(key)
		require.NoError(t, err)
		resp, err := adm.Split(ctx, &pb.SplitRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: key}}}, grpc.WaitForReady(true))
		require.NoError(t, err)
		followChange(t, resp.GetChange())
		after, err := r.Lookup(key)
		require.NoError(t, err)
		assert.Equal(t, before.Slice.Start < after.Slice.Start, after.Slice.End == before.Slice.End, "the key is in one half: %s of %s", after.Slice, before.Slice)
		assert.Less(t, after.Slice.Width(), before.Slice.Width())
		assert.Equal(t, replicaIDs(before.Replicas), replicaIDs(after.Replicas), "a split moves nothing")
		checkAgrees(t, ctx, c, r, 100)
	})

	t.Run("replicas and a new node", func(t *testing.T) {
		// n3 joins after the router read the node list; the map naming it makes the router
		// read it again at once (the interval is an hour).
		c.StartNode("n3", nil)
		waitFor(t, 30*time.Second, "n3 registers", func() bool { return adm.nodes(ctx)["n3"] != nil })
		key := []byte("replicated-key")
		resp, err := adm.Move(ctx, &pb.MoveRequest{Slice: &pb.SliceRef{Ref: &pb.SliceRef_Key{Key: key}}, To: []string{"n3", "n1"}}, grpc.WaitForReady(true))
		require.NoError(t, err)
		followChange(t, resp.GetChange())
		withAddresses(t, ctx, c, r, 5*time.Second)
		rt, err := r.Lookup(key)
		require.NoError(t, err)
		assert.Equal(t, []string{"n1", "n3"}, replicaIDs(rt.Replicas))
		// The default policy, round-robin, takes them in turn.
		var got []string
		for range 4 {
			rep, err := r.Pick(key)
			require.NoError(t, err)
			got = append(got, rep.ID)
		}
		assert.ElementsMatch(t, []string{"n1", "n1", "n3", "n3"}, got)
		assert.NotEqual(t, got[0], got[1])
		checkAgrees(t, ctx, c, r, 100)
	})
	if t.Failed() {
		return
	}

	// The leader loses etcd: its lease lapses and the standby leads, under a new term. The
	// router resumes from the new leader.
	require.NoError(t, firstClient.Close())
	waitFor(t, 30*time.Second, "the standby leads", func() bool {
		st, err := pb.NewAdminServiceClient(c.Conn()).Status(ctx, &pb.StatusRequest{})
		return err == nil && st.GetLeader() && st.GetLeaderAddress() == standby.Addr && st.GetPosition().GetTerm() > term0
	})
	moveAway(t, []byte("after-failover"))
	term1, _ := r.Position()
	assert.Greater(t, term1, term0, "the router follows the new term")
	checkAgrees(t, ctx, c, r, 100)

	// The leader stops, and a new assigner starts at its address: the router reconnects.
	standby.Stop()
	replacement := c.StartAssigner()
	require.Equal(t, standby.Addr, replacement.Addr)
	moveAway(t, []byte("after-restart"))
	term2, _ := r.Position()
	assert.Greater(t, term2, term1, "the router follows the new term")
	checkAgrees(t, ctx, c, r, 100)
	withAddresses(t, ctx, c, r, 10*time.Second)
}
