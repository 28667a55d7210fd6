package assigner_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/certs"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/target"
)

// addrsOf returns the addresses of nodes.
func addrsOf(nodes ...*node) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.srv.Addr()
	}
	return out
}

// leaders returns the leader each assigner of nodes reports for every target, once they all
// agree and each leader is the one Rank prefers among live: name -> address.
func leaders(t *testing.T, names []string, live []*node, within time.Duration) map[string]string {
	t.Helper()
	out := map[string]string{}
	eventually(t, within, "every target led by its owner", func() bool {
		for _, name := range names {
			want := target.Rank(name, addrsOf(live...))[0]
			st, err := live[0].admin.Status(named(ctxT(t, time.Second), name), &pb.StatusRequest{})
			if err != nil || st.GetLeaderAddress() != want {
				return false
			}
			out[name] = want
		}
		return true
	})
	return out
}

// named makes ctx's calls name target name.
func named(ctx context.Context, name string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, target.MetadataKey, name)
}

// TestTargetsSpreadAndFailOverAlone: targets created through the registry are led by their
// owners among the live assigners; killing one assigner moves only its targets, each to a
// new leader within the session TTL and a second, and the others keep their leaders.
func TestTargetsSpreadAndFailOverAlone(t *testing.T) {
	c := newCluster(t)
	nodes := []*node{c.start(), c.start(), c.start()}
	owner(t, nodes...) // the default target is led: the cluster is up
	admin := pb.NewTargetServiceClient(nodes[0].conn)
	var names []string
	for i := range 6 {
		name := fmt.Sprintf("svc-%d", i)
		_, err := admin.CreateTarget(ctxT(t, 5*time.Second), &pb.CreateTargetRequest{Name: name, Config: "min_replicas: 1\n"})
		require.NoError(t, err)
		names = append(names, name)
	}
	before := leaders(t, names, nodes, 15*time.Second)
	byLeader := map[string]int{}
	for _, l := range before {
		byLeader[l]++
	}
	assert.Greater(t, len(byLeader), 1, "the targets are spread: %v", before)

	victim := nodes[0]
	for _, n := range nodes {
		if byLeader[n.srv.Addr()] > 0 {
			victim = n
			break
		}
	}
	live := slices.DeleteFunc(slices.Clone(nodes), func(n *node) bool { return n == victim })
	killed := time.Now()
	victim.stop()
	after := leaders(t, names, live, 5*time.Second)
	took := time.Since(killed)
	for _, name := range names {
		if before[name] != victim.srv.Addr() {
			assert.Equal(t, before[name], after[name], "%s was not the victim's: it keeps its leader", name)
		}
	}
	assert.Less(t, took, 2*time.Second, "the victim's targets are led again within the session TTL (1 s) + 1 s")
	t.Logf("the victim's targets were led again %s after it stopped", took)
}

// TestTheRegistryChecksAndRefuses: a config is checked field by field, names are checked,
// the default target is fixed, and a target with registered members is deleted only by force.
func TestTheRegistryChecksAndRefuses(t *testing.T) {
	c := newCluster(t)
	a := c.start()
	a.leading(t)
	reg := pb.NewTargetServiceClient(a.conn)
	ctx := ctxT(t, 20*time.Second)
	for _, bad := range []struct{ name, config, says string }{
		{"kv", "churn_budget: 2\n", "churn_budget 2"},
		{"kv", "imbalance_tolerance: snug\n", "imbalance_tolerance"},
		{"kv", "roles: leader-follower\n", "roles"},
		{"kv", "node_tll: 10s\n", "node_tll"},
		{"kv", "exclusive: true\n", "exclusive"},
		{"KV", "", "name \"KV\""},
		{"default", "", "default target"},
	} {
		_, err := reg.CreateTarget(ctx, &pb.CreateTargetRequest{Name: bad.name, Config: bad.config})
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%s %q", bad.name, bad.config)
		assert.ErrorContains(t, err, bad.says)
	}
	list, err := reg.ListTargets(ctx, &pb.ListTargetsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetTargets(), 1, "nothing refused was created")

	_, err = reg.CreateTarget(ctx, &pb.CreateTargetRequest{Name: "kv", Config: "min_replicas: 2\nimbalance_tolerance: tight\n"})
	require.NoError(t, err)
	_, err = reg.CreateTarget(ctx, &pb.CreateTargetRequest{Name: "kv"})
	assert.Equal(t, codes.AlreadyExists, status.Code(err))
	_, err = reg.UpdateTarget(ctx, &pb.UpdateTargetRequest{Name: "nope"})
	assert.Equal(t, codes.NotFound, status.Code(err))

	kv := dialTarget(t, "kv", a)
	eventually(t, 10*time.Second, "kv is led", func() bool {
		st, err := pb.NewAdminServiceClient(kv).Status(ctxT(t, time.Second), &pb.StatusRequest{})
		return err == nil && st.GetLeader() && st.GetMinReplicas() == 2 && st.GetParams()["dead_band"] == "0.025"
	})
	_, err = pb.NewNodeServiceClient(kv).Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: "m1", Capacity: 1}, Address: "127.0.0.1:1"})
	require.NoError(t, err)
	nodes, err := a.admin.ListNodes(ctx, &pb.ListNodesRequest{})
	require.NoError(t, err)
	assert.Empty(t, nodes.GetNodes(), "a member of kv is not one of the default target")

	_, err = reg.DeleteTarget(ctx, &pb.DeleteTargetRequest{Name: "kv"})
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
	assert.ErrorContains(t, err, "kv has 1 registered members")
	_, err = reg.DeleteTarget(ctx, &pb.DeleteTargetRequest{Name: "kv", Force: true})
	require.NoError(t, err)
	eventually(t, 10*time.Second, "kv is gone", func() bool {
		_, err := a.admin.Status(named(ctxT(t, time.Second), "kv"), &pb.StatusRequest{})
		return status.Code(err) == codes.NotFound
	})
}

// dialTarget connects to the leader of target name among nodes.
func dialTarget(t *testing.T, name string, nodes ...*node) *grpc.ClientConn {
	t.Helper()
	conn, err := dial.TargetLeader(name, addrsOf(nodes...), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestTheWebViewOfATarget: the page's picker lists every target with its leader to an
// unconfined viewer and only its own to a viewer confined to one, which may open its
// target's view and not another's.
func TestTheWebViewOfATarget(t *testing.T) {
	s := startSecured(t, func(cfg *assigner.Config) { cfg.MetricsListen = "127.0.0.1:0" })
	s.leading(t)
	_, err := pb.NewTargetServiceClient(s.as(t, "admin", "alice")).CreateTarget(ctxT(t, 10*time.Second), &pb.CreateTargetRequest{Name: "kv"})
	require.NoError(t, err)
	type listed struct {
		Targets []struct{ Name, Leader string }
	}
	viewer := newPage(t, s.srv.MetricsAddr(), s.pki.Source("viewer", "vera").ClientTLS("assigner"))
	eventually(t, 10*time.Second, "both targets listed, each with its leader", func() bool {
		var l listed
		code, err := viewer.get("api/targets", &l)
		return err == nil && code == http.StatusOK && len(l.Targets) == 2 && l.Targets[1].Name == "kv" && l.Targets[1].Leader == s.srv.Addr()
	})
	src, err := s.pki.Issue(certs.Request{Kind: "viewer", Name: "kim", Target: "kv"}).Load()
	require.NoError(t, err)
	kim := newPage(t, s.srv.MetricsAddr(), src.ClientTLS("assigner"))
	var l listed
	code, err := kim.get("api/targets?target=kv", &l)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Len(t, l.Targets, 1)
	assert.Equal(t, "kv", l.Targets[0].Name)
	code, err = kim.get("api/state?target=kv", nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, "its target's view")
	code, err = kim.get("api/state", nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, code, "not the default target's")
}

// TestATargetsConfigChangesWithoutANewTerm: a target's new constants (its churn budget) are
// applied by its leader in the term it leads, persisted with the config they came from; a
// new role model takes a new term.
func TestATargetsConfigChangesWithoutANewTerm(t *testing.T) {
	c := newCluster(t)
	// Make-before-break, which a primary-secondary target needs.
	n := c.start(func(cfg *assigner.Config) { cfg.Core.BreakBeforeMake = false })
	owner(t, n)
	admin := pb.NewTargetServiceClient(n.conn)
	_, err := admin.CreateTarget(ctxT(t, 5*time.Second), &pb.CreateTargetRequest{Name: "kv", Config: "churn_budget: 0.05\n"})
	require.NoError(t, err)
	status := func() *pb.StatusResponse {
		st, err := n.admin.Status(named(ctxT(t, time.Second), "kv"), &pb.StatusRequest{})
		if err != nil {
			return nil
		}
		return st
	}
	var term uint64
	eventually(t, 10*time.Second, "kv led with its churn budget", func() bool {
		st := status()
		term = st.GetPosition().GetTerm()
		return st.GetLeader() && st.GetParams()["max_churn"] == "0.05"
	})

	_, err = admin.UpdateTarget(ctxT(t, 5*time.Second), &pb.UpdateTargetRequest{Name: "kv", Config: "churn_budget: 0.2\n"})
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the new churn budget applied", func() bool {
		return status().GetParams()["max_churn"] == "0.2"
	})
	assert.Equal(t, term, status().GetPosition().GetTerm(), "the same term")

	_, err = admin.UpdateTarget(ctxT(t, 5*time.Second), &pb.UpdateTargetRequest{Name: "kv",
		Config: "churn_budget: 0.2\nroles: primary-secondary\n"})
	require.NoError(t, err)
	eventually(t, 10*time.Second, "a new term for the new role model", func() bool {
		st := status()
		return st.GetLeader() && st.GetPosition().GetTerm() > term
	})
}

// TestAHeavyTargetIsLedAlone: once a target's leader publishes a size of HeavySlices or more,
// the assigner that owns it leads no other target; the light ones move to the others.
func TestAHeavyTargetIsLedAlone(t *testing.T) {
	c := newCluster(t)
	heavy := func(cfg *assigner.Config) { small(cfg); cfg.HeavySlices = 64 }
	nodes := []*node{c.start(heavy), c.start(heavy), c.start(heavy)}
	owner(t, nodes...)
	admin := pb.NewTargetServiceClient(nodes[0].conn)
	names := []string{"big"}
	_, err := admin.CreateTarget(ctxT(t, 5*time.Second), &pb.CreateTargetRequest{Name: "big",
		Config: "params: {initial_slices_per_node: \"96\", min_slices_per_node: \"2\", max_slices_per_node: \"128\"}\n"})
	require.NoError(t, err)
	for i := range 12 { // by Rank alone, one of them would be led beside big but 1% of the time
		name := fmt.Sprintf("light-%d", i)
		_, err := admin.CreateTarget(ctxT(t, 5*time.Second), &pb.CreateTargetRequest{Name: name})
		require.NoError(t, err)
		names = append(names, name)
	}
	// A member of big, so that it has a map (96 slices) and its leader a size to publish.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	member, err := dial.TargetLeader("big", addrsOf(nodes...), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer member.Close()
	beats := pb.NewNodeServiceClient(member)
	go func() {
		for ctx.Err() == nil {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			if _, err := beats.Heartbeat(cctx, &pb.HeartbeatRequest{NodeId: "m1"}); status.Code(err) == codes.NotFound {
				_, _ = beats.Register(cctx, &pb.RegisterRequest{Node: &pb.Node{Id: "m1", Capacity: 1}, Address: "127.0.0.1:1"})
			}
			cancel()
			time.Sleep(200 * time.Millisecond)
		}
	}()
	bigOwner := target.Rank("big", addrsOf(nodes...))[0]
	eventually(t, 30*time.Second, "big led by its owner, and nothing else led there", func() bool {
		for _, name := range names {
			st, err := nodes[0].admin.Status(named(ctxT(t, time.Second), name), &pb.StatusRequest{})
			if err != nil || st.GetLeaderAddress() == "" || (name == "big") != (st.GetLeaderAddress() == bigOwner) {
				return false
			}
		}
		return true
	})

	// A light assigner dies: its targets go to the other light one, none to big's owner.
	var victim, heir *node
	for _, n := range nodes {
		switch {
		case n.srv.Addr() == bigOwner:
		case victim == nil:
			victim = n
		default:
			heir = n
		}
	}
	victim.stop()
	eventually(t, 10*time.Second, "every light target led by the light assigner left", func() bool {
		for _, name := range names[1:] {
			st, err := heir.admin.Status(named(ctxT(t, time.Second), name), &pb.StatusRequest{})
			if err != nil || st.GetLeaderAddress() != heir.srv.Addr() {
				return false
			}
		}
		return true
	})
}
