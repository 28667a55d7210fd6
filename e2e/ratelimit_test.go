package e2e_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvcluster"
	ratelimitv1 "github.com/sliceplane/sliceplane/examples/ratelimit/proto/ratelimit/v1"
	"github.com/sliceplane/sliceplane/internal/launch"
)

// TestARollingRestartOfTheRateLimiterFailsNoTake runs the example rate limiter's binaries
// (an assigner with primary and secondary roles, three members, mutual TLS) and restarts
// every member in turn under a steady stream of takes routed by key, each member draining
// on SIGTERM: no take may fail.
func TestARollingRestartOfTheRateLimiterFailsNoTake(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries; skipped in -short mode")
	}
	if raceEnabled {
		t.Skip("runs without the race detector, in make test's second step (the binaries it starts are not instrumented either)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newScenario(t, ctx)
	etcd, _ := s.startEtcd()
	c, err := kvcluster.New(kvcluster.Options{Bin: s.bin, Dir: t.TempDir(), Etcd: []string{etcd.Endpoint()}, PKI: s.pki,
		AssignerArgs: []string{"--roles", "primary-secondary", "--pass-interval", "200ms", "--session-ttl", "2s", "--handoff-linger", "500ms",
			"--first-map-nodes", "3"},
		DrainTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(10 * time.Second); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
	if _, err := c.StartAssigner(ctx, "a1"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"r1", "r2", "r3"} {
		if _, err := c.StartRateLimiter(ctx, id, "--report-interval", "200ms"); err != nil {
			t.Fatal(err)
		}
	}
	rl := rateLimiterClient(t, ctx, s.pki, c.Assigners())
	takes := startTaking(ctx, rl)
	err = launch.WaitFor(ctx, "every member to answer takes", 100*time.Millisecond, func(context.Context) error {
		if n := takes.answered(); n < 3 {
			return fmt.Errorf("%d members answered", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Members("ratelimit") {
		before, _ := takes.count()
		start := time.Now()
		if err := c.Roll(ctx, m); err != nil {
			t.Fatal(err)
		}
		waitRegistered(t, ctx, c, m.ID)
		after, slowest := takes.count()
		t.Logf("rolled %s in %s under %d takes; the slowest take so far took %s", m.ID, time.Since(start).Round(time.Millisecond), after-before, slowest)
	}
	failed := takes.stop()
	n, slowest := takes.count()
	if n == 0 || len(failed) > 0 {
		t.Fatalf("%d takes, %d failed under the rolling restart (want none): %v", n, len(failed), failed[:min(len(failed), 5)])
	}
	// A take waits while its key's primary is handed over (no member takes writes then).
	t.Logf("%d takes, none failed; the slowest took %s", n, slowest)
}

// rateLimiterClient returns a client of the rate limiter that routes through a router of
// assigners with a router's certificate of pki, both closed when the test ends.
func rateLimiterClient(t *testing.T, ctx context.Context, pki *launch.PKI, assigners []string) ratelimitv1.RateLimitServiceClient {
	t.Helper()
	files, err := pki.Issue("router", "e2e")
	if err != nil {
		t.Fatal(err)
	}
	src, err := files.Load()
	if err != nil {
		t.Fatal(err)
	}
	r, err := client.NewRouter(client.RouterConfig{Assigners: assigners, TLS: client.TLS{Cert: files.Cert, Key: files.Key, CA: files.CA}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(rctx) //nolint:errcheck // nil once rctx ends
	}()
	t.Cleanup(func() { stop(); <-done })
	conn, err := grpc.NewClient("sliceplane:///ratelimit", append(client.GRPCDialOptions(r), src.DialOption("node"))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return ratelimitv1.NewRateLimitServiceClient(conn)
}

// takes is a steady caller of the rate limiter: a take of one of 50 keys every 10 ms, each
// allowed 10 s to be answered, until stopped.
type takes struct {
	stopc chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	n       int
	failed  []error
	slowest time.Duration
	by      map[string]int // takes answered, by member
}

func startTaking(ctx context.Context, rl ratelimitv1.RateLimitServiceClient) *takes {
	tk := &takes{stopc: make(chan struct{}), by: map[string]int{}}
	tk.wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			key := fmt.Sprintf("user-%d", i%50)
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			start := time.Now()
			resp, err := rl.Take(client.WithWriteKey(cctx, []byte(key)), &ratelimitv1.TakeRequest{Key: key})
			took := time.Since(start)
			cancel()
			tk.mu.Lock()
			tk.n++
			tk.slowest = max(tk.slowest, took)
			if err == nil {
				tk.by[resp.GetMember()]++
			}
			if err != nil {
				tk.failed = append(tk.failed, fmt.Errorf("take %d, of %s: %w", i, key, err))
			}
			tk.mu.Unlock()
			select {
			case <-tk.stopc:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return tk
}

// count returns how many takes were made, and the longest one took.
func (tk *takes) count() (int, time.Duration) {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	return tk.n, tk.slowest
}

// answered returns how many members answered takes.
func (tk *takes) answered() int {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	return len(tk.by)
}

// stop stops the takes and returns the errors of those that failed.
func (tk *takes) stop() []error {
	close(tk.stopc)
	tk.wg.Wait()
	tk.mu.Lock()
	defer tk.mu.Unlock()
	return tk.failed
}

// waitRegistered waits until the assigner lists member id as live and not draining: the
// next member to roll then has one more to drain onto.
func waitRegistered(t *testing.T, ctx context.Context, c *kvcluster.Cluster, id string) {
	t.Helper()
	conn, err := c.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	adm := pb.NewAdminServiceClient(conn)
	wctx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	err = launch.WaitFor(wctx, id+" to be registered", 100*time.Millisecond, func(ctx context.Context) error {
		resp, err := adm.ListNodes(ctx, &pb.ListNodesRequest{})
		if err != nil {
			return err
		}
		for _, n := range resp.GetNodes() {
			if n.GetNode().GetId() == id && !n.GetDraining() {
				return nil
			}
		}
		return fmt.Errorf("%s is not listed", id)
	})
	if err != nil {
		t.Fatal(err)
	}
}
