package assigner_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/internal/balance"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
)

// TestFailingPassesStillCleanUpAndSaySo: while every balancing pass fails, a node that goes
// silent still loses its slices (I1), and the failures show in the metric, status and
// explain.
func TestFailingPassesStillCleanUpAndSaySo(t *testing.T) {
	c := newCluster(t)
	var broken atomic.Bool
	a := c.start(func(cfg *assigner.Config) {
		small(cfg)
		cfg.Core.WrapAlgorithm = func(alg balance.Algorithm) balance.Algorithm { return breakable{alg, &broken} }
	})
	a.leading(t)
	ctx := ctxT(t, 30*time.Second)
	for _, id := range []string{"n1", "n2"} {
		_, err := a.nodes.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: id}, Address: "127.0.0.1:1"})
		require.NoError(t, err)
	}
	// n1 stays alive; n2 beats too until both hold slices (on a busy machine that can take
	// longer than its TTL), then goes silent.
	var n2Silent atomic.Bool
	beat, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-beat.Done():
				return
			case <-tick.C:
				_, _ = a.nodes.Heartbeat(beat, &pb.HeartbeatRequest{NodeId: "n1"})
				if !n2Silent.Load() {
					_, _ = a.nodes.Heartbeat(beat, &pb.HeartbeatRequest{NodeId: "n2"})
				}
			}
		}
	}()
	defer wg.Wait()
	defer stop()
	eventually(t, 10*time.Second, "both nodes hold slices", func() bool {
		if !a.hasMap() {
			return false
		}
		m := a.assignment(t)
		var on1, on2 bool
		for _, s := range m.All() {
			on1, on2 = on1 || s.Holds("n1"), on2 || s.Holds("n2")
		}
		return on1 && on2
	})
	broken.Store(true) // every pass fails from now on
	n2Silent.Store(true)

	eventually(t, 15*time.Second, "n2 expired and holds nothing", func() bool {
		if len(a.nodesList(t)) != 1 {
			return false
		}
		for _, s := range a.assignment(t).All() {
			if s.Holds("n2") {
				return false
			}
		}
		return true
	})
	st, err := a.admin.Status(ctx, &pb.StatusRequest{})
	require.NoError(t, err)
	assert.Positive(t, st.GetPassFailures())
	assert.Contains(t, st.GetPassError(), "something broke")
	assert.NotNil(t, st.GetPassErrorTime())
	x, err := a.admin.Explain(ctx, &pb.ExplainRequest{})
	require.NoError(t, err)
	assert.Positive(t, x.GetPassFailures())
	assert.Contains(t, x.GetPassError(), "something broke")
	failures, err := metric(a, "sliceplane_assigner_pass_failures_total", "")
	require.NoError(t, err)
	assert.Positive(t, failures)
}

// breakable is an algorithm whose passes fail, for whatever reason a real one might, once
// broken is set.
type breakable struct {
	balance.Algorithm
	broken *atomic.Bool
}

func (b breakable) Rebalance(in balance.Input) (balance.Result, error) {
	if b.broken.Load() {
		return balance.Result{}, errors.New("balance: something broke")
	}
	return b.Algorithm.Rebalance(in)
}
