package lifecycle_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/examples/kvstore/lifecycle"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTheFirstFailureStopsTheOthers(t *testing.T) {
	boom := errors.New("boom")
	stopped := make(chan struct{})
	err := lifecycle.Run(context.Background(), "kvnode",
		lifecycle.Part{Name: "router", Run: func(ctx context.Context) error { <-ctx.Done(); close(stopped); return nil }},
		lifecycle.Part{Name: "node", Run: func(context.Context) error { return boom }},
	)
	require.ErrorIs(t, err, boom)
	require.EqualError(t, err, "kvnode: node: boom")
	select {
	case <-stopped:
	default:
		t.Fatal("Run returned before the router stopped")
	}
}

func TestHTTPServesUntilItsContextEnds(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
		ReadHeaderTimeout: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- lifecycle.HTTP(ctx, srv, lis, false, time.Second) }()

	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + lis.Addr().String())
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, "ok", string(body))

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err, "a shutdown is no failure")
	case <-time.After(10 * time.Second):
		t.Fatal("HTTP did not return after its context ended")
	}
	_, err = c.Get("http://" + lis.Addr().String())
	require.Error(t, err, "the listener is closed")
}
