// Package etcdtest starts an embedded etcd for a test, on loopback, in the test's temporary
// directory, fast and not durable, and stops it when the test ends.
package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/sliceplane/sliceplane/internal/embedetcd"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

// Start starts an embedded etcd for t and returns it; it is closed when t ends.
func Start(t testing.TB) *embedetcd.Server {
	t.Helper()
	return StartTLS(t, mtls.Config{})
}

// StartTLS starts an embedded etcd for t that serves clients over mutual TLS only, with the
// files of tls (plaintext if it names none); it is closed when t ends.
func StartTLS(t testing.TB, tls mtls.Config) *embedetcd.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := embedetcd.Start(ctx, embedetcd.Options{Dir: t.TempDir(), Fast: true, LogLevel: "fatal", TLS: tls})
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// Client returns a client of s, closed when t ends.
func Client(t testing.TB, s *embedetcd.Server) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// New starts an embedded etcd for t and returns a client of it.
func New(t testing.TB) *clientv3.Client {
	t.Helper()
	return Client(t, Start(t))
}

// StartCluster starts an embedded etcd cluster of n members for t, with elections of
// realistic length (100 ms heartbeats, 1 s election timeout: a new leader in 1-2 s, as in
// production), and stops it when t ends.
func StartCluster(t testing.TB, n int) *embedetcd.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := embedetcd.StartCluster(ctx, embedetcd.Options{Dir: t.TempDir(), Fast: true, TickMs: 100, ElectionMs: 1000, LogLevel: "fatal"}, n)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// ClusterClient returns a client of every member of c, closed when t ends.
func ClusterClient(t testing.TB, c *embedetcd.Cluster) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// ClusterLeaks are goleak options for what etcd's peer transport leaves behind once the
// members of a cluster have stopped: HTTP connections between members that etcd does not
// close. A test binary that runs a cluster passes them to goleak.VerifyTestMain.
func ClusterLeaks() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).abortPendingRead"),
		goleak.IgnoreAnyFunction("github.com/soheilhy/cmux.(*MuxConn).Read"),
		// A killed member's peer handlers may wait forever on its closed backend.
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/etcdserver/api/etcdhttp.newPeerHandler.versionHandler.func1"),
	}
}
