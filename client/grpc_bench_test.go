package client

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sliceplane/sliceplane/internal/assignment"
	"github.com/sliceplane/sliceplane/internal/keyspace"
)

// BenchmarkGRPCRouting measures what routing by key adds to a grpc-go call: the same unary
// call on loopback, over a ClientConn dialled straight to the server ("direct") and over one
// made with GRPCDialOptions, its key set with WithWriteKey ("routed", the context made
// once; "routed-new-context" makes it per call, as most callers will), under a map older
// than freshMapFor; "routed-fresh-map" under a map just taken, whose generation each call
// says. "pick" is the
// picker alone, for a streaming call's context; "pick-unary" for the context the interceptor
// gives it, in which it records its choice.
func BenchmarkGRPCRouting(b *testing.B) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis) //nolint:errcheck // it returns when stopped
	defer srv.Stop()
	addr := lis.Addr().String()
	a, err := assignment.New(1, []assignment.Slice{{Range: keyspace.Full(), Replicas: ids("a", "b"), Primary: "a"}})
	if err != nil {
		b.Fatal(err)
	}
	r := newTestRouter(b, LeastOutstanding, a, map[assignment.NodeID]nodeInfo{"a": {address: addr, capacity: 1}, "b": {address: "127.0.0.1:1", capacity: 1}})
	creds := grpc.WithTransportCredentials(insecure.NewCredentials())
	direct, err := grpc.NewClient("passthrough:///"+addr, creds)
	if err != nil {
		b.Fatal(err)
	}
	defer direct.Close()
	routed, err := grpc.NewClient("sliceplane:///bench", append(GRPCDialOptions(r), creds)...)
	if err != nil {
		b.Fatal(err)
	}
	defer routed.Close()
	key, req := []byte("user:42"), &healthpb.HealthCheckRequest{}
	run := func(conn *grpc.ClientConn, ctx func() context.Context) func(*testing.B) {
		return func(b *testing.B) {
			hc := healthpb.NewHealthClient(conn)
			if _, err := hc.Check(ctx(), req, grpc.WaitForReady(true)); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := hc.Check(ctx(), req); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	keyed := WithWriteKey(context.Background(), key)
	mapAged := func(age time.Duration) {
		v := *r.view.Load()
		v.since = time.Now().Add(-age)
		r.view.Store(&v)
	}
	mapAged(freshMapFor)
	b.Run("direct", run(direct, context.Background))
	b.Run("routed", run(routed, func() context.Context { return keyed }))
	b.Run("routed-new-context", run(routed, func() context.Context { return WithWriteKey(context.Background(), key) }))
	mapAged(-time.Hour) // fresh throughout the run
	b.Run("routed-fresh-map", run(routed, func() context.Context { return keyed }))
	mapAged(freshMapFor)
	pick := func(ctx context.Context) func(*testing.B) {
		return func(b *testing.B) {
			p := &keyPicker{r: r, conns: map[string]balancer.SubConn{addr: nil}}
			info := balancer.PickInfo{FullMethodName: "/grpc.health.v1.Health/Check", Ctx: ctx}
			b.ReportAllocs()
			for b.Loop() {
				res, err := p.Pick(info)
				if err != nil {
					b.Fatal(err)
				}
				res.Done(balancer.DoneInfo{})
			}
		}
	}
	b.Run("pick", pick(keyed))
	b.Run("pick-unary", pick(&tryCtx{Context: keyed, key: callKey{key: key, write: true}}))
}
