package grpcserver_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/grpcserver"
	"github.com/sliceplane/sliceplane/internal/grpcserver/grpcservertest"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// run runs s with tasks until the test ends or stop is called, and returns stop, which
// returns Run's error.
func run(t *testing.T, s *grpcserver.Server, tasks ...grpcserver.Task) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, tasks...) }()
	var err error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("Run did not return after its context ended")
			}
		}
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

func dial(t *testing.T, addr string, conf *tls.Config) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(conf)))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

func check(ctx context.Context, conn *grpc.ClientConn, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	return resp.GetStatus(), err
}

// TestServesMutualTLS serves health, reflection and metrics behind mutual TLS, refuses a
// client without a certificate, and stops every goroutine when its context ends.
func TestServesMutualTLS(t *testing.T) {
	pki := mtlstest.New(t)
	reg := prometheus.NewRegistry()
	srv, err := grpcserver.New(grpcserver.Config{
		Name: "test", Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", Rules: authz.DistributorRules(),
		TLS: pki.Source("distributor", "d1"), Registry: reg, Logger: quiet(), Grace: time.Second,
	})
	require.NoError(t, err)
	assert.Equal(t, srv.Addr(), srv.Advertise(), "the bound address by default")
	srv.Health().SetServingStatus("mine", healthpb.HealthCheckResponse_NOT_SERVING)
	taskDone := make(chan struct{})
	stop := run(t, srv, grpcserver.Task{Name: "waiting", Run: func(ctx context.Context) error {
		defer close(taskDone)
		<-ctx.Done()
		return nil
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	node := pki.Source("node", "n1").ClientTLS("distributor")
	conn := dial(t, srv.Addr(), node)
	st, err := check(ctx, conn, "")
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, st)
	st, err = check(ctx, conn, "mine")
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, st, "a service the caller set")

	anonymous := node.Clone()
	anonymous.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
	_, err = check(ctx, dial(t, srv.Addr(), anonymous), "")
	assert.Equal(t, codes.Unauthenticated, status.Code(err), "no certificate: %v", err)

	services := grpcservertest.ListServices(ctx, t, conn)
	assert.Contains(t, services, healthpb.Health_ServiceDesc.ServiceName)
	assert.Contains(t, services, reflectionpb.ServerReflection_ServiceDesc.ServiceName)

	body, err := scrape(srv.MetricsAddr(), node)
	require.NoError(t, err)
	assert.Contains(t, body, `sliceplane_test_requests_denied_total{method="/grpc.health.v1.Health/Check",reason="unauthenticated"} 1`)
	_, err = scrape(srv.MetricsAddr(), anonymous)
	assert.Error(t, err, "the metrics need a client certificate too")

	require.NoError(t, stop(), "a cancelled Run is a clean stop")
	select {
	case <-taskDone:
	default:
		t.Fatal("Run returned before its task")
	}
	_, err = healthpb.NewHealthClient(dial(t, srv.Addr(), node)).Check(ctx, &healthpb.HealthCheckRequest{})
	assert.Equal(t, codes.Unavailable, status.Code(err), "the port is closed: %v", err)
}

func scrape(addr string, conf *tls.Config) (string, error) {
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Get("https://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// TestAFailingTaskStopsTheServer returns the task's error, named, and stops the rest.
func TestAFailingTaskStopsTheServer(t *testing.T) {
	srv, err := grpcserver.New(grpcserver.Config{Name: "test", Listen: "127.0.0.1:0", Rules: authz.DistributorRules(),
		Registry: prometheus.NewRegistry(), Logger: quiet()})
	require.NoError(t, err)
	assert.Empty(t, srv.MetricsAddr(), "no metrics asked for")
	boom := errors.New("boom")
	err = srv.Run(context.Background(),
		grpcserver.Task{Name: "failing", Run: func(context.Context) error { return boom }},
		grpcserver.Task{Name: "waiting", Run: func(ctx context.Context) error { <-ctx.Done(); return nil }})
	require.ErrorIs(t, err, boom)
	assert.EqualError(t, err, "test: failing: boom")
}

func TestNewFailsOnABusyAddress(t *testing.T) {
	a, err := grpcserver.New(grpcserver.Config{Name: "test", Listen: "127.0.0.1:0", Registry: prometheus.NewRegistry(), Logger: quiet()})
	require.NoError(t, err)
	stop := run(t, a)
	_, err = grpcserver.New(grpcserver.Config{Name: "test", Listen: a.Addr(), Registry: prometheus.NewRegistry(), Logger: quiet()})
	assert.ErrorContains(t, err, "test: listening on "+a.Addr())
	require.NoError(t, stop())
}

func TestCheckListen(t *testing.T) {
	src := mtlstest.New(t).Source("assigner", "a1")
	for _, c := range []struct {
		src             *mtls.Source
		insecure        bool
		listen, metrics string
		want            string
	}{
		{nil, false, "127.0.0.1:0", "", ""},
		{nil, false, "localhost:7070", "[::1]:7071", ""},
		{src, false, "0.0.0.0:7070", ":7071", ""},
		{nil, true, "0.0.0.0:7070", ":7071", ""},
		{nil, false, "nonsense", "", "x: --listen: address nonsense: missing port in address"},
		{nil, false, "127.0.0.1:0", "nonsense", "x: --metrics-listen: address nonsense"},
		{nil, false, "0.0.0.0:7070", "", "x: --listen: mtls: bad TLS configuration: refusing to serve the x's gRPC API on 0.0.0.0:7070 without TLS"},
		{nil, false, "127.0.0.1:0", ":7071", "x: --metrics-listen: mtls: bad TLS configuration: refusing to serve the x's metrics on :7071 without TLS"},
	} {
		err := grpcserver.CheckListen("x", c.src, c.insecure, c.listen, c.metrics)
		if c.want == "" {
			assert.NoError(t, err, "%+v", c)
			continue
		}
		assert.ErrorContains(t, err, c.want, "%+v", c)
	}
}

func TestFillDefaults(t *testing.T) {
	every, workers := time.Duration(0), 3
	require.NoError(t, grpcserver.FillDefaults("x", grpcserver.Default("--every", &every, time.Second)))
	require.NoError(t, grpcserver.FillDefaults("x", grpcserver.Default("--workers", &workers, 4)))
	assert.Equal(t, time.Second, every, "zero is the default")
	assert.Equal(t, 3, workers, "a value set is kept")

	every, workers = -time.Millisecond, 0
	err := grpcserver.FillDefaults("x", grpcserver.Default("--every", &every, time.Second))
	assert.EqualError(t, err, "x: --every -1ms: want more than 0, or 0 for the default (1s)")
	workers = -2
	err = grpcserver.FillDefaults("x", grpcserver.Default("--workers", &workers, 4))
	assert.EqualError(t, err, "x: --workers -2: want more than 0, or 0 for the default (4)")
}

// TestStreamsInFlightAreCut stops a server with a stream that never ends on its own: at
// once without grace, after the grace with it.
func TestStreamsInFlightAreCut(t *testing.T) {
	for _, grace := range []time.Duration{0, 200 * time.Millisecond} {
		srv, err := grpcserver.New(grpcserver.Config{Name: "test", Listen: "127.0.0.1:0", Rules: authz.DistributorRules(),
			Registry: prometheus.NewRegistry(), Logger: quiet(), Grace: grace})
		require.NoError(t, err)
		stop := run(t, srv)
		conn, err := grpc.NewClient(srv.Addr(), (*mtls.Source)(nil).DialOption())
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		require.NoError(t, err)
		_, err = watch.Recv()
		require.NoError(t, err, "the stream is open")

		began := time.Now()
		require.NoError(t, stop(), "grace %s", grace)
		assert.GreaterOrEqual(t, time.Since(began), grace, "the stream had its grace")
		_, err = watch.Recv()
		assert.Equal(t, codes.Unavailable, status.Code(err), "grace %s: the stream was cut: %v", grace, err)
		cancel()
		conn.Close()
	}
}

// A server counts the client connections it holds, in sliceplane_<server>_connections: each
// client once, however many calls it makes, until it goes.
func TestOpenConnectionsAreCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv, err := grpcserver.New(grpcserver.Config{Name: "test", Listen: "127.0.0.1:0", Registry: reg, Logger: quiet()})
	require.NoError(t, err)
	run(t, srv)
	open := func(n int) error {
		want := fmt.Sprintf("# HELP sliceplane_test_connections Client connections to the gRPC API that are open.\n"+
			"# TYPE sliceplane_test_connections gauge\nsliceplane_test_connections %d\n", n)
		return testutil.GatherAndCompare(reg, strings.NewReader(want), "sliceplane_test_connections")
	}
	assert.NoError(t, open(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var conns []*grpc.ClientConn
	for range 2 {
		conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		defer conn.Close()
		for range 3 {
			_, err := check(ctx, conn, "")
			require.NoError(t, err)
		}
		conns = append(conns, conn)
	}
	assert.NoError(t, open(2), "two clients, three calls each")
	require.NoError(t, conns[0].Close())
	require.Eventually(t, func() bool { return open(1) == nil }, 10*time.Second, 5*time.Millisecond, "a client that went is no longer counted")
}
