package healthcheck_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sliceplane/sliceplane/internal/authz"
	"github.com/sliceplane/sliceplane/internal/healthcheck"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startGRPC serves gRPC health with mutual TLS as the assigner does: authz verifies the
// client's certificate, and health is open to any identity of the CA.
func startGRPC(t *testing.T, src *mtls.Source) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := grpc.NewServer(authz.New("test", src, nil, authz.AssignerRules(), nil, nil).ServerOptions()...)
	healthpb.RegisterHealthServer(s, health.NewServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(lis)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return lis.Addr().String()
}

// startHTTPS serves /healthz as the metrics server does with TLS: a client certificate is
// required by the handshake itself.
func startHTTPS(t *testing.T, conf *tls.Config) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(http.ResponseWriter, *http.Request) {})
	srv := &http.Server{Handler: mux, TLSConfig: conf, ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.ServeTLS(lis, "", ""); !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serving: %v", err)
		}
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return "https://" + lis.Addr().String() + "/healthz"
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestGRPCWithMutualTLS(t *testing.T) {
	p := mtlstest.New(t)
	addr := startGRPC(t, p.Source("assigner", "a1"))

	require.NoError(t, healthcheck.GRPCTLS(ctxT(t), addr, "", p.Source("node", "n1").ClientTLS(), grpc.WaitForReady(true)))

	// Without a certificate: plaintext against TLS never gets an answer.
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	assert.Error(t, healthcheck.GRPC(short, addr, "", grpc.WaitForReady(true)))

	// A certificate of another CA is refused by the server: Unauthenticated.
	other := mtlstest.New(t)
	stranger := other.Source("node", "n1").ClientConfig()
	stranger.VerifyConnection = nil // the stranger does not check the server either
	err := healthcheck.GRPCTLS(ctxT(t), addr, "", stranger)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Unauthenticated")
}

func TestHTTPWithMutualTLS(t *testing.T) {
	p := mtlstest.New(t)
	url := startHTTPS(t, p.Source("node", "n1").ServerTLS())

	require.NoError(t, healthcheck.HTTPTLS(ctxT(t), url, p.Source("viewer", "probe").ClientTLS()))
	plainURL := "http://" + strings.TrimPrefix(url, "https://")
	require.NoError(t, healthcheck.HTTPTLS(ctxT(t), plainURL, p.Source("viewer", "probe").ClientTLS()), "http:// is asked over TLS")

	// Without a certificate the handshake fails (nor does the system trust this CA).
	assert.Error(t, healthcheck.HTTP(ctxT(t), url))
	noCert := p.Source("viewer", "probe").ClientTLS()
	noCert.GetClientCertificate = nil
	// How the refusal shows depends on when TLS 1.3 reports it ("certificate required", or
	// the HTTP/2 connection failing after the handshake): that it fails is what counts.
	require.Error(t, healthcheck.HTTPTLS(ctxT(t), url, noCert))
}
