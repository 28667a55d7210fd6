package distributor_test

import (
	"bytes"
	"crypto/tls"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/authz/authztest"
	"github.com/sliceplane/sliceplane/internal/certs"
	"github.com/sliceplane/sliceplane/internal/clustertest"
	"github.com/sliceplane/sliceplane/internal/distributor"
	"github.com/sliceplane/sliceplane/internal/faultproxy"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

// freeAddr returns a loopback address nothing listens on, for a server that must be known
// before it starts.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// servedSerial returns the serial number of the certificate the server at addr presents to
// a new connection.
func servedSerial(t *testing.T, addr string) *big.Int {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec // only reads the certificate
	require.NoError(t, err)
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber
}

// rotationCluster runs a mutual TLS cluster whose nodes reach distributor d1 through a
// proxy that can cut their connections.
func rotationCluster(t *testing.T) (*clustertest.Cluster, *prometheus.Registry, *faultproxy.Proxy) {
	t.Helper()
	old := mtls.CheckInterval
	mtls.CheckInterval = 10 * time.Millisecond
	t.Cleanup(func() { mtls.CheckInterval = old }) // registered first: runs after every part stopped

	listen := freeAddr(t)
	proxy, err := faultproxy.New(listen)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	reg := prometheus.NewRegistry()
	c := clustertest.New(t, clustertest.Options{TLS: true, Distributor: func(cfg *distributor.Config) {
		cfg.Registry, cfg.Listen, cfg.Advertise = reg, listen, proxy.Addr()
	}})
	c.StartDistributor("d1")
	c.StartNode("n1", nil)
	c.StartNode("n2", nil)
	delivered(t, c)
	return c, reg, proxy
}

// TestCertificatesRotateWithoutARestart replaces the leaves, then the CA, under running
// nodes: open streams keep delivering, new connections use the new files.
func TestCertificatesRotateWithoutARestart(t *testing.T) {
	c, reg, proxy := rotationCluster(t)
	d1 := c.Distributors()["d1"]
	listen := d1.Addr
	before := servedSerial(t, listen)
	epochs := map[string]uint64{}
	for id, n := range c.Nodes() {
		epochs[id] = n.Cursor().Epoch
	}

	// New leaves from the same CA.
	leaf := c.PKI.Issue(certs.Request{Kind: "distributor", Name: "d1"})
	c.PKI.Config("node", "n1")
	c.PKI.Config("node", "n2")
	want := readSerial(t, leaf.Cert)
	require.NotEqual(t, before, want)
	require.Eventually(t, func() bool { return servedSerial(t, listen).Cmp(want) == 0 }, patience, 10*time.Millisecond,
		"new connections get the new certificate")
	reloads, err := d1.TLS.Reloads()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, reloads, 1)
	delivered(t, c)
	for id, n := range c.Nodes() {
		assert.Equal(t, epochs[id], n.Cursor().Epoch, "%s's stream started over", id)
	}

	// A new CA: first trusted next to the old one, then every leaf issued by it, then the
	// old CA retired. Open connections keep what they were made with.
	rotateCA(t, c)
	delivered(t, c)
	for id, n := range c.Nodes() {
		assert.Equal(t, epochs[id], n.Cursor().Epoch, "%s's stream started over", id)
	}
	// Cut the nodes' connections: they dial again with the files of now, which only the
	// new CA vouches for; a node presenting its old certificate would be refused.
	proxy.StallExisting()
	proxy.DropStalled()
	delivered(t, c)
	assert.Positive(t, proxy.Open(), "the nodes connected again")
	assert.Empty(t, authztest.Denied(t, reg, "distributor", pb.DistributorService_Pull_FullMethodName), "no call was refused")
	after, err := d1.TLS.Reloads()
	require.NoError(t, err)
	assert.Greater(t, after, reloads, "the distributor read the new CA and leaf")
	assert.Equal(t, readSerial(t, leaf.Cert), servedSerial(t, listen), "the distributor serves its leaf of the new CA")
}

// rotateCA replaces the cluster's CA: the new one is trusted next to the old, every leaf
// in use is issued again by it, and the old CA is retired.
func rotateCA(t *testing.T, c *clustertest.Cluster) {
	t.Helper()
	caFile := filepath.Join(c.PKI.Dir, "ca.crt")
	oldPEM, err := os.ReadFile(caFile)
	require.NoError(t, err)
	ca, err := certs.NewCA("sliceplane test CA 2", time.Hour)
	require.NoError(t, err)
	require.NoError(t, certs.WriteAtomic(caFile, append(bytes.Clone(oldPEM), ca.CertPEM()...), 0o644))
	for _, r := range []certs.Request{
		{Kind: "assigner", Name: "a0"}, {Kind: "distributor", Name: "d1"}, {Kind: "node", Name: "n1"}, {Kind: "node", Name: "n2"},
	} {
		l, err := ca.Issue(r)
		require.NoError(t, err)
		_, err = certs.WriteLeaf(c.PKI.Dir, r, l)
		require.NoError(t, err)
	}
	require.NoError(t, certs.WriteAtomic(caFile, ca.CertPEM(), 0o644))
	c.PKI.CA = ca
}

func readSerial(t *testing.T, certFile string) *big.Int {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, certFile[:len(certFile)-len(".crt")]+".key")
	require.NoError(t, err)
	return pair.Leaf.SerialNumber
}
