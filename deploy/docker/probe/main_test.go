package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

func probe(args ...string) (int, string) {
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String() + errOut.String()
}

func TestHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.Error(w, "no", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	code, out := probe("http", srv.URL+"/healthz")
	assert.Equal(t, 0, code, out)
	code, out = probe("http", srv.URL+"/other")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "503")
}

func TestGRPC(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := health.NewServer()
	hs.SetServingStatus("sliceplane.leader", healthpb.HealthCheckResponse_NOT_SERVING)
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, hs)
	go s.Serve(lis) //nolint:errcheck // stopped below
	defer s.Stop()

	code, out := probe("grpc", lis.Addr().String())
	assert.Equal(t, 0, code, out)
	code, out = probe("grpc", lis.Addr().String(), "-service", "sliceplane.leader")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "NOT_SERVING")
	hs.SetServingStatus("sliceplane.leader", healthpb.HealthCheckResponse_SERVING)
	code, out = probe("grpc", lis.Addr().String(), "-service", "sliceplane.leader")
	assert.Equal(t, 0, code, out)
}

func TestUnreachableAndUsage(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	lis.Close()
	code, out := probe("grpc", addr, "-timeout", "200ms")
	assert.Equal(t, 1, code, out)
	assert.True(t, strings.HasPrefix(out, "unhealthy: "), out)
	for _, args := range [][]string{{}, {"http"}, {"tcp", "x:1"}, {"http", "http://x", "-bogus"}} {
		code, _ := probe(args...)
		assert.Equal(t, 2, code, "%q", args)
	}
}

func TestGRPCWithMutualTLS(t *testing.T) {
	p := mtlstest.New(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := grpc.NewServer(authz.New("test", p.Source("assigner", "a1"), nil, authz.AssignerRules(), nil, nil).ServerOptions()...)
	healthpb.RegisterHealthServer(s, health.NewServer())
	go s.Serve(lis) //nolint:errcheck // stopped below
	defer s.Stop()
	addr := lis.Addr().String()

	c := p.Config("node", "n1")
	code, out := probe("grpc", addr, "-tls-cert", c.Cert, "-tls-key", c.Key, "-tls-ca", c.CA)
	assert.Equal(t, 0, code, out)
	code, out = probe("grpc", addr, "-timeout", "300ms")
	assert.Equal(t, 1, code, out)
	assert.True(t, strings.HasPrefix(out, "unhealthy: "), out)

	// Files that do not go together are a usage error, before anything is dialled.
	code, out = probe("grpc", addr, "-tls-cert", c.Cert)
	assert.Equal(t, 2, code, out)
	assert.Contains(t, out, "--tls-key")
}
