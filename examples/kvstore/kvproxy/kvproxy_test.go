package kvproxy_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sliceplane/sliceplane/examples/kvstore/kvclient"
	"github.com/sliceplane/sliceplane/examples/kvstore/kvproxy"
	"github.com/sliceplane/sliceplane/internal/launch"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T, cfg kvproxy.Config) *kvproxy.Proxy {
	t.Helper()
	p, err := kvproxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("proxy: %v", err)
		}
	})
	return p
}

// get reads a key through the proxy and returns the status.
func get(ctx context.Context, hc *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body) //nolint:errcheck // only the status matters
	return resp.StatusCode, nil
}

// With TLS the proxy answers only clients with a certificate of its CA. No assigner runs, so
// the answer is 503 (no map yet): the proxy's own serving is what is tested.
func TestWithTLSTheProxyServesOnlyClientsWithACertificate(t *testing.T) {
	pki, err := launch.NewPKI(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	own, err := pki.Issue("router", "proxy")
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, kvproxy.Config{Listen: "127.0.0.1:0", Assigners: []string{"127.0.0.1:1"}, TLS: own})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	viewer, err := pki.Source("viewer", "v")
	if err != nil {
		t.Fatal(err)
	}
	// The nodes' client checks for a node's certificate; the proxy's is a router's.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: viewer.ClientTLS("router")}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	if code, err := get(ctx, hc, "https://"+p.Addr()+kvclient.KeyPath+"k"); err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("a client with a certificate: %d, %v; want 503 (no map)", code, err)
	}
	if _, err := get(ctx, kvclient.HTTPClient(viewer, 10*time.Second), "https://"+p.Addr()+kvclient.KeyPath+"k"); err == nil {
		t.Error("a client that expects a node accepted the proxy's router certificate")
	}
	if code, err := get(ctx, http.DefaultClient, "http://"+p.Addr()+kvclient.KeyPath+"k"); err == nil && code != http.StatusBadRequest {
		t.Errorf("a plaintext client: %d; want a refusal", code)
	}
	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: viewer.ClientTLS("router")}, Timeout: 10 * time.Second}
	noCert.Transport.(*http.Transport).TLSClientConfig.GetClientCertificate = nil
	if _, err := get(ctx, noCert, "https://"+p.Addr()+kvclient.KeyPath+"k"); err == nil {
		t.Error("a client without a certificate was served")
	}
}

func TestAPlaintextProxyServesOnLoopbackOnly(t *testing.T) {
	if _, err := kvproxy.New(kvproxy.Config{Listen: "0.0.0.0:0", Assigners: []string{"127.0.0.1:1"}}); !errors.Is(err, mtls.ErrConfig) {
		t.Fatalf("plaintext on every interface: %v, want refused", err)
	}
	p := start(t, kvproxy.Config{Listen: "127.0.0.1:0", Assigners: []string{"127.0.0.1:1"}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if code, err := get(ctx, http.DefaultClient, "http://"+p.Addr()+kvclient.KeyPath+"k"); err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("plaintext on loopback: %d, %v; want 503 (no map)", code, err)
	}
}
