package distributormain

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/membership"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

func TestTLSSettingsAreUsageErrors(t *testing.T) {
	pki := mtlstest.New(t)
	d1 := pki.Config("distributor", "d1")
	n1 := pki.Config("node", "n1")
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	require.NoError(t, os.WriteFile(policy, []byte("grants:\n  spiffe://sliceplane/node/n1: [viewer]\n"), 0o644))
	badPolicy := filepath.Join(dir, "bad-policy.yaml")
	require.NoError(t, os.WriteFile(badPolicy, []byte("grants:\n  spiffe://sliceplane/node/n1: [wizard]\n"), 0o644))
	tlsFlags := func(c mtls.Config) []string {
		return []string{"--tls-cert", c.Cert, "--tls-key", c.Key, "--tls-ca", c.CA}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert", d1.Cert}, "--tls-key, --tls-ca missing"},
		{[]string{"--tls-cert", d1.Cert, "--tls-key", d1.Key}, "--tls-ca missing"},
		{[]string{"--tls-cert", d1.Cert, "--tls-key", d1.Key, "--tls-ca", filepath.Join(dir, "none.crt")}, "none.crt"},
		{append(tlsFlags(d1), "--insecure"), "--insecure goes with no TLS files"},
		{tlsFlags(n1), "names spiffe://sliceplane/node/n1; a distributor's certificate must name spiffe://sliceplane/distributor/<id>"},
		{[]string{"--authz-policy", policy}, "--authz-policy needs --tls-cert"},
		{append(tlsFlags(d1), "--authz-policy", badPolicy), `unknown role "wizard"`},
		{append(tlsFlags(d1), "--authz-policy", filepath.Join(dir, "none.yaml")), "--authz-policy: "},
		{[]string{"--listen", "0.0.0.0:7080"}, "--listen: mtls: bad TLS configuration: refusing to serve the distributor's gRPC API on 0.0.0.0:7080 without TLS"},
		{[]string{"--listen", ":7080"}, "refusing to serve"},
		{[]string{"--metrics-listen", "0.0.0.0:7081"}, "--metrics-listen: mtls: bad TLS configuration: refusing to serve the distributor's metrics on 0.0.0.0:7081"},
		{tlsFlags(d1), "--etcd-endpoints http://127.0.0.1:2379: with TLS the etcd client speaks https only"},
	} {
		cmd := NewCommand()
		cmd.SetArgs(append([]string{"--id", "d1", "--log-level", "error"}, c.args...))
		cmd.SetErr(&bytes.Buffer{})
		err := cmd.ExecuteContext(context.Background())
		require.Error(t, err, "%v", c.args)
		assert.Contains(t, err.Error(), c.want, "%v", c.args)
		assert.ErrorIs(t, err, ErrUsage, "%v: main exits with status 2", c.args)
	}
}

// TestRunServesMutualTLS runs the command with TLS flags: its gRPC and metrics endpoints
// take only clients with a certificate of the CA.
func TestRunServesMutualTLS(t *testing.T) {
	pki := mtlstest.New(t)
	endpoint := startTLSEtcd(t, pki)
	d1 := pki.Config("distributor", "d1")
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second,
		TLS: pki.Source("admin", "test").ClientTLS(), Logger: zap.NewNop()})
	require.NoError(t, err)
	defer cli.Close()
	metricsAddr := freePort(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := NewCommand()
	// No assigner runs: serving does not wait for one.
	cmd.SetArgs([]string{"--id", "d1", "--etcd-endpoints", endpoint, "--assigners", "127.0.0.1:1",
		"--listen", "127.0.0.1:0", "--metrics-listen", metricsAddr, "--log-level", "error",
		"--tls-cert", d1.Cert, "--tls-key", d1.Key, "--tls-ca", d1.CA})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	addr := waitRegistered(t, ctx, cli, done)

	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	defer hcancel()
	viewer := pki.Source("viewer", "alice")
	conn, err := grpc.NewClient(addr, viewer.DialOption("distributor"))
	require.NoError(t, err)
	defer conn.Close()
	health, err := healthpb.NewHealthClient(conn).Check(hctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	require.NoError(t, err, "health over mTLS")
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, health.GetStatus())

	plain, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer plain.Close()
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	defer pcancel()
	_, err = healthpb.NewHealthClient(plain).Check(pctx, &healthpb.HealthCheckRequest{})
	assert.Error(t, err, "a plaintext client is not served")

	https := &http.Client{Transport: &http.Transport{TLSClientConfig: viewer.ClientTLS("distributor")}}
	defer https.CloseIdleConnections()
	resp, err := https.Get("https://" + metricsAddr + "/metrics")
	require.NoError(t, err, "metrics over mTLS")
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(body), "sliceplane_distributor_pull_streams")
	anon := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the server must refuse it
	defer anon.CloseIdleConnections()
	_, err = anon.Get("https://" + metricsAddr + "/metrics")
	assert.Error(t, err, "metrics without a client certificate")

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err, "a cancelled run is a clean stop")
	case <-time.After(30 * time.Second):
		t.Fatal("did not stop")
	}
}

// waitRegistered waits until distributor d1 registers and returns its address.
func waitRegistered(t *testing.T, ctx context.Context, cli *clientv3.Client, done <-chan error) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		set, _, err := membership.Load(ctx, cli, "/sliceplane/")
		require.NoError(t, err)
		if addr := set["d1"]; addr != "" {
			return addr
		}
		select {
		case err := <-done:
			t.Fatalf("the distributor stopped before registering: %v", err)
		default:
		}
		require.True(t, time.Now().Before(deadline), "d1 not registered within 30s")
		time.Sleep(20 * time.Millisecond)
	}
}

// freePort returns a loopback address nothing listens on.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// startTLSEtcd runs an etcd that serves clients over mutual TLS only, with the PKI's
// etcd/e0 certificate, and returns its endpoint.
func startTLSEtcd(t *testing.T, pki *mtlstest.PKI) string {
	t.Helper()
	return etcdtest.StartTLS(t, pki.Config("etcd", "e0")).Endpoint()
}
