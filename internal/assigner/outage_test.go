package assigner_test

import (
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/source/sourcetest"
)

// sourceAvailable reads the leader's sliceplane_assigner_source_available.
func (n *node) sourceAvailable(t *testing.T) float64 {
	t.Helper()
	return n.metric(t, "sliceplane_assigner_source_available").GetGauge().GetValue()
}

// passes returns how many balancing passes n ran (the count of its pass durations).
func (n *node) passes(t *testing.T) uint64 {
	t.Helper()
	return n.metric(t, "sliceplane_assigner_pass_duration_seconds").GetHistogram().GetSampleCount()
}

// metric returns n's one series of the metric name.
func (n *node) metric(t *testing.T, name string) *dto.Metric {
	t.Helper()
	mfs, err := n.registry.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0]
		}
	}
	t.Fatalf("no %s", name)
	return nil
}

// leaderAndStandby starts two assigners on a source the test can cut off, and returns them
// with the leader's term.
func leaderAndStandby(t *testing.T) (src *sourcetest.Outage, a, b *node, term uint64) {
	t.Helper()
	c := newCluster(t)
	src = sourcetest.NewOutage(source.NewEtcd(c.cli, "/sliceplane/data/"))
	withSource := func(cfg *assigner.Config) { cfg.Source = src }
	a, others := owner(t, c.start(small, withSource), c.start(small, withSource))
	return src, a, others[0], a.leading(t).GetPosition().GetTerm()
}

// TestASourceOutageKeepsTheTerm cuts the source off for twice the leader's lease: the leader
// keeps its term and serves (status, metric and the map say so), the standby does not take
// over, balancing passes are held; once the source is back, the leader follows it again
// within a second or so, in the same term.
func TestASourceOutageKeepsTheTerm(t *testing.T) {
	src, a, b, term := leaderAndStandby(t)
	ctx := ctxT(t, time.Minute)
	for _, id := range []string{"n1", "n2"} {
		_, err := a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: id}, Address: "127.0.0.1:1"})
		require.NoError(t, err)
	}
	eventually(t, 10*time.Second, "a map", a.hasMap)
	require.Equal(t, 1.0, a.sourceAvailable(t))

	src.Cut()
	var st *pb.StatusResponse
	eventually(t, 10*time.Second, "the status says the source is lost", func() bool {
		var err error
		st, err = a.admin.Status(ctx, &pb.StatusRequest{})
		return err == nil && st.GetSourceError() != ""
	})
	assert.Contains(t, st.GetSourceError(), "cut off")
	assert.False(t, st.GetSourceMisconfigured())
	assert.Equal(t, 0.0, a.sourceAvailable(t))
	held := a.passes(t)

	// Twice the lease (1 s here) and more: the leader keeps beating and serving.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		st, err := a.admin.Status(ctx, &pb.StatusRequest{})
		require.NoError(t, err)
		require.True(t, st.GetLeader(), "the leader stepped down in an outage of its source")
		require.Equal(t, term, st.GetPosition().GetTerm())
		require.NotEmpty(t, st.GetSourceError())
		_, err = a.nodes.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "n1"})
		require.NoError(t, err, "a node's heartbeat during the outage")
		sb, err := b.admin.Status(ctx, &pb.StatusRequest{})
		require.NoError(t, err)
		require.False(t, sb.GetLeader(), "the standby took over")
		time.Sleep(100 * time.Millisecond) // the outage's length is the test's point: a poll, not a wait for luck
	}
	assert.Equal(t, held, a.passes(t), "balancing passes ran while the source was lost")

	src.Restore()
	eventually(t, 5*time.Second, "the leader follows the source again", func() bool {
		st, err := a.admin.Status(ctx, &pb.StatusRequest{})
		return err == nil && st.GetSourceError() == "" && st.GetLeader()
	})
	assert.Equal(t, 1.0, a.sourceAvailable(t))
	st, err := a.admin.Status(ctx, &pb.StatusRequest{})
	require.NoError(t, err)
	assert.Equal(t, term, st.GetPosition().GetTerm(), "one term through the outage")
	eventually(t, 5*time.Second, "passes run again", func() bool { return a.passes(t) > held })
}

// TestANewLeaderTakesOverWithoutItsSource stops the leader while the source is cut off: the
// standby takes over all the same (only the etcd lease decides), says the source is lost,
// and follows it once it is back.
func TestANewLeaderTakesOverWithoutItsSource(t *testing.T) {
	src, a, b, term := leaderAndStandby(t)
	src.Cut()
	a.stop()
	st := b.leading(t)
	assert.Greater(t, st.GetPosition().GetTerm(), term)
	eventually(t, 10*time.Second, "the new leader says the source is lost", func() bool {
		st, err := b.admin.Status(context.Background(), &pb.StatusRequest{})
		return err == nil && st.GetSourceError() != ""
	})
	src.Restore()
	eventually(t, 5*time.Second, "the new leader follows the source", func() bool {
		st, err := b.admin.Status(context.Background(), &pb.StatusRequest{})
		return err == nil && st.GetLeader() && st.GetSourceError() == ""
	})
}
