package assigner_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/assigner"
	"github.com/sliceplane/sliceplane/internal/embedetcd"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
)

// quantaLog follows an assigner's quanta and keeps their terms and causes.
type quantaLog struct {
	mu     sync.Mutex
	terms  map[uint64]bool
	reinit int
	err    error
}

func followQuanta(t *testing.T, n *node) *quantaLog {
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := n.quanta.WatchQuanta(ctx, &pb.WatchQuantaRequest{})
	require.NoError(t, err)
	l := &quantaLog{terms: map[uint64]bool{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			resp, err := recv(stream)
			l.mu.Lock()
			if err != nil {
				l.err = err
				l.mu.Unlock()
				return
			}
			q := resp.GetQuantum()
			l.terms[q.GetPosition().GetTerm()] = true
			if q.GetReinitializing() && q.GetCause() != "distributors" {
				l.reinit++
			}
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// The loss of the etcd cluster's leader is routine: etcd elects another in a second or two,
// and the assigner rides it out, retrying within its own lease, keeping its term, and
// sending no reinitializing quantum.
func TestAssignerKeepsItsTermThroughEtcdLeaderKills(t *testing.T) {
	if testing.Short() {
		t.Skip("kills etcd members three times")
	}
	ec := etcdtest.StartCluster(t, 3)
	c := &cluster{t: t, cli: etcdtest.ClusterClient(t, ec)}
	a := c.start(func(cfg *assigner.Config) { cfg.SessionTTL = 5 * time.Second })
	st := a.leading(t)
	term := st.GetPosition().GetTerm()
	startFleet(t, hot, 4, a)
	eventually(t, 15*time.Second, "a map", a.hasMap)
	quanta := followQuanta(t, a)

	// Writes run throughout: admin changes (each a meta record write) as well as passes.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []error
	writes := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		pace := time.NewTicker(5 * time.Millisecond)
		defer pace.Stop()
		for ctx.Err() == nil {
			select {
			case <-pace.C:
			case <-ctx.Done():
				return
			}
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := a.admin.Freeze(cctx, &pb.FreezeRequest{Reason: "etcd leader kill test"})
			if err == nil {
				_, err = a.admin.Unfreeze(cctx, &pb.UnfreezeRequest{})
			}
			cancel()
			mu.Lock()
			if err != nil && ctx.Err() == nil {
				failed = append(failed, err)
			} else if err == nil {
				writes++
			}
			mu.Unlock()
		}
	}()
	written := func() int { mu.Lock(); defer mu.Unlock(); return writes }

	for kill := range 3 {
		var leader *embedetcd.Server
		eventually(t, 15*time.Second, "an etcd leader", func() bool { leader = ec.Leader(); return leader != nil })
		before := written()
		leader.Kill()
		eventually(t, 15*time.Second, "a new etcd leader", func() bool { l := ec.Leader(); return l != nil && l != leader })
		eventually(t, 15*time.Second, "admin changes written after the kill", func() bool { return written() > before+2 })
		rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		require.NoError(t, ec.Restart(rctx, slices.Index(ec.Members, leader)), "restarting member after kill %d", kill+1)
		cancel()
		st, err := a.admin.Status(context.Background(), &pb.StatusRequest{})
		require.NoError(t, err)
		require.Equal(t, term, st.GetPosition().GetTerm(), "the term after kill %d", kill+1)
	}
	stop()
	wg.Wait()
	retries := 0.0
	for _, op := range []string{"meta", "append", "put_node", "delete_node"} {
		v, _ := metric(a, "sliceplane_assigner_etcd_retries_total", op) // absent: none retried
		retries += v
	}
	t.Logf("%d admin changes written, %.0f etcd writes retried", written(), retries)

	mu.Lock()
	assert.Empty(t, failed, "admin changes failed")
	mu.Unlock()
	quanta.mu.Lock()
	defer quanta.mu.Unlock()
	assert.NoError(t, quanta.err, "the quanta stream stays open")
	assert.Equal(t, map[uint64]bool{term: true}, quanta.terms, "every quantum of the one term")
	assert.Equal(t, 1, quanta.reinit, "one reinitializing quantum: the stream's first")
}
