package distributor_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/frame"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

// streamer serves Pull as the distributor's transport does, without the router: after the
// start, it sends the same encoded delta count times.
type streamer struct {
	pb.UnimplementedDistributorServiceServer
	delta []byte
	count int
}

func (s *streamer) Pull(stream pb.DistributorService_PullServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	f := &frame.Frame{Data: s.delta}
	for range s.count {
		if err := stream.SendMsg(f); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkPullTransportTLS measures the Pull stream's transport alone, with plaintext and
// with mutual TLS side by side: full deltas (1024 puts of 100-byte values) from a server
// built as the distributor's (keepalive, frame codec, authz interceptor) to a client dialed
// as a node dials, on loopback.
func BenchmarkPullTransportTLS(b *testing.B) {
	b.Run("plaintext", func(b *testing.B) { pullTransport(b, false) })
	b.Run("mTLS", func(b *testing.B) { pullTransport(b, true) })
}

func pullTransport(b *testing.B, secure bool) {
	const ops = 1024
	var server, node *mtls.Source
	if secure {
		pki := mtlstest.New(b)
		server, node = pki.Source("distributor", "d1"), pki.Source("node", "n1")
	}
	delta := &pb.Delta{Epoch: 1, To: ops}
	for i := range ops {
		delta.Ops = append(delta.Ops, &pb.DeltaOp{Op: &pb.DeltaOp_Put{Put: &pb.ItemChange{Key: fmt.Appendf(nil, "item-%08d", i), Value: make([]byte, 100)}}})
	}
	data, err := proto.Marshal(&pb.PullResponse{Delta: delta})
	if err != nil {
		b.Fatal(err)
	}
	az := authz.New("distributor", server, nil, authz.DistributorRules(), prometheus.NewRegistry(), nil)
	srv := grpc.NewServer(append(append(dial.ServerOptions(), frame.ServerOption()), az.ServerOptions()...)...)
	pb.RegisterDistributorServiceServer(srv, &streamer{delta: data, count: b.N})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() { srv.Stop(); <-served }()
	conn, err := dial.Peer(ln.Addr().String(), node.DialOption("distributor"))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()

	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	start := time.Now()
	stream, err := pb.NewDistributorServiceClient(conn).Pull(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := stream.Send(&pb.PullRequest{Request: &pb.PullRequest_Start{Start: &pb.PullStart{NodeId: "n1"}}}); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		if _, err := stream.Recv(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(ops*b.N)/time.Since(start).Seconds(), "items/s")
}
