package embedetcd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

// The options are etcdtest.ClusterLeaks, which this package cannot import.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).abortPendingRead"),
		goleak.IgnoreAnyFunction("github.com/soheilhy/cmux.(*MuxConn).Read"),
		// A killed member's peer handlers may wait forever on its closed backend.
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/etcdserver/api/etcdhttp.newPeerHandler.versionHandler.func1"))
}

func TestStartServesAndRestartsFromItsDirectory(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	s, err := Start(ctx, Options{Dir: dir, Fast: true, LogLevel: "fatal"})
	require.NoError(t, err)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	_, err = c.Put(ctx, "k", "v")
	require.NoError(t, err)
	require.NoError(t, c.Close())
	s.Close()

	s, err = Start(ctx, Options{Dir: dir, Fast: true, LogLevel: "fatal"})
	require.NoError(t, err)
	defer s.Close()
	c, err = clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer c.Close()
	resp, err := c.Get(ctx, "k")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, "v", string(resp.Kvs[0].Value))
}

func TestStartRejectsNoDirectory(t *testing.T) {
	_, err := Start(context.Background(), Options{})
	require.Error(t, err)
}

func TestClusterElectsANewLeaderWhenItsLeaderStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := StartCluster(ctx, Options{Dir: t.TempDir(), Fast: true, LogLevel: "fatal"}, 3)
	require.NoError(t, err)
	defer c.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	_, err = cli.Put(ctx, "k", "v")
	require.NoError(t, err)

	for range 3 { // a second loss without the restart would leave no quorum
		var old *Server
		require.Eventually(t, func() bool { old = c.Leader(); return old != nil }, 10*time.Second, 10*time.Millisecond)
		start := time.Now()
		old.Kill()
		t.Logf("killed in %s", time.Since(start))
		require.Eventually(t, func() bool { l := c.Leader(); return l != nil && l != old }, 10*time.Second, 10*time.Millisecond)
		t.Logf("new leader after %s", time.Since(start))
		resp, err := cli.Get(ctx, "k")
		require.NoError(t, err)
		require.Len(t, resp.Kvs, 1, "the data survives on the other members")
		i := slices.Index(c.Members, old)
		require.NoError(t, c.Restart(ctx, i))
		_, err = cli.Put(ctx, "k", "v")
		require.NoError(t, err)
	}
}

func TestTLSAdmitsOnlyClientsWithACertificateFromTheCA(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pki := mtlstest.New(t)
	s, err := Start(ctx, Options{Dir: t.TempDir(), Fast: true, LogLevel: "fatal", TLS: pki.Config("assigner", "a1")})
	require.NoError(t, err)
	defer s.Close()
	require.True(t, strings.HasPrefix(s.Endpoint(), "https://127.0.0.1:"), s.Endpoint())

	// Refusals are retried by the client until the deadline; acceptances get time to spare on a
	// busy machine.
	const refused, accepted = 2 * time.Second, 20 * time.Second
	put := func(endpoint string, tlsConf *tls.Config, wait time.Duration) error {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 2 * time.Second, TLS: tlsConf, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer c.Close()
		pctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		_, err = c.Put(pctx, "k", "v")
		return err
	}
	assert.Error(t, put(s.Endpoint(), nil, refused), "a client without TLS")
	assert.Error(t, put("http://"+strings.TrimPrefix(s.Endpoint(), "https://"), nil, refused), "a plaintext client")
	caPEM, err := os.ReadFile(filepath.Join(pki.Dir, "ca.crt"))
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(caPEM))
	assert.Error(t, put(s.Endpoint(), &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, refused),
		"a client that trusts the CA but has no certificate")
	other := mtlstest.New(t).Source("distributor", "d1")
	assert.Error(t, put(s.Endpoint(), other.ClientTLS(), refused), "a client whose certificate is from another CA")

	require.NoError(t, put(s.Endpoint(), pki.Source("distributor", "d1").ClientTLS(), accepted), "a distributor's certificate")
	require.NoError(t, put(s.Endpoint(), pki.Source("assigner", "a2").ClientTLS(), accepted), "another assigner's")
}

func TestANetworkAddressWithoutTLSIsRefused(t *testing.T) {
	ctx := context.Background()
	_, err := Start(ctx, Options{Dir: t.TempDir(), ClientAddr: "0.0.0.0:0", LogLevel: "fatal"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "refusing to serve the embedded etcd on 0.0.0.0:0 without TLS")

	_, err = Start(ctx, Options{Dir: t.TempDir(), LogLevel: "fatal", TLS: mtls.Config{Cert: "/no/such.crt"}})
	require.Error(t, err)
	assert.ErrorIs(t, err, mtls.ErrConfig)
	assert.Contains(t, err.Error(), "--tls-key, --tls-ca missing")
}
