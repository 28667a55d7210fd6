package metricsserver_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/internal/logging/logtest"
	"github.com/sliceplane/sliceplane/internal/metricsserver"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestServesTheRegistryUntilCancelled(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "sliceplane_test_things_total", Help: "Things."})
	reg.MustRegister(c)
	c.Add(3)
	s, err := metricsserver.Listen("127.0.0.1:0", reg, nil, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + s.Addr() + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(body), "sliceplane_test_things_total 3")
	assert.Contains(t, string(body), "promhttp_metric_handler_errors_total", "the handler counts its errors in the registry")

	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err, "a cancelled Serve is a clean stop")
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
	_, err = client.Get("http://" + s.Addr() + "/metrics")
	assert.Error(t, err, "the port is closed")
}

func TestNoAddressNoEndpoint(t *testing.T) {
	s, err := metricsserver.Listen("", prometheus.NewRegistry(), nil, nil)
	require.NoError(t, err)
	assert.Nil(t, s)
	assert.Empty(t, s.Addr())
	assert.NoError(t, s.Serve(context.Background()), "a nil Server serves nothing and returns")
	assert.NoError(t, s.Close())
}

func TestAddressInUse(t *testing.T) {
	a, err := metricsserver.Listen("127.0.0.1:0", prometheus.NewRegistry(), nil, nil)
	require.NoError(t, err)
	defer a.Close()
	_, err = metricsserver.Listen(a.Addr(), prometheus.NewRegistry(), nil, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), a.Addr())
}

// TestAClientWithoutACertificateIsLoggedAtDebug: the handshake a client without a
// certificate fails goes to the server's structured log, at debug, not to stderr.
func TestAClientWithoutACertificateIsLoggedAtDebug(t *testing.T) {
	pki := mtlstest.New(t)
	logs := &logtest.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := metricsserver.Listen("127.0.0.1:0", prometheus.NewRegistry(), pki.Source("assigner", "a1").ServerTLS(), log)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 5 * time.Second} //nolint:gosec // the client's certificate is what is missing
	defer client.CloseIdleConnections()
	_, err = client.Get("https://" + s.Addr() + "/metrics")
	require.Error(t, err)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "TLS handshake error") {
		require.True(t, time.Now().Before(deadline), "no log of the refused handshake: %s", logs.String())
		time.Sleep(10 * time.Millisecond) // the server logs after the client saw the error
	}
	assert.Contains(t, logs.String(), `"level":"DEBUG"`)
}
