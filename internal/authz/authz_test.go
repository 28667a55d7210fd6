package authz_test

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/authz/authztest"
	"github.com/sliceplane/sliceplane/internal/certs"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
	"github.com/sliceplane/sliceplane/internal/target"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fake answers every call it gets, so that what a test sees is the interceptor's decision;
// it records who the interceptor said called.
type fake struct {
	pb.UnimplementedAdminServiceServer
	pb.UnimplementedNodeServiceServer
	pb.UnimplementedDistributorServiceServer
	pb.UnimplementedTargetServiceServer
	callers chan string
}

func (f *fake) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	f.callers <- authz.Caller(ctx)
	return &pb.StatusResponse{}, nil
}

func (f *fake) Drain(ctx context.Context, _ *pb.DrainRequest) (*pb.DrainResponse, error) {
	f.callers <- authz.Caller(ctx)
	return &pb.DrainResponse{}, nil
}

// fakeNode is the fake's NodeService, whose Drain differs from the AdminService's.
type fakeNode struct{ *fake }

func (f fakeNode) Drain(ctx context.Context, _ *pb.NodeServiceDrainRequest) (*pb.NodeServiceDrainResponse, error) {
	f.callers <- authz.Caller(ctx)
	return &pb.NodeServiceDrainResponse{}, nil
}

func (f *fake) Heartbeat(ctx context.Context, _ *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	f.callers <- authz.Caller(ctx)
	return &pb.HeartbeatResponse{}, nil
}

func (f *fake) Register(ctx context.Context, _ *pb.RegisterRequest) (*pb.RegisterResponse, error) {
	return &pb.RegisterResponse{}, nil
}

// Pull answers each message with an empty delta until the node stops.
func (f *fake) Pull(stream pb.DistributorService_PullServer) error {
	for {
		if _, err := stream.Recv(); err != nil {
			return err
		}
		if err := stream.Send(&pb.PullResponse{Delta: &pb.Delta{}}); err != nil {
			return err
		}
	}
}

type server struct {
	addr   string
	fake   *fake
	denied *prometheus.Registry
}

func serve(t *testing.T, src *mtls.Source, policy *authz.Policy) *server {
	t.Helper()
	reg := prometheus.NewRegistry()
	rules := authz.AssignerRules()
	for m, r := range authz.DistributorRules() {
		rules[m] = r
	}
	a := authz.New("test", src, policy, rules, reg, nil)
	g := grpc.NewServer(a.ServerOptions()...)
	f := &fake{callers: make(chan string, 16)}
	pb.RegisterAdminServiceServer(g, f)
	pb.RegisterNodeServiceServer(g, fakeNode{f})
	pb.RegisterDistributorServiceServer(g, f)
	pb.RegisterTargetServiceServer(g, f)
	healthpb.RegisterHealthServer(g, health.NewServer())
	reflection.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go g.Serve(lis) //nolint:errcheck // Stop ends it
	t.Cleanup(g.Stop)
	return &server{addr: lis.Addr().String(), fake: f, denied: reg}
}

func dialAs(t *testing.T, s *server, src *mtls.Source) *grpc.ClientConn {
	t.Helper()
	return dialWith(t, s, src.DialOption())
}

func dialWith(t *testing.T, s *server, opt grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(s.addr, opt)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func code(err error) codes.Code { return status.Code(err) }

func denied(t *testing.T, s *server, method, reason string) float64 {
	t.Helper()
	return authztest.Denied(t, s.denied, "test", method)[reason]
}

func TestTheRoleMatrix(t *testing.T) {
	p := mtlstest.New(t)
	s := serve(t, p.Source("assigner", "a1"), nil)
	admin := pb.NewAdminServiceClient(dialAs(t, s, p.Source("admin", "alice")))
	viewer := pb.NewAdminServiceClient(dialAs(t, s, p.Source("viewer", "vic")))
	nodeConn := dialAs(t, s, p.Source("node", "n1"))
	router := pb.NewNodeServiceClient(dialAs(t, s, p.Source("router", "r1")))
	ctx := ctxT(t)

	_, err := admin.Drain(ctx, &pb.DrainRequest{NodeId: "n1"})
	require.NoError(t, err)
	require.Equal(t, "spiffe://sliceplane/admin/alice", <-s.fake.callers, "the handler learns who called")
	_, err = viewer.Status(ctx, &pb.StatusRequest{})
	require.NoError(t, err)
	<-s.fake.callers
	_, err = pb.NewNodeServiceClient(nodeConn).Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "n1"})
	require.NoError(t, err, "a node acts as itself")
	<-s.fake.callers

	_, err = viewer.Drain(ctx, &pb.DrainRequest{NodeId: "n1"})
	require.Equal(t, codes.PermissionDenied, code(err))
	require.ErrorContains(t, err, "spiffe://sliceplane/viewer/vic (roles router, viewer) may not call /sliceplane.v1.AdminService/Drain in target \"default\": it needs one of the roles admin")
	_, err = pb.NewAdminServiceClient(nodeConn).Drain(ctx, &pb.DrainRequest{NodeId: "n2"})
	require.Equal(t, codes.PermissionDenied, code(err), "a node is no admin")
	_, err = pb.NewNodeServiceClient(nodeConn).Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "n2"})
	require.Equal(t, codes.PermissionDenied, code(err))
	require.ErrorContains(t, err, `may act only as node "n1", not as node "n2"`)
	_, err = pb.NewNodeServiceClient(nodeConn).Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Id: "n2"}})
	require.Equal(t, codes.PermissionDenied, code(err))
	_, err = pb.NewNodeServiceClient(nodeConn).Drain(ctx, &pb.NodeServiceDrainRequest{NodeId: "n2"})
	require.Equal(t, codes.PermissionDenied, code(err), "a node drains only itself")
	require.ErrorContains(t, err, `may act only as node "n1", not as node "n2"`)
	_, err = router.Heartbeat(ctx, &pb.HeartbeatRequest{NodeId: "r1"})
	require.Equal(t, codes.PermissionDenied, code(err), "a router reads the map, no more")

	require.Equal(t, 2.0, denied(t, s, "/sliceplane.v1.AdminService/Drain", authz.ReasonRole))
	require.Equal(t, 1.0, denied(t, s, "/sliceplane.v1.NodeService/Heartbeat", authz.ReasonImpersonation))
	require.Equal(t, 1.0, denied(t, s, "/sliceplane.v1.NodeService/Heartbeat", authz.ReasonRole))
	require.Equal(t, 1.0, denied(t, s, "/sliceplane.v1.NodeService/Register", authz.ReasonImpersonation))
}

func TestCallersWithoutAnIdentityAreUnauthenticated(t *testing.T) {
	p := mtlstest.New(t)
	s := serve(t, p.Source("assigner", "a1"), nil)
	ctx := ctxT(t)

	expired, err := p.Issue(certs.Request{Kind: "admin", Name: "old", NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}).Load()
	require.NoError(t, err)
	stranger := mtlstest.New(t)
	// A client of another CA trusts the server through a bundle: only its own certificate
	// is the problem.
	foreign := stranger.Issue(certs.Request{Kind: "admin", Name: "eve"})
	foreign.CA = p.Config("admin", "unused").CA
	foreignSrc, err := foreign.Load()
	require.NoError(t, err)
	// A client that trusts the server but cannot say who it is.
	noCert := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})) //nolint:gosec // the test's point

	for name, c := range map[string]struct {
		opt  grpc.DialOption
		want string
	}{
		"expired":   {expired.DialOption(), "expired"},
		"other CA":  {foreignSrc.DialOption(), "unknown authority"},
		"no client": {noCert, "no certificate"},
	} {
		_, err := pb.NewAdminServiceClient(dialWith(t, s, c.opt)).Drain(ctx, &pb.DrainRequest{NodeId: "n1"})
		require.Equal(t, codes.Unauthenticated, code(err), "%s: %v", name, err)
		require.ErrorContains(t, err, c.want, name)
	}
	require.Equal(t, 3.0, denied(t, s, "/sliceplane.v1.AdminService/Drain", authz.ReasonUnauthenticated))

	// Health is for every identity, and for no one without one.
	_, err = healthpb.NewHealthClient(dialWith(t, s, noCert)).Check(ctx, &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.Unauthenticated, code(err))
	_, err = healthpb.NewHealthClient(dialAs(t, s, p.Source("router", "r1"))).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
}

func TestANodePullsOnlyAsItself(t *testing.T) {
	p := mtlstest.New(t)
	s := serve(t, p.Source("distributor", "d1"), nil)
	ctx := ctxT(t)
	pull := func(src *mtls.Source, as string) error {
		stream, err := pb.NewDistributorServiceClient(dialAs(t, s, src)).Pull(ctx)
		require.NoError(t, err)
		defer stream.CloseSend() //nolint:errcheck // the test is done with it
		// A stream the server has already refused makes Send return io.EOF;
		// the refusal's status is what Recv returns, so Send's error is not the answer.
		_ = stream.Send(&pb.PullRequest{Request: &pb.PullRequest_Start{Start: &pb.PullStart{NodeId: as}}})
		_, err = stream.Recv()
		return err
	}
	require.NoError(t, pull(p.Source("node", "n2"), "n2"))
	err := pull(p.Source("node", "n1"), "n2")
	require.Equal(t, codes.PermissionDenied, code(err))
	require.ErrorContains(t, err, `not as node "n2"`)
	require.Equal(t, codes.PermissionDenied, code(pull(p.Source("admin", "alice"), "n2")), "an admin does not pull")
	require.Equal(t, 1.0, denied(t, s, "/sliceplane.v1.DistributorService/Pull", authz.ReasonImpersonation))
}

func TestAPolicyGrantsMore(t *testing.T) {
	p := mtlstest.New(t)
	policy, err := authz.ParsePolicy([]byte(`
grants:
  spiffe://sliceplane/node/n1: [viewer]
  spiffe://sliceplane/router/*: [admin]
`))
	require.NoError(t, err)
	s := serve(t, p.Source("assigner", "a1"), policy)
	ctx := ctxT(t)
	_, err = pb.NewAdminServiceClient(dialAs(t, s, p.Source("node", "n1"))).Status(ctx, &pb.StatusRequest{})
	require.NoError(t, err, "n1 is granted viewer")
	<-s.fake.callers
	_, err = pb.NewAdminServiceClient(dialAs(t, s, p.Source("node", "n2"))).Status(ctx, &pb.StatusRequest{})
	require.Equal(t, codes.PermissionDenied, code(err), "n2 is not")
	_, err = pb.NewAdminServiceClient(dialAs(t, s, p.Source("router", "ops"))).Drain(ctx, &pb.DrainRequest{NodeId: "n1"})
	require.NoError(t, err, "every router is granted admin")
	<-s.fake.callers
}

func TestBadPoliciesAreRefused(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown role":  "grants:\n  spiffe://sliceplane/node/n1: [root]\n",
		"other domain":  "grants:\n  spiffe://example.org/node/n1: [viewer]\n",
		"not an id":     "grants:\n  alice: [admin]\n",
		"unknown field": "grant:\n  spiffe://sliceplane/node/n1: [viewer]\n",
		"scope of none": "scopes:\n  spiffe://sliceplane/admin/alice: []\n",
		"bad target":    "scopes:\n  spiffe://sliceplane/admin/alice: [Not_A_Name]\n",
		"confined":      "scopes:\n  spiffe://sliceplane/target/kv/admin/alice: [kv]\n",
		"scope not id":  "scopes:\n  alice: [kv]\n",
	} {
		_, err := authz.ParsePolicy([]byte(doc))
		require.ErrorIs(t, err, authz.ErrPolicy, name)
	}
	p, err := authz.ParsePolicy(nil)
	require.NoError(t, err, "an empty policy grants nothing")
	require.Equal(t, "node, router", p.Roles(mtls.Identity{Kind: "node", Name: "n1"}).String())
}

func TestPlaintextLetsEverythingThroughAndNamesTheAddress(t *testing.T) {
	s := serve(t, nil, nil)
	_, err := pb.NewAdminServiceClient(dialAs(t, s, nil)).Drain(ctxT(t), &pb.DrainRequest{NodeId: "n1"})
	require.NoError(t, err)
	require.Contains(t, <-s.fake.callers, "plaintext:127.0.0.1:")
}

func TestEveryMethodHasARule(t *testing.T) {
	rules := authz.AssignerRules()
	for _, desc := range []grpc.ServiceDesc{pb.AdminService_ServiceDesc, pb.NodeService_ServiceDesc, pb.AssignmentService_ServiceDesc, pb.QuantaService_ServiceDesc} {
		for _, m := range desc.Methods {
			require.True(t, authz.HasRule(rules, "/"+desc.ServiceName+"/"+m.MethodName), m.MethodName)
		}
		for _, m := range desc.Streams {
			require.True(t, authz.HasRule(rules, "/"+desc.ServiceName+"/"+m.StreamName), m.StreamName)
		}
	}
	require.True(t, authz.HasRule(authz.DistributorRules(), "/sliceplane.v1.DistributorService/Pull"))
	require.False(t, authz.HasRule(authz.DistributorRules(), "/sliceplane.v1.AdminService/Drain"), "a distributor serves no admin calls")
}

// TestIdentitiesAreConfinedToTheirTarget: an identity that names a target acts only in it,
// and the refusal names both targets; members and routers that name none act only in the
// default target; admins that name none act in every target, but a confined admin may not
// change the registry of targets.
func TestIdentitiesAreConfinedToTheirTarget(t *testing.T) {
	p := mtlstest.New(t)
	s := serve(t, p.Source("assigner", "a1"), nil)
	issue := func(r certs.Request) *mtls.Source {
		src, err := p.Issue(r).Load()
		require.NoError(t, err)
		return src
	}
	in := func(name string) context.Context {
		return metadata.AppendToOutgoingContext(ctxT(t), target.MetadataKey, name)
	}
	memberA := pb.NewNodeServiceClient(dialAs(t, s, issue(certs.Request{Kind: "node", Name: "n1", Target: "a"})))
	_, err := memberA.Heartbeat(in("a"), &pb.HeartbeatRequest{NodeId: "n1"})
	require.NoError(t, err, "a member of target a acts in a")
	require.Equal(t, "spiffe://sliceplane/target/a/node/n1", <-s.fake.callers)
	_, err = memberA.Heartbeat(in("b"), &pb.HeartbeatRequest{NodeId: "n1"})
	require.Equal(t, codes.PermissionDenied, code(err), "a member of target a is refused by target b")
	require.ErrorContains(t, err, `spiffe://sliceplane/target/a/node/n1 may not call /sliceplane.v1.NodeService/Heartbeat in target "b": its identity is confined to target "a"`)
	_, err = memberA.Heartbeat(ctxT(t), &pb.HeartbeatRequest{NodeId: "n1"})
	require.Equal(t, codes.PermissionDenied, code(err), "nor may it act in the default target")

	plain := pb.NewNodeServiceClient(dialAs(t, s, p.Source("node", "n2")))
	_, err = plain.Heartbeat(ctxT(t), &pb.HeartbeatRequest{NodeId: "n2"})
	require.NoError(t, err, "a member that names no target acts in the default one, as before targets")
	<-s.fake.callers
	_, err = plain.Heartbeat(in("a"), &pb.HeartbeatRequest{NodeId: "n2"})
	require.Equal(t, codes.PermissionDenied, code(err))
	require.ErrorContains(t, err, "give it spiffe://sliceplane/target/a/node/n2")

	admin := pb.NewAdminServiceClient(dialAs(t, s, p.Source("admin", "alice")))
	_, err = admin.Drain(in("b"), &pb.DrainRequest{NodeId: "n1"})
	require.NoError(t, err, "an admin that names no target acts in every target")
	<-s.fake.callers
	adminA := dialAs(t, s, issue(certs.Request{Kind: "admin", Name: "bob", Target: "a"}))
	_, err = pb.NewAdminServiceClient(adminA).Drain(in("a"), &pb.DrainRequest{NodeId: "n1"})
	require.NoError(t, err, "an admin of target a acts in a")
	<-s.fake.callers
	_, err = pb.NewAdminServiceClient(adminA).Drain(in("b"), &pb.DrainRequest{NodeId: "n1"})
	require.Equal(t, codes.PermissionDenied, code(err))
	_, err = pb.NewTargetServiceClient(adminA).CreateTarget(in("a"), &pb.CreateTargetRequest{Name: "c"})
	require.Equal(t, codes.PermissionDenied, code(err), "a confined admin does not change the registry")
	require.ErrorContains(t, err, "this method acts on every target")

	require.Equal(t, 3.0, denied(t, s, "/sliceplane.v1.NodeService/Heartbeat", authz.ReasonTarget))
	require.Equal(t, 1.0, denied(t, s, "/sliceplane.v1.AdminService/Drain", authz.ReasonTarget))
	require.Equal(t, 1.0, denied(t, s, "/sliceplane.v1.TargetService/CreateTarget", authz.ReasonTarget))
}

// TestAPolicyScopesAnAdminToSomeTargets: an admin the policy scopes to targets acts in those,
// is refused in the others and on the registry with the reason, and a list of the targets
// shows it only its own; the kind's pattern scopes every identity of the kind.
func TestAPolicyScopesAnAdminToSomeTargets(t *testing.T) {
	p := mtlstest.New(t)
	policy, err := authz.ParsePolicy([]byte(`
scopes:
  spiffe://sliceplane/admin/alice: [kv, counter]
  spiffe://sliceplane/viewer/*: [default]
`))
	require.NoError(t, err)
	s := serve(t, p.Source("assigner", "a1"), policy)
	in := func(name string) context.Context {
		return metadata.AppendToOutgoingContext(ctxT(t), target.MetadataKey, name)
	}
	alice := dialAs(t, s, p.Source("admin", "alice"))
	for _, name := range []string{"kv", "counter"} {
		_, err := pb.NewAdminServiceClient(alice).Drain(in(name), &pb.DrainRequest{NodeId: "n1"})
		require.NoError(t, err, "alice acts in %s", name)
		<-s.fake.callers
	}
	_, err = pb.NewAdminServiceClient(alice).Drain(ctxT(t), &pb.DrainRequest{NodeId: "n1"})
	require.Equal(t, codes.PermissionDenied, code(err), "nor in the default target")
	require.ErrorContains(t, err, `in target "default": the policy scopes it to targets kv, counter`)
	_, err = pb.NewTargetServiceClient(alice).DeleteTarget(in("kv"), &pb.DeleteTargetRequest{Name: "kv"})
	require.Equal(t, codes.PermissionDenied, code(err), "a scoped admin does not change the registry")
	require.ErrorContains(t, err, "this method acts on every target")

	_, err = pb.NewAdminServiceClient(dialAs(t, s, p.Source("admin", "bob"))).Drain(in("other"), &pb.DrainRequest{NodeId: "n1"})
	require.NoError(t, err, "an admin the policy does not name acts in every target")
	<-s.fake.callers
	_, err = pb.NewAdminServiceClient(dialAs(t, s, p.Source("viewer", "vic"))).Status(in("kv"), &pb.StatusRequest{})
	require.Equal(t, codes.PermissionDenied, code(err), "every viewer is scoped to the default target")

	aliceID := mtls.Identity{ID: "spiffe://sliceplane/admin/alice", Kind: "admin", Name: "alice"}
	assert.True(t, policy.Admits(aliceID, "kv"))
	assert.False(t, policy.Admits(aliceID, ""), "the default target")
	assert.True(t, policy.Admits(mtls.Identity{ID: "spiffe://sliceplane/admin/bob", Kind: "admin", Name: "bob"}, "anything"))
	require.Equal(t, 2.0, denied(t, s, "/sliceplane.v1.AdminService/Drain", authz.ReasonTarget)+
		denied(t, s, "/sliceplane.v1.AdminService/Status", authz.ReasonTarget))
}
