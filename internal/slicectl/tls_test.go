package slicectl

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/certs"
	"github.com/sliceplane/sliceplane/internal/dial"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

// tlsAdmin is an assigner's admin service reduced to what status and freeze call.
type tlsAdmin struct {
	pb.UnimplementedAdminServiceServer
	freezes atomic.Int32
}

func (*tlsAdmin) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	return &pb.StatusResponse{Leader: true, LeaderAddress: "a1"}, nil
}

func (a *tlsAdmin) Freeze(context.Context, *pb.FreezeRequest) (*pb.FreezeResponse, error) {
	a.freezes.Add(1)
	return &pb.FreezeResponse{}, nil
}

// startTLSAssigner serves the fake admin service and the leader's health as the assigner
// does: with src's TLS (nil: plaintext) and the assigner's authorization rules.
func startTLSAssigner(t *testing.T, src *mtls.Source) (string, *tlsAdmin) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := grpc.NewServer(authz.New("assigner", src, nil, authz.AssignerRules(), nil, nil).ServerOptions()...)
	admin := &tlsAdmin{}
	pb.RegisterAdminServiceServer(s, admin)
	hs := health.NewServer()
	hs.SetServingStatus(dial.LeaderHealthService, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, hs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(lis)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return lis.Addr().String(), admin
}

func tlsFlags(c mtls.Config) []string {
	return []string{"--tls-cert", c.Cert, "--tls-key", c.Key, "--tls-ca", c.CA}
}

func TestTLSFlagsRolesAndRefusals(t *testing.T) {
	p := mtlstest.New(t)
	addr, admin := startTLSAssigner(t, p.Source("assigner", "a1"))
	base := []string{"--assigner", addr, "--timeout", "5s"}
	viewer, alice := p.Config("viewer", "v"), p.Config("admin", "alice")

	out, errOut, err := run(t, append(append(base, tlsFlags(viewer)...), "status")...)
	require.NoError(t, err, errOut)
	assert.Regexp(t, `(?m)^leader\s+`, out)

	// A viewer may not override: refused by the server, said so, nothing done.
	_, _, err = run(t, append(append(base, tlsFlags(viewer)...), "freeze")...)
	t.Log(err)
	require.ErrorIs(t, err, ErrPermission)
	assert.NotErrorIs(t, err, ErrUsage)
	assert.Regexp(t, `^freeze: permission denied: spiffe://sliceplane/viewer/v .*may not call /sliceplane.v1.AdminService/Freeze in target "default": it needs one of the roles admin$`, err.Error())
	assert.Zero(t, admin.freezes.Load())

	out, errOut, err = run(t, append(append(base, tlsFlags(alice)...), "freeze")...)
	require.NoError(t, err, errOut)
	assert.Contains(t, out, "balancing frozen")
	assert.EqualValues(t, 1, admin.freezes.Load())
}

func TestTLSFromTheEnvironmentAndFlagsWin(t *testing.T) {
	p := mtlstest.New(t)
	addr, admin := startTLSAssigner(t, p.Source("assigner", "a1"))
	viewer, alice := p.Config("viewer", "v"), p.Config("admin", "alice")
	t.Setenv(envTLSCert, viewer.Cert)
	t.Setenv(envTLSKey, viewer.Key)
	t.Setenv(envTLSCA, viewer.CA)

	_, errOut, err := run(t, "--assigner", addr, "--timeout", "5s", "status")
	require.NoError(t, err, errOut)
	_, _, err = run(t, "--assigner", addr, "--timeout", "5s", "freeze")
	require.ErrorIs(t, err, ErrPermission, "the environment's viewer is who calls")

	_, errOut, err = run(t, append([]string{"--assigner", addr, "--timeout", "5s"}, append(tlsFlags(alice), "freeze")...)...)
	require.NoError(t, err, errOut)
	assert.EqualValues(t, 1, admin.freezes.Load())

	out, _, err := run(t, "status", "--help")
	require.NoError(t, err)
	assert.Contains(t, out, "(env SLICEPLANE_TLS_CERT)")
}

func TestTLSMismatchesAreExplained(t *testing.T) {
	p := mtlstest.New(t)
	tlsAddr, _ := startTLSAssigner(t, p.Source("assigner", "a1"))
	plainAddr, _ := startTLSAssigner(t, nil)
	viewer := p.Config("viewer", "v")

	start := time.Now()
	_, _, err := run(t, "--assigner", tlsAddr, "--timeout", "1s", "status")
	require.Error(t, err)
	t.Log(err)
	assert.Contains(t, err.Error(), "the assigner at "+tlsAddr+" requires TLS: give --tls-cert, --tls-key and --tls-ca")
	assert.Less(t, time.Since(start), 8*time.Second)

	_, _, err = run(t, append([]string{"--assigner", plainAddr, "--timeout", "1s"}, append(tlsFlags(viewer), "status")...)...)
	require.Error(t, err)
	t.Log(err)
	assert.Contains(t, err.Error(), "the assigner does not use TLS")

	// An expired certificate: the server says who it cannot authenticate.
	old := p.Issue(certs.Request{Kind: "admin", Name: "old", NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	_, _, err = run(t, append([]string{"--assigner", tlsAddr, "--timeout", "2s"}, append(tlsFlags(old), "status")...)...)
	t.Log(err)
	require.ErrorIs(t, err, ErrUnauthenticated)
	assert.Contains(t, err.Error(), "status: not authenticated: ")
	assert.Contains(t, err.Error(), "expired")

	// Files that do not go together are a usage error, before anything is dialled.
	_, _, err = run(t, "--assigner", tlsAddr, "--tls-cert", viewer.Cert, "status")
	require.ErrorIs(t, err, ErrUsage)
	assert.Contains(t, err.Error(), "--tls-key")
}

func TestTLSFlagsReachEtcd(t *testing.T) {
	// An incomplete set is refused by the data commands too: they load the same flags.
	_, _, err := run(t, "data", "get", "k", "--tls-ca", "/nonexistent/ca.crt")
	require.ErrorIs(t, err, ErrUsage)
	assert.True(t, strings.Contains(err.Error(), "--tls-cert"), err)
}
