package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/client/memstore"
	"github.com/sliceplane/sliceplane/internal/certs"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/mtls"
	"github.com/sliceplane/sliceplane/internal/mtls/mtlstest"
)

func tlsOf(c mtls.Config) client.TLS { return client.TLS{Cert: c.Cert, Key: c.Key, CA: c.CA} }

func TestNewNodeChecksItsCertificate(t *testing.T) {
	pki := mtlstest.New(t)
	n2 := tlsOf(pki.Config("node", "n2"))
	node := func(id string, tls client.TLS) error {
		_, err := client.NewNode(client.NodeConfig{ID: id, Assigners: []string{"127.0.0.1:1"}, Address: "127.0.0.1:2",
			Store: memstore.New(), TLS: tls, Logger: quiet()})
		return err
	}
	require.NoError(t, node("n2", n2), "its own certificate")
	require.NoError(t, node("n2", client.TLS{}), "no TLS: plaintext")
	kv := tlsOf(pki.Issue(certs.Request{Kind: "node", Name: "m1", Target: "kv"}))
	member := func(name string, tls client.TLS) error {
		_, err := client.NewNode(client.NodeConfig{ID: "m1", Target: name, Assigners: []string{"127.0.0.1:1"}, Address: "127.0.0.1:2",
			Store: memstore.New(), TLS: tls, Logger: quiet()})
		return err
	}
	require.NoError(t, member("kv", kv), "a certificate of its target")
	assert.ErrorContains(t, member("ads", kv), "node \"m1\" of target \"ads\": the certificate")
	assert.ErrorContains(t, member("kv", tlsOf(pki.Config("node", "m1"))), "not spiffe://sliceplane/target/kv/node/m1")
	for _, c := range []struct {
		id   string
		tls  client.TLS
		want string
	}{
		{"n1", n2, "names spiffe://sliceplane/node/n2, not spiffe://sliceplane/node/n1"},
		{"n2", tlsOf(pki.Issue(certs.Request{Kind: "node", Name: "n2", Target: "kv"})),
			"names spiffe://sliceplane/target/kv/node/n2, not spiffe://sliceplane/node/n2"},
		{"n1", tlsOf(pki.Config("router", "n1")), "names spiffe://sliceplane/router/n1, not spiffe://sliceplane/node/n1"},
		{"n2", client.TLS{Cert: n2.Cert, Key: n2.Key}, "--tls-ca missing"},
		{"n2", client.TLS{Cert: n2.Cert, Key: n2.Cert, CA: n2.CA}, "loading"},
		{"n2", client.TLS{Cert: n2.Cert, Key: n2.Key, CA: n2.CA + ".missing"}, "no such file"},
	} {
		err := node(c.id, c.tls)
		require.Error(t, err, "%+v", c)
		assert.ErrorContains(t, err, c.want)
		assert.ErrorIs(t, err, client.ErrTLS)
	}
}

func TestNewRouterChecksItsTLS(t *testing.T) {
	pki := mtlstest.New(t)
	r1 := tlsOf(pki.Config("router", "r1"))
	_, err := client.NewRouter(client.RouterConfig{Assigners: []string{"127.0.0.1:1"}, TLS: r1})
	require.NoError(t, err)
	_, err = client.NewRouter(client.RouterConfig{Assigners: []string{"127.0.0.1:1"}, TLS: client.TLS{Cert: r1.Cert}})
	assert.ErrorContains(t, err, "--tls-key, --tls-ca missing")
	assert.ErrorIs(t, err, client.ErrTLS)
}

// TestNodeAndRouterOverMutualTLS runs a node and routers against a cluster that speaks only
// mutual TLS.
func TestNodeAndRouterOverMutualTLS(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{TLS: true})
	c.StartDistributor("d1")
	n1 := c.StartNode("n1", nil)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	clock, err := c.Source.Put(ctx, []byte("k"), []byte("v"))
	require.NoError(t, err)
	require.NoError(t, c.WaitClock(ctx, clock), "the node pulls over mTLS")
	it, ok, err := n1.Store.Get(ctx, []byte("k"))
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, "v", string(it.Value))

	// A router identity, and a viewer (whose role implies router's), read the map and the
	// node list, with the nodes' addresses.
	for _, kind := range []string{"router", "viewer"} {
		r, err := client.NewRouter(client.RouterConfig{Assigners: c.Assigners(), TLS: tlsOf(c.PKI.Config(kind, "r1")), Logger: quiet()})
		require.NoError(t, err)
		runRouter(t, r)
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		require.NoError(t, r.WaitReady(rctx), kind)
		rcancel()
		waitFor(t, 30*time.Second, "the router routes to n1", func() bool {
			route, err := r.Lookup([]byte("k"))
			return err == nil && len(route.Replicas) == 1 && route.Replicas[0].ID == "n1" && route.Replicas[0].Address != ""
		})
	}

	// A router without TLS gets nothing from the cluster.
	plain, err := client.NewRouter(client.RouterConfig{Assigners: c.Assigners(), Logger: quiet()})
	require.NoError(t, err)
	runRouter(t, plain)
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	defer pcancel()
	assert.Error(t, plain.WaitReady(pctx), "a plaintext router is not served")
}
