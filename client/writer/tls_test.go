package writer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/writer"
	"github.com/sliceplane/sliceplane/internal/embedetcd/etcdtest"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

// startTLSEtcd runs an etcd that serves clients over mutual TLS only, with the PKI's
// etcd/e0 certificate, and returns its endpoint.
func startTLSEtcd(t *testing.T, pki *mtlstest.PKI) string {
	t.Helper()
	return etcdtest.StartTLS(t, pki.Config("etcd", "e0")).Endpoint()
}

func TestDialOverMutualTLS(t *testing.T) {
	pki := mtlstest.New(t)
	endpoint := startTLSEtcd(t, pki)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	f := pki.Config("admin", "loader")
	cli, err := writer.Dial([]string{endpoint}, client.TLS{Cert: f.Cert, Key: f.Key, CA: f.CA})
	require.NoError(t, err)
	defer cli.Close()
	w := writer.New(cli, writer.DefaultPrefix)
	_, err = w.Put(ctx, []byte("k"), []byte("v"))
	require.NoError(t, err)
	it, ok, err := w.Get(ctx, []byte("k"))
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, "v", string(it.Value))

	// Without a certificate etcd does not serve the writer.
	plain, err := writer.Dial([]string{endpoint}, client.TLS{})
	require.NoError(t, err)
	defer plain.Close()
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	defer pcancel()
	_, err = writer.New(plain, writer.DefaultPrefix).Put(pctx, []byte("k"), []byte("w"))
	assert.Error(t, err)
}

func TestDialWithoutTLS(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli, err := writer.Dial([]string{etcd.Endpoint()}, client.TLS{})
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = writer.New(cli, writer.DefaultPrefix).Put(ctx, []byte("k"), []byte("v"))
	require.NoError(t, err)

	_, err = writer.Dial([]string{etcd.Endpoint()}, client.TLS{Cert: "x.crt"})
	assert.ErrorIs(t, err, client.ErrTLS)
	assert.ErrorContains(t, err, "--tls-key, --tls-ca missing")
}
