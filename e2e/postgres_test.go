package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/examples/kvstore/loadgen"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/source/postgres"
	"github.com/sliceplane/sliceplane/internal/source/postgres/pgtest"
)

// pgRows is how many rows TestPostgresEndToEnd fills by COPY.
const pgRows = 100_000

// TestPostgresEndToEnd runs the real binaries over a throwaway PostgreSQL (make
// e2e-postgres): 1 assigner, 2 distributors and 4 nodes, every link mutual TLS. It fills
// the table by COPY and times how long until every node holds it against the COPY itself,
// then updates, inserts and deletes rows while slices move and one distributor is killed
// and restarted; once the writers stop, every node must hold exactly what it must.
func TestPostgresEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries; skipped in -short mode")
	}
	if raceEnabled {
		t.Skip("runs without the race detector, in make test's second step (the binaries it starts are not instrumented either)")
	}
	pg := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s, src := startPostgresCluster(t, ctx, pg.DSN)

	rows := make([]postgres.Row, 0, pgRows+pgRows/10)
	for i := range pgRows {
		rows = append(rows, postgres.Row{Key: loadgen.Key(i), Value: fmt.Appendf(nil, "v%d", i)})
		if i%10 == 0 {
			rows = append(rows, postgres.Row{Key: loadgen.Key(i), Fragment: "f", Value: []byte("frag")})
		}
	}
	start := time.Now()
	clock, err := src.Copy(ctx, rows)
	if err != nil {
		t.Fatal(err)
	}
	copied := time.Since(start)
	s.waitClock(clock)
	filled := time.Since(start)
	t.Logf("COPY of %d rows: %s; every node holds them %s after the COPY began (%.2f× the COPY)",
		len(rows), copied.Round(time.Millisecond), filled.Round(time.Millisecond), filled.Seconds()/copied.Seconds())

	s.churn(src, pgRows)
	s.slicectl("freeze", "--reason", "e2e-postgres")
	rep := s.check("the writes")
	lost := rep.Missing + rep.Leaked + rep.Stale + rep.Slices
	t.Logf("postgres e2e: items=%d copy=%s fill=%s (%.2f× the COPY) lost=%d", rep.Items,
		copied.Round(time.Millisecond), filled.Round(time.Millisecond), filled.Seconds()/copied.Seconds(), lost)
}

// startPostgresCluster builds the binaries and starts the cluster on PostgreSQL dsn (an
// embedded etcd keeps the assigner's state), and returns it with a writer of the table.
func startPostgresCluster(t *testing.T, ctx context.Context, dsn string) (*scenario, *postgres.Source) {
	t.Helper()
	s := newScenario(t, ctx)
	if err := postgres.Init(ctx, postgres.Config{DSN: dsn}); err != nil {
		t.Fatal(err)
	}
	src, err := postgres.Open(ctx, postgres.Config{DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	s.src = src
	etcd, _ := s.startEtcd()
	s.newCluster(etcd.Endpoint(), "--source", "postgres", "--pg-dsn", dsn)
	s.startMembers(1, 2, 4)
	return s, src
}

// startMembers starts the assigners, distributors and nodes, and waits until every node is
// registered.
func (s *scenario) startMembers(assigners, distributors, nodes int) {
	t := s.t
	for i := range assigners {
		if _, err := s.cluster.StartAssigner(s.ctx, fmt.Sprintf("a%d", i+1)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range distributors {
		if _, err := s.cluster.StartDistributor(s.ctx, fmt.Sprintf("d%d", i+1)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range nodes {
		if _, err := s.cluster.StartNode(s.ctx, fmt.Sprintf("n%d", i+1)); err != nil {
			t.Fatal(err)
		}
	}
	s.until("every node holds its first snapshot", func(ctx context.Context) error {
		for _, n := range s.cluster.Nodes() {
			st, err := n.State(ctx)
			if err != nil {
				return err
			}
			if st.Clock == 0 {
				return fmt.Errorf("node %s has no clock yet", st.ID)
			}
		}
		return nil
	})
}

// waitClock waits until every node has applied everything up to clock.
func (s *scenario) waitClock(clock uint64) {
	s.until("every node to reach the clock", func(ctx context.Context) error {
		for _, n := range s.cluster.Nodes() {
			st, err := n.State(ctx)
			if err != nil {
				return err
			}
			if st.Clock < clock {
				return fmt.Errorf("node %s is at %d of %d", st.ID, st.Clock, clock)
			}
		}
		return nil
	})
}

// churn writes to the table (rewrites, new rows, fragments, deletes) while slices move, and
// kills and restarts distributor d1 meanwhile; it returns once the writers stopped.
func (s *scenario) churn(src *postgres.Source, keys int) {
	t := s.t
	conn, err := s.cluster.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, stop := context.WithCancel(s.ctx)
	var wg sync.WaitGroup
	var writes, moves atomic.Int64
	errs := make(chan error, 2)
	wg.Go(func() { errs <- writeRows(ctx, src, keys, &writes) })
	wg.Go(func() { errs <- moveSlices(ctx, pb.NewAdminServiceClient(conn), &moves) })
	s.until("writes and moves under way", func(context.Context) error {
		if writes.Load() < 500 || moves.Load() < 5 {
			return fmt.Errorf("%d writes, %d moves", writes.Load(), moves.Load())
		}
		return nil
	})
	d1, _ := s.cluster.Member("distributor", "d1")
	d1.Proc().Kill()
	s.until("every node pulls from d2", s.pullingFrom("d2", true))
	if err := s.cluster.Restart(s.ctx, d1); err != nil {
		t.Fatal(err)
	}
	before := writes.Load()
	s.until("some node pulls from d1 again, under writes", func(ctx context.Context) error {
		if err := s.pullingFrom("d1", false)(ctx); err != nil {
			return err
		}
		if writes.Load() < before+500 {
			return fmt.Errorf("%d writes since d1 came back", writes.Load()-before)
		}
		return nil
	})
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d writes and %d moves; d1 killed and restarted", writes.Load(), moves.Load())
}

// until waits for cond, within patience.
func (s *scenario) until(what string, cond func(context.Context) error) {
	ctx, cancel := context.WithTimeout(s.ctx, patience)
	defer cancel()
	if err := launch.WaitFor(ctx, what, 20*time.Millisecond, cond); err != nil {
		s.t.Fatal(err)
	}
}

// pullingFrom returns a condition: every node (all) or some node pulls from distributor d.
func (s *scenario) pullingFrom(d string, all bool) func(context.Context) error {
	return func(ctx context.Context) error {
		n := 0
		for _, node := range s.cluster.Nodes() {
			st, err := node.State(ctx)
			if err != nil {
				return err
			}
			if st.Distributor == d {
				n++
			}
		}
		if all && n < len(s.cluster.Nodes()) || n == 0 {
			return fmt.Errorf("%d nodes pull from %s", n, d)
		}
		return nil
	}
}

// writeRows writes until ctx ends: rewrites of existing rows, new rows, fragments and
// deletes, each its own transaction, counted in n.
func writeRows(ctx context.Context, src *postgres.Source, keys int, n *atomic.Int64) error {
	rng := rand.New(rand.NewPCG(7, 8))
	for next := keys; ctx.Err() == nil; n.Add(1) {
		key := loadgen.Key(rng.IntN(next))
		var err error
		switch rng.IntN(10) {
		case 0:
			_, err = src.Delete(ctx, key)
		case 1:
			_, err = src.PutFragment(ctx, key, "f", fmt.Appendf(nil, "g%d", rng.Int()))
		case 2, 3:
			_, err = src.Put(ctx, loadgen.Key(next), []byte("new"))
			next++
		default:
			_, err = src.Put(ctx, key, fmt.Appendf(nil, "w%d", rng.Int()))
		}
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("writing: %w", err)
		}
	}
	return nil
}

// moveSlices moves a random slice to a random node every 100 ms until ctx ends, counting
// the moves made in n.
func moveSlices(ctx context.Context, admin pb.AdminServiceClient, n *atomic.Int64) error {
	rng := rand.New(rand.NewPCG(9, 10))
	for ctx.Err() == nil {
		nodes, err := admin.ListNodes(ctx, &pb.ListNodesRequest{})
		if err == nil {
			var slices *pb.ListSlicesResponse
			if slices, err = admin.ListSlices(ctx, &pb.ListSlicesRequest{}); err == nil && len(slices.GetSlices()) > 0 && len(nodes.GetNodes()) > 0 {
				sl := slices.GetSlices()[rng.IntN(len(slices.GetSlices()))]
				to := nodes.GetNodes()[rng.IntN(len(nodes.GetNodes()))].GetNode().GetId()
				ref := &pb.SliceRef{Ref: &pb.SliceRef_Start{Start: sl.GetRange().GetStart()}}
				// A slice in a handoff is refused for now: the next one will do.
				if _, err := admin.Move(ctx, &pb.MoveRequest{Slice: ref, To: []string{to}}, grpc.WaitForReady(true)); err == nil {
					n.Add(1)
				}
			}
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
	return nil
}
