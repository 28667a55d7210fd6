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
