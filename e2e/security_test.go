package e2e_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/launch"
)

// The cluster the demo runs, secured the same way, refuses who it must: a client without a
// certificate cannot freeze, register or drain; a node's certificate calls no admin method
// and pulls no other node's stream; and what it refused left the cluster whole.
func TestTheClusterRefusesStrangers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := startCluster(t, ctx, 300, "n1", "n2")
	lead := s.leader()
	d1, _ := s.cluster.Member("distributor", "d1")

	s.phase("plaintext is not spoken", func() {
		admin := pb.NewAdminServiceClient(conn(t, lead.Addr, grpc.WithTransportCredentials(insecure.NewCredentials())))
		if _, err := admin.Freeze(s.callCtx(), &pb.FreezeRequest{Reason: "plaintext"}); err == nil {
			t.Error("a plaintext client froze the map")
		}
	})
	s.phase("no certificate: Unauthenticated", func() { s.refuseWithoutCertificate(lead.Addr, d1.Addr) })
	s.phase("another CA's admin: refused", func() {
		other, err := launch.NewPKI(t.TempDir(), 0)
		if err != nil {
			t.Fatal(err)
		}
		stranger, err := other.Source("admin", "mallory")
		if err != nil {
			t.Fatal(err)
		}
		// Its client verifies the server against its own CA and fails first; either way, no call.
		c := conn(t, lead.Addr, stranger.DialOption("assigner"))
		if _, err := pb.NewAdminServiceClient(c).Drain(s.callCtx(), &pb.DrainRequest{NodeId: "n1"}); err == nil {
			t.Error("an admin of another CA drained n1")
		}
	})
	s.phase("node n1's certificate: PermissionDenied on admin calls and as another node", func() {
		s.refuseNodeOutOfBounds(lead.Addr, d1.Addr)
	})
	s.phase("a viewer inspects and does not drain", func() {
		viewer, err := s.pki.Source("viewer", "e2e")
		if err != nil {
			t.Fatal(err)
		}
		admin := pb.NewAdminServiceClient(conn(t, lead.Addr, viewer.DialOption("assigner")))
		if _, err := admin.Status(s.callCtx(), &pb.StatusRequest{}); err != nil {
			t.Errorf("a viewer's Status: %v", err)
		}
		expect(t, "a viewer draining", codes.PermissionDenied, call(admin.Drain(s.callCtx(), &pb.DrainRequest{NodeId: "n1"})))
	})
	s.phase("nothing refused touched the cluster", func() {
		s.untouched()
		s.write(100)
		s.converged("the refused calls")
	})
}

// refuseWithoutCertificate checks that a TLS client that trusts the CA but has no
// certificate can neither freeze, drain, register nor pull.
func (s *scenario) refuseWithoutCertificate(assigner, distributor string) {
	t := s.t
	caPEM, err := os.ReadFile(s.admin.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	noCert := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}))
	c := conn(t, assigner, noCert)
	expect(t, "Freeze without a certificate", codes.Unauthenticated, call(pb.NewAdminServiceClient(c).Freeze(s.callCtx(), &pb.FreezeRequest{Reason: "x"})))
	expect(t, "Drain without a certificate", codes.Unauthenticated, call(pb.NewAdminServiceClient(c).Drain(s.callCtx(), &pb.DrainRequest{NodeId: "n1"})))
	expect(t, "Register without a certificate", codes.Unauthenticated, call(pb.NewNodeServiceClient(c).Register(s.callCtx(),
		&pb.RegisterRequest{Node: &pb.Node{Id: "n9"}, Address: "127.0.0.1:1"})))
	expect(t, "Pull without a certificate", codes.Unauthenticated, pull(s.callCtx(), conn(t, distributor, noCert), "n1"))
}

// refuseNodeOutOfBounds checks that node n1's certificate calls no admin method and acts as
// no other node, at the assigner or at a distributor.
func (s *scenario) refuseNodeOutOfBounds(assigner, distributor string) {
	t := s.t
	n1, err := s.pki.Source("node", "n1")
	if err != nil {
		t.Fatal(err)
	}
	c := conn(t, assigner, n1.DialOption("assigner"))
	admin := pb.NewAdminServiceClient(c)
	expect(t, "n1 freezing", codes.PermissionDenied, call(admin.Freeze(s.callCtx(), &pb.FreezeRequest{Reason: "x"})))
	expect(t, "n1 draining n2", codes.PermissionDenied, call(admin.Drain(s.callCtx(), &pb.DrainRequest{NodeId: "n2"})))
	expect(t, "n1 registering as n2", codes.PermissionDenied, call(pb.NewNodeServiceClient(c).Register(s.callCtx(),
		&pb.RegisterRequest{Node: &pb.Node{Id: "n2"}, Address: "127.0.0.1:1"})))
	expect(t, "n1 heartbeating as n2", codes.PermissionDenied, call(pb.NewNodeServiceClient(c).Heartbeat(s.callCtx(),
		&pb.HeartbeatRequest{NodeId: "n2"})))
	expect(t, "n1 pulling as n2", codes.PermissionDenied, pull(s.callCtx(), conn(t, distributor, n1.DialOption("distributor")), "n2"))
}

// untouched checks that only the cluster's own nodes registered, and none drains.
func (s *scenario) untouched() {
	t := s.t
	c, err := s.cluster.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nodes, err := pb.NewAdminServiceClient(c).ListNodes(s.callCtx(), &pb.ListNodesRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.GetNodes() {
		if id := n.GetNode().GetId(); id != "n1" && id != "n2" {
			t.Errorf("node %s registered", id)
		}
		if n.GetDraining() {
			t.Errorf("node %s drains", n.GetNode().GetId())
		}
	}
}

// callCtx bounds one call.
func (s *scenario) callCtx() context.Context {
	ctx, cancel := context.WithTimeout(s.ctx, 20*time.Second)
	s.t.Cleanup(cancel)
	return ctx
}

func conn(t *testing.T, addr string, creds grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient(addr, creds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// call keeps the error of a unary call.
func call[T any](_ T, err error) error { return err }

// pull opens a Pull stream as node id and returns the error of its first answer.
func pull(ctx context.Context, c *grpc.ClientConn, id string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := pb.NewDistributorServiceClient(c).Pull(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&pb.PullRequest{Request: &pb.PullRequest_Start{Start: &pb.PullStart{NodeId: id}}}); err != nil {
		_, err = stream.Recv() // the stream's status is there
		return err
	}
	_, err = stream.Recv()
	return err
}

func expect(t *testing.T, what string, want codes.Code, err error) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: %v (%v), want %v", what, got, err, want)
	} else {
		t.Logf("%s: %v", what, err)
	}
}
