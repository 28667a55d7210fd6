package kvnode_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvnode"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/logging/logtest"
)

// leader is a stand-in for a leading assigner: it takes registrations and heartbeats, and
// counts them.
type leader struct {
	pb.UnimplementedNodeServiceServer
	registered atomic.Int64
}

func (l *leader) Register(context.Context, *pb.RegisterRequest) (*pb.RegisterResponse, error) {
	l.registered.Add(1)
	return &pb.RegisterResponse{Ttl: durationpb.New(10 * time.Second)}, nil
}

func (l *leader) Heartbeat(context.Context, *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	return &pb.HeartbeatResponse{}, nil
}

// serveLeader serves a leader on a loopback port until the returned stop.
func serveLeader(t *testing.T) (addr string, l *leader, stop func()) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l = &leader{}
	srv := grpc.NewServer()
	pb.RegisterNodeServiceServer(srv, l)
	hs := health.NewServer()
	hs.SetServingStatus(dial.LeaderHealthService, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(lis) //nolint:errcheck // ends with Stop
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			srv.Stop()
			<-served
		})
	}
	t.Cleanup(stop)
	return lis.Addr().String(), l, stop
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	addrs, err := launch.FreeAddrs(1)
	if err != nil {
		t.Fatal(err)
	}
	return addrs[0]
}

// TestADrainWithNowhereToGoEndsPromptly stops a node (SIGTERM's cancel) with a long drain
// timeout while no assigner runs: from the start, or since the assigner it registered with
// went away, as when a test's whole cluster is stopped at once. With nowhere to hand its
// slices to, it stops at once rather than wait out the timeout, and its log says why.
func TestADrainWithNowhereToGoEndsPromptly(t *testing.T) {
	for _, tc := range []struct {
		name string
		// assigner returns the assigners' address and, once the node runs, makes sure
		// none runs there.
		assigner func(t *testing.T) (string, func(t *testing.T))
	}{
		{"no assigner ever", func(t *testing.T) (string, func(*testing.T)) {
			return closedPort(t), func(*testing.T) {}
		}},
		{"the assigner gone", func(t *testing.T) (string, func(*testing.T)) {
			addr, l, stop := serveLeader(t)
			return addr, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				err := launch.WaitFor(ctx, "the node to register", 10*time.Millisecond, func(context.Context) error {
					if l.registered.Load() == 0 {
						return errors.New("not yet")
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				stop()
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, gone := tc.assigner(t)
			var log logtest.Buffer
			srv, err := kvnode.New(kvnode.Config{ID: "k1", Listen: "127.0.0.1:0", Assigners: []string{addr}, DataDir: t.TempDir(),
				DrainTimeout: time.Minute, Logger: slog.New(slog.NewTextHandler(&log, nil))})
			if err != nil {
				t.Fatal(err)
			}
			ctx, stop := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Run(ctx) }()
			gone(t)

			const deadline = 2 * time.Second
			start := time.Now()
			stop()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("the node's stop: %v", err)
				}
			case <-time.After(deadline):
				<-done // the drain timeout, a minute, ends it
				t.Fatalf("the node took %s to stop, more than %s:\n%s", time.Since(start).Round(time.Millisecond), deadline, log.String())
			}
			t.Logf("the node stopped in %s", time.Since(start).Round(time.Millisecond))
			if !strings.Contains(log.String(), "stopping without a drain: nowhere to hand the slices to") ||
				!strings.Contains(log.String(), "no assigner runs") {
				t.Errorf("the log does not say why the node stopped without a drain:\n%s", log.String())
			}
		})
	}
}
